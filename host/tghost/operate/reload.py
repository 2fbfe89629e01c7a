"""reload: ``tghost run --reload``, for plugin authors: a supervisor that watches the served plugins'
source files and, on a change, starts a new ``tghost run`` worker process, waits until it serves,
then has the old one hand its services over and stop. Python cannot safely replace a module in
place (see :mod:`tghost.operate.plugin_watch`), so a reload is always a new process.

The worker's side (:class:`ReloadWorker`): started ahead, it waits on standby for ``go`` on its
stdin (:func:`standing_by`) before it imports the plugins; it writes one JSON line to the file
descriptor in ``TGHOST_RELOAD_WORKER`` once it serves and announces (what it serves), and reads
one from its stdin, ``{"hand_over": [service ids]}``, when its successor serves: those services' request
consumers close at once and the requests still reaching them are served, not refused, then the
host stops as on SIGTERM. Stdin closing (the supervisor died) stops it too. Both processes
announce under one host id for a moment; the old one only withdraws, which directories never
count as a clash (docs/protocol.md §4.7).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import watchfiles

from tghost.announcing.announcer import HostIdentity
from tghost.discovery.catalog import Catalog
from tghost.operate.host import Host
from tghost.operate.plugin_watch import installed_plugins
from tghost.system.paths import app_dir
from tghost.system.processes import describe_exit
from tghost.system.tasks import cancel_and_wait

__all__ = ["EXPECT_ENV", "STALE_EXIT", "WORKER_ENV", "ReloadWorker", "Reloader", "broken_after_change", "standing_by"]

log = logging.getLogger(__name__)

#: The environment variable that makes ``tghost run`` a reload worker: the file descriptor of its ready line.
WORKER_ENV = "TGHOST_RELOAD_WORKER"
#: The plugins the previous worker served, as a JSON list: a worker that fails to load one of them
#: exits with :data:`STALE_EXIT` before it connects, and the previous worker serves on.
EXPECT_ENV = "TGHOST_RELOAD_EXPECT"
#: The exit code of a worker whose plugins broke with the change.
STALE_EXIT = 3
#: Milliseconds a change may keep coming in before a reload starts (watchfiles' debounce).
DEBOUNCE_MS = 300
#: Seconds the file watches get to be set up before the source is checked for saves meanwhile.
SETTLE = 1.0


def standing_by() -> bool:
    """A worker's first step: wait until the supervisor says go (``True``), or closes stdin
    (``False``: it is not needed, and exits quietly)."""
    return sys.stdin.readline().strip() == "go"


def broken_after_change(catalog: Catalog) -> list[str]:
    """Of the plugins the previous worker served (``TGHOST_RELOAD_EXPECT``), those that failed to
    load now, each logged as one line; ``[]`` outside a reload."""
    expected = set(json.loads(os.environ.get(EXPECT_ENV) or "[]"))
    broken = [report for report in catalog.plugins if report.name in expected and report.failed]
    for report in broken:
        log.error("plugin %s no longer loads after the change (%s): still serving the code from before it; fix "
                  "it and save again", report.name, report.errors[0])
    return [report.name for report in broken]


class ReloadWorker(Host):
    """A ``tghost run`` started by :class:`Reloader`: a :class:`tghost.Host` that says when it
    serves (one JSON line on file descriptor ``ready_fd``: ``{"services": [ids], "plugins":
    {name: version}}``) and hands over to its successor when stdin says so (module docstring)."""

    def __init__(self, *args: Any, ready_fd: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ready_fd = ready_fd

    async def start(self) -> Self:
        """:meth:`tghost.Host.start`, then the ready line."""
        await super().start()
        served = {"services": [endpoint.descriptor.id for endpoint in self.server.endpoints],
                  "plugins": {r.name: r.version for r in self.catalog.plugins if r.status == "loaded"}}
        with open(self._ready_fd, "w", encoding="utf-8") as ready:
            ready.write(json.dumps(served) + "\n")
        return self

    async def serve(self, *, handle_signals: bool = True) -> int:
        """:meth:`tghost.Host.serve`, stopping also when the supervisor says so on stdin."""
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._read_stdin, args=(loop,), name="reload hand-over", daemon=True).start()
        return await super().serve(handle_signals=handle_signals)

    def _read_stdin(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for the supervisor's word (or stdin's end), then stop, handing over what it names."""
        line = sys.stdin.readline()
        try:
            said = json.loads(line) if line.strip() else {}
        except ValueError:
            said = {}
        services = said.get("hand_over", []) if isinstance(said, dict) else []
        loop.call_soon_threadsafe(self._hand_over, services)

    def _hand_over(self, services: Collection[str]) -> None:
        if services:
            log.info("reload: the new worker serves %s; handing over and stopping", ", ".join(services))
        with contextlib.suppress(RuntimeError):  # not serving yet: nothing to hand over
            for endpoint in self.server.endpoints:
                if endpoint.descriptor.id in services:
                    endpoint.hand_off()
        self.request_stop()


@dataclass
class _Worker:
    """One worker process, and what its ready line said it serves (``None``: not ready)."""

    process: asyncio.subprocess.Process
    ready: asyncio.Task[dict[str, Any] | None]
    expect: list[str]
    started: float = 0.0
    """When it was told to go: it imports the plugins after that."""
    served: dict[str, Any] | None = None

    async def go(self) -> None:
        """Tell the worker on standby to load the plugins and serve."""
        self.started = time.time()
        await self._say("go")

    async def hand_over(self, services: Sequence[str]) -> None:
        """Tell the worker its successor serves ``services``: it hands them over and stops."""
        await self._say(json.dumps({"hand_over": list(services)}))
        self.dismiss()

    def dismiss(self) -> None:
        """Close the worker's stdin: one on standby exits, one serving stops."""
        if self.process.stdin is not None:
            self.process.stdin.close()

    async def _say(self, line: str) -> None:
        stdin = self.process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.write((line + "\n").encode())
            with contextlib.suppress(ConnectionError):
                await stdin.drain()

    def signal(self, sig: int) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)


@dataclass
class Reloader:
    """The supervisor: runs ``tghost run`` with ``argv`` (the command line after ``tghost``) as a
    worker process, and a new one on every change to the served plugins' source (``*.py`` under
    each entry point's top-level package, editable installs included) or to the installed plugins
    (a ``tghost.plugins`` entry point added, removed or at another version). ``host_id``: the id
    the workers announce (default: this supervisor claims a host slot, as ``tghost run`` does).

    :meth:`run` returns the exit code of the last worker. SIGINT/SIGTERM are passed on to the
    workers (the worker drains as ``tghost run`` does; a second signal ends its grace).
    """

    argv: Sequence[str]
    host_id: str | None = None
    _workers: list[_Worker] = field(default_factory=list)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _retiring: set[asyncio.Future[None]] = field(default_factory=set)
    _standby: _Worker | None = None

    def run(self) -> int:
        """Supervise until a signal or the worker's own exit; returns the worker's exit code."""
        logging.getLogger("watchfiles").setLevel(logging.WARNING)  # its "N changes detected": reload logs its own
        with HostIdentity.claim(app_dir(), self.host_id) as identity:
            self.host_id = identity.id
            return asyncio.run(self._run())

    async def _run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        worker = await self._start([])
        if worker.served is None:
            return await self._finish(worker)
        log.info("reload: watching %s for changes", ", ".join(str(p) for p in sorted(set().union(*_plugin_source())))
                 or "the installed plugins")
        while True:
            changes = await self._next_change(worker)
            if changes is None:
                return await self._finish(worker)
            worker = await self._reload(worker, changes)

    async def _finish(self, worker: _Worker) -> int:
        code = await worker.process.wait()
        if self._standby is not None:
            self._standby.dismiss()
            await self._standby.process.wait()
        await asyncio.gather(*self._retiring)
        return code

    def _on_signal(self, sig: int) -> None:
        self._stopping.set()
        for worker in self._workers:
            worker.signal(sig)

    async def _start(self, expect: Iterable[str]) -> _Worker:
        """Start a worker (the one on standby, if it expects the same plugins) and wait until it
        serves or exits; then start the next one on standby."""
        standby, self._standby = self._standby, None
        if standby is None or standby.expect != sorted(expect) or standby.process.returncode is not None:
            if standby is not None:
                standby.dismiss()
            standby = await self._spawn(expect)
        worker = await self._serve(standby)
        self._standby = await self._spawn(worker.served["plugins"] if worker.served else expect)
        return worker

    async def _serve(self, worker: _Worker) -> _Worker:
        """Tell a worker to go, and wait until it serves or exits."""
        self._workers.append(worker)
        await worker.go()
        exited = asyncio.ensure_future(worker.process.wait())
        await asyncio.wait({worker.ready, exited}, return_when=asyncio.FIRST_COMPLETED)
        exited.cancel()
        worker.served = await worker.ready  # the pipe ends when the worker exits
        if worker.served is None:
            await worker.process.wait()
            self._workers.remove(worker)
        return worker

    async def _spawn(self, expect: Iterable[str]) -> _Worker:
        """A worker process on standby: Python and tghost imported, waiting to be told to go
        before it imports the plugins (so a reload costs their import, not the interpreter's start)."""
        read_fd, write_fd = os.pipe()
        env = {**os.environ, WORKER_ENV: str(write_fd), EXPECT_ENV: json.dumps(sorted(expect)),
               "TGHOST_HOST_ID": self.host_id or ""}
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tghost", *self.argv, env=env, stdin=subprocess.PIPE, pass_fds=(write_fd,),
                start_new_session=True)  # a terminal's Ctrl-C reaches it once, through this supervisor
        finally:
            os.close(write_fd)
        return _Worker(process, asyncio.ensure_future(asyncio.to_thread(_read_ready, read_fd)), sorted(expect))

    async def _reload(self, worker: _Worker, changes: list[str]) -> _Worker:
        """Start the successor; if it serves, the old worker hands over to it, else it serves on."""
        log.info("reload: %s changed; starting a new worker", ", ".join(changes))
        successor = await self._start(worker.served["plugins"] if worker.served else [])
        if successor.served is None:
            code = successor.process.returncode
            worker.started = successor.started  # the saves until then are tried: wait for the next one
            if self._stopping.is_set():
                return worker
            log.error("reload: the new worker did not start (%s); the previous one serves on. Waiting for the next "
                      "change", "a plugin no longer loads" if code == STALE_EXIT else describe_exit(code))
            return worker
        await worker.hand_over(successor.served["services"])
        self._retiring.add(asyncio.ensure_future(self._retire(worker)))
        log.info("reload: serving %s", _versions(successor.served["plugins"]) or "no plugins")
        return successor

    async def _retire(self, worker: _Worker) -> None:
        code = await worker.process.wait()
        self._workers.remove(worker)
        if code:
            log.warning("reload: the previous worker stopped with %s", describe_exit(code))

    async def _next_change(self, worker: _Worker) -> list[str] | None:
        """The changed files (or plugins) that call for a reload; ``None`` when the worker exited or a signal came."""
        watching = asyncio.ensure_future(self._watch(worker))
        ended = {asyncio.ensure_future(worker.process.wait()), asyncio.ensure_future(self._stopping.wait())}
        done, _ = await asyncio.wait({watching, *ended}, return_when=asyncio.FIRST_COMPLETED)
        for task in ended:
            task.cancel()
        if watching in done:
            return watching.result()
        await cancel_and_wait(watching)
        if not self._stopping.is_set():
            log.error("reload: the worker stopped by itself (%s)", describe_exit(worker.process.returncode))
        return None

    async def _watch(self, worker: _Worker) -> list[str]:
        """Wait for a change of a served plugin's source, or of the installed plugins."""
        stop = asyncio.Event()
        served = (worker.served or {}).get("plugins", {})
        packages, modules = _plugin_source()
        changes: asyncio.Queue[list[str]] = asyncio.Queue()
        watched = ((packages, True, _source_changes),
                   ({*_site_dirs(), *(m.parent for m in modules)}, False,
                    lambda batch: [p for _, p in batch if Path(p) in modules] + _plugin_changes(batch, served)))
        watches = [asyncio.ensure_future(self._feed(changes, stop, dirs, recursive, accept))
                   for dirs, recursive, accept in watched]
        try:
            await asyncio.sleep(SETTLE)  # the watches are set up: a save before then is found by its time
            edited = _edited_since(worker.started, packages, modules)
            return edited or await changes.get()
        finally:
            stop.set()
            await asyncio.gather(*watches, return_exceptions=True)

    @staticmethod
    async def _feed(changes: asyncio.Queue[list[str]], stop: asyncio.Event, dirs: Collection[Path], recursive: bool,
                    accept: Any) -> None:
        if not dirs:
            return
        async for batch in watchfiles.awatch(*dirs, recursive=recursive, stop_event=stop, debounce=DEBOUNCE_MS,
                                             step=50, rust_timeout=500, yield_on_timeout=False):
            found = await asyncio.to_thread(accept, batch)
            if found:
                changes.put_nowait(found)


def _read_ready(fd: int) -> dict[str, Any] | None:
    """The worker's ready line (``None``: it closed the pipe first, e.g. it exited)."""
    with open(fd, encoding="utf-8") as ready:
        line = ready.readline()
    try:
        served = json.loads(line)
    except ValueError:
        return None
    return served if isinstance(served, dict) else None


def _source_changes(batch: set[tuple[watchfiles.Change, str]]) -> list[str]:
    return sorted({path for _, path in batch if path.endswith(".py")})


def _plugin_changes(batch: set[tuple[watchfiles.Change, str]], served: dict[str, str | None]) -> list[str]:
    """After an install or uninstall in ``batch``: the plugins installed, removed or at another
    version than the worker serves, as ``plugin NAME VERSION``."""
    if not any(path.endswith(_INSTALLED) for _, path in batch):
        return []
    now = {name: ep.dist.version if ep.dist is not None else None for name, ep in installed_plugins().items()}
    return [f"plugin {name} {now.get(name) or 'removed'}" for name in sorted(set(now) | set(served))
            if now.get(name) != served.get(name) and (name in served or name in now)]


#: What an install or uninstall adds or removes in a site-packages directory.
_INSTALLED = (".dist-info", ".pth", ".egg-link")


def _versions(plugins: dict[str, str | None]) -> str:
    return ", ".join(f"{name} {version or '?'}" for name, version in sorted(plugins.items()))


def _plugin_source() -> tuple[set[Path], set[Path]]:
    """Where the installed plugins' code is (found, never imported): the directories of their
    top-level packages, and the files of those that are a lone module."""
    packages: set[Path] = set()
    modules: set[Path] = set()
    for ep in installed_plugins().values():
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(ep.module.split(".")[0])
            if spec is not None and spec.submodule_search_locations:
                packages.update(Path(location) for location in spec.submodule_search_locations)
            elif spec is not None and spec.origin:
                modules.add(Path(spec.origin))
    return {p.resolve() for p in packages if p.is_dir()}, {m.resolve() for m in modules}


def _edited_since(started: float, packages: Iterable[Path], modules: Iterable[Path]) -> list[str]:
    """The plugin source files saved since a worker started (before its file watches were set up)."""
    files = [*(path for package in packages for path in package.rglob("*.py")), *modules]
    return sorted(str(path) for path in files if _mtime(path) > started)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _site_dirs() -> list[Path]:
    """The directories on ``sys.path`` (site-packages, ``PYTHONPATH``), watched on their own, not
    their sub-directories: where installs add and remove ``.dist-info`` and ``.pth`` files."""
    return sorted({Path(entry).resolve() for entry in sys.path if entry and os.path.isdir(entry)})
