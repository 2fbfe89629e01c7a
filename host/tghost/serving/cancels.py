"""cancels: a service's control topic (docs/protocol.md §2.11), where callers cancel calls and
probe whether a host of the service still lives (§2.15).

A request goes to whichever host the Shared subscription picks, so a cancel cannot follow it
there. Every host serving the service reads every cancel instead, on its own Exclusive
subscription to the non-persistent control topic, and stops the call if it runs it. A cancel
for an id this host does not run (another host's call, a finished or unknown one) costs one
dictionary lookup and is dropped.

A liveness probe is answered on the listener thread itself, never waiting for the event loop:
a host whose loop is busy (an ``async`` tool that blocks it) is slow, not dead.

Reads and checks cancels; what stopping a call means is the endpoint's and its driver's, and
what a probe's answer says is the endpoint's.
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
#: Called on the C++ listener thread with a probe's own ``id`` and the request id it names.
OnProbe = Callable[[str, str], None]


class ControlTopic:
    """This host's reader of one service's control topic: each cancel (a message with the
    ``tghost-cancel`` property and an ``id``) is handed to ``on_cancel`` on the event loop
    (through ``mailbox``), each liveness probe (``tghost-probe`` and an ``id``) to ``on_probe`` on
    the listener thread."""

    def __init__(self, descriptor: ToolServiceDescriptor, on_cancel: OnCancel, on_probe: OnProbe,
                 mailbox: hop.Mailbox) -> None:
        self.topic = wire.control_topic(descriptor.request_queue)
        self._subscription = f"{descriptor.id}-control-{uuid.uuid4().hex[:12]}"
        self._on_cancel = on_cancel
        self._on_probe = on_probe
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
        """The C++ listener thread: acknowledge, hand a cancel to the loop, answer a probe."""
        hop.acknowledge(consumer, message)
        properties = message.properties()
        request_id = properties.get("id")
        if request_id and wire.CANCEL in properties:
            self._mailbox.put(self._on_cancel, request_id, properties)
        elif request_id and wire.PROBE in properties:
            self._on_probe(request_id, properties[wire.PROBE])

    async def close(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.close()
