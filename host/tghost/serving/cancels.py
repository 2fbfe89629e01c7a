"""cancels: a service's control topic (docs/protocol.md §2.11), where callers cancel calls.

A request goes to whichever host the Shared subscription picks, so a cancel cannot follow it
there. Every host serving the service reads every cancel instead, on its own Exclusive
subscription to the non-persistent control topic, and stops the call if it runs it. A cancel
for an id this host does not run (another host's call, a finished or unknown one) costs one
dictionary lookup and is dropped.

Reads and checks cancels; what stopping a call means is the endpoint's and its driver's.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pulsar
import pulsar.asyncio

from tghost.protocol import wire
from tghost.protocol.descriptors import ToolServiceDescriptor
from tghost.pulsar import hop

__all__ = ["ControlTopic"]

log = logging.getLogger(__name__)

#: Called on the event loop with a cancel's request id and properties.
OnCancel = Callable[[str, Mapping[str, str]], None]


class ControlTopic:
    """This host's reader of one service's control topic: each cancel (a message with the
    ``tghost-cancel`` property and an ``id``) is handed to ``on_cancel`` on the event loop
    (through ``mailbox``)."""

    def __init__(self, descriptor: ToolServiceDescriptor, on_cancel: OnCancel, mailbox: hop.Mailbox) -> None:
        self.topic = wire.control_topic(descriptor.request_queue)
        self._subscription = f"{descriptor.id}-control-{uuid.uuid4().hex[:12]}"
        self._on_cancel = on_cancel
        self._mailbox = mailbox
        self._consumer: pulsar.asyncio.Consumer | None = None  # subscribed by start()

    async def start(self, client: pulsar.asyncio.Client) -> None:
        """Subscribe (Exclusive, this host's own subscription).

        Raises:
            pulsar.asyncio.PulsarException: the broker refused the subscription.
        """
        self._consumer = await hop.subscribe_listening(client, self.topic, self._subscription,
                                                       pulsar.ConsumerType.Exclusive, self._on_message)

    def _on_message(self, consumer: Any, message: Any) -> None:
        """The C++ listener thread: acknowledge, and hand a cancel to the loop."""
        hop.acknowledge(consumer, message)
        properties = message.properties()
        request_id = properties.get("id")
        if request_id and wire.CANCEL in properties:
            self._mailbox.put(self._on_cancel, request_id, properties)

    async def close(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.close()
