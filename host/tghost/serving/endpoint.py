"""endpoint: one tool service on Pulsar (docs/protocol.md §2): a Shared subscription
``<service-id>-request`` on its request topic, a non-batching producer on its response topic,
its control topic, and the driver that takes its requests along the request state machine.

The hot path (docs/internals/performance.md §1): each request goes to the service's driver
(:class:`tghost.serving.driver.Driver`), picked once when the endpoint opens
(:func:`tghost.serving.driver.driver_for`), from the thread that received it: the inline
driver's own receive thread, or the C++ message listener (the thread lane's; the loop driver's,
through one hop into the loop). A persistent topic is read with ``receive`` on the loop, one
request per free slot, and a request there is acknowledged only once the broker has its reply.
What no driver answers is the endpoint's own: a request without an ``id``, and one that reaches
a stopping service.

Never lets one service's faults stop another from answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import pulsar
import pulsar.asyncio

from tghost.author.hookspecs import Authorize
from tghost.author.service import ToolService
from tghost.protocol import wire
from tghost.protocol.descriptors import ToolServiceDescriptor
from tghost.protocol.trust import Signer
from tghost.pulsar import hop
from tghost.serving import executors, handoff
from tghost.serving.access import Fleet, Gate
from tghost.serving.cancels import ControlTopic
from tghost.serving.driver import Driver, Receiving, driver_for, subscription_options
from tghost.serving.executors.base import Executor
from tghost.serving.replays import SharedReplays
from tghost.serving.request import UNANSWERABLE, CallListener, CallRecord, Port, Prover, Request, Terms
from tghost.serving.settings import ServeSettings
from tghost.system.logs import LogSummary
from tghost.system.tasks import cancel_and_wait

__all__ = ["ServiceEndpoint"]

log = logging.getLogger(__name__)


class ServiceEndpoint:
    """Serves one tool service: receive, hand each request to the driver, hand off, drain, close.

    ``invoke`` runs in this service's own :class:`tghost.serving.executors.base.Executor` (worker
    threads or worker processes, ``max_concurrency`` at most), so a plugin that never returns
    starves only its own service. The checks before ``invoke`` are
    :meth:`tghost.serving.request.Terms.check`'s. Made by :meth:`open`, subscribed.
    """

    def __init__(self, terms: Terms, executor: Executor, client: pulsar.asyncio.Client, port: Port,
                 driver: Driver, mailbox: hop.Mailbox) -> None:
        self.terms = terms
        self.descriptor = terms.descriptor
        self.service = terms.service
        self.persistent = terms.persistent
        self.executor = executor
        self.counters = {"received": 0, "unanswerable": 0}
        self._client = client
        self._port = port
        self._driver = driver
        self._mailbox = mailbox
        self._consumer: pulsar.asyncio.Consumer | None = None  # subscribed in open()
        self._replays: SharedReplays | None = None  # with an access policy
        self._receiving: asyncio.Task[None] | None = None  # a driver that receives by itself
        self._departure = handoff.Departure(self.descriptor.id, self._close_consumer)
        self._released = False
        self._arriving: set[str] = set()  # request ids received, on their way to the driver (a hop)
        self._control = ControlTopic(terms, driver, port.producer, mailbox, self._arriving,
                                     lambda: self._departure.stopping)
        self._unanswerable = LogSummary(
            log, f"service {self.descriptor.id}: dropped %(count)d request(s) that cannot be answered: %(reason)s "
                 "(e.g. %(example)s); a caller must set it (docs/protocol.md §2.3)")

    @classmethod
    async def open(cls, client: pulsar.asyncio.Client, service: ToolService, descriptor: ToolServiceDescriptor,
                   settings: ServeSettings, listeners: Sequence[CallListener] = (), authorize: Authorize | None = None,
                   gate: Gate | None = None, signer: Signer | None = None, fleet: Fleet | None = None,
                   host_id: str | None = None) -> ServiceEndpoint:
        """Serve ``service``: create the response producer, start the executor, pick the driver,
        subscribe and receive (the other arguments: :class:`tghost.serving.server.Server`'s).

        Raises:
            pulsar.asyncio.PulsarException: the broker refused the producer or a subscription
                (what was opened is closed again).
        """
        terms = Terms(service, descriptor, descriptor.timeout or settings.timeout,
                      descriptor.max_concurrency or settings.max_concurrency, settings.max_queue,
                      settings.max_payload, settings.max_redeliveries, authorize, gate, fleet, host_id,
                      settings.error_detail)
        executor = executors.create(service, descriptor, terms.max_concurrency, settings.isolation,
                                    settings.worker_limits)
        mailbox = hop.Mailbox(asyncio.get_running_loop())
        producer = await client.create_producer(descriptor.response_queue, batching_enabled=False,
                                                block_if_queue_full=True)
        prover = Prover(descriptor.request_queue, gate, signer) if gate is not None or signer is not None else None
        port = Port(producer, mailbox, listeners, descriptor.id, prover, structured=service.output_schema is not None)
        await executor.start()
        endpoint = cls(terms, executor, client, port, driver_for(terms, port, executor, mailbox), mailbox)
        try:
            await endpoint._subscribe()
        except BaseException:
            await endpoint.close()
            raise
        return endpoint

    async def _subscribe(self) -> None:
        """Read the control topic and, with an access policy, the replay record the service's
        hosts share (docs/protocol.md §2.8) before the first request, then subscribe."""
        await self._control.start(self._client)
        gate = self.terms.gate
        if gate is not None:
            self._replays = await SharedReplays.open(self._client, self.descriptor.request_queue, gate.window)
            gate.share(self.descriptor.request_queue, self._replays)
        options = subscription_options(self._driver, self.terms, self._on_message)
        self._consumer = self._port.consumer = await self._client.subscribe(
            self.descriptor.request_queue, self.subscription, consumer_type=pulsar.ConsumerType.Shared, **options)
        if isinstance(self._driver, Receiving) and not self._driver.listens:
            self._receiving = asyncio.create_task(self._driver.receive(self._consumer, self._take),
                                                  name=f"receive {self.descriptor.id}")

    @property
    def subscription(self) -> str:
        """The Shared subscription name, ``<service-id>-request`` (docs/protocol.md §2.4)."""
        return f"{self.descriptor.id}-request"

    def is_connected(self) -> bool:
        """Whether the response producer is connected to the broker now."""
        return bool(self._port.producer.is_connected())

    @property
    def in_flight(self) -> int:
        """Requests received and not yet answered (running, or waiting for a slot)."""
        return self._driver.in_flight

    @property
    def stopping(self) -> bool:
        """Whether the service stopped taking new calls (:meth:`stop_receiving`)."""
        return self._departure.stopping

    def _on_message(self, consumer: Any, message: Any) -> None:
        """The C++ listener thread: a request (a raw ``_pulsar.Message``) is in; to the loop first
        for a driver that takes on the loop."""
        if self._driver.on_loop:
            request_id = message.properties().get("id")
            if request_id is not None:
                self._arriving.add(request_id)  # held from now on (a probe's answer says so)
            self._mailbox.put(self._take, message)
        else:
            self._take(message)

    def _take(self, message: Any) -> None:
        """Hand an answerable request to the driver; one without an ``id``, or one that reaches a
        stopping service that did not hand off, to the loop (:meth:`_turn_away`). (A persistent
        one the receive loop took as the service stopped goes to the driver, which answers it
        ``unavailable`` once the broker has the reply.)"""
        self.counters["received"] += 1
        request_id = message.properties().get("id")
        if request_id is None or (self._departure.turning_away and not self.persistent):
            self._mailbox.put(self._turn_away, message, request_id)
        else:
            self._driver.take(Request(CallRecord(self.descriptor.id, request_id), message))
        self._arriving.discard(request_id)  # the driver holds it now (or it is answered)

    def _turn_away(self, message: Any, request_id: str | None) -> None:
        """On the loop: acknowledge a request without an ``id`` unanswered (and count it); answer
        one that reached a stopping service ``unavailable``, telling the lookout."""
        request = Request(CallRecord(self.descriptor.id, request_id), message)
        if request_id is None:
            self.counters["unanswerable"] += 1
            request.record.status = UNANSWERABLE
            self._unanswerable.add("no 'id' property", f"message {message.message_id()} on "
                                   f"{self.descriptor.request_queue}")
            self._unanswerable.flush()
        else:
            resend = self._departure.turn_away(request_id)
            request.claim(wire.UNAVAILABLE, self._port)
            self._port.send(request, self.terms.error(request_id, wire.UNAVAILABLE,
                                                      self.terms.refusal(wire.UNAVAILABLE), started=not resend))
        self._port.settle(request.record, message, request.started)

    def hand_off(self) -> None:
        """Another endpoint of this host serves the service from now on (a toolset's new object
        of the same id, started already): :meth:`stop_receiving` then closes the request consumer
        at once, with no lookout, and serves the requests that still reach it meanwhile instead
        of answering them ``unavailable``."""
        self._departure.hand_off()

    async def stop_receiving(self) -> None:
        """Stop taking new requests; in-flight ones go on (see :meth:`drain`).

        Every request that reached this host and did not start (waiting for a slot, or arriving
        now) is answered ``unavailable`` at once. A non-persistent topic's request consumer is
        closed as soon as another host is seen sharing the subscription
        (:class:`tghost.serving.handoff.Departure`), so the broker routes new requests there; a
        host that is the only one stays subscribed until :meth:`close` and answers them
        ``unavailable`` (the broker would drop them otherwise). A persistent topic's requests
        stay with the broker, for another host or this service's next start: its consumer
        prefetches nothing and stops asking. After :meth:`hand_off`, see there.
        """
        self._departure.stopping = True
        if not self._departure.handed_off:
            self._driver.stop()
        if self.persistent and self._receiving is not None:
            await cancel_and_wait(self._receiving)
        else:  # what a handed-off consumer receives until it closes is in flight, for the drain
            await self._departure.stop(self._client, self.descriptor.request_queue, self.subscription,
                                       self._consumer is not None and self.is_connected())

    async def _close_consumer(self) -> None:
        if self._consumer is not None:
            await self._quietly("close the consumer", self._consumer.close())

    async def drain(self, grace: float, over: asyncio.Event | None = None) -> int:
        """Wait up to ``grace`` seconds (or until ``over`` is set: a second Ctrl-C) for in-flight
        calls; cut off the rest, which are answered ``unavailable`` (persistent: returned to the
        broker). Returns how many were cut off."""
        if not self.in_flight:
            return 0
        finished = asyncio.ensure_future(self._driver.idle())
        ended = asyncio.ensure_future((over or asyncio.Event()).wait())
        await asyncio.wait({finished, ended}, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
        finished.cancel()
        ended.cancel()
        return await self._driver.cut_off()

    async def release(self) -> None:
        """Let go of the executor's workers (a thread still in a plugin runs on; worker processes
        stop), once :meth:`drain` is over. The request consumer stays as it is: a host that is
        the only one answers ``unavailable`` until :meth:`close`. Runs once; errors are logged."""
        if not self._released:
            self._released = True
            self._driver.close()
            await self.executor.close()

    async def close(self) -> None:
        """Close the consumer (first answering ``unavailable`` what arrived until then) and the
        producer, and :meth:`release` the workers if that was not done; errors are logged, not raised.
        Still subscribed (the only host), it answers ``unavailable`` from now on without
        ``started: false`` (a caller would send the call again to a subscription nobody reads)."""
        self._departure.last_word()
        await self.release()
        await self._control.close()
        if self._replays is not None and self.terms.gate is not None:
            self.terms.gate.unshare(self.descriptor.request_queue, self._replays)
            await self._replays.close()
            self._replays = None
        await self._departure.leave()
        if self._receiving is not None:
            self._receiving.cancel()
        with contextlib.suppress(TimeoutError):  # the answers to requests that arrived while stopping
            async with asyncio.timeout(1.0):
                await self._driver.idle()
        self._unanswerable.flush(force=True)
        await self._quietly("flush the producer", self._port.producer.flush())
        await self._quietly("close the producer", self._port.producer.close())

    async def _quietly(self, what: str, closing: Any) -> None:
        try:
            await closing
        except Exception as exc:
            log.debug("service %s: could not %s: %s", self.descriptor.id, what, exc)
