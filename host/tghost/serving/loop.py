"""loop: a service's requests driven on the event loop, one task each (docs/internals/performance.md §1).

The driver of every service the thread lane (:mod:`tghost.serving.lane`) does not serve:
``async def`` tools, process isolation and persistent topics. A request received on the C++
listener thread crosses into the loop once (:class:`tghost.pulsar.hop.Mailbox`), before the
endpoint hands it over; one from a persistent topic's receive loop is on the loop already. Its task waits for one of the
service's ``max_concurrency`` slots, checks the request, runs ``invoke`` in the service's
executor (:mod:`tghost.serving.executors`) under its timeout (:class:`~tghost.serving.deadlines.Deadlines`),
and answers through the port. A persistent request's last reply is waited for, since the
request is acknowledged only once the broker has it.

It drives the one request state machine of :mod:`tghost.serving.request`, as the thread lane does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import pulsar
import pulsar.asyncio

from tghost.author.service import Call
from tghost.protocol import wire
from tghost.protocol.callers import CALLER
from tghost.serving.deadlines import Deadlines
from tghost.serving.executors.base import Executor
from tghost.serving.request import FAILURES, NOT_STARTED, RETURNED, Port, Request, Terms, confirmed_on_loop

__all__ = ["LoopDriver"]

log = logging.getLogger(__name__)


class LoopDriver:
    """Drives one service's requests on the event loop, one task per request (see the module;
    the interface is :class:`tghost.serving.driver.Driver`).

    ``listens``: the requests come from the C++ listener thread (through the endpoint's hop into
    the loop), else from a persistent topic's receive loop (:meth:`receive`).
    ``threaded_checks``: the checks of a request that names a caller run in a thread, since its
    mark in the shared replay record waits for the broker.
    """

    on_loop = True

    def __init__(self, terms: Terms, port: Port, executor: Executor, listens: bool = True,
                 threaded_checks: bool = False) -> None:
        self._terms = terms
        self._port = port
        self._executor = executor
        self.listens = listens
        self._threaded_checks = threaded_checks
        self._slots = asyncio.Semaphore(terms.max_concurrency)
        self._admitted = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._calls: dict[str, tuple[asyncio.Task[None], Request]] = {}  # by request id, for a cancel
        self._waiting: set[asyncio.Task[None]] = set()  # waiting for a slot
        self._clock = Deadlines(terms.timeout)
        self._freed = asyncio.Event()
        self._stopping = False

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def take(self, request: Request) -> None:
        task = asyncio.create_task(self._handle(request))
        self._tasks.add(task)
        self._calls[request.request_id] = (task, request)
        task.add_done_callback(self._finished)

    async def receive(self, consumer: pulsar.asyncio.Consumer, take: Callable[[Any], None]) -> None:
        """A persistent topic's receive loop: receive a request only when fewer than
        ``max_concurrency`` calls are in flight, and hand it (a raw ``_pulsar.Message``) to
        ``take``; until the consumer closes (or the task is cancelled)."""
        while True:
            while self.in_flight >= self._terms.max_concurrency:
                self._freed.clear()
                await self._freed.wait()
            try:
                message = await consumer.receive()
            except pulsar.asyncio.PulsarException as exc:
                if exc.error() == pulsar.Result.AlreadyClosed:
                    return
                log.warning("service %s: receive failed (%s); retrying", self._terms.service_id, exc)
                await asyncio.sleep(0.5)
                continue
            take(message._message)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._freed.set()

    async def _handle(self, request: Request) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            if self._stopping:
                await self._refuse(request, *self._terms.stopped(False))
            elif (refusal := self._terms.over_capacity(self._admitted)) is not None:
                await self._refuse(request, wire.OVERLOADED, refusal)
            else:
                await self._admit(request, task)
        except asyncio.CancelledError as exc:
            if not request.answered:
                await self._cut_off(request, started=NOT_STARTED not in exc.args)
            raise
        except Exception:
            log.exception("service %s: could not reply to request %s", self._terms.service_id, request.request_id)
        finally:
            self._tasks.discard(task)  # answered: no longer in flight
            if self._calls.get(request.request_id, (None,))[0] is task:
                del self._calls[request.request_id]
            self._port.settle(request.record, request.message, request.started,
                              acknowledge=request.record.status != RETURNED)

    def running(self, request_id: str) -> Request | None:
        call = self._calls.get(request_id)
        return call[1] if call is not None else None

    def cancel(self, request: Request) -> None:
        call = self._calls.get(request.request_id)
        if call is not None and request.claim(wire.CANCELLED, self._port):
            self._port.send(request, self._terms.error(request.request_id, wire.CANCELLED,
                                                       self._terms.refusal(wire.CANCELLED)))
            call[0].cancel()  # the call's task: an async invoke stops, a worker process is killed

    async def _admit(self, request: Request, task: asyncio.Task[None]) -> None:
        self._admitted += 1
        try:
            self._waiting.add(task)
            try:
                await self._slots.acquire()
            finally:
                self._waiting.discard(task)
            try:
                await self._answer(request, task)
            finally:
                self._slots.release()
        finally:
            self._admitted -= 1

    async def _cut_off(self, request: Request, started: bool) -> None:
        """A call cancelled by shutdown (``started``: in ``invoke``, else waiting for a slot): a
        persistent request goes back to the broker unanswered (another host takes it when this
        consumer closes); any other is answered ``unavailable``."""
        if self._terms.persistent:
            request.record.status = RETURNED
        else:
            with contextlib.suppress(Exception):
                await self._refuse(request, *self._terms.stopped(started))

    async def _answer(self, request: Request, task: asyncio.Task[None]) -> None:
        """Check the request, invoke under the timeout, and send the reply (or error)."""
        try:
            call = await self._checked(request)
            self._clock.start(task)
            try:
                await self._invoke(request, call)
            finally:
                self._clock.stop(task)
        except asyncio.CancelledError:
            if not self._clock.expired(task):
                raise
            await self._refuse(request, wire.TIMEOUT, self._terms.refusal(wire.TIMEOUT))
        except FAILURES as exc:  # a SystemExit too, which would end the event loop
            await self._refuse(request, *self._terms.failure(exc, request.request_id))

    async def _checked(self, request: Request) -> Call:
        """:meth:`Terms.check`; in a worker thread for a request that names a caller, whose mark
        in the shared replay record waits for the broker."""
        if not self._threaded_checks or CALLER not in request.message.properties():
            return self._terms.check(request, self._port)
        return await asyncio.to_thread(self._terms.check, request, self._port)

    async def _invoke(self, request: Request, call: Call) -> None:
        """Run the call and send its reply: one response, or for a generator one per chunk
        (:meth:`tghost.serving.request.Request.chunk`) then an empty last one."""
        spans = request.record.spans
        result = await self._executor.run(call, spans.stage if spans is not None else None)
        if isinstance(result, str):
            await self._reply(request, None, wire.encode_response(result))
            return
        try:
            async with contextlib.aclosing(result):
                async for chunk in result:
                    full = request.chunk(self._port, chunk)
                    if full is None:
                        return
                    await confirmed_on_loop(full)
        finally:
            rest = request.rest()
        await confirmed_on_loop(rest)
        await self._reply(request, None, wire.encode_response("", True))

    async def _refuse(self, request: Request, error_type: str, text: str, started: bool = True) -> None:
        """Answer the request with an error reply of ``error_type`` saying ``text`` (``started``:
        whether the call may have started, :meth:`Terms.error`)."""
        await self._reply(request, error_type, self._terms.error(request.request_id, error_type, text, started))

    async def _reply(self, request: Request, status: str | None, payload: bytes) -> None:
        """Claim the request and send its last reply (``status``: the error type, ``None`` for a
        result). A persistent request's reply is waited for, since the request is acknowledged
        only once the broker has it. A non-persistent one's is not: the broker never delivers a
        non-persistent request again, so the acknowledgement changes nothing, and waiting would
        cost a hop and the client's I/O thread the GIL (docs/internals/performance.md §1). A
        persistent request whose reply the broker did not take is left unacknowledged
        (:data:`~tghost.serving.request.RETURNED`), for another delivery."""
        if not request.claim(status, self._port):
            return
        if not self._terms.persistent:
            self._port.send(request, payload, status is None)
            return
        receipt = asyncio.ensure_future(self._port.receipt(request, payload, status is None))
        try:
            await asyncio.shield(receipt)
        except asyncio.CancelledError:  # a timeout or shutdown while the reply was on its way
            with contextlib.suppress(Exception):
                await receipt  # the reply is out: settle the request once the broker has it
            if receipt.cancelled() or receipt.exception() is not None:
                request.record.status = RETURNED
            raise
        except pulsar.asyncio.PulsarException as exc:
            log.warning("service %s: the broker did not take the reply to request %s (%s); the request is left "
                        "unacknowledged, so the broker delivers it again", self._terms.service_id,
                        request.request_id, exc)
            request.record.status = RETURNED

    def stop(self) -> None:
        self._stopping = True
        for task in list(self._waiting):
            task.cancel(NOT_STARTED)

    async def idle(self) -> None:
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def cut_off(self) -> int:
        pending = [task for task in self._tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)  # let them answer 'unavailable'
        return len(pending)

    def close(self) -> None:
        """Nothing of its own to let go (its timer is the loop's)."""
