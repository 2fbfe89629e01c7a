"""The physical floor for the round trip: a raw ``pulsar.asyncio`` echo server, no tghost host.

``python -m bench.echo_server URL TOPIC`` subscribes (Shared) to ``non-persistent://tg/request/TOPIC``
and answers each request on the response topic with the seed 000 envelope, echoing the ``id``
property and the ``text`` argument; batching off. Runs until killed.
"""

from __future__ import annotations

import asyncio
import sys

import pulsar
import pulsar.asyncio

from tghost import wire
from tghost.descriptors import request_queue, response_queue


async def reply(producer: pulsar.asyncio.Producer, consumer: pulsar.asyncio.Consumer, message: pulsar.Message) -> None:
    """Answer one request with its ``text`` argument and acknowledge it."""
    text = wire.decode_request(message.data()).arguments.get("text", "")
    await producer.send(wire.encode_response(str(text)), properties={"id": message.properties()["id"]})
    await consumer.acknowledge(message)


async def serve(url: str, topic: str) -> None:
    """Answer every request concurrently (one task each), forever."""
    client = pulsar.asyncio.Client(url)
    producer = await client.create_producer(response_queue(topic), batching_enabled=False, block_if_queue_full=True)
    consumer = await client.subscribe(request_queue(topic), f"{topic}-request",
                                      consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1000)
    replies: set[asyncio.Task[None]] = set()
    while True:
        task = asyncio.create_task(reply(producer, consumer, await consumer.receive()))
        replies.add(task)
        task.add_done_callback(replies.discard)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2]))
