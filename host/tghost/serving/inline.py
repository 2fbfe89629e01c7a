"""inline: a short plain ``def`` call run on the thread that received it, with no hand-off, as
the floor does (docs/internals/performance.md §1).

The thread lane (:mod:`tghost.serving.lane`) hands every request from the C++ listener thread to
a worker thread; that hand-off is most of what a short call costs over a raw echo. The inline
driver is the lane with one more way to run a call: the service has a receive thread of its own
(``consumer.receive``, as the raw sync echo has), so its requests never wait behind another
service's, and one of its requests runs right there when it is safe:

- the service's last :data:`RECENT` calls each took under :data:`BUDGET` seconds, from the
  checks to the reply (a service is measured on the lane first: a slow one never runs inline);
- nothing of the service is in flight, so at most one inline call runs and ``max_concurrency``
  holds; a burst queues in the lane as before, and is answered ``overloaded`` past its bound;
- no inline call of the service is stuck (see below), and the service is not stopping.

Everything else is the lane's: the checks, the timer that answers ``timeout``, ``cancel``,
``overloaded``, ``unavailable`` at a drain or when the grace ends, the call listeners. A
stream's chunks go on a worker thread (the receive thread must not wait for a stream), as a job
of the service's executor, which a timeout or cancel abandons as the lane's.

A call measured short may turn slow (a cache miss, a lock, a plugin that blocks). Once an inline
call has run :data:`HANDOVER` seconds, the lane's timer thread hands the service's receiving to a
new receive thread, so the requests behind it are admitted, queued, answered ``overloaded`` past
the bound, cancelled and drained as the lane's; the call goes on where it runs, and one of the
service's worker threads waits until it ends, so ``max_concurrency`` holds. The timer looks only
while inline calls run: the first after a quiet spell wakes it. An inline call its caller was
answered for (a timeout, a cancel, the grace's end) leaves its thread with the plugin, counted one
of the service's stuck threads; a new receive thread takes over at once (if none did already),
the old one ends when the plugin returns, and until then no call runs inline.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pulsar
import pulsar.asyncio

from tghost.serving.executors.thread import ThreadExecutor
from tghost.serving.lane import ThreadLane
from tghost.serving.request import FAILURES, Port, Request, Terms

__all__ = ["BUDGET", "HANDOVER", "RECENT", "InlineDriver"]

log = logging.getLogger(__name__)

#: Seconds a call may take, from the checks to the reply, for the next to run inline.
BUDGET = 0.001
#: How many of a service's latest calls must each have been within :data:`BUDGET`.
RECENT = 8
#: Seconds an inline call may run before its service receives on a new thread (see the module).
HANDOVER = 0.05
#: Milliseconds a receive thread waits for a request before it looks whether to end.
RECEIVE_WAIT_MS = 1000

_INLINE = object()  # ``Request.job`` of a call running on its receive thread


class InlineDriver(ThreadLane):
    """The thread lane, receiving on a thread of the service's own and running short calls there
    (see the module; the interface is :class:`tghost.serving.driver.Driver`).

    :meth:`receive` starts the receive thread; :meth:`take` runs on it.
    """

    listens = False
    on_loop = False

    def __init__(self, terms: Terms, port: Port, executor: ThreadExecutor, loop: asyncio.AbstractEventLoop) -> None:
        self._took: collections.deque[float] = collections.deque(maxlen=RECENT)  # seconds of the latest calls
        self._current: Request | None = None  # the call running inline now, on the receive thread
        self._aside: dict[Request, threading.Event] = {}  # inline calls handed over: set when each ends
        self._left: set[Request] = set()  # inline calls whose caller was answered while the plugin runs on
        self._watched = False  # the timer looks at the inline calls (else it sleeps until a deadline)
        self._inlined = False  # an inline call started since the timer last looked
        self._generation = 0  # the receive thread that takes requests now; an older one ends
        self._source: tuple[pulsar.asyncio.Consumer, Callable[[Any], None]] | None = None  # set by receive()
        self._receiving: asyncio.Future[None] | None = None
        super().__init__(terms, port, executor, loop)  # last: it starts the timer thread, which reads the above

    def take(self, request: Request) -> None:
        with self._lock:
            inline = (not self.in_flight and not self._left and not self._stopping and not self._closed
                      and len(self._took) == RECENT and max(self._took, default=0.0) < BUDGET
                      and self._executor.starved() is None)  # else the lane answers 'overloaded'
            if inline:
                request.job = _INLINE
                self._current = request
                self._waiting[request] = None
                self._by_id[request.request_id] = request
                self._inlined = True
                if not self._watched:  # the first inline call after a quiet spell wakes the timer
                    self._watched = True
                    self._wake.notify()
        if inline:
            self._run(request)
        else:
            super().take(request)

    def _run(self, request: Request) -> None:
        """:meth:`ThreadLane._run`, timed: every call of the service, inline or on the lane, tells
        whether the next may run inline."""
        started = time.perf_counter()
        super()._run(request)
        took = time.perf_counter() - started
        with self._lock:
            self._took.append(took)
            if request is self._current:
                self._current = None
            if request in self._left:  # its plugin returned: inline calls may run again
                self._left.discard(request)
                self._executor.hold(-1)
            aside = self._aside.pop(request, None)
        if aside is not None:
            aside.set()

    def _stream(self, request: Request, chunks: Any) -> None:
        if request.job is not _INLINE:
            super()._stream(request, chunks)
            return
        with self._lock:  # the receive thread never waits for a stream: a worker runs it, as the lane's
            if not request.answered:
                request.job = self._executor.submit(self._stream_apart, request, chunks)

    def _stream_apart(self, request: Request, chunks: Any) -> None:
        """On a worker thread: an inline call's stream, answered as :meth:`ThreadLane._run` would."""
        try:
            super()._stream(request, chunks)
        except FAILURES as exc:
            self._refuse(request, *self._terms.failure(exc, request.request_id))

    def _abandon(self, request: Request) -> None:
        """The caller of ``request`` was answered (a timeout, a cancel, the grace's end): a call
        still running inline keeps its thread, counted stuck, and a new receive thread takes over
        at once if none did already."""
        with self._lock:
            if request.job is not _INLINE:
                super()._abandon(request)
                return
            aside = self._aside.pop(request, None)
            if request is not self._current and aside is None:  # it returned meanwhile
                return
            self._left.add(request)
            self._executor.hold(1)
            generation = self._hand_over() if request is self._current else None
        if aside is not None:
            aside.set()  # its worker thread's wait is over: the slot is free
        if generation is not None:
            self._start_receiving(generation)

    def _watch(self, wait: float) -> float:
        """The timer thread, holding the lock: hand the receiving over once the inline call has
        run :data:`HANDOVER` seconds; else look again by then while inline calls run, or sleep
        until a deadline once none ran since the last look."""
        current, inlined, self._inlined = self._current, self._inlined, False
        if current is None:
            self._watched = inlined
            return min(wait, HANDOVER) if inlined else wait
        ran = time.perf_counter() - current.started
        if ran < HANDOVER:
            return min(wait, HANDOVER - ran)
        log.debug("service %s: request %s ran %.3fs inline; receiving on a new thread", self._terms.service_id,
                  current.request_id, ran)
        self._aside[current] = ended = threading.Event()
        self._executor.submit(ended.wait)  # one of the service's threads waits for it: max_concurrency holds
        self._start_receiving(self._hand_over())
        return wait

    def _hand_over(self) -> int:
        """Hold the lock: the current inline call keeps its thread; the next receive thread's
        generation, which takes the requests from now on."""
        self._current = None
        self._generation += 1
        return self._generation

    async def receive(self, consumer: pulsar.asyncio.Consumer, take: Callable[[Any], None]) -> None:
        """Receive the service's requests on a thread of its own and hand each (a raw
        ``_pulsar.Message``) to ``take`` there; returns once the consumer closes."""
        self._source = (consumer, take)
        self._receiving = self._loop.create_future()
        self._start_receiving(0)
        await asyncio.shield(self._receiving)

    def _start_receiving(self, generation: int) -> None:
        threading.Thread(target=self._receive, args=(generation,), daemon=True,
                         name=f"tghost-{self._terms.service_id}-receive-{generation}").start()

    def _receive(self, generation: int) -> None:
        assert self._source is not None
        consumer, take = self._source[0]._consumer, self._source[1]
        while generation == self._generation:  # until the consumer closes: a lone draining host answers on
            try:
                message = consumer.receive(RECEIVE_WAIT_MS)
            except pulsar.Timeout:
                continue
            except pulsar.AlreadyClosed:
                break
            except pulsar.PulsarException as exc:
                log.warning("service %s: receive failed (%s); retrying", self._terms.service_id, exc)
                time.sleep(0.5)
                continue
            try:
                take(message)
            except Exception:  # a defect in taking one request must not end the service's receiving
                log.exception("service %s: could not take a request; receiving goes on", self._terms.service_id)
        if generation == self._generation:
            self._finish()

    def _finish(self) -> None:
        if self._receiving is not None:
            self._loop.call_soon_threadsafe(_done, self._receiving)


def _done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
