"""endpoint: one tool service on Pulsar (docs/protocol.md §2): a Shared subscription
``<service-id>-request`` on its request topic, a non-batching producer on its response topic,
and the executor whose workers run its ``invoke``.

The hot path (docs/internals/performance.md §1): a request on a non-persistent topic arrives through a C++
message listener. A plain ``def`` service under thread isolation answers it on its worker
threads (:mod:`tghost.serving.lane`); any other crosses into the event loop once
(:class:`tghost.pulsar.hop.Mailbox`) and is driven there, through the same request state
machine (:mod:`tghost.serving.request`). The reply goes out with the producer's ``send_async``,
and the request is acknowledged as it is sent. A persistent topic is read with ``receive``
instead, one request per free slot, and a request there is acknowledged only once the broker
has its reply.

Never lets one service's faults stop another from answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pulsar
import pulsar.asyncio

from tghost.author.hookspecs import Authorize
from tghost.author.service import Call, ToolService
from tghost.protocol import wire
from tghost.protocol.callers import CALLER
from tghost.protocol.descriptors import ToolServiceDescriptor
from tghost.protocol.trust import Signer
from tghost.pulsar import hop
from tghost.serving import executors, handoff
from tghost.serving.access import Fleet, Gate
from tghost.serving.cancels import ControlTopic
from tghost.serving.deadlines import Deadlines
from tghost.serving.executors.thread import ThreadExecutor
from tghost.serving.lane import ThreadLane
from tghost.serving.replays import SharedReplays
from tghost.serving.request import (
    NOT_STARTED,
    RETURNED,
    UNANSWERABLE,
    CallListener,
    CallRecord,
    Port,
    Prover,
    Request,
    Terms,
    confirmed_on_loop,
)
from tghost.serving.settings import ServeSettings
from tghost.system.logs import LogSummary

__all__ = ["RECEIVER_QUEUE", "ServiceEndpoint"]

log = logging.getLogger(__name__)

#: Messages the client may buffer per consumer of a non-persistent request topic: the burst
#: one host absorbs per service. The receive loop drains the buffer eagerly and the endpoint
#: answers ``overloaded`` beyond its bound, so the host itself drops nothing. But the broker
#: drops a non-persistent message when no consumer has a free permit (Pulsar's semantics): a
#: larger burst, arriving faster than the host takes it, partly never reaches the host and its
#: callers time out; use a persistent topic for such bursts. (tests/serving/test_faults.py sends
#: 2000 at once; pulsar-client's default of 1000 lost a third of them.) A persistent topic keeps
#: what no host has taken, so its consumer buffers nothing (size 0) and receives only when a
#: slot is free.
RECEIVER_QUEUE = 10_000


class ServiceEndpoint:
    """Serves one tool service: receive, bound, check, invoke, reply, then acknowledge.

    ``invoke`` runs in this service's own :class:`tghost.serving.executors.base.Executor` (worker
    threads or worker processes, ``max_concurrency`` at most), so a plugin that never returns
    starves only its own service. At the timeout the caller is answered ``timeout`` at once and
    the slot is freed; the executor stops the call if it can (a worker process is killed).

    The checks before ``invoke`` are :meth:`tghost.serving.request.Terms.check`'s.
    """

    def __init__(
        self,
        service: ToolService,
        descriptor: ToolServiceDescriptor,
        settings: ServeSettings,
        listeners: Sequence[CallListener] = (),
        authorize: Authorize | None = None,
        gate: Gate | None = None,
        signer: Signer | None = None,
        fleet: Fleet | None = None,
        host_id: str | None = None,
    ) -> None:
        self.service = service
        self.signer = signer
        self.descriptor = descriptor
        self.terms = Terms(service, descriptor, descriptor.timeout or settings.timeout,
                           descriptor.max_concurrency or settings.max_concurrency, settings.max_queue,
                           settings.max_payload, settings.max_redeliveries, authorize, gate, fleet, host_id,
                           settings.error_detail)
        self.persistent = self.terms.persistent
        self.counters = {"received": 0, "unanswerable": 0}
        self._listeners = tuple(listeners)
        self.executor = executors.create(service, descriptor, self.terms.max_concurrency, settings.isolation,
                                         settings.worker_limits)
        self._slots = asyncio.Semaphore(self.terms.max_concurrency)
        self._room = asyncio.Semaphore(self.terms.max_concurrency) if self.persistent else None
        self._admitted = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._calls: dict[str, tuple[asyncio.Task[None], Request]] = {}  # loop-path calls by request id
        self._control = ControlTopic(descriptor, self._cancel, self._answer_probe)
        self._replays: SharedReplays | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._consumer: pulsar.asyncio.Consumer | None = None
        self._producer: pulsar.asyncio.Producer | None = None
        self._port: Port | None = None
        self._mailbox: hop.Mailbox | None = None
        self._lane: ThreadLane | None = None
        self._clock = Deadlines(self.terms.timeout)
        self._stopping = False
        self._handed_off = False
        self._client: pulsar.asyncio.Client | None = None
        self._waiting: set[asyncio.Task[None]] = set()  # requests waiting for a slot
        self._peers: handoff.PeerLookout | None = None
        self._unsubscribing: asyncio.Task[None] | None = None
        self._released = False
        self._unanswerable = LogSummary(
            log, f"service {self.descriptor.id}: dropped %(count)d request(s) that cannot be answered: %(reason)s "
                 "(e.g. %(example)s); a caller must set it (docs/protocol.md §2.3)")

    @property
    def subscription(self) -> str:
        """The Shared subscription name, ``<service-id>-request`` (docs/protocol.md §2.4)."""
        return f"{self.descriptor.id}-request"

    def is_connected(self) -> bool:
        """Whether the response producer is connected to the broker now (False before start)."""
        return self._producer is not None and bool(self._producer.is_connected())

    @property
    def in_flight(self) -> int:
        """Requests received and not yet answered (running, waiting for a slot, or being refused)."""
        return len(self._tasks) + (self._lane.in_flight if self._lane is not None else 0)

    @property
    def stopping(self) -> bool:
        """Whether the service stopped taking new calls (:meth:`stop_receiving`)."""
        return self._stopping

    async def start(self, client: pulsar.asyncio.Client) -> None:
        """Create the response producer, start the executor, then subscribe and start receiving.

        Raises:
            pulsar.asyncio.PulsarException: the broker refused the producer or subscription.
        """
        loop = asyncio.get_running_loop()
        self._mailbox = hop.Mailbox(loop)
        self._client = client
        self._producer = await client.create_producer(
            self.descriptor.response_queue, batching_enabled=False, block_if_queue_full=True
        )
        proving = self.terms.gate is not None or self.signer is not None
        prover = Prover(self.descriptor.request_queue, self.terms.gate, self.signer) if proving else None
        self._port = Port(self._producer, self._mailbox, self._listeners, self.descriptor.id, prover,
                          structured=self.service.output_schema is not None)
        await self.executor.start()
        if isinstance(self.executor, ThreadExecutor) and self.service.runs_in_thread and not self.persistent:
            self._lane = ThreadLane(self.terms, self._port, self.executor, loop)
        await self._control.start(client, self._mailbox)
        try:
            await self._share_replays(client)
            self._consumer = self._port.consumer = await client.subscribe(
                self.descriptor.request_queue,
                self.subscription,
                consumer_type=pulsar.ConsumerType.Shared,
                **self._consumer_options(),
            )
        except BaseException:
            await self.release()
            await self._unshare_replays()
            raise
        if self.persistent:
            self._loop_task = asyncio.create_task(self._receive_loop(), name=f"receive {self.descriptor.id}")

    async def _share_replays(self, client: pulsar.asyncio.Client) -> None:
        """With an access policy: read the replay record the service's hosts share (docs/protocol.md
        §2.8) before the first request, so a restarted host refuses what any host ran."""
        if self.terms.gate is not None:
            self._replays = await SharedReplays.open(client, self.descriptor.request_queue, self.terms.gate.window)
            self.terms.gate.share(self.descriptor.request_queue, self._replays)

    async def _unshare_replays(self) -> None:
        if self._replays is not None:
            self.terms.gate.unshare(self.descriptor.request_queue, self._replays)  # type: ignore[union-attr]
            await self._replays.close()
            self._replays = None

    def _consumer_options(self) -> dict[str, Any]:
        if not self.persistent:
            return {"receiver_queue_size": RECEIVER_QUEUE, "message_listener": self._on_message}
        return {"receiver_queue_size": 0,
                "dead_letter_policy": pulsar.ConsumerDeadLetterPolicy(self.terms.max_redeliveries + 1)}

    def _on_message(self, consumer: Any, message: Any) -> None:
        """The C++ listener thread: hand an answerable request to the thread lane, if the
        service has one and is not stopping; anything else to the loop (:class:`tghost.pulsar.hop.Mailbox`)."""
        request_id = message.properties().get("id")
        if self._lane is None or self._stopping or request_id is None:
            self._mailbox.put(self._received, message)  # type: ignore[union-attr]
            return
        self.counters["received"] += 1
        self._lane.take(CallRecord(self.descriptor.id, request_id), message)

    def _received(self, message: Any) -> None:
        """A request (a raw ``_pulsar.Message``) is in: handle it in its own task."""
        self.counters["received"] += 1
        task = asyncio.create_task(self._handle(message))
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    async def _receive_loop(self) -> None:
        assert self._consumer is not None
        while True:
            if self._room is not None:
                await self._room.acquire()  # persistent: take a request only when it can run
            try:
                message = await self._consumer.receive()
            except pulsar.asyncio.PulsarException as exc:
                self._release_room()
                if exc.error() == pulsar.Result.AlreadyClosed:
                    return
                log.warning("service %s: receive failed (%s); retrying", self.descriptor.id, exc)
                await asyncio.sleep(0.5)
                continue
            self._received(message._message)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._release_room()

    def _release_room(self) -> None:
        if self._room is not None:
            self._room.release()

    async def _handle(self, message: Any) -> None:
        task: asyncio.Task[None] = asyncio.current_task()  # type: ignore[assignment]
        request = Request(CallRecord(self.descriptor.id, message.properties().get("id")), message)
        log.debug("service %s: request %s received", self.descriptor.id, request.record.request_id)
        if request.record.request_id is not None:
            self._calls[request.record.request_id] = (task, request)
        try:
            if request.record.request_id is None:
                self.counters["unanswerable"] += 1
                request.record.status = UNANSWERABLE
                self._unanswerable.add("no 'id' property", f"message {message.message_id()} on "
                                       f"{self.descriptor.request_queue}")
                self._unanswerable.flush()
            elif self._stopping and not self._handed_off:
                if self._peers is not None:
                    self._peers.mine(request.record.request_id)
                await self._refuse(request, wire.UNAVAILABLE, self.terms.refusal(wire.UNAVAILABLE))
            elif (refusal := self.terms.over_capacity(self._admitted)) is not None:
                await self._refuse(request, wire.OVERLOADED, refusal)
            else:
                await self._admit(request, task)
        except asyncio.CancelledError as exc:
            if not request.answered:
                await self._cut_off(request, started=NOT_STARTED not in exc.args)
            raise
        except Exception:
            log.exception("service %s: could not reply to request %s", self.descriptor.id, request.record.request_id)
        finally:
            self._tasks.discard(task)  # answered: no longer in flight
            if self._calls.get(request.request_id, (None,))[0] is task:
                del self._calls[request.request_id]
            self._port.settle(request.record, message, request.started,  # type: ignore[union-attr]
                              acknowledge=request.record.status != RETURNED)

    def _cancel(self, request_id: str, properties: Mapping[str, str]) -> None:
        """A cancel from the control topic (docs/protocol.md §2.11): stop the call if this host
        runs it and the cancel comes from its caller; answer it ``cancelled`` at once."""
        running = self._calls.get(request_id)
        request = running[1] if running else self._lane.running(request_id) if self._lane else None
        if request is None or not self.terms.may_cancel(request.record, properties, self._control.topic):
            return  # another host's call, a finished one, or not its caller's cancel
        request.cancelled.set()
        if running is None:
            self._lane.cancel(request)  # type: ignore[union-attr]
        elif request.claim(wire.CANCELLED, self._port):
            self._port.send(request, self.terms.error(request_id, wire.CANCELLED,  # type: ignore[union-attr]
                                                      self.terms.refusal(wire.CANCELLED)))
            running[0].cancel()  # the call's task: an async invoke stops, a worker process is killed

    def _answer_probe(self, probe_id: str, request_id: str) -> None:
        """The control topic's listener thread: a caller asks whether this host lives (docs/protocol.md
        §2.15). Answer on the response topic with the probe's ``id``, and whether this host holds
        ``request_id`` (admitted, waiting or running; not one still in the receive queue)."""
        if self._producer is None:
            return
        holds = request_id in self._calls or (self._lane is not None and self._lane.running(request_id) is not None)
        hop.send(self._producer, b"", {"id": probe_id, wire.ALIVE: "1", wire.HOLDS: "1" if holds else "0"})

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
        if self.persistent:
            request.record.status = RETURNED
        elif request.record.request_id is not None:
            with contextlib.suppress(Exception):
                await self._refuse(request, wire.UNAVAILABLE, self.terms.refusal(wire.UNAVAILABLE, started))

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
            await self._refuse(request, wire.TIMEOUT, self.terms.refusal(wire.TIMEOUT))
        except Exception as exc:
            await self._refuse(request, *self.terms.failure(exc, request.request_id))

    async def _checked(self, request: Request) -> Call:
        """:meth:`Terms.check`; in a worker thread for a request that names a caller, whose mark
        in the shared replay record waits for the broker."""
        if self._replays is None or CALLER not in request.message.properties():
            return self.terms.check(request, self._port)  # type: ignore[arg-type]
        return await asyncio.to_thread(self.terms.check, request, self._port)  # type: ignore[arg-type]

    async def _invoke(self, request: Request, call: Call) -> None:
        """Run the call and send its reply: one response, or for a generator one per chunk
        (:meth:`tghost.serving.request.Request.chunk`) then an empty last one."""
        spans = request.record.spans
        result = await self.executor.run(call, spans.stage if spans is not None else None)
        if isinstance(result, str):
            await self._reply(request, None, wire.encode_response(result))
            return
        try:
            async with contextlib.aclosing(result):
                async for chunk in result:
                    full = request.chunk(self._port, chunk)  # type: ignore[arg-type]
                    if full is None:
                        return
                    await confirmed_on_loop(full)
        finally:
            rest = request.rest()
        await confirmed_on_loop(rest)
        await self._reply(request, None, wire.encode_response("", True))

    async def _refuse(self, request: Request, error_type: str, text: str) -> None:
        """Answer the request with an error reply of ``error_type`` saying ``text``."""
        await self._reply(request, error_type, self.terms.error(request.request_id, error_type, text))

    async def _reply(self, request: Request, status: str | None, payload: bytes) -> None:
        """Claim the request and send its last reply (``status``: the error type, ``None`` for a
        result). A persistent request's reply is waited for, since the request is acknowledged
        only once the broker has it. A non-persistent one's is not: the broker never delivers a
        non-persistent request again, so the acknowledgement changes nothing, and waiting would
        cost a hop and the client's I/O thread the GIL (docs/internals/performance.md §1). The producer is
        flushed before it closes. A persistent request whose reply the broker did not take is
        left unacknowledged (:data:`~tghost.serving.request.RETURNED`), for another delivery."""
        if not request.claim(status, self._port):
            return
        port: Port = self._port  # type: ignore[assignment]
        if not self.persistent:
            port.send(request, payload, status is None)
            return
        receipt = asyncio.ensure_future(port.receipt(request, payload, status is None))
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
                        "unacknowledged, so the broker delivers it again", self.descriptor.id, request.request_id, exc)
            request.record.status = RETURNED

    def hand_off(self) -> None:
        """Another endpoint of this host serves the service from now on (a toolset's new object
        of the same id, started already): :meth:`stop_receiving` then closes the request consumer
        at once, with no lookout, and serves the requests that still reach it meanwhile instead
        of answering them ``unavailable``."""
        self._handed_off = True

    async def stop_receiving(self) -> None:
        """Stop taking new requests; in-flight ones go on (see :meth:`drain`).

        Every request that reached this host and did not start (waiting for a slot, or arriving
        now) is answered ``unavailable`` at once. A non-persistent topic's request consumer is
        closed as soon as another host is seen sharing the subscription
        (:class:`tghost.serving.handoff.PeerLookout`), so the broker routes new requests there; a
        host that is the only one stays subscribed until :meth:`close` and answers them
        ``unavailable`` (the broker would drop them otherwise). A persistent topic's requests
        stay with the broker, for another host or this service's next start: its consumer
        prefetches nothing and stops asking. After :meth:`hand_off`, see there.
        """
        self._stopping = True
        if not self._handed_off:
            self._refuse_waiting()
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        elif self._handed_off and self._unsubscribing is None:
            self._unsubscribing = asyncio.create_task(self._unsubscribe())
            await self._unsubscribing  # what it receives until then is in flight, for the drain
        elif self._consumer is not None and self._client is not None:
            await self._look_for_peers(self._client)

    def _refuse_waiting(self) -> None:
        """Answer ``unavailable`` every request waiting for a slot, now and from now on."""
        if self._lane is not None:
            self._lane.stop()
        for task in list(self._waiting):
            task.cancel(NOT_STARTED)

    async def _look_for_peers(self, client: pulsar.asyncio.Client) -> None:
        """Without a lookout (no broker now, or it does not answer in time) the consumer stays
        subscribed and answers ``unavailable`` until :meth:`close`."""
        if not self.is_connected():
            return
        self._peers = peers = handoff.PeerLookout(self._hand_off)  # told of every request from now on
        try:
            async with asyncio.timeout(handoff.LOOKOUT_TIMEOUT):
                await peers.start(client, self.descriptor.request_queue, self.subscription)
        except Exception as exc:
            self._peers = None
            await peers.close()
            log.debug("service %s: cannot look out for other hosts while draining: %r", self.descriptor.id, exc)

    def _hand_off(self) -> None:
        """Another host shares the subscription: close the request consumer now (once)."""
        if self._unsubscribing is None:
            log.info("service %s: another host serves it; stopped receiving its requests here", self.descriptor.id)
            self._unsubscribing = asyncio.create_task(self._unsubscribe())

    async def _unsubscribe(self) -> None:
        """Close the request consumer, then the lookout. On a hand-off this runs as the draining
        consumer has just received a request: a Shared subscription deals requests out in turn,
        so the next ones go to the other hosts while the close reaches the broker (a request the
        broker sends to a consumer that is closing is dropped by the client, unanswered)."""
        if self._consumer is not None:
            await self._quietly("close the consumer", self._consumer.close())
        if self._peers is not None:
            await self._peers.close()

    async def drain(self, grace: float, over: asyncio.Event | None = None) -> int:
        """Wait up to ``grace`` seconds (or until ``over`` is set: a second Ctrl-C) for in-flight
        calls; cancel the rest, which are answered ``unavailable`` (persistent: returned to the
        broker). Returns how many were cancelled."""
        if not self.in_flight:
            return 0
        finished = asyncio.ensure_future(self._all_answered())
        ended = asyncio.ensure_future((over or asyncio.Event()).wait())
        await asyncio.wait({finished, ended}, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
        finished.cancel()
        ended.cancel()
        pending = [task for task in self._tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)  # let them answer 'unavailable'
        return len(pending) + (self._lane.cut_off() if self._lane is not None else 0)

    async def _all_answered(self) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks))
        if self._lane is not None:
            await self._lane.idle()

    async def release(self) -> None:
        """Let go of the executor's workers (a thread still in a plugin runs on; worker processes
        stop), once :meth:`drain` is over. The request consumer stays as it is: a host that is
        the only one answers ``unavailable`` until :meth:`close`. Runs once; errors are logged."""
        if not self._released:
            self._released = True
            await self._close_executor()

    async def close(self) -> None:
        """Close the consumer (first answering ``unavailable`` what arrived until then) and the
        producer, and :meth:`release` the workers if that was not done; errors are logged, not raised."""
        await self.release()
        await self._control.close()
        await self._unshare_replays()
        if self._unsubscribing is None:
            self._unsubscribing = asyncio.create_task(self._unsubscribe())
        await self._unsubscribing
        if self._tasks:  # 'unavailable' answers to requests that arrived while stopping
            await asyncio.wait(set(self._tasks), timeout=1.0)
        self._unanswerable.flush(force=True)
        if self._producer is not None:
            await self._quietly("flush the producer", self._producer.flush())
            await self._quietly("close the producer", self._producer.close())

    async def _close_executor(self) -> None:
        if self._lane is not None:
            self._lane.close()
        await self.executor.close()

    async def _quietly(self, what: str, closing: Any) -> None:
        try:
            await closing
        except Exception as exc:
            log.debug("service %s: could not %s: %s", self.descriptor.id, what, exc)
