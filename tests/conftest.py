"""Shared test fixtures. The broker fixture ``pulsar_broker`` comes from ``tghost.testing``.

The tests mirror the stage packages of ``host/tghost`` (``tests/<stage>/``); the ones at this
level check the README, ``docs/`` and the examples.

Two speeds, selected by fixture: a test that talks to a real broker requests one of
:data:`BROKER_FIXTURES` (``pulsar_broker``: the session's broker; ``host_process``: ``tghost
run`` subprocesses; ``own_brokers``: brokers it starts, stops or restarts itself, in this
process or detached), and exactly those tests are marked ``broker``; ``pytest -m "not broker"``
runs the rest. In those, starting an embedded broker or connecting to one from this process fails
at once, naming the fixture to request (:class:`BrokerGuard`), so no test reaches a
broker without being marked. Subprocesses are not watched: a test whose ``tghost`` commands start
or reach a broker requests one of these fixtures too.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import queue
import re
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Generator, Iterable, Iterator
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest

from tghost.broker import EmbeddedBroker, stop_broker
from tghost.discovery.discover import ENTRY_POINT_GROUP
from tghost.pulsar.clients import PulsarSettings
from tghost.system.net import free_port

T = TypeVar("T")

#: The fixtures that give a test a real broker; a test that requests one is marked ``broker``.
BROKER_FIXTURES = frozenset({"pulsar_broker", "host_process", "own_brokers"})


def asks_for_a_broker(item: pytest.Item) -> bool:
    """Whether the test requests one of :data:`BROKER_FIXTURES`, directly or through a fixture."""
    return not BROKER_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``broker`` every test that :func:`asks_for_a_broker`."""
    for item in items:
        if asks_for_a_broker(item):
            item.add_marker(pytest.mark.broker)


#: What a test that reached for a broker without asking is told.
UNASKED = ("this test talks to a broker: request the pulsar_broker fixture (or host_process for 'tghost run' "
           "subprocesses, own_brokers for brokers of its own), so that it is marked 'broker' and "
           "-m 'not broker' leaves it out")


class BrokerGuard:
    """Keeps a test from reaching a broker: once :meth:`install` ed, :meth:`EmbeddedBroker.start`
    fails at once with :data:`UNASKED`, and so does :meth:`PulsarSettings.connect` (every client
    tghost makes comes from it) as soon as a Pulsar broker answered it; where none answers it
    fails as it always does. :meth:`check` fails too if a refusal was swallowed on the way."""

    def __init__(self) -> None:
        self.refused = 0
        """How many times a broker was reached and refused."""

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Patch :class:`EmbeddedBroker` and :class:`PulsarSettings` (undone with ``monkeypatch``)."""
        connect = PulsarSettings.connect

        async def refuse_connected(settings: PulsarSettings) -> NoReturn:
            client = await connect(settings)
            await client.close()
            self.refuse()

        monkeypatch.setattr(EmbeddedBroker, "start", lambda *args, **kwargs: self.refuse())
        monkeypatch.setattr(PulsarSettings, "connect", refuse_connected)

    def refuse(self) -> NoReturn:
        """Count a refusal and fail the test with :data:`UNASKED`."""
        self.refused += 1
        pytest.fail(UNASKED, pytrace=False)

    def check(self) -> None:
        """Fail the test with :data:`UNASKED` if anything was refused."""
        if self.refused:
            pytest.fail(UNASKED, pytrace=False)


#: The :class:`BrokerGuard` of the test being run, if it asks for no broker.
GUARD = pytest.StashKey[BrokerGuard]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Run a test that asks for no broker under a :class:`BrokerGuard`: its call, and the setup
    and teardown of its fixtures, a module's or the session's included."""
    if asks_for_a_broker(item):
        return (yield)
    item.stash[GUARD] = guard = BrokerGuard()
    with pytest.MonkeyPatch.context() as patch:
        guard.install(patch)
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """Fail a guarded test whose code swallowed a refusal; and, for a test that hangs, print
    what its event loop waits on just before pytest-timeout stops it (:func:`_show_tasks`)."""
    timer = threading.Timer(max(1.0, _timeout(item) - TASKS_SHOWN_BEFORE), _show_tasks)
    timer.daemon = True
    timer.start()
    try:
        result = yield
    finally:
        timer.cancel()
    if GUARD in item.stash:
        item.stash[GUARD].check()
    return result


#: Seconds before pytest-timeout's bound at which a hung test's unfinished asyncio tasks are shown.
TASKS_SHOWN_BEFORE = 5.0


def _timeout(item: pytest.Item) -> float:
    """The pytest-timeout bound of ``item`` in seconds: its ``timeout`` mark, else ``--timeout``,
    else the ini value (pytest-timeout's own order)."""
    mark = item.get_closest_marker("timeout")
    if mark is not None and (mark.args or "timeout" in mark.kwargs):
        return float(mark.args[0] if mark.args else mark.kwargs["timeout"])
    return float(item.config.getoption("timeout", None) or item.config.getini("timeout") or 300)


def _show_tasks() -> None:
    """Print the stack of every unfinished asyncio task in this process to stderr: pytest-timeout
    shows threads only, and a hung async test's threads are all idle (its loop waits in select)."""
    # Python 3.11 keeps every task in _all_tasks; 3.12 on, the scheduled ones in _scheduled_tasks
    registry = getattr(asyncio.tasks, "_all_tasks", None) or getattr(asyncio.tasks, "_scheduled_tasks", ())
    tasks = [task for task in list(registry) if not task.done()]
    print(f"\n{'+' * 20} {len(tasks)} unfinished asyncio task(s) {'+' * 20}", file=sys.stderr)
    for task in tasks:
        with contextlib.suppress(Exception):  # read from another thread: a task may move meanwhile
            task.print_stack(file=sys.stderr)


class OwnBrokers:
    """The embedded brokers one test starts itself, to stop, restart, fill or damage them:
    :meth:`start` runs one in this process, :meth:`detached` takes in one that a ``tghost``
    subprocess started detached (``tghost broker start``, ``tghost run``). :meth:`stop_all` stops
    each, last first; one that fails to stop does not keep the others running."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._tmp_path_factory = tmp_path_factory
        self._stops = contextlib.ExitStack()

    def start(self, data_dir: Path | None = None, port: int | None = None, **options: Any) -> EmbeddedBroker:
        """A started :class:`EmbeddedBroker` on ``port`` (default: a free one) with its data in
        ``data_dir`` (default: a fresh temporary dir); ``options`` are the broker's own
        (``log_level``, ``metrics_port``, ``echo``...). The test may stop and start it again.

        Raises:
            BrokerError: it did not start (see :meth:`EmbeddedBroker.start`).
        """
        broker = EmbeddedBroker(data_dir or self._tmp_path_factory.mktemp("broker"), port or free_port(), **options)
        self._stops.callback(broker.stop)
        return broker.start()

    def detached(self, port: int, data_dir: Path | None = None) -> None:
        """Stop the detached broker on ``port`` with ``data_dir`` (default: the one running
        there) at the end, if it still runs."""
        self._stops.callback(stop_broker, port, data_dir)

    def stop_all(self) -> None:
        """Stop every broker started or taken in, last first (raises the last failure, if any)."""
        self._stops.close()


@pytest.fixture
def own_brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnBrokers]:
    """Brokers of this test's own (:class:`OwnBrokers`), all stopped at its end."""
    brokers = OwnBrokers(tmp_path_factory)
    yield brokers
    brokers.stop_all()


#: What ``tghost run`` logs once it serves: its catalog's size and the broker's URL.
READY = r"\d+ service\(s\), \d+ tool\(s\) on"


async def until(condition: Callable[[], object], what: str = "the condition", timeout: float = 30.0) -> None:
    """Wait on the running loop until ``condition()`` is true, checking every 20 ms.

    Raises:
        AssertionError: not within ``timeout`` seconds; the message names ``what``.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        await asyncio.sleep(0.02)


def tghost_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
               cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``tghost ARGS`` as a user would, in a process of its own (in ``cwd``), and capture what it prints."""
    return subprocess.run([sys.executable, "-m", "tghost", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


def live_tools(env: dict[str, str], *args: str) -> dict[str, dict[str, object]]:
    """``tghost tools --json ARGS``, by tool name."""
    result = tghost_cli("tools", "--json", *args, env=env)
    assert result.returncode in (0, 3), result.stderr  # 3: no live host, none listed
    return {row["name"]: row for row in json.loads(result.stdout)}


class PluginDir:
    """A directory of test distributions: ``<module>.py`` plus ``<dist>-<ver>.dist-info``.

    Put on ``sys.path`` (in process) or ``PYTHONPATH`` (subprocesses), importlib.metadata
    finds the distributions and their ``tghost.plugins`` entry points, as if pip-installed.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.names: list[str] = []

    def add(self, name: str, source: str, version: str = "1.0") -> str:
        """Write a plugin distribution ``tghost-test-<name>``; returns the entry point name."""
        module = "tghost_test_" + re.sub(r"\W", "_", name)
        sys.modules.pop(module, None)  # an earlier test may have imported another source
        (self.root / f"{module}.py").write_text(textwrap.dedent(source))
        info = self.root / f"{module}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: tghost-test-{name}\nVersion: {version}\n"
        )
        (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{name} = {module}\n")
        self.names.append(name)
        importlib.invalidate_caches()
        return name

    def entry_points(self) -> list[EntryPoint]:
        """The entry points of the distributions written here (found through importlib.metadata)."""
        return [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name in self.names]

    def user_env(self, broker_url: str, config_dir: Path, topic_prefix: str) -> dict[str, str]:
        """A user's environment for ``tghost`` subprocesses: these distributions and no other
        plugin (the pip-installed examples are disabled), the broker at ``broker_url``, a fresh
        descriptors topic ``<topic_prefix>-<random>`` and a private config dir (host slots, tools.toml)."""
        others = [ep.name for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in self.names]
        return self.env(TGHOST_PULSAR_URL=broker_url, XDG_CONFIG_HOME=str(config_dir),
                        TGHOST_DESCRIPTORS_TOPIC=f"persistent://tg/config/{topic_prefix}-{uuid.uuid4().hex[:8]}",
                        TGHOST_DISABLE_PLUGINS=",".join(others))

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a subprocess that sees these distributions."""
        path = os.pathsep.join(p for p in (str(self.root), os.environ.get("PYTHONPATH")) if p)
        return {**os.environ, "PYTHONPATH": path, **extra}


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PluginDir:
    """An empty :class:`PluginDir` on ``sys.path`` for this test."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    return PluginDir(root)


class Output:
    """A subprocess's stdout or stderr, read line by line in a daemon thread, so :meth:`wait_for`
    keeps its deadline even when the process goes quiet; what was read so far is :attr:`text`."""

    def __init__(self, stream: Iterable[str]) -> None:
        self.text = ""
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Iterable[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)  # the end: the process closed the stream

    def wait_for(self, match: str | Callable[[str], bool], timeout: float = 30.0) -> str:
        """Read until a line matches ``match`` (a regex, or a predicate); returns that line.

        Raises:
            AssertionError: the stream ended or the line did not come in ``timeout`` seconds.
        """
        found = match if callable(match) else lambda line: re.search(match, line) is not None
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                self._lines.put(None)
                break
            self.text += line
            if found(line):
                return line
        raise AssertionError(f"no line matching {match!r} in {timeout}s; output so far:\n{self.text}")

    def rest(self, timeout: float = 10.0) -> str:
        """Everything read until the stream ends (or ``timeout`` seconds pass)."""
        with contextlib.suppress(AssertionError):
            self.wait_for(lambda line: False, timeout)
        return self.text


class HostProcess:
    """A ``tghost run`` subprocess (or another long-running ``command``, e.g. ``("trustgraph",
    "sync")``); its stderr log, read as an :class:`Output`, is :attr:`log`."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path | None = None,
                 command: tuple[str, ...] = ("run",), stdout: int = subprocess.DEVNULL) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tghost", *command, *args],
            env=env, cwd=cwd, stderr=subprocess.PIPE, stdout=stdout, text=True,
        )
        assert self.process.stderr is not None
        self.stderr = Output(self.process.stderr)

    @property
    def log(self) -> str:
        """The stderr log read so far."""
        return self.stderr.text

    def wait_for(self, pattern: str, timeout: float = 30.0) -> str:
        """Read the log until a line matches ``pattern`` (a regex); returns that line.

        Raises:
            AssertionError: the process exited or the line did not come in ``timeout`` seconds.
        """
        return self.stderr.wait_for(pattern, timeout)

    def finish(self, timeout: float = 30.0) -> int:
        """Wait for exit; returns the exit code and reads the rest of the log."""
        self.process.wait(timeout)
        self.stderr.rest(5)
        return self.process.returncode


@pytest.fixture
def host_process() -> Iterator[Callable[..., HostProcess]]:
    """Start ``tghost run`` (or ``command``) subprocesses; any still running at the end are killed."""
    started: list[HostProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
              command: tuple[str, ...] = ("run",), stdout: int = subprocess.DEVNULL) -> HostProcess:
        host = HostProcess(list(args), env or dict(os.environ), cwd, command, stdout)
        started.append(host)
        return host

    yield start
    for host in started:
        if host.process.poll() is None:
            host.process.kill()
            host.process.wait()


class LoopThread:
    """An event loop in a daemon thread, for a peer's async code (TrustGraph's processors) that
    must keep running while the test blocks, e.g. on a subprocess's log."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        """Run ``coro`` on the thread's loop; returns its result (raises what it raises)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
