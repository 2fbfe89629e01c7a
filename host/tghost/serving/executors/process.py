"""executors.process: plugin code in worker processes, one call at a time each, up to the service's
max concurrency. A worker whose call outlives its caller is terminated, then killed; one that dies
(signal, ``os._exit``, OOM) fails only its own call; both are replaced at once, as are workers
recycled after ``max_calls`` calls or above ``max_memory``.

Host side only: never runs plugin code (:mod:`.child` does, in the child). Workers start with
``forkserver``: ``fork`` is unsafe once the Pulsar client's threads run.

Why not pebble or loky here: a call is a conversation, not a job. A generator streams chunks while
it runs (pebble and loky return one result per task); a crash must fail one call at once (loky
breaks the whole pool, pebble notices within its 0.1 s poll); recycling on memory needs the host
to own a worker between calls; and one pipe per worker, read by the event loop, costs about 0.1 ms
a call where pebble's three thread hops cost 0.35 ms. The import probe (:mod:`tghost.discovery.probe`), a job
per plugin, does use pebble.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
from collections import deque
from collections.abc import AsyncGenerator, Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from tghost.author.service import Call, ToolError
from tghost.protocol import wire
from tghost.serving.executors.base import (
    CANCELLED,
    CRASH,
    MEMORY,
    PROCESS,
    RECYCLED,
    RESTART_REASONS,
    TIMEOUT,
    Executor,
    Outcome,
    WorkerLimits,
    WorkerRaised,
    WorkerStats,
)
from tghost.serving.executors.child import EntryPointSource, ObjectSource, run_worker
from tghost.system import tracing
from tghost.system.processes import CONTEXT, describe_exit

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["ProcessExecutor"]

log = logging.getLogger(__name__)

#: Seconds a terminated worker gets to exit before it is killed.
KILL_AFTER = 1.0
#: Seconds a worker started for the pool (not for a waiting call) may take to load its service.
LOAD_TIMEOUT = 120.0


def _abandoned(call: Call) -> str:
    """Why a worker still in ``call`` is stopped: its caller cancelled it, or it timed out."""
    return CANCELLED if call.cancelled is not None and call.cancelled.is_set() else TIMEOUT


def _error_type(exc: BaseException) -> str:
    """The ``error.type`` of a worker span that ended with ``exc``."""
    if isinstance(exc, ToolError):
        return exc.error_type
    if isinstance(exc, WorkerRaised):
        return wire.TOOL_SERVICE_ERROR
    return "cancelled" if isinstance(exc, asyncio.CancelledError | GeneratorExit) else type(exc).__name__


class _Worker:
    """One worker process and the host's end of its pipe.

    The event loop watches the pipe from the first wait to the worker's end, not once per call
    (two ``epoll_ctl`` system calls a call saved). While nothing waits, a readable pipe can only
    be the worker's end (EOF, or a message after its call was given up): the loop stops
    watching then, so it never spins on it."""

    def __init__(self, process: BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.calls = 0
        self._loop: asyncio.AbstractEventLoop | None = None  # watching the pipe, when not None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid

    async def receive(self, report: Callable[[wire.Progress], None] | None = None) -> Any:
        """The next message, read when the pipe is readable (the event loop never blocks on it);
        the call's progress updates on the way are handed to ``report`` (dropped without one).

        Raises:
            EOFError: the worker died (its end of the pipe closed).
        """
        while True:
            while not self.conn.poll():
                await self._readable()
            message = self.conn.recv()
            if message[0] != "progress":
                return message
            if report is not None:
                report(wire.Progress(*message[1]))

    async def _readable(self) -> None:
        """Wait until the pipe is readable."""
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        if self._loop is None:
            loop.add_reader(self.conn.fileno(), self._on_readable)
            self._loop = loop
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _on_readable(self) -> None:
        if self._waiter is None:
            self._unwatch()  # nobody waits: see the class doc
        elif not self._waiter.done():
            self._waiter.set_result(None)

    def _unwatch(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(Exception):  # the loop or the pipe is already closed
                self._loop.remove_reader(self.conn.fileno())
            self._loop = None

    async def exit_code(self, timeout: float = KILL_AFTER) -> int | None:
        """Wait up to ``timeout`` seconds for the process to end; its exit code (negative: signal)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.process.exitcode is None and loop.time() < deadline:
            await asyncio.sleep(0.005)
        return self.process.exitcode

    async def stop(self, kill: bool) -> None:
        """End the process: ask it to (its pipe says ``None``), or terminate it; kill it if it lingers."""
        self._unwatch()
        with contextlib.suppress(OSError):
            if kill:
                self.process.terminate()
            else:
                self.conn.send(None)
        if await self.exit_code() is None:
            self.process.kill()
            await self.exit_code()
        self.conn.close()
        with contextlib.suppress(ValueError):
            self.process.close()


class ProcessExecutor(Executor):
    """Runs a service's calls in worker processes: one warm at start, more as concurrent calls
    need them, at most ``max_workers``; each replaced at once when it ends (see the module doc).

    A crashed call is answered ``tool-service-error`` naming the exit code or signal; a cancelled
    one (timeout) frees its slot at once while its worker is terminated in the background.
    """

    isolation = PROCESS

    def __init__(self, service_id: str, source: EntryPointSource | ObjectSource, max_workers: int,
                 limits: WorkerLimits) -> None:
        super().__init__(service_id, max_workers)
        self.source = source
        self.limits = limits
        self.restarts = dict.fromkeys(RESTART_REASONS, 0)
        self._idle: deque[_Worker] = deque()
        self._waiting: deque[asyncio.Future[_Worker | None]] = deque()
        self._live = 0  # workers starting, idle or busy
        self._starting = 0  # workers started for the pool, not ready yet
        self._busy = 0
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Start the first worker and wait until it has loaded the service (at most ``LOAD_TIMEOUT``
        seconds), so the service is ready when the host says it serves; a failure is logged, and
        each call then tries a worker of its own."""
        await self._grow()

    async def run(self, call: Call, span: Span | None = None) -> Outcome:
        try:
            # plain pickle: a call is plain data (multiprocessing's pickler costs twice as much);
            # its cancel flag and progress line stay here (the worker is killed; its updates cross the pipe)
            request = pickle.dumps(call._replace(cancelled=None, report=None), pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise ToolError(f"the arguments cannot be sent to a worker process of service {self.service_id!r}: "
                            f"{type(exc).__name__}: {exc}", wire.TOOL_SERVICE_ERROR) from None
        worker = await self._take()
        traced = tracing.child("worker", span, **{"process.pid": worker.pid})
        self._busy += 1
        try:
            try:
                worker.conn.send_bytes(request)
                message = await worker.receive(call.report)
            except BaseException as exc:
                self._busy -= 1
                raise await self._lost(worker, exc, call) from None
            if message[0] == "stream":
                return self._stream(worker, traced, call)
            self._busy -= 1
            outcome = self._finish(worker, message)
        except BaseException as exc:
            tracing.end(traced, _error_type(exc))
            raise
        tracing.end(traced)
        return outcome

    async def _stream(self, worker: _Worker, traced: Span | None, call: Call) -> AsyncGenerator[str, None]:
        finished = False
        error: str | None = "cancelled"
        try:
            while True:
                try:
                    message = await worker.receive(call.report)
                except BaseException as exc:
                    finished = True
                    raise await self._lost(worker, exc, call) from None
                if message[0] != "chunk":
                    finished = True
                    self._finish(worker, message)
                    error = None
                    return
                yield message[1]
        except BaseException as exc:
            error = _error_type(exc)
            raise
        finally:
            self._busy -= 1
            tracing.end(traced, error)
            if not finished:  # the reader stopped early (cancelled): the worker is still in the call
                self._retire(worker, _abandoned(call), kill=True)

    def _finish(self, worker: _Worker, message: tuple[Any, ...]) -> str:
        """Take a call's last message: hand the worker back (or retire it); the observation or the error."""
        kind = message[0]
        if kind == "oom":
            self._retire(worker, MEMORY)
            raise ToolError(message[1], wire.TOOL_SERVICE_ERROR)
        worker.calls += 1
        self._give_back(worker, rss=message[-1])
        if kind == "error":
            raise ToolError(message[2], message[1])
        if kind == "raised":
            _, name, text, remote_traceback, _ = message
            raise WorkerRaised(name, text, remote_traceback, worker.pid)
        return "" if kind == "end" else str(message[1])

    async def _lost(self, worker: _Worker, exc: BaseException, call: Call) -> BaseException:
        """The call's worker is gone: cancelled (terminate it), or dead (crash). What to raise."""
        if not isinstance(exc, (EOFError, OSError)):
            self._retire(worker, _abandoned(call), kill=True)
            return exc
        code = await worker.exit_code()
        self._retire(worker, CRASH, kill=code is None)
        log.error("service %s: worker process %s died during a call (%s); a new one is starting",
                  self.service_id, worker.pid, describe_exit(code))
        return ToolError(f"the worker process of service {self.service_id!r} died during the call "
                         f"({describe_exit(code)}); a new worker was started", wire.TOOL_SERVICE_ERROR)

    # --- the pool -------------------------------------------------------------------------------

    async def _take(self) -> _Worker:
        """An idle worker, a new one (below ``max_workers``), or the next one handed back."""
        while True:
            if self._closed:
                raise ToolError(f"service {self.service_id!r} is shutting down", wire.UNAVAILABLE)
            if self._idle:
                worker = self._idle.popleft()
                if not worker.conn.poll():  # an idle worker says nothing: a readable pipe is its end (EOF)
                    return worker
                log.error("service %s: idle worker process %s had died (%s); a new one is starting",
                          self.service_id, worker.pid, describe_exit(await worker.exit_code()))
                self._retire(worker, CRASH)
                continue
            if self._live < self.max_workers and self._starting <= len(self._waiting):
                self._live += 1
                try:
                    return await self._spawn()
                except BaseException:
                    self._live -= 1
                    raise
            waiter: asyncio.Future[_Worker | None] = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            handed = await waiter
            if handed is not None:
                return handed

    def _give_back(self, worker: _Worker, rss: int | None = None) -> None:
        if self._closed:
            self._background(worker.stop(kill=False))
        elif self.limits.max_calls and worker.calls >= self.limits.max_calls:
            self._retire(worker, RECYCLED)
        elif self.limits.max_memory and rss is not None and rss > self.limits.max_memory * 1024 * 1024:
            log.info("service %s: worker process %s uses %d MiB, over --max-worker-memory %d MiB: replaced",
                     self.service_id, worker.pid, rss // (1024 * 1024), self.limits.max_memory)
            self._retire(worker, MEMORY)
        else:
            self._hand_over(worker)

    def _hand_over(self, worker: _Worker | None) -> None:
        """Give a worker to the first call waiting for one (``None``: wake it to try again), or keep it idle."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(worker)
                return
        if worker is not None:
            self._idle.append(worker)

    def _retire(self, worker: _Worker, reason: str, kill: bool = False) -> None:
        """Stop a worker in the background (kill: terminate, then kill), count it, start its replacement."""
        self._live -= 1
        self._background(worker.stop(kill))
        if not self._closed:
            self.restarts[reason] += 1
            self._replace()

    def _replace(self) -> None:
        """Start one worker in the background, for the pool."""
        self._background(self._grow())

    async def _grow(self) -> None:
        """Start one worker for the pool (unless it is full), and hand it over once ready."""
        if self._closed or self._live >= self.max_workers:
            return
        self._live += 1
        self._starting += 1
        try:
            worker = await asyncio.wait_for(self._spawn(), LOAD_TIMEOUT)
        except Exception as exc:
            self._live -= 1
            log.error("service %s: could not start a worker process: %s", self.service_id,
                      exc if str(exc) else f"it did not load the service within {LOAD_TIMEOUT:g}s")
            self._hand_over(None)
            return
        finally:
            self._starting -= 1
        if self._closed:
            await worker.stop(kill=False)
        else:
            self._hand_over(worker)

    async def _spawn(self) -> _Worker:
        """Start a worker process and wait until it has loaded the service.

        Raises:
            ToolError: the worker could not load the service, or died while loading it.
        """
        parent, child_end = CONTEXT.Pipe()
        process = CONTEXT.Process(
            target=run_worker, args=(child_end, self.source, self.limits.max_memory),
            name=f"tghost-worker-{self.service_id}")
        await asyncio.to_thread(process.start)
        child_end.close()
        worker = _Worker(process, parent)
        try:
            message = await worker.receive()
        except (EOFError, OSError):
            code = await worker.exit_code()
            await worker.stop(kill=True)
            raise ToolError(f"the worker process of service {self.service_id!r} died while loading the plugin "
                            f"({describe_exit(code)})", wire.TOOL_SERVICE_ERROR) from None
        except BaseException:
            await asyncio.shield(worker.stop(kill=True))
            raise
        if message[0] != "ready":
            await worker.stop(kill=True)
            raise ToolError(f"service {self.service_id!r} could not be loaded in a worker process: {message[1]}",
                            wire.TOOL_SERVICE_ERROR)
        return worker

    def _background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stats(self) -> WorkerStats:
        return WorkerStats(PROCESS, self.max_workers, workers=self._live, busy=self._busy,
                           restarts=dict(self.restarts))

    async def close(self) -> None:
        """Stop every worker (idle ones are asked, busy ones after their calls are terminated)."""
        self._closed = True
        while self._idle:
            self._background(self._idle.popleft().stop(kill=False))
        self._hand_over(None)
        for waiter in self._waiting:
            if not waiter.done():
                waiter.set_result(None)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=KILL_AFTER * 3)
