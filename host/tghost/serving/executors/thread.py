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
import queue
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from tghost.author.service import Call, ToolError, ToolService, invoke, observation
from tghost.protocol import wire
from tghost.serving.executors.base import THREAD, Executor, Outcome, WorkerStats

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["Job", "ThreadExecutor"]

log = logging.getLogger(__name__)

#: Seconds after its caller was answered (a timeout, a cancel) that a call still in plugin code
#: is logged as stuck: one that watches ``ctx.cancelled`` returns well within it.
STUCK_WARNING_AFTER = 1.0

_DONE = object()


def _next_chunk(chunks: Iterator[Any]) -> Any:
    return next(chunks, _DONE)


class Job:
    """One piece of plugin code handed to a thread (:meth:`ThreadExecutor.submit`): ``fn(*args)``.

    ``future`` gets its result when the submitter asked for one; ``abandoned`` once its caller
    stopped waiting (:meth:`ThreadExecutor.abandon`).
    """

    __slots__ = ("abandoned", "args", "finished", "fn", "future", "started")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], future: Future[Any] | None) -> None:
        self.fn, self.args, self.future = fn, args, future
        self.started = self.finished = self.abandoned = False


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

    The threads are its own, fed by one ``SimpleQueue`` (``concurrent.futures``' pool costs a
    ``Future``, a work item and a semaphore per call: docs/internals/performance.md §14). Only threads that
    serve the queue take calls, and at most ``max_workers`` do: a stuck thread stops serving,
    and a new one takes its place while the service has fewer than ``2 * max_workers``.
    """

    isolation = THREAD

    def __init__(self, service: ToolService, service_id: str, max_workers: int) -> None:
        super().__init__(service_id, max_workers)
        self.service = service
        self._blocking = service.runs_in_thread
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._serving = 0  # threads that take jobs from the queue (never a stuck one)
        self._idle = 0  # of those, waiting for a job no submit has claimed yet
        self._running = 0  # threads running plugin code now, stuck ones included
        self._stuck = 0
        self._started = 0  # threads started so far (their names)
        self._closed = False

    async def run(self, call: Call, span: Span | None = None) -> Outcome:
        if self._blocking:
            result = await self._in_thread(invoke, self.service, call)
        else:
            result = invoke(self.service, call)
        if inspect.isawaitable(result):
            result = await result
        if inspect.isasyncgen(result) or inspect.isgenerator(result):
            return self._chunks(result)
        return observation(self.service_id, result)

    async def _chunks(self, result: Any) -> AsyncGenerator[str, None]:
        if inspect.isasyncgen(result):
            async with contextlib.aclosing(result):
                async for chunk in result:
                    yield observation(self.service_id, chunk)
            return
        try:
            while (chunk := await self._in_thread(_next_chunk, result)) is not _DONE:
                yield observation(self.service_id, chunk)
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
        job = self.submit(fn, *args, wanted=True)
        assert job.future is not None
        try:
            return await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            self.abandon(job)
            raise

    def submit(self, fn: Callable[..., Any], *args: Any, wanted: bool = False) -> Job:
        """Run ``fn(*args)`` on one of the service's threads as soon as one is free (queued
        until then); returns at once, from any thread. With ``wanted``, ``job.future`` gets the
        result (else ``fn`` deals with its own, and an exception it lets out is logged)."""
        job = Job(fn, args, Future() if wanted else None)
        with self._lock:
            if self._idle:
                self._idle -= 1  # that thread takes it
                grow = False
            else:
                grow = self._serving < self._room()
                self._serving += grow
        self._jobs.put(job)
        if grow:
            self._start_thread()
        return job

    def _room(self) -> int:
        """How many threads may serve the queue now (hold the lock)."""
        return min(self.max_workers, 2 * self.max_workers - self._stuck)

    def _start_thread(self) -> None:
        with self._lock:
            self._started += 1
            name = f"tghost-{self.service_id}_{self._started}"
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def _serve(self) -> None:
        """A thread's life: take jobs and run them, until the executor closes or this thread
        was stuck in one and another has taken its place meanwhile."""
        while (job := self._jobs.get()) is not None:
            with self._lock:
                # abandoned, or its future cancelled, while it waited; once running, its future
                # can no longer be cancelled, so the result always has a place to go
                if job.abandoned or (job.future is not None and not job.future.set_running_or_notify_cancel()):
                    self._idle += 1
                    continue
                job.started = True
                self._running += 1
            try:
                result = job.fn(*job.args)
            except BaseException as exc:
                if job.future is None:
                    log.exception("service %s: unhandled exception in a worker thread", self.service_id)
                else:
                    job.future.set_exception(exc)
            else:
                if job.future is not None:
                    job.future.set_result(result)
            if not self._after(job):
                return

    def _after(self, job: Job) -> bool:
        """A thread finished ``job``: whether it goes on serving the queue."""
        with self._lock:
            self._running -= 1
            job.finished = True
            if job.abandoned:  # it was stuck, and stopped serving then
                self._stuck -= 1
                if self._closed or self._serving >= self._room():
                    return False  # another thread took its place
                self._serving += 1
            self._idle += 1
            return True

    def abandon(self, job: Job) -> None:
        """The caller of ``job`` stopped waiting (its timeout, a cancel, a shutdown): a job not
        started yet never starts; one running gives its slot back at once and is counted stuck
        until the plugin returns."""
        with self._lock:
            if job.finished or job.abandoned:
                return
            job.abandoned = True
            if not job.started:
                return
            self._stuck += 1
            self._serving -= 1  # this thread serves no more until the plugin returns
            grow = self._serving < self._room() and not self._jobs.empty()
            self._serving += grow
        if grow:  # calls wait in the queue: a thread takes the stuck one's place now
            self._start_thread()
        warning = threading.Timer(STUCK_WARNING_AFTER, self._warn_stuck, (job,))
        warning.daemon = True
        warning.start()

    def hold(self, calls: int) -> None:
        """``calls`` (1) calls on a thread not the executor's own (the inline driver's receive
        thread) were left with their plugin at their caller's answer, or (-1) returned: counted
        running and stuck meanwhile, as the executor's own stuck threads are."""
        with self._lock:
            self._running += calls
            self._stuck += calls

    def _warn_stuck(self, job: Job) -> None:
        """:data:`STUCK_WARNING_AFTER` seconds after ``job`` was abandoned: a warning if it still
        runs (a plain def that watches ``ctx.cancelled`` has returned by then)."""
        with self._lock:
            if job.finished:
                return
            stuck = self._stuck
        log.warning("service %s: a call's thread still runs in plugin code %gs after its caller was answered (a "
                    "timeout or a cancel); %d thread(s) stuck of %d. A long plain def should return when "
                    "ctx.cancelled is set; --isolation process kills such calls", self.service_id,
                    STUCK_WARNING_AFTER, stuck, 2 * self.max_workers)

    def starved(self) -> str | None:
        """Why no call can start now (every one of the service's threads is stuck), or ``None``."""
        if self._stuck < 2 * self.max_workers:
            return None
        return (f"service {self.service_id!r} could not start the call: all {self._stuck} of its threads (twice its "
                "max concurrency) are stuck in calls that timed out or were cancelled. Python cannot stop a thread; "
                "they free when the plugin returns. Retry later; the host's operator can serve it with "
                "--isolation process to have such calls killed")

    def stats(self) -> WorkerStats:
        with self._lock:
            running, stuck, serving = self._running, self._stuck, self._serving
        return WorkerStats(THREAD, self.max_workers, workers=serving + stuck, busy=running - stuck, stuck=stuck)

    async def close(self) -> None:
        """Let the threads go: each ends after the job it runs (calls still queued never start)."""
        with self._lock:
            self._closed = True
            serving = self._serving
        while True:  # drop what waits: its callers are answered by the lane or were cancelled
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None and job.future is not None:
                job.future.cancel()
        for _ in range(serving):
            self._jobs.put(None)
