"""lane: a service's requests served on threads alone, with no event-loop hop (docs/internals/performance.md §1).

For a service whose plain (blocking) ``invoke`` runs in the host's worker threads, on a
non-persistent request topic, the C++ listener thread admits each request and hands it straight
to a worker thread (:meth:`tghost.serving.executors.thread.ThreadExecutor.submit`); the worker
checks it, invokes, sends the reply and acknowledges the request. That is a raw sync echo's path
plus one thread hop. The event loop sees only what is rare: a shutdown's drain. The inline
driver (:class:`tghost.serving.inline.InlineDriver`) is this lane with a receive thread of its
own, which runs short calls itself; every other service is driven on the loop
(:class:`tghost.serving.loop.LoopDriver`). The interface they share is
:class:`tghost.serving.driver.Driver`.

The lane drives the one request state machine of :mod:`tghost.serving.request` (the service's
:class:`~tghost.serving.request.Terms`, :func:`~tghost.serving.request.failure`, a
:class:`~tghost.serving.request.Request` per call, the :class:`~tghost.serving.request.Port`),
so its semantics and reply texts are the loop driver's:

- ``overloaded`` beyond ``max_concurrency + max_queue`` admitted requests, or when every one
  of the service's threads is stuck in a call that timed out or was cancelled;
- ``timeout`` at the deadline, ``timeout`` seconds after ``invoke`` started (a timer thread;
  the plugin's thread is counted stuck until it returns);
- ``unavailable`` for calls that did not start when the service stops (:meth:`ThreadLane.stop`)
  and for those still running when its grace ends (:meth:`ThreadLane.cut_off`).

It owns its state, and reaches Pulsar only through its port.
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
from typing import Any

from tghost.author.service import invoke, observation
from tghost.protocol import wire
from tghost.serving.executors.thread import ThreadExecutor
from tghost.serving.request import FAILURES, Port, Request, Terms, confirmed

__all__ = ["ThreadLane"]

log = logging.getLogger(__name__)

_DONE = object()


class ThreadLane:
    """Serves one thread-isolated service's requests on its worker threads (see the module; the
    interface is :class:`tghost.serving.driver.Driver`).

    :meth:`take` is called on the C++ listener thread; :meth:`stop`, :meth:`idle`,
    :meth:`cut_off` and :meth:`close` on the event loop the lane was created on.
    """

    listens = True
    on_loop = False

    def __init__(self, terms: Terms, port: Port, executor: ThreadExecutor, loop: asyncio.AbstractEventLoop) -> None:
        self._terms = terms
        self._port = port
        self._executor = executor
        self._loop = loop
        self._lock = threading.Lock()
        self._waiting: dict[Request, None] = {}  # admitted, not started
        self._running: dict[Request, None] = {}  # started, in deadline order (one timeout for all)
        self._by_id: dict[str, Request] = {}  # both, by request id (for a cancel)
        self._emptied: asyncio.Future[None] | None = None  # set while the loop waits in idle()
        self._stopping = False
        self._closed = False
        self._wake = threading.Condition(self._lock)
        self._timer = threading.Thread(target=self._expire_due, daemon=True,
                                       name=f"tghost-deadlines-{executor.service_id}")
        self._timer.start()

    @property
    def in_flight(self) -> int:
        """Calls admitted and not yet answered (waiting for a thread or running)."""
        return len(self._waiting) + len(self._running)

    def take(self, request: Request) -> None:
        """Admit one answerable request and queue it for a worker thread, or answer ``overloaded``."""
        with self._lock:
            refusal = self._terms.over_capacity(self.in_flight) or self._executor.starved()
            if refusal is None:
                self._waiting[request] = None
                self._by_id[request.request_id] = request
        if refusal is not None:
            self._refuse(request, wire.OVERLOADED, refusal)
            return
        request.job = self._executor.submit(self._run, request)

    def _run(self, request: Request) -> None:
        """On a worker thread: check, invoke and answer one call."""
        with self._lock:
            if request.answered:  # answered 'unavailable' while it waited
                return
            del self._waiting[request]
            request.deadline = time.monotonic() + self._terms.timeout
            self._running[request] = None
        if self._stopping:
            self._refuse(request, *self._terms.stopped(False))
            return
        try:
            result = invoke(self._terms.service, self._terms.check(request, self._port))
            if inspect.isawaitable(result):
                result = self._on_loop(_awaited(result))
            if inspect.isgenerator(result) or inspect.isasyncgen(result):
                self._stream(request, result)
                return
            payload = wire.encode_response(observation(self._terms.service_id, result))
        except FAILURES as exc:
            self._refuse(request, *self._terms.failure(exc, request.request_id))
            return
        if not self._answer(request, None, payload):
            log.debug("service %s: a result came after its call was answered; dropped", self._terms.service_id)

    def _stream(self, request: Request, chunks: Any) -> None:
        """Send each chunk as the plugin yields it (:meth:`Request.chunk`), then the empty last
        reply; stops early once the call is claimed by its deadline or a shutdown. Raises what
        the plugin raises, and :class:`~tghost.serving.request.ChunkNotSent`."""
        if inspect.isasyncgen(chunks):
            def following() -> Any:
                return self._on_loop(_next_async(chunks))

            def close() -> Any:
                return self._on_loop(chunks.aclose())
        else:
            following, close = functools.partial(next, chunks, _DONE), chunks.close
        try:
            while (chunk := following()) is not _DONE:
                full = request.chunk(self._port, observation(self._terms.service_id, chunk))
                if full is None:
                    return
                confirmed(full)
        finally:
            close()
        confirmed(request.rest())
        self._answer(request, None, wire.encode_response("", True))

    def _on_loop(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coroutine`` on the lane's event loop and wait for it here, at most the call's
        timeout (a plain ``invoke`` that returned an awaitable or an async generator).

        Raises:
            TimeoutError: it did not finish in time (the deadline has answered the call).
        """
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(self._terms.timeout)

    def _refuse(self, request: Request, error_type: str, text: str, started: bool = True,
                waiting_only: bool = False) -> bool:
        """:meth:`_answer` with an error reply of ``error_type`` saying ``text`` (``started``:
        whether the call may have started, :meth:`Terms.error`)."""
        return self._answer(request, error_type, self._terms.error(request.request_id, error_type, text, started),
                            waiting_only)

    def _answer(self, request: Request, status: str | None, payload: bytes, waiting_only: bool = False) -> bool:
        """Claim ``request``, send its last reply (the encoded ``payload``; ``status`` is the error
        type, ``None`` for a result) and settle it. Returns False when it was already answered
        (or, with ``waiting_only``, had started)."""
        with self._lock:
            if waiting_only and request not in self._waiting:
                return False
            if not request.claim(status, self._port):
                return False
            self._waiting.pop(request, None)
            self._running.pop(request, None)
            if self._by_id.get(request.request_id) is request:
                del self._by_id[request.request_id]
            emptied = self._emptied is not None and not self.in_flight
        try:
            self._port.send(request, payload, status is None)
            self._port.settle(request.record, request.message, request.started)
        except Exception:
            log.exception("service %s: could not reply to request %s", self._terms.service_id, request.request_id)
        if emptied:
            self._loop.call_soon_threadsafe(self._set_emptied)
        return True

    def _expire_due(self) -> None:
        """The timer thread: answer ``timeout`` for each running call past its deadline.

        Idle, it sleeps ``timeout`` seconds at a time, so a call started meanwhile (deadline
        ``timeout`` after its start) is never due before the timer wakes: taking a call never
        has to wake it."""
        while True:
            with self._lock:
                while True:
                    if self._closed:
                        return
                    due, wait = _due(self._running, time.monotonic(), self._terms.timeout)
                    if due:
                        break
                    self._wake.wait(self._watch(wait))
            for request in due:
                self._let_go(request, wire.TIMEOUT, self._terms.refusal(wire.TIMEOUT))

    def _watch(self, wait: float) -> float:
        """The timer thread, holding the lock, before it sleeps ``wait`` seconds (until the next
        deadline): how long it sleeps. The inline driver looks at its running call here."""
        return wait

    def running(self, request_id: str) -> Request | None:
        """The call of ``request_id`` in the lane (waiting or running), if any."""
        return self._by_id.get(request_id)

    def cancel(self, request: Request) -> None:
        """The caller cancelled ``request``: free its slot and answer it ``cancelled`` at once; a
        plain ``def`` still in its thread is counted stuck until it returns (and is told, by the
        control topic, once answered: ``tghost.Context.cancelled``)."""
        self._let_go(request, wire.CANCELLED, self._terms.refusal(wire.CANCELLED))

    def _let_go(self, request: Request, error_type: str, text: str, started: bool = True) -> bool:
        """Let go of ``request``'s thread (counted stuck while the plugin runs on; its slot is
        free), then answer it (:meth:`_refuse`, whose result it returns): a caller that hears
        the answer and calls again at once meets the service as it is."""
        self._abandon(request)
        return self._refuse(request, error_type, text, started)

    def _abandon(self, request: Request) -> None:
        if request.job is not None:
            self._executor.abandon(request.job)

    def stop(self) -> None:
        """Answer every call that did not start ``unavailable``; those admitted later are answered
        so when they would start."""
        with self._lock:
            self._stopping = True
            waiting = list(self._waiting)
        for request in waiting:
            if self._refuse(request, *self._terms.stopped(False), waiting_only=True):
                self._abandon(request)

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

    async def cut_off(self) -> int:
        """The grace ended: answer every call still in the lane ``unavailable`` (its thread is
        counted stuck until the plugin returns). Returns how many were answered."""
        with self._lock:
            left = list(self._waiting) + list(self._running)
        cut = 0
        for request in left:
            cut += self._let_go(request, *self._terms.stopped(True))
        return cut

    def close(self) -> None:
        """Stop the timer thread (calls still running are no longer timed)."""
        with self._lock:
            self._closed = True
            self._wake.notify()


def _due(running: dict[Request, None], now: float, idle: float) -> tuple[list[Request], float]:
    """The running calls past their deadline at ``now`` (``running`` is in deadline order), and
    the seconds to wait for the next deadline (``idle`` when none runs)."""
    due = list(itertools.takewhile(lambda request: request.deadline <= now, running))
    head = next(iter(running), None)
    return due, (head.deadline - now if head is not None else idle)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


async def _next_async(chunks: Any) -> Any:
    try:
        return await chunks.__anext__()
    except StopAsyncIteration:
        return _DONE
