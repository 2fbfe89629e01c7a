"""handoff: does another host share a draining service's Shared subscription?

A host that shuts down should stop receiving at the broker, so that the Shared subscription
``<service-id>-request`` routes new requests to the other hosts. But on a non-persistent topic
a request published while the subscription has no consumer is dropped by the broker, never
answered: a host that is the only one must stay subscribed and answer ``unavailable`` until it
exits. The Pulsar client cannot ask the broker how many consumers a subscription has, so a
draining host finds out by looking: a :class:`PeerLookout` reads every request on the topic on
a subscription of its own, and the draining consumer reports each request it still receives.
A Shared subscription dispatches the topic's messages in order, so a request that the lookout
saw *before* one the draining consumer received, and that never reached the draining consumer,
went to another consumer: another host is there (:meth:`PeerLookout.mine`). Then the draining
host closes its request consumer. :class:`Departure` is that whole leaving, for one service's
endpoint (:mod:`tghost.serving.endpoint`): a hand-off within this host, the lookout, and the
only host's last word (docs/protocol.md §2.6).

Never answers requests: it tells the endpoint how.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import pulsar
import pulsar.asyncio

from tghost.protocol import wire
from tghost.pulsar import hop

__all__ = ["LAST_WORD_MARGIN", "LOOKOUT_TIMEOUT", "PEER_WAIT", "Departure", "PeerLookout"]

log = logging.getLogger(__name__)

#: Seconds a request the lookout saw may stay away from the draining consumer before it counts as
#: taken by another host, when no later request arrives to tell by order.
PEER_WAIT = 1.0
#: Seconds the lookout's subscription may take; a host that cannot look out stays subscribed.
LOOKOUT_TIMEOUT = 2.0
#: Seconds the only host, closing, waits beyond a caller's longest pause between sendings for the
#: last calls it answered ``unavailable`` (started: false) to come again (docs/protocol.md §2.6).
LAST_WORD_MARGIN = 0.1
#: Messages the lookout's consumer may buffer (it only notes ids; a burst beyond is not needed).
LOOKOUT_QUEUE = 1000


class PeerLookout:
    """Tells, while a host drains one service, whether another consumer shares its Shared
    subscription; calls ``found()`` once (on the loop) when one does.

    Feed it every request the draining consumer still receives with :meth:`mine` (by the
    request's ``id`` property); the lookout itself sees every request on the topic. Start with
    :meth:`start`, end with :meth:`close`.
    """

    def __init__(self, found: Callable[[], None], wait: float = PEER_WAIT) -> None:
        self._found = found
        self._wait = wait
        # seen by the lookout, not (yet) by the draining consumer: id -> (order seen, monotonic seconds)
        self._unclaimed: dict[str, tuple[int, float]] = {}
        self._count = 0
        self._early: set[str] = set()  # received by the draining consumer before the lookout saw them
        self._consumer: pulsar.asyncio.Consumer | None = None
        self.peer_found = False
        """Whether another consumer was seen taking a request (then ``found`` was called)."""
        self._closed = False

    async def start(self, client: pulsar.asyncio.Client, topic: str, subscription: str) -> PeerLookout:
        """Read every request on ``topic`` on an Exclusive subscription of its own,
        ``<subscription>-drain-<random>`` (gone when closed, on a non-persistent topic).

        Raises:
            pulsar.asyncio.PulsarException: the broker refused the subscription.
        """
        mailbox = hop.Mailbox(asyncio.get_running_loop())
        self._consumer = await client.subscribe(
            topic, f"{subscription}-drain-{uuid.uuid4().hex[:12]}", consumer_type=pulsar.ConsumerType.Exclusive,
            receiver_queue_size=LOOKOUT_QUEUE,
            message_listener=lambda consumer, message: mailbox.put(self._seen, message.properties().get("id")))
        return self

    async def try_start(self, client: pulsar.asyncio.Client, topic: str, subscription: str) -> bool:
        """:meth:`start` within :data:`LOOKOUT_TIMEOUT`; False (logged, closed) when it cannot
        (no broker now, or it does not answer in time)."""
        try:
            async with asyncio.timeout(LOOKOUT_TIMEOUT):
                await self.start(client, topic, subscription)
        except Exception as exc:
            await self.close()
            log.debug("cannot look out for other hosts on %s while draining: %r", subscription, exc)
            return False
        return True

    def _seen(self, request_id: str | None) -> None:
        if request_id is None or self.peer_found or self._closed:
            return
        if request_id in self._early:
            self._early.discard(request_id)
            return
        now = time.monotonic()
        self._unclaimed[request_id] = (self._count, now)
        self._count += 1
        _, oldest = next(iter(self._unclaimed.values()))
        if now - oldest > self._wait:
            self._peer(f"a request seen {now - oldest:.1f}s ago never reached this host")

    def mine(self, request_id: str | None) -> None:
        """The draining consumer received ``request_id``: a request the lookout saw before it, and
        that the draining consumer did not receive, went to another consumer."""
        if request_id is None or self.peer_found or self._closed:
            return
        claimed = self._unclaimed.pop(request_id, None)
        if claimed is None:
            self._early.add(request_id)
            return
        if self._unclaimed and next(iter(self._unclaimed.values()))[0] < claimed[0]:  # dicts keep insertion order
            self._peer("a request before this one went to another consumer")

    def _peer(self, why: str) -> None:
        self.peer_found = True
        self._unclaimed.clear()
        self._early.clear()
        log.debug("another consumer shares the subscription: %s", why)
        self._found()

    async def close(self) -> None:
        """Leave the lookout's subscription (:func:`tghost.pulsar.hop.leave`) and tell nothing more."""
        self._closed = True
        if self._consumer is None:
            return
        consumer, self._consumer = self._consumer, None
        await hop.leave(consumer)


class Departure:
    """How one service's endpoint leaves its Shared subscription once it stops (the module).

    - :meth:`hand_off` first: another endpoint of this host serves the service; :meth:`stop`
      closes the consumer at once, and the requests that still reach it are served.
    - Else :meth:`stop` starts a :class:`PeerLookout`, and the consumer is closed as soon as
      another host is seen; until then each request that reaches it is turned away
      (:meth:`turn_away`), answered ``unavailable`` with ``started: false``.
    - The only host stays subscribed until :meth:`leave`, at the endpoint's close: from
      :meth:`last_word` on, its ``unavailable`` says nothing of a start (a caller would send the
      call again to a subscription nobody reads), and it waits out a caller's longest pause after
      the last ``started: false`` before it closes the consumer.

    ``close_consumer`` closes the request consumer (errors are the endpoint's to log).
    """

    def __init__(self, service_id: str, close_consumer: Callable[[], Awaitable[None]]) -> None:
        self._service_id = service_id
        self._close_consumer = close_consumer
        self.stopping = False
        """Whether the service stopped taking new calls."""
        self.handed_off = False
        """Whether another endpoint of this host serves the service (:meth:`hand_off`)."""
        self._peers: PeerLookout | None = None  # while draining, until another host is seen
        self._leaving: asyncio.Task[None] | None = None  # closing the consumer, once
        self._sent_away = 0.0  # when a request was last answered 'unavailable', started: false (monotonic s)
        self._last_word = False

    @property
    def turning_away(self) -> bool:
        """Whether a request that reaches the service now is answered ``unavailable``."""
        return self.stopping and not self.handed_off

    def hand_off(self) -> None:
        """Another endpoint of this host serves the service from now on (see the class)."""
        self.handed_off = True

    async def stop(self, client: pulsar.asyncio.Client, topic: str, subscription: str, connected: bool) -> None:
        """The service stops: close the consumer now after a :meth:`hand_off` (and wait for it),
        else look out for another host (not while the broker is away: then the consumer stays
        until :meth:`leave`)."""
        self.stopping = True
        if self.handed_off:
            await self._leave_soon()
        elif connected:
            self._peers = PeerLookout(self._peer_found)  # told of every request from now on
            if not await self._peers.try_start(client, topic, subscription):
                self._peers = None

    def turn_away(self, request_id: str) -> bool:
        """A request reached the stopping service (on the loop): tell the lookout. Whether its
        ``unavailable`` says ``started: false``, so that its caller sends it again (not after
        :meth:`last_word`)."""
        if self._peers is not None:
            self._peers.mine(request_id)
        if self._last_word:
            return False
        self._sent_away = time.monotonic()
        return True

    def last_word(self) -> None:
        """The endpoint closes: if still subscribed (the only host), say nothing of a start from now on."""
        self._last_word = self._leaving is None

    async def leave(self) -> None:
        """Close the consumer, if not done; the only host first waits until every caller it
        answered ``started: false`` had its longest pause (docs/protocol.md §2.6) to send again."""
        if self._leaving is None:
            longest = wire.RESEND_PAUSE * 2 ** (wire.RESENDS - 1) + LAST_WORD_MARGIN
            await asyncio.sleep(max(0.0, self._sent_away + longest - time.monotonic()))
        await self._leave_soon()

    def _peer_found(self) -> None:
        log.info("service %s: another host serves it; stopped receiving its requests here", self._service_id)
        self._leave_soon()

    def _leave_soon(self) -> asyncio.Task[None]:
        if self._leaving is None:
            self._leaving = asyncio.create_task(self._close())
        return self._leaving

    async def _close(self) -> None:
        """Close the request consumer, then the lookout (as the draining consumer has just
        received a request: the Shared subscription deals the next ones to other hosts)."""
        await self._close_consumer()
        if self._peers is not None:
            await self._peers.close()

