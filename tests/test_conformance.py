"""conformance: the wire check in tghost.testing passes every example service and catches a
service that breaks the contract. Both sides speak to the real embedded broker."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from importlib.metadata import entry_points

import pulsar
import pytest

from tghost.broker import EmbeddedBroker
from tghost.discovery.discover import ENTRY_POINT_GROUP, discover
from tghost.protocol.descriptors import ToolServiceDescriptor, request_queue, response_queue
from tghost.pulsar.clients import PulsarSettings
from tghost.testing import LocalHost, check_conformance

#: A valid call of each example service: (arguments, config).
SAMPLES = {
    "joke-service": ({"topic": "cats"}, {"style": "pun"}),
    "calculator": ({"expression": "2 * (3 + 4)"}, {}),
    "calculator-steps": ({"expression": "2 * (3 + 4)"}, {}),
    "custom-rag": ({"question": "Who is on the enterprise tier?"}, {"collection": "customers"}),
}


def examples() -> list:
    return [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name in ("joke", "calculator", "knowledge")]


async def test_every_example_service_passes_the_wire_check(pulsar_broker: EmbeddedBroker) -> None:
    catalog = discover(examples())
    assert set(catalog.descriptors) == set(SAMPLES)  # a new example service needs a sample call here
    async with LocalHost(pulsar_broker.url, catalog):
        for service_id, (arguments, config) in SAMPLES.items():
            result = await check_conformance(pulsar_broker.url, catalog.descriptors[service_id], arguments, config)
            assert result.ok and not result.failures, str(result)
            assert len(result.findings) >= 10  # every rule was checked, none skipped for lack of replies


@contextlib.asynccontextmanager
async def sloppy_service(url: str, topic: str) -> AsyncIterator[ToolServiceDescriptor]:
    """A foreign service that answers every request with ``{"response": 42}``: no ``error``,
    a number for ``response``, no ``end_of_stream``; and undecodable requests not at all."""
    client = await PulsarSettings(url).connect()
    consumer = await client.subscribe(request_queue(topic), f"{topic}-request",
                                      consumer_type=pulsar.ConsumerType.Shared)
    producer = await client.create_producer(response_queue(topic), batching_enabled=False)

    async def serve() -> None:
        while True:
            message = await consumer.receive()
            await consumer.acknowledge(message)
            with contextlib.suppress(ValueError):
                json.loads(message.data())
                await producer.send(json.dumps({"response": 42}).encode(), properties=message.properties())

    task = asyncio.create_task(serve())
    try:
        yield ToolServiceDescriptor.model_validate({"id": topic, "request-queue": request_queue(topic),
                                                    "response-queue": response_queue(topic)})
    finally:
        task.cancel()
        await client.close()


async def test_a_service_that_breaks_the_envelope_fails_the_check(pulsar_broker: EmbeddedBroker) -> None:
    async with sloppy_service(pulsar_broker.url, "sloppy") as descriptor:
        result = await check_conformance(pulsar_broker.url, descriptor, {"x": 1}, timeout=2.0)
    assert not result.ok
    failed = {f.rule for f in result.failures}
    assert any("'end_of_stream' (boolean)" in rule for rule in failed), str(result)
    assert any("undecodable request" in rule for rule in failed), str(result)
    assert "FAIL" in str(result) and "'response' is int, not a string" in str(result)


async def test_a_service_that_never_answers_fails_the_check(pulsar_broker: EmbeddedBroker) -> None:
    silent = ToolServiceDescriptor.model_validate({"id": "silent", "request-queue": request_queue("silent"),
                                                   "response-queue": response_queue("silent")})
    result = await check_conformance(pulsar_broker.url, silent, {}, timeout=0.5)
    assert not result.ok
    assert [f.passed for f in result.findings if f.rule.startswith("§2.4 a request")] == [False, False, False]


@pytest.mark.parametrize("service_id", ["calculator-steps"])
async def test_a_streaming_service_is_checked_chunk_by_chunk(pulsar_broker: EmbeddedBroker, service_id: str) -> None:
    catalog = discover(examples())
    async with LocalHost(pulsar_broker.url, catalog) as host:
        chunks = [c async for c in host.stream(service_id, SAMPLES[service_id][0])]
        result = await check_conformance(pulsar_broker.url, catalog.descriptors[service_id], *SAMPLES[service_id])
    assert len(chunks) > 1 and result.ok
    stream_rule = next(f for f in result.findings if f.rule.startswith("§2.5 a stream ends"))
    assert stream_rule.detail == f"{len(chunks) + 1} response(s)"  # every chunk, then the empty last one
