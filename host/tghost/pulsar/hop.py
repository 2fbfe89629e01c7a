"""hop: the Pulsar client's threads meet the event loop here, once per message.

``pulsar.asyncio`` hops from the C++ client's threads into the loop for every receive, every
send and every acknowledgement. The hot paths (serve, call) instead get each message from a
C++ *message listener* and cross into the loop through a :class:`Mailbox`: one
``call_soon_threadsafe`` per batch of messages, however many arrive while the loop is busy.
Replies go out with the C++ producer's ``send_async``, with no callback unless a receipt is
awaited; acknowledgements need no hop at all.

The functions take the ``pulsar.asyncio`` objects tghost already holds and use the C++
objects under them (``_client``, ``_producer``, ``_consumer``: pulsar-client 3.x).
Never knows about services, tools or the wire format.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import _pulsar
import pulsar
import pulsar.asyncio
import pulsar.schema

__all__ = [
    "STREAM_WINDOW", "SWITCH_INTERVAL", "Listener", "Mailbox", "acknowledge", "leave", "permits_taken", "receipt",
    "send", "subscribe_listening",
]

#: Called on a C++ listener thread with the raw ``_pulsar.Consumer`` and ``_pulsar.Message``;
#: must not block (hand the message to a :class:`Mailbox`).
Listener = Callable[[Any, Any], None]

_BYTES = pulsar.schema.BytesSchema()
log = logging.getLogger(__name__)

#: Seconds for ``sys.setswitchinterval`` in a process that serves (``tghost run``): the C++
#: client's listener and I/O threads need the GIL for every message (the listener, the send
#: receipt) and, while the event loop is busy, wait for it up to this long; Python's default
#: 5 ms delays replies under load (docs/internals/performance.md).
SWITCH_INTERVAL = 0.0005
#: Chunks of one stream sent before the sender waits for the broker to have them all. A
#: non-persistent topic has no flow control from the consumer back to the producer: a caller's
#: consumer whose queue is full loses what the broker sends it, so a stream is paced by the
#: broker's receipts, and a window keeps it within a slow caller's reach.
STREAM_WINDOW = 64


class Mailbox:
    """Calls handed in from any thread, run on ``loop`` in arrival order.

    :meth:`put` appends to a deque and, only when no drain is already scheduled, schedules one
    with ``loop.call_soon_threadsafe``: a burst of messages costs one wake-up of the loop. An
    exception in a call is the loop's exception handler's (logged); the next calls still run.
    Calls put after the loop closed are dropped.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._calls: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = collections.deque()
        self._scheduled = False

    def put(self, call: Callable[..., None], *args: Any) -> None:
        """Run ``call(*args)`` on the loop soon; safe from any thread, never blocks."""
        self._calls.append((call, args))
        if not self._scheduled:
            self._scheduled = True
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: nothing will run these
                self._calls.clear()

    def _drain(self) -> None:
        self._scheduled = False  # before taking: a put after this schedules a new drain
        calls = self._calls
        while calls:
            call, args = calls.popleft()
            try:
                call(*args)
            except Exception as exc:
                self.loop.call_exception_handler({"message": f"mailbox call {call!r} failed", "exception": exc})


async def subscribe_listening(
    client: pulsar.asyncio.Client,
    topic: str,
    subscription: str,
    consumer_type: pulsar.ConsumerType,
    listener: Listener,
    receiver_queue_size: int = 1000,
    dead_letter_policy: pulsar.ConsumerDeadLetterPolicy | None = None,
) -> pulsar.asyncio.Consumer:
    """Subscribe with a C++ message listener (``pulsar.asyncio`` has no such option): every
    message goes to ``listener`` on the client's listener thread; ``receive`` is not allowed.

    Returns the ``pulsar.asyncio.Consumer`` around the C++ consumer (for ``close`` and
    ``is_connected``; its ``_consumer`` is what :func:`acknowledge` takes), once the broker took
    its first permits (:func:`permits_taken`).

    Raises:
        pulsar.asyncio.PulsarException: the broker refused the subscription.
    """
    conf = _pulsar.ConsumerConfiguration()
    conf.consumer_type(consumer_type)
    conf.receiver_queue_size(receiver_queue_size)
    conf.schema(_BYTES.schema_info())
    if dead_letter_policy is not None:
        conf.dead_letter_policy(dead_letter_policy.policy())
    conf.message_listener(listener)
    loop = asyncio.get_running_loop()
    created: asyncio.Future[Any] = loop.create_future()
    client._client.subscribe_async_v2(topic, subscription, conf,
                                      lambda value: loop.call_soon_threadsafe(_settle, created, value))
    consumer = pulsar.asyncio.Consumer(await created, _BYTES)
    await permits_taken(client, topic)
    return consumer


def _settle(future: asyncio.Future[Any], value: Any) -> None:
    if future.done():
        return
    if isinstance(value, _pulsar.Error):
        future.set_exception(pulsar.asyncio.PulsarException(value.error, value.message))
    else:
        future.set_result(value)


async def permits_taken(client: pulsar.asyncio.Client, topic: Any) -> None:
    """After a consumer of ``client`` subscribed on ``topic``: wait until the broker took the
    first permits it sent, if ``topic`` is one non-persistent topic (else return at once).

    The client sends them after the broker confirmed the subscription, and a non-persistent topic
    drops a message that finds no consumer with a permit: a request published in between was
    lost (1 to 2 in 1,000 subscriptions idle, 6 in 150 under load; pulsar-lite logged "Dropping
    non-persistent shared entry: no consumer with permits"). A lookup on the same client takes
    the same connection (one per broker), whose commands the broker handles in order, so its
    answer comes after the permits. On a cluster where the topic lives on another broker than
    the service URL's, the lookup goes elsewhere, and this narrows the window rather than
    closing it. A failed lookup is logged (debug) and not raised: the consumer is there.
    """
    if not (isinstance(topic, str) and topic.startswith("non-persistent://")):
        return
    try:
        await client.get_topic_partitions(topic)
    except pulsar.asyncio.PulsarException as exc:
        log.debug("after subscribing on %s, the lookup that waits for its permits failed: %s", topic, exc)


async def leave(consumer: pulsar.asyncio.Consumer) -> None:
    """Close ``consumer``, whose subscription is its own (Exclusive, a name no one else uses),
    and drop that subscription: unsubscribe, else (the broker away, or refusing) close. Never
    raises. Never for a Shared subscription other hosts use.

    pulsar-lite 0.2.0 keeps a non-persistent subscription after its consumer closed, and visits
    it for every message on the topic: 3,000 left behind by closed callers made a round trip on
    their response topic 6 times slower (0.94 to 5.75 ms). Apache Pulsar drops such a
    subscription itself when its consumer closes; unsubscribing is the same there.
    """
    try:
        await consumer.unsubscribe()
    except Exception as exc:
        log.debug("could not unsubscribe %s on %s (%s); closing the consumer", consumer.subscription_name(),
                  consumer.topic(), exc)
        with contextlib.suppress(Exception):
            await consumer.close()


def send(producer: pulsar.asyncio.Producer, payload: bytes, properties: dict[str, str],
         done: Callable[[Any, Any], None] | None = None) -> None:
    """Send ``payload`` with ``properties`` without waiting. ``done(result, message_id)``, if
    given, runs on the client's I/O thread once the broker has it (``result`` is
    ``_pulsar.Result.Ok``) or it failed; without it nothing runs then, which saves the I/O thread
    taking the GIL (about 50 µs of CPU per message, docs/internals/performance.md §1). Messages of one
    producer go out in the order sent, and ``producer.flush()`` waits for all. Blocks only when
    the producer's queue of pending messages is full and it was created with
    ``block_if_queue_full``."""
    builder = _pulsar.MessageBuilder()
    builder.content(payload)
    for key, value in properties.items():
        builder.property(key, value)
    producer._producer.send_async(builder.build(), done)


def receipt(mailbox: Mailbox, producer: pulsar.asyncio.Producer, payload: bytes,
            properties: dict[str, str]) -> asyncio.Future[None]:
    """:func:`send`, and a future on the mailbox's loop that is done once the broker has the
    message (or fails with ``pulsar.asyncio.PulsarException``); one mailbox hop."""
    future: asyncio.Future[None] = mailbox.loop.create_future()
    send(producer, payload, properties, lambda result, _: mailbox.put(_received, future, result))
    return future


def _received(future: asyncio.Future[None], result: Any) -> None:
    if future.done():
        return
    if result == _pulsar.Result.Ok:
        future.set_result(None)
    else:
        future.set_exception(pulsar.asyncio.PulsarException(result))


def acknowledge(consumer: Any, message: Any) -> None:
    """Acknowledge a raw ``_pulsar.Message`` on a raw ``_pulsar.Consumer``: no callback and no
    hop (the client groups acknowledgements, so this returns at once, and flushes them at
    close). A failure (the consumer closed) is the C++ client's to log; a persistent request
    left unacknowledged is delivered again, and the wire contract allows a duplicate reply."""
    try:
        consumer.acknowledge_async(message, None)  # no wait for the grouping tracker's answer
    except Exception as exc:  # _pulsar raises its own exception types
        log.debug("acknowledge failed: %s", exc)
