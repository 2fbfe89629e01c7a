"""executors.thread: plugin code in the host process. A plain ``invoke`` (and each step of a plain
generator) runs in the service's own worker threads; an ``async`` one on the event loop.

Fast, and no isolation: Python cannot stop a thread, so a call that never returns keeps its
thread. Those stuck threads are counted, and a call none can start is answered ``overloaded``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tghost.author.service import ToolError, ToolService, invoke
from tghost.protocol import wire
from tghost.serving.executors.base import THREAD, Call, Executor, Outcome, WorkerStats

__all__ = ["Job", "ThreadExecutor"]

_DONE = object()


def _next_chunk(chunks: Iterator[Any]) -> Any:
    return next(chunks, _DONE)


@dataclass(eq=False)
class Job:
    """One piece of plugin code handed to a thread (:meth:`ThreadExecutor.submit`).

    ``future`` holds its result; ``abandoned`` once its caller stopped waiting (:meth:`ThreadExecutor.abandon`).
    """

    future: Future[Any] = field(init=False, repr=False)
    finished: bool = False
    abandoned: bool = False


class ThreadExecutor(Executor):
    """Runs a service's calls in this process: ``max_workers`` threads, started as needed.

    ``stuck`` counts threads still running plugin code whose call was cancelled (timed out):
    they are not free until the plugin returns. When every thread is taken that way, a call is
    answered ``overloaded`` at once, saying so, instead of waiting for a thread that never comes.

    :meth:`submit` and :meth:`abandon` are the synchronous interface, safe from any thread (the
    thread lane, :mod:`tghost.serving.lane`, uses them); :meth:`run` is the awaitable one.
    """

    isolation = THREAD

    def __init__(self, service: ToolService, service_id: str, max_workers: int) -> None:
        super().__init__(service_id, max_workers)
        self.service = service
        self._blocking = service.runs_in_thread
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix=f"tghost-{service_id}")
        self._lock = threading.Lock()
        self._running = 0  # threads running plugin code now, stuck ones included
        self._stuck = 0

    async def run(self, call: Call) -> Outcome:
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
        """The caller of ``job`` stopped waiting (its timeout, a shutdown): a job not started yet
        never starts, and one running is counted stuck until the plugin returns."""
        with self._lock:
            if not job.future.cancel() and not job.finished and not job.abandoned:
                job.abandoned = True
                self._stuck += 1

    def starved(self) -> str | None:
        """Why no call can start now (every thread stuck in a call that timed out), or ``None``."""
        if self._stuck < self.max_workers:
            return None
        return (f"service {self.service_id!r} could not start the call: all {self.max_workers} of its worker "
                f"threads are taken, {self._stuck} of them stuck in calls that timed out (Python cannot stop "
                "a thread; they free when the plugin returns). Retry later; the host's operator can serve it "
                "with --isolation process to have such calls killed")

    def _run(self, job: Job, fn: Callable[..., Any], *args: Any) -> Any:
        with self._lock:
            self._running += 1
        try:
            return fn(*args)
        finally:
            with self._lock:
                self._running -= 1
                job.finished = True
                if job.abandoned:
                    self._stuck -= 1

    def stats(self) -> WorkerStats:
        with self._lock:
            running, stuck = self._running, self._stuck
        return WorkerStats(THREAD, self.max_workers, workers=len(self._pool._threads), busy=running - stuck,
                           stuck=stuck)

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
