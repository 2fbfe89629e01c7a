"""lane: a service's requests served on threads alone, with no event-loop hop (docs/benchmarks.md §1).

For a service whose plain (blocking) ``invoke`` runs in the host's worker threads, on a
non-persistent request topic, the C++ listener thread admits each request and hands it straight
to a worker thread (:meth:`tghost.executors.thread.ThreadExecutor.submit`); the worker checks
it, invokes, sends the reply and acknowledges the request. That is a raw sync echo's path plus
one thread hop. The event loop sees only what is rare: a
shutdown's drain. Every other service, and a stopping one's new requests, take the loop path
(:class:`tghost.serve.ServiceWorker`).

The semantics are the loop path's, and so are the replies' texts:

- ``overloaded`` beyond ``max_concurrency + max_queue`` admitted requests, or when every
  worker thread is stuck in a call that timed out;
- ``timeout`` at the deadline, ``timeout`` seconds after ``invoke`` started (a watch thread;
  the plugin's thread is counted stuck until it returns);
- ``unavailable`` for calls that did not start when the service stops (:meth:`ThreadLane.stop`)
  and for those still running when its grace ends (:meth:`ThreadLane.cut_off`).

Exactly one last reply per request: whoever claims a call first (its worker thread, the
deadline, the shutdown) answers it, and a stream's chunks stop once it is claimed.
Never touches Pulsar: the owner sends (:class:`Owner`).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import threading
import time
from collections.abc import Coroutine
from concurrent import futures
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from . import hop, wire
from .service import ToolError, ToolService

if TYPE_CHECKING:
    from .executors import Call
    from .executors.thread import Job, ThreadExecutor
    from .serve import CallRecord

__all__ = ["Owner", "ThreadLane"]

log = logging.getLogger(__name__)

_DONE = object()


class Owner(Protocol):
    """What a lane needs from the service worker it serves for (:class:`tghost.serve.ServiceWorker`)."""

    service: ToolService
    timeout: float
    """Seconds a call may run."""
    capacity: int
    """Requests admitted at once: ``max_concurrency`` running plus ``max_queue`` waiting."""

    @property
    def stopping(self) -> bool:
        """Whether the service stopped taking new calls."""

    def check(self, record: CallRecord, message: Any) -> Call:
        """The call to make, once the request passes every check; raises :class:`ToolError`."""

    def send_chunk(self, record: CallRecord, payload: bytes) -> Future[bool]:
        """Send one chunk of a stream (not the last reply); the future is done (True: sent) once
        the broker has it."""

    def finish(self, record: CallRecord, message: Any, payload: bytes, started: float) -> None:
        """Send the last reply, then acknowledge ``message`` and tell the call listeners."""

    def refusal(self, error_type: str, started: bool = False) -> str:
        """The reply text of an ``overloaded``, ``timeout`` or ``unavailable`` answer."""


class _Call:
    """One request in the lane. ``lock`` orders its chunks before its last reply."""

    __slots__ = ("answered", "deadline", "job", "lock", "message", "record", "started")

    def __init__(self, record: CallRecord, message: Any) -> None:
        self.record = record
        self.message = message
        self.started = time.perf_counter()
        self.deadline = 0.0  # time.monotonic() seconds, once invoke starts
        self.job: Job | None = None
        self.answered = False
        self.lock = threading.Lock()


class ThreadLane:
    """Serves one thread-isolated service's requests on its worker threads (see the module).

    :meth:`take` is called on the C++ listener thread; :meth:`stop`, :meth:`idle`,
    :meth:`cut_off` and :meth:`close` on the event loop the lane was created on.
    """

    def __init__(self, owner: Owner, executor: ThreadExecutor, loop: asyncio.AbstractEventLoop) -> None:
        self._owner = owner
        self._executor = executor
        self._loop = loop
        self._lock = threading.Lock()
        self._waiting: dict[_Call, None] = {}  # admitted, not started
        self._running: dict[_Call, None] = {}  # started, in deadline order (one timeout for all)
        self._emptied: asyncio.Future[None] | None = None  # set while the loop waits in idle()
        self._closed = False
        self._wake = threading.Condition(self._lock)
        self._watch = threading.Thread(target=self._watch_deadlines, daemon=True,
                                       name=f"tghost-deadlines-{executor.service_id}")
        self._watch.start()

    @property
    def in_flight(self) -> int:
        """Calls admitted and not yet answered (waiting for a thread or running)."""
        return len(self._waiting) + len(self._running)

    def take(self, record: CallRecord, message: Any) -> None:
        """Admit one answerable request and queue it for a worker thread, or answer ``overloaded``."""
        call = _Call(record, message)
        with self._lock:
            full = self.in_flight >= self._owner.capacity
            starved = None if full else self._executor.starved()
            if not full and starved is None:
                self._waiting[call] = None
        if full or starved is not None:
            self._refuse(call, wire.OVERLOADED, starved or self._owner.refusal(wire.OVERLOADED))
            return
        call.job = self._executor.submit(self._run, call)

    def _run(self, call: _Call) -> None:
        """On a worker thread: check, invoke and answer one call."""
        with self._lock:
            if call.answered:  # answered 'unavailable' while it waited
                return
            del self._waiting[call]
            call.deadline = time.monotonic() + self._owner.timeout
            self._running[call] = None
        if self._owner.stopping:
            self._refuse(call, wire.UNAVAILABLE, self._owner.refusal(wire.UNAVAILABLE))
            return
        status: str | None
        try:
            result = self._owner.service.invoke(*self._owner.check(call.record, call.message))
            if inspect.isawaitable(result):
                result = self._on_loop(_awaited(result))
            if inspect.isgenerator(result) or inspect.isasyncgen(result):
                self._stream(call, result)
                return
            status, payload = None, wire.encode_response(wire.observation(result))
        except ToolError as exc:
            status, payload = exc.error_type, wire.encode_error(exc.error_type, str(exc))
        except wire.TooLarge as exc:
            status, payload = wire.TOOL_SERVICE_ERROR, wire.encode_error(wire.TOOL_SERVICE_ERROR, str(exc))
        except Exception as exc:
            log.exception("service %s: invoke raised", self._executor.service_id)
            status, payload = wire.TOOL_SERVICE_ERROR, wire.encode_error(wire.TOOL_SERVICE_ERROR,
                                                                          f"{type(exc).__name__}: {exc}")
        self._finish(call, status, payload)

    def _stream(self, call: _Call, chunks: Any) -> None:
        """Send each chunk as the plugin yields it, then the empty last reply; stops early once
        the call is claimed by its deadline or a shutdown. At most :data:`tghost.hop.STREAM_WINDOW`
        chunks are unconfirmed by the broker at a time. Raises what the plugin raises."""
        if inspect.isasyncgen(chunks):
            def following() -> Any:
                return self._on_loop(_next_async(chunks))

            def close() -> Any:
                return self._on_loop(chunks.aclose())
        else:
            following, close = functools.partial(next, chunks, _DONE), chunks.close
        unconfirmed: list[Future[bool]] = []
        try:
            while (chunk := following()) is not _DONE:
                payload = wire.encode_response(wire.observation(chunk), False)
                with call.lock:
                    if call.answered:
                        return
                    unconfirmed.append(self._owner.send_chunk(call.record, payload))
                if len(unconfirmed) >= hop.STREAM_WINDOW:
                    futures.wait(unconfirmed)
                    unconfirmed.clear()
        finally:
            close()
        futures.wait(unconfirmed)
        self._finish(call, None, wire.encode_response("", True))

    def _on_loop(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coroutine`` on the lane's event loop and wait for it here, at most the call's
        timeout (a plain ``invoke`` that returned an awaitable or an async generator).

        Raises:
            TimeoutError: it did not finish in time (the deadline has answered the call).
        """
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(self._owner.timeout)

    def _finish(self, call: _Call, status: str | None, payload: bytes) -> None:
        if not self._answer(call, status, payload) and status is None:
            log.debug("service %s: a result came after its call was answered; dropped", self._executor.service_id)

    def _refuse(self, call: _Call, error_type: str, text: str, waiting_only: bool = False) -> bool:
        """:meth:`_answer` with an error reply of ``error_type`` saying ``text``."""
        return self._answer(call, error_type, wire.encode_error(error_type, text), waiting_only)

    def _answer(self, call: _Call, status: str | None, payload: bytes, waiting_only: bool = False) -> bool:
        """Claim ``call`` and send its last reply, the encoded ``payload``; ``status`` is the
        error type (``None``: a result). Returns False when it was already answered (or, with
        ``waiting_only``, had started)."""
        with call.lock:
            with self._lock:
                if call.answered or (waiting_only and call not in self._waiting):
                    return False
                call.answered = True
                self._waiting.pop(call, None)
                self._running.pop(call, None)
                emptied = self._emptied is not None and not self.in_flight
            if status is not None:
                call.record.status = status
            try:
                self._owner.finish(call.record, call.message, payload, call.started)
            except Exception:
                log.exception("service %s: could not reply to request %s", self._executor.service_id,
                              call.record.request_id)
        if emptied:
            self._loop.call_soon_threadsafe(self._set_emptied)
        return True

    def _watch_deadlines(self) -> None:
        """The watch thread: answer ``timeout`` for each running call past its deadline.

        Idle, it sleeps ``timeout`` seconds at a time, so a call started meanwhile (deadline
        ``timeout`` after its start) is never due before the watch wakes: taking a call never
        has to wake it."""
        while True:
            with self._lock:
                while True:
                    if self._closed:
                        return
                    due, wait = _due(self._running, time.monotonic(), self._owner.timeout)
                    if due:
                        break
                    self._wake.wait(wait)
            for call in due:
                self._abandon(call)
                self._refuse(call, wire.TIMEOUT, self._owner.refusal(wire.TIMEOUT))

    def _abandon(self, call: _Call) -> None:
        if call.job is not None:
            self._executor.abandon(call.job)

    def stop(self) -> None:
        """Answer every call that did not start ``unavailable``; those admitted later are answered
        so when they would start (the owner is stopping)."""
        with self._lock:
            waiting = list(self._waiting)
        for call in waiting:
            if self._refuse(call, wire.UNAVAILABLE, self._owner.refusal(wire.UNAVAILABLE), waiting_only=True):
                self._abandon(call)

    async def idle(self) -> None:
        """Wait until no call is in the lane."""
        with self._lock:
            if not self.in_flight:
                return
            if self._emptied is None:
                self._emptied = self._loop.create_future()
            emptied = self._emptied
        await asyncio.shield(emptied)

    def _set_emptied(self) -> None:
        if self._emptied is not None and not self._emptied.done():
            self._emptied.set_result(None)

    def cut_off(self) -> int:
        """The grace ended: answer every call still in the lane ``unavailable`` (its thread is
        counted stuck until the plugin returns). Returns how many were answered."""
        with self._lock:
            left = list(self._waiting) + list(self._running)
        cut = 0
        for call in left:
            self._abandon(call)
            cut += self._refuse(call, wire.UNAVAILABLE, self._owner.refusal(wire.UNAVAILABLE, started=True))
        return cut

    def close(self) -> None:
        """Stop the watch thread (calls still running are no longer timed)."""
        with self._lock:
            self._closed = True
            self._wake.notify()


def _due(running: dict[_Call, None], now: float, idle: float) -> tuple[list[_Call], float]:
    """The running calls past their deadline at ``now`` (``running`` is in deadline order), and
    the seconds to wait for the next deadline (``idle`` when none runs)."""
    due = list(itertools.takewhile(lambda call: call.deadline <= now, running))
    head = next(iter(running), None)
    return due, (head.deadline - now if head is not None else idle)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


async def _next_async(chunks: Any) -> Any:
    try:
        return await chunks.__anext__()
    except StopAsyncIteration:
        return _DONE
