"""cancels: a service's control topic (docs/protocol.md §2.11), where callers cancel calls and
probe whether a host of the service still lives (§2.15).

A request goes to whichever host the Shared subscription picks, so a cancel cannot follow it
there. Every host serving the service reads every cancel instead, on its own Exclusive
subscription to the non-persistent control topic, and stops the call if it runs it. A cancel
for an id this host does not run (another host's call, a finished or unknown one) costs one
dictionary lookup and is dropped.

A liveness probe is answered on the listener thread itself, never waiting for the event loop:
a host whose loop is busy (an ``async`` tool that blocks it) is slow, not dead.

Reads and checks cancels, and answers probes, from what the service's driver runs; what
stopping a call means is the driver's.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Container, Mapping
from typing import TYPE_CHECKING, Any

import pulsar
import pulsar.asyncio

from tghost.protocol import wire
from tghost.pulsar import hop
from tghost.serving.request import Terms

if TYPE_CHECKING:
    from tghost.serving.driver import Driver

__all__ = ["ControlTopic"]

log = logging.getLogger(__name__)


class ControlTopic:
    """This host's reader of one service's control topic: each cancel (a message with the
    ``tghost-cancel`` property and an ``id``) is checked and handed to ``driver`` on the event
    loop (through ``mailbox``); each liveness probe (``tghost-probe`` and an ``id``) is answered
    on ``producer`` (the response topic's) from the listener thread. ``arriving``: the request
    ids on their way from the request listener to the driver (held too); ``draining()``: whether
    the service stops (a probe's answer says so)."""

    def __init__(self, terms: Terms, driver: Driver, producer: pulsar.asyncio.Producer, mailbox: hop.Mailbox,
                 arriving: Container[str], draining: Callable[[], bool]) -> None:
        self.topic = wire.control_topic(terms.descriptor.request_queue)
        self._subscription = f"{terms.descriptor.id}-control-{uuid.uuid4().hex[:12]}"
        self._terms = terms
        self._driver = driver
        self._producer = producer
        self._mailbox = mailbox
        self._arriving = arriving
        self._draining = draining
        self._consumer: pulsar.asyncio.Consumer | None = None  # subscribed by start()

    async def start(self, client: pulsar.asyncio.Client) -> None:
        """Subscribe (Exclusive, this host's own subscription).

        Raises:
            pulsar.asyncio.PulsarException: the broker refused the subscription.
        """
        self._consumer = await hop.subscribe_listening(client, self.topic, self._subscription,
                                                       pulsar.ConsumerType.Exclusive, self._on_message)

    def _on_message(self, consumer: Any, message: Any) -> None:
        """The C++ listener thread: acknowledge, hand a cancel to the loop, answer a probe."""
        hop.acknowledge(consumer, message)
        properties = message.properties()
        request_id = properties.get("id")
        if request_id and wire.CANCEL in properties:
            self._mailbox.put(self._cancel, request_id, properties)
        elif request_id and wire.PROBE in properties:
            self._answer_probe(request_id, properties[wire.PROBE])

    def _cancel(self, request_id: str, properties: Mapping[str, str]) -> None:
        """On the loop, a cancel (docs/protocol.md §2.11): stop the call if this host runs it and
        the cancel comes from its caller; it is answered ``cancelled`` at once, and then the plugin
        is told (``tghost.Context.cancelled``), so a plugin that returns when told never answers
        first. (A worker process's call is killed later, by its task: it still reads it as a cancel.)"""
        request = self._driver.running(request_id)
        if request is None or not self._terms.may_cancel(request.record, properties, self.topic):
            return  # another host's call, a finished one, or not its caller's cancel
        self._driver.cancel(request)
        request.cancelled.set()

    def _answer_probe(self, probe_id: str, request_id: str) -> None:
        """A caller asks whether this host lives (docs/protocol.md §2.15). Answer on the response
        topic with the probe's ``id``, whether this host holds ``request_id`` (from the moment its
        listener has it: on the way to the driver, waiting or running; not one still in the
        client's receive queue) and, while the service stops, that it does."""
        holds = request_id in self._arriving or self._driver.running(request_id) is not None
        answer = {"id": probe_id, wire.ALIVE: "1", wire.HOLDS: "1" if holds else "0"}
        if self._draining():
            answer[wire.DRAINING] = "1"
        hop.send(self._producer, b"", answer)

    async def close(self) -> None:
        """Leave this host's subscription (:func:`tghost.pulsar.hop.leave`)."""
        if self._consumer is not None:
            await hop.leave(self._consumer)
