"""executors.thread: plugin code in the host process. A plain ``invoke`` (and each step of a plain
generator) runs in the service's own worker threads; an ``async`` one on the event loop.

Fast, and no isolation: Python cannot stop a thread, so a call whose caller was answered (its
timeout, a cancel, the end of a shutdown's grace) while the plugin runs on keeps its thread. Its
slot is freed at once all the same: a service runs at most its max concurrency of calls, on
twice as many threads. Stuck threads are counted, and once all of a service's threads are
stuck, a call is answered ``overloaded``, saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tghost.author.service import Call, ToolError, ToolService, invoke
from tghost.protocol import wire
from tghost.serving.executors.base import THREAD, Executor, Outcome, WorkerStats

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["Job", "ThreadExecutor"]

log = logging.getLogger(__name__)

_DONE = object()


def _next_chunk(chunks: Iterator[Any]) -> Any:
    return next(chunks, _DONE)


@dataclass(eq=False)
class Job:
    """One piece of plugin code handed to a thread (:meth:`ThreadExecutor.submit`).

    ``future`` holds its result; ``abandoned`` once its caller stopped waiting (:meth:`ThreadExecutor.abandon`).
    """

    future: Future[Any] = field(init=False, repr=False)
    started: bool = False
    finished: bool = False
    abandoned: bool = False


class ThreadExecutor(Executor):
    """Runs a service's calls in this process: at most ``max_workers`` at once, on threads
    started as needed.

    A call abandoned while its plugin code runs (:meth:`abandon`) gives its slot back at once; its
    thread is counted ``stuck`` until the plugin returns. The service has ``2 * max_workers``
    threads, so it keeps its full concurrency with up to ``max_workers`` of them stuck; once all
    are stuck, a call is answered ``overloaded`` at once, saying so (:meth:`starved`), instead of
    waiting for a thread that may never come.

    :meth:`submit` and :meth:`abandon` are the synchronous interface, safe from any thread (the
    thread lane, :mod:`tghost.serving.lane`, uses them); :meth:`run` is the awaitable one.
    """

    isolation = THREAD

    def __init__(self, service: ToolService, service_id: str, max_workers: int) -> None:
        super().__init__(service_id, max_workers)
        self.service = service
        self._blocking = service.runs_in_thread
        self._pool = ThreadPoolExecutor(2 * max_workers, thread_name_prefix=f"tghost-{service_id}")
        self._slots = threading.Semaphore(max_workers)  # taken by each call running and not abandoned
        self._lock = threading.Lock()
        self._running = 0  # threads running plugin code now, stuck ones included
        self._stuck = 0

    async def run(self, call: Call, span: Span | None = None) -> Outcome:
        if self._blocking:
            result = await self._in_thread(invoke, self.service, call)
        else:
            result = invoke(self.service, call)
        if inspect.isawaitable(result):
            result = await result
        if inspect.isasyncgen(result) or inspect.isgenerator(result):
            return self._chunks(result)
        return wire.observation(result)

    async def _chunks(self, result: Any) -> AsyncGenerator[str, None]:
        if inspect.isasyncgen(result):
            async with contextlib.aclosing(result):
                async for chunk in result:
                    yield wire.observation(chunk)
            return
        try:
            while (chunk := await self._in_thread(_next_chunk, result)) is not _DONE:
                yield wire.observation(chunk)
        finally:
            with contextlib.suppress(ValueError):  # "generator already executing" in a stuck thread
                result.close()

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in one of the service's threads; a cancelled call leaves it stuck there.

        Raises:
            ToolError: ``overloaded`` when every thread is stuck (:meth:`starved`).
        """
        if (starved := self.starved()) is not None:
            raise ToolError(starved, wire.OVERLOADED)
        job = self.submit(fn, *args)
        try:
            return await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            self.abandon(job)
            raise

    def submit(self, fn: Callable[..., Any], *args: Any) -> Job:
        """Run ``fn(*args)`` on one of the service's threads as soon as one is free (queued
        until then); returns at once, from any thread. ``job.future`` gets the result."""
        job = Job()
        job.future = self._pool.submit(self._run, job, fn, *args)
        return job

    def abandon(self, job: Job) -> None:
        """The caller of ``job`` stopped waiting (its timeout, a cancel, a shutdown): a job not
        started yet never starts; one running gives its slot back at once and is counted stuck
        until the plugin returns."""
        with self._lock:
            if job.future.cancel() or job.finished or job.abandoned:
                return
            job.abandoned = True
            if not job.started:
                return
            self._stuck += 1
            self._slots.release()
            stuck = self._stuck
        log.warning("service %s: a call's thread runs on in plugin code after its caller was answered (a timeout "
                    "or a cancel); %d thread(s) stuck of %d. A long plain def should return when ctx.cancelled is "
                    "set; --isolation process kills such calls", self.service_id, stuck, 2 * self.max_workers)

    def starved(self) -> str | None:
        """Why no call can start now (every one of the service's threads is stuck), or ``None``."""
        if self._stuck < 2 * self.max_workers:
            return None
        return (f"service {self.service_id!r} could not start the call: all {self._stuck} of its threads (twice its "
                "max concurrency) are stuck in calls that timed out or were cancelled. Python cannot stop a thread; "
                "they free when the plugin returns. Retry later; the host's operator can serve it with "
                "--isolation process to have such calls killed")

    def _run(self, job: Job, fn: Callable[..., Any], *args: Any) -> Any:
        self._slots.acquire()
        with self._lock:
            if job.abandoned:  # while it waited for a slot
                self._slots.release()
                return None
            job.started = True
            self._running += 1
        try:
            return fn(*args)
        finally:
            with self._lock:
                self._running -= 1
                job.finished = True
                if job.abandoned:
                    self._stuck -= 1
                else:
                    self._slots.release()

    def stats(self) -> WorkerStats:
        with self._lock:
            running, stuck = self._running, self._stuck
        return WorkerStats(THREAD, self.max_workers, workers=len(self._pool._threads), busy=running - stuck,
                           stuck=stuck)

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
