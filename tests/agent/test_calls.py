"""calls: how long a call waits, and what a call of a tool that no live host serves says."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest

from tghost.agent.client import ToolCallError, call_timeout
from tghost.agent.directory import ToolDirectory
from tghost.announcing.announcer import announcement_key
from tghost.protocol.announcement import current_topic
from tghost.protocol.descriptors import DEFAULT_TIMEOUT, ToolServiceDescriptor
from tghost.pulsar.clients import PulsarSettings
from tghost.pulsar.embedded import EmbeddedBroker
from tghost.serving.settings import ServeSettings


@pytest.fixture
def topic() -> str:
    """A fresh descriptors topic per test, so tests never see each other's hosts."""
    return f"persistent://tg/config/calls-{uuid.uuid4().hex[:8]}"


async def announce_silent(url: str, topic: str, timeout: float | None, host: str = "h", lease: float = 30.0) -> None:
    """Announce, as host ``host``, the service ``silent`` (on a topic nobody serves, with this
    ``timeout``) and its tool ``hush``."""
    queue = f"silent-{uuid.uuid4().hex[:8]}"
    service = {"id": "silent", "request-queue": f"non-persistent://tg/request/{queue}",
               "response-queue": f"non-persistent://tg/response/{queue}",
               **({} if timeout is None else {"timeout": timeout})}
    tool = {"name": "hush", "description": "Never answers.", "service": "silent"}
    client = await PulsarSettings(url).connect()
    try:
        producer = await client.create_producer(current_topic(topic), batching_enabled=False)
        for kind, name, descriptor in [("tool-service", "silent", service), ("tool", "hush", tool)]:
            value = {"kind": kind, "name": name, "status": "available", "host": {"id": host},
                     "descriptor": descriptor, "plugin": None, "lease": {"seconds": lease, "sent_at": time.time()}}
            await producer.send(json.dumps(value).encode(), partition_key=announcement_key(kind, name, host))
        await producer.close()
    finally:
        await client.close()


def test_a_call_waits_as_given_else_as_its_service_says_else_as_a_host_does() -> None:
    service: dict[str, Any] = {"id": "s", "request-queue": "rq", "response-queue": "rs"}
    untimed, timed = (ToolServiceDescriptor.model_validate(service),
                      ToolServiceDescriptor.model_validate({**service, "timeout": 120}))
    assert call_timeout(untimed) == DEFAULT_TIMEOUT == ServeSettings().timeout == 30
    assert call_timeout(timed) == 120 and call_timeout(timed, 5) == 5 and call_timeout(None) == 30


async def test_invoke_waits_as_long_as_the_service_announces_by_default(
    pulsar_broker: EmbeddedBroker, topic: str
) -> None:
    await announce_silent(pulsar_broker.url, topic, timeout=0.3)
    async with ToolDirectory(PulsarSettings(pulsar_broker.url), topic) as found:
        assert "hush" in found.tools
        async with asyncio.timeout(10):  # the old default waited 60 s
            with pytest.raises(ToolCallError, match=r"^timeout: no complete answer .* within 0\.3s"):
                await found.invoke("hush", {})
