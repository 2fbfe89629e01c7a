"""The floors for the round trip: raw echo servers on the Pulsar client, no tghost host.

``python -m bench.echo_server URL TOPIC [sync|asyncio|listener|listener-loop]`` subscribes (Shared) to
``non-persistent://tg/request/TOPIC`` and answers each request on the response topic with the
seed 000 envelope, echoing the ``id`` property and the ``text`` argument; batching off. Runs
until killed.

- ``sync`` (the reference floor): one thread of the sync ``pulsar.Client``: receive,
  acknowledge, send (waiting for the broker's receipt), next.
- ``asyncio``: ``pulsar.asyncio``, one task per request (receive, send, acknowledge: a thread
  hop into the loop for each).
- ``listener``: the client's message listener answers on the client's listener thread itself
  (``send_async`` without a callback, acknowledge): no hand-off between threads at all.
- ``listener-loop``: the listener hands each request to an asyncio loop with one
  ``call_soon_threadsafe``, where it is answered the same way: the one hand-off a host that
  runs plugins away from the client's threads cannot avoid (docs/internals/performance.md §1).
"""

from __future__ import annotations

import asyncio
import sys
import threading

import pulsar
import pulsar.asyncio

from tghost.protocol import wire
from tghost.protocol.descriptors import request_queue, response_queue


def answer(message: pulsar.Message) -> bytes:
    """The seed 000 response echoing the request's ``text`` argument."""
    return wire.encode_response(str(wire.decode_request(message.data()).arguments.get("text", "")))


def serve_sync(url: str, topic: str) -> None:
    """The floor: receive, acknowledge, send, one request after another, forever."""
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer(response_queue(topic), batching_enabled=False, block_if_queue_full=True)
    consumer = client.subscribe(request_queue(topic), f"{topic}-request", consumer_type=pulsar.ConsumerType.Shared,
                                receiver_queue_size=1000)
    while True:
        message = consumer.receive()
        consumer.acknowledge(message)
        producer.send(answer(message), properties={"id": message.properties()["id"]})


async def reply(producer: pulsar.asyncio.Producer, consumer: pulsar.asyncio.Consumer, message: pulsar.Message) -> None:
    """Answer one request with its ``text`` argument and acknowledge it."""
    await producer.send(answer(message), properties={"id": message.properties()["id"]})
    await consumer.acknowledge(message)


async def serve_asyncio(url: str, topic: str) -> None:
    """Answer every request concurrently (one task each), forever."""
    client = pulsar.asyncio.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = await client.create_producer(response_queue(topic), batching_enabled=False, block_if_queue_full=True)
    consumer = await client.subscribe(request_queue(topic), f"{topic}-request",
                                      consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1000)
    replies: set[asyncio.Task[None]] = set()
    while True:
        task = asyncio.create_task(reply(producer, consumer, await consumer.receive()))
        replies.add(task)
        task.add_done_callback(replies.discard)


def answer_now(producer: pulsar.Producer, consumer: pulsar.Consumer, message: pulsar.Message) -> None:
    """Send the answer without waiting for the broker's receipt, then acknowledge."""
    producer.send_async(answer(message), None, properties={"id": message.properties()["id"]})
    consumer.acknowledge(message)


def serve_listener(url: str, topic: str, loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Answer each request on the listener thread, or (``loop``) on ``loop`` after one hop; forever."""
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer(response_queue(topic), batching_enabled=False, block_if_queue_full=True)

    def on_message(consumer: pulsar.Consumer, message: pulsar.Message) -> None:
        if loop is None:
            answer_now(producer, consumer, message)
        else:
            loop.call_soon_threadsafe(answer_now, producer, consumer, message)

    client.subscribe(request_queue(topic), f"{topic}-request", consumer_type=pulsar.ConsumerType.Shared,
                     receiver_queue_size=1000, message_listener=on_message)
    if loop is None:
        threading.Event().wait()
    else:
        loop.run_forever()


if __name__ == "__main__":
    mode = sys.argv[3] if len(sys.argv) > 3 else "sync"
    if mode == "asyncio":
        asyncio.run(serve_asyncio(sys.argv[1], sys.argv[2]))
    elif mode == "listener":
        serve_listener(sys.argv[1], sys.argv[2])
    elif mode == "listener-loop":
        serve_listener(sys.argv[1], sys.argv[2], asyncio.new_event_loop())
    else:
        serve_sync(sys.argv[1], sys.argv[2])
