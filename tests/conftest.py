"""Shared test fixtures. The broker fixture ``pulsar_broker`` comes from ``tghost.testing``.

The tests mirror the stage packages of ``host/tghost`` (``tests/<stage>/``); the ones at this
level check the README, ``docs/`` and the examples. Every test that talks to a real broker is
marked ``broker`` here (it uses the ``pulsar_broker`` or ``host_process`` fixture, or starts a
broker or a ``LocalHost`` itself), so ``pytest -m "not broker"`` runs the rest in seconds.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
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
from collections.abc import Callable, Coroutine, Iterator
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tghost.discovery.discover import ENTRY_POINT_GROUP

T = TypeVar("T")

#: Fixtures that start or use a real broker, and the names a test uses to start one itself.
BROKER_FIXTURES = frozenset({"pulsar_broker", "host_process"})
BROKER_NAMES = ("EmbeddedBroker", "LocalHost", "ensure_broker", "tghost_cli(", "live_tools(", "subprocess")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that talks to a real broker ``broker`` (see the module docstring)."""
    for item in items:
        if BROKER_FIXTURES & set(getattr(item, "fixturenames", ())) or _starts_a_broker(item):
            item.add_marker(pytest.mark.broker)


def _starts_a_broker(item: pytest.Item) -> bool:
    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        return True
    return any(name in source for name in BROKER_NAMES)


#: What ``tghost run`` logs once it serves: its catalog's size and the broker's URL.
READY = r"\d+ service\(s\), \d+ tool\(s\) on"


def tghost_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
               cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``tghost ARGS`` as a user would, in a process of its own (in ``cwd``), and capture what it prints."""
    return subprocess.run([sys.executable, "-m", "tghost", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


def live_tools(env: dict[str, str], *args: str) -> dict[str, dict[str, object]]:
    """``tghost tools --json ARGS``, by tool name."""
    result = tghost_cli("tools", "--json", *args, env=env)
    assert result.returncode == 0, result.stderr
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


class HostProcess:
    """A ``tghost run`` subprocess (or another long-running ``command``, e.g. ``("trustgraph",
    "sync")``); its stderr log is collected in ``self.log``.

    A daemon thread reads stderr line by line into a queue, so :meth:`wait_for` keeps its
    deadline even when the host goes quiet.
    """

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path | None = None,
                 command: tuple[str, ...] = ("run",), stdout: int = subprocess.DEVNULL) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tghost", *command, *args],
            env=env, cwd=cwd, stderr=subprocess.PIPE, stdout=stdout, text=True,
        )
        self.log = ""
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._lines.put(line)
        self._lines.put(None)  # end of the log: the process exited

    def wait_for(self, pattern: str, timeout: float = 30.0) -> str:
        """Read the log until a line matches ``pattern``; returns that line.

        Raises:
            AssertionError: the process exited or the line did not come in ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                self._lines.put(None)
                break
            self.log += line
            if re.search(pattern, line):
                return line
        raise AssertionError(f"no log line matching {pattern!r} in {timeout}s; log so far:\n{self.log}")

    def finish(self, timeout: float = 30.0) -> int:
        """Wait for exit; returns the exit code and appends the rest of the log."""
        self.process.wait(timeout)
        while (line := self._lines.get(timeout=5)) is not None:
            self.log += line
        self._lines.put(None)
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
