"""child: the main loop of one worker process (process isolation). It loads its
service (importing the plugin by entry point), then runs one call at a time from its pipe.

Runs in the child only, and never outlives the host (Linux: the
parent-death signal; elsewhere: the end of its pipe).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import pickle
import resource
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint
from multiprocessing.connection import Connection
from typing import Any

from tghost.author.service import Call, ToolError, ToolService, invoke, observation
from tghost.protocol import wire
from tghost.system.processes import die_with_parent

__all__ = ["EntryPointSource", "ObjectSource", "rss", "run_worker"]

#: The hard cap on a worker's data segment is this many times ``--max-worker-memory``: room for
#: a worker above the bound to finish its call and be replaced, before calls fail.
HARD_MEMORY_FACTOR = 2


@dataclass(frozen=True)
class EntryPointSource:
    """Load a service as the host did: import the plugin's entry point and call its hooks, with
    the host's ``config`` (its TOML config file as a dict; the plugins a plugin adds follow it)."""

    name: str
    value: str
    service_id: str
    config: dict[str, Any] = field(default_factory=dict)

    def load(self) -> tuple[ToolService, Callable[[], None]]:
        """The service, freshly registered by the plugin in this process, and what to call when the
        worker ends (the plugin's ``tghost_shutdown`` hooks).

        Raises:
            LookupError: the plugin failed, or did not register the service here.
        """
        from tghost.discovery.discover import ENTRY_POINT_GROUP, PluginSelection, discover

        ep = EntryPoint(self.name, self.value, ENTRY_POINT_GROUP)
        catalog = discover([ep], strict=False, selection=PluginSelection(), config=self.config)
        if self.service_id not in catalog.services:
            catalog.shutdown()
            errors = "; ".join(e for report in catalog.plugins for e in report.errors)
            raise LookupError(f"plugin {self.name!r} did not register service {self.service_id!r} in the worker "
                              f"process{': ' + errors if errors else ''}")
        return catalog.services[self.service_id], catalog.shutdown


@dataclass(frozen=True)
class ObjectSource:
    """A service registered in-process (``catalog_of``, ``LocalHost``), sent to the worker pickled.
    Its class, or its ``@tool`` function, must be importable by module and name."""

    service: ToolService

    def load(self) -> tuple[ToolService, Callable[[], None]]:
        """The unpickled service (nothing to call at the end)."""
        return self.service, _nothing


def _nothing() -> None:
    pass


def rss() -> int:
    """This process's resident memory now, bytes (peak resident memory where /proc is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def _unmeasured() -> None:
    return None


def _die_with_parent() -> None:
    """Linux: be killed when the forkserver that forked this worker ends, which it does when the
    host ends, even by SIGKILL. Elsewhere an idle worker ends when the host's end of its pipe closes.

    The forkserver ends when the host's "alive" pipe closes, but it hands every child a copy of
    that pipe (so the child could use it too): a worker busy in a call would keep the forkserver,
    and so itself, alive for ever. The copy is closed here.
    """
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    alive = getattr(server, "_forkserver_alive_fd", None)
    if server is not None and alive is not None:
        with contextlib.suppress(OSError):
            os.close(alive)
        server._forkserver_alive_fd = None
    die_with_parent(signal.SIGKILL)


def _cap_memory(max_memory: int) -> None:
    if max_memory:
        cap = HARD_MEMORY_FACTOR * max_memory * 1024 * 1024
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))


def run_worker(conn: Connection, source: EntryPointSource | ObjectSource, max_memory: int) -> None:
    """Load the service, say ``("ready",)`` (or ``("failed", why)``), then serve calls until the pipe
    closes or says ``None``. Per call, the host gets (see :class:`tghost.serving.executors.process.ProcessExecutor`):
    ``("progress", (done, total, message))`` for each progress update, then
    ``("result", observation, rss)``; or ``("stream",)``, ``("chunk", observation)`` per chunk and
    ``("end", rss)``; or ``("error", error_type, message, rss)`` (a ``ToolError``), ``("raised",
    exception class name, message, traceback, rss)`` (any other exception); or ``("oom", message)``
    and the worker exits (``rss``: bytes after the call, ``None`` without ``max_memory``)."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; the host decides
    _cap_memory(max_memory)
    try:
        service, shutdown = source.load()
    except BaseException as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready",))
    runner = _Runner(service, conn, bool(max_memory))
    try:
        while True:
            try:
                call = conn.recv()
            except (EOFError, OSError):
                return
            if call is None or not runner.run(call):
                return
    finally:
        shutdown()


class _Runner:
    def __init__(self, service: ToolService, conn: Connection, measure: bool) -> None:
        self.service = service
        self.conn = conn
        self.rss = rss if measure else _unmeasured
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    def run(self, call: Call) -> bool:
        """Serve one call; False when this worker must end (it ran out of memory)."""
        try:
            self._invoke(call._replace(report=self._report))
        except MemoryError:
            self._say(("oom", "MemoryError: the call needed more memory than this worker may have "
                                   "(tghost run --max-worker-memory); the worker was replaced"))
            return False
        except ToolError as exc:
            self._say(("error", exc.error_type, str(exc), self.rss()))
        except Exception as exc:
            self._say(("raised", type(exc).__name__, str(exc), traceback.format_exc(), self.rss()))
        return True

    def _say(self, message: tuple[Any, ...]) -> None:
        """Send ``message`` to the host: plain ``pickle`` of plain data (multiprocessing's own
        pickler copies its dispatch table for every message; the host's ``recv`` reads both)."""
        self.conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))

    def _report(self, update: wire.Progress) -> None:
        """A progress update of the call, to the host (which sends it on if the caller asked)."""
        self._say(("progress", tuple(update)))

    def _invoke(self, call: Call) -> None:
        result = invoke(self.service, call)
        if inspect.isawaitable(result):
            result = self.loop.run_until_complete(result)
        if inspect.isasyncgen(result):
            self._say(("stream",))
            try:
                while True:
                    try:
                        chunk = self.loop.run_until_complete(result.__anext__())
                    except StopAsyncIteration:
                        break
                    self._say(("chunk", observation(self.service.id, chunk)))
            finally:
                self.loop.run_until_complete(result.aclose())
            self._say(("end", self.rss()))
        elif inspect.isgenerator(result):
            self._say(("stream",))
            with contextlib.closing(result):
                for chunk in result:
                    self._say(("chunk", observation(self.service.id, chunk)))
            self._say(("end", self.rss()))
        else:
            self._say(("result", observation(self.service.id, result), self.rss()))
