"""directory + announce: hosts announce, the directory catches up, follows, expires and invokes."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import tghost
from tghost.broker import EmbeddedBroker, PulsarSettings
from tghost.client import ToolCallError
from tghost.directory import Change, ToolDirectory
from tghost.discover import catalog_of
from tghost.testing import LocalHost


@tghost.tool(service="kb", config=["collection"])
async def search(question: str, collection: str, ctx: tghost.Context) -> str:
    """Search a collection."""
    return f"{ctx.user} asked {collection}: {question}"


@tghost.tool(group=["math"], state="counted")
async def count(text: str) -> int:
    """Count characters."""
    return len(text)


def kb_catalog() -> Any:
    return catalog_of([search, count], [search.tool("query-customers", collection="customers"),
                                        search.tool("query-products", collection="products", group=["sales"])])


@pytest.fixture
def topic() -> str:
    """A fresh descriptors topic per test, so tests never see each other's hosts."""
    return f"persistent://tg/config/test-{uuid.uuid4().hex[:8]}"


async def directory(broker: EmbeddedBroker, topic: str) -> ToolDirectory:
    return await ToolDirectory(PulsarSettings(broker.url), topic, expiry_interval=0.05).start()


async def next_changes(changes: AsyncIterator[Change], n: int) -> list[tuple[str, str]]:
    """The next ``n`` changes as (kind, name), waiting at most 10 s."""
    async with asyncio.timeout(10):
        return [(change.kind, change.name) for change in [await anext(changes) for _ in range(n)]]


async def test_a_directory_started_after_the_host_catches_up(pulsar_broker: EmbeddedBroker, topic: str) -> None:
    async with LocalHost(pulsar_broker.url, kb_catalog(), announce_as="host-a", topic=topic):
        found = await directory(pulsar_broker, topic)
        try:
            assert sorted(found.tools) == ["count", "query-customers", "query-products"]
            tool = found.tools["query-customers"]
            assert tool.descriptor.config == {"collection": "customers"}
            assert [p.host["id"] for p in tool.providers] == ["host-a"]
            assert tool.providers[0].plugin == {"entry_point": "local", "distribution": None, "version": None}
            assert found.services["kb"].descriptor.required_config == ("collection",)
        finally:
            await found.close()


async def test_a_following_directory_sees_tools_added_then_removed_on_withdraw(
    pulsar_broker: EmbeddedBroker, topic: str
) -> None:
    found = await directory(pulsar_broker, topic)
    changes = found.changes()
    first = asyncio.ensure_future(anext(changes))  # start watching before the host starts
    await asyncio.sleep(0)
    try:
        async with LocalHost(pulsar_broker.url, kb_catalog(), announce_as="host-a", topic=topic):
            added = [(await first).kind] + [k for k, _ in await next_changes(changes, 2)]
            assert added == ["added"] * 3 and sorted(found.tools) == ["count", "query-customers", "query-products"]
        removed = await next_changes(changes, 3)
        assert sorted(removed) == [("removed", "count"), ("removed", "query-customers"),
                                   ("removed", "query-products")]
        assert found.tools == {}
    finally:
        await changes.aclose()
        await found.close()


async def test_a_host_that_stops_heartbeating_expires_after_its_lease(
    pulsar_broker: EmbeddedBroker, topic: str
) -> None:
    found = await directory(pulsar_broker, topic)
    host = LocalHost(pulsar_broker.url, kb_catalog(), announce_as="dying", lease=0.6, topic=topic)
    try:
        await host.__aenter__()
        for name in ("count", "query-customers", "query-products"):
            await found.wait_for(name)
        assert host.announcer is not None and host.announcer._heartbeat is not None
        changes = found.changes()
        host.announcer._heartbeat.cancel()  # the host "dies": no heartbeat, no withdraw
        expired = await next_changes(changes, 3)
        assert {kind for kind, _ in expired} == {"expired"} and found.tools == {}
    finally:
        host.announcer = None
        await host.__aexit__(None, None, None)
        await found.close()


async def test_heartbeats_keep_a_short_lease_alive(pulsar_broker: EmbeddedBroker, topic: str) -> None:
    found = await directory(pulsar_broker, topic)
    try:
        async with LocalHost(pulsar_broker.url, kb_catalog(), announce_as="steady", lease=0.6, topic=topic) as host:
            await found.wait_for("count")
            await asyncio.sleep(2.0)  # more than three leases
            assert "count" in found.tools
            assert host.announcer is not None and host.announcer.sent > 3 + 3 * 2
    finally:
        await found.close()


async def test_two_providers_keep_a_service_alive_when_one_leaves(pulsar_broker: EmbeddedBroker, topic: str) -> None:
    found = await directory(pulsar_broker, topic)
    try:
        async with LocalHost(pulsar_broker.url, kb_catalog(), announce_as="one", topic=topic) as one:
            async with LocalHost(pulsar_broker.url, kb_catalog(), announce_as="two", topic=topic) as two:
                await asyncio.sleep(0.3)
                assert sorted(p.host["id"] for p in found.tools["count"].providers) == ["one", "two"]
                results = await asyncio.gather(*(found.invoke("count", {"text": "x" * i}, groups=["*"])
                                                 for i in range(30)))
                assert results == [str(i) for i in range(30)]
                received = [w.counters["received"] for h in (one, two) for w in h.server.workers
                            if w.descriptor.id == "count"]
                assert all(r > 0 for r in received) and sum(received) == 30
            await asyncio.sleep(0.3)
            assert [p.host["id"] for p in found.tools["count"].providers] == ["one"]
            assert await found.invoke("count", {"text": "after"}, groups=["math"]) == "5"
    finally:
        await found.close()


async def test_invoke_merges_the_tools_config_values_into_the_request(
    pulsar_broker: EmbeddedBroker, topic: str
) -> None:
    async with LocalHost(pulsar_broker.url, kb_catalog(), announce_as="h", topic=topic):
        found = await directory(pulsar_broker, topic)
        try:
            answer = await found.invoke("query-customers", {"question": "refunds?"}, user="alice")
            assert answer == "alice asked customers: refunds?"
            chunks = [c async for c in found.stream("query-products", {"question": "x"}, groups=["sales"])]
            assert chunks == ["trustgraph asked products: x"]
        finally:
            await found.close()


async def test_invoke_refuses_tools_the_groups_and_state_do_not_allow(
    pulsar_broker: EmbeddedBroker, topic: str
) -> None:
    async with LocalHost(pulsar_broker.url, kb_catalog(), announce_as="h", topic=topic):
        found = await directory(pulsar_broker, topic)
        try:
            with pytest.raises(ToolCallError) as info:
                await found.invoke("query-products", {"question": "x"})  # in "sales", not "default"
            assert info.value.error_type == "not-allowed" and "groups ['sales']" in info.value.message
            with pytest.raises(ToolCallError) as unknown:
                await found.invoke("no-such-tool", {})
            assert unknown.value.error_type == "unknown-tool"
        finally:
            await found.close()


async def test_filtered_sets_are_cached_and_invalidated_on_change(pulsar_broker: EmbeddedBroker, topic: str) -> None:
    found = await directory(pulsar_broker, topic)
    try:
        assert found.available(["*"]) == []
        async with LocalHost(pulsar_broker.url, kb_catalog(), announce_as="h", topic=topic):
            await found.wait_for("count")
            await asyncio.sleep(0.2)
            first = found.available(["math"])
            assert [t.name for t in first] == ["count"]
            assert found.available(["math"]) is first  # cached
        await found.wait_for("count", present=False)
        assert found.available(["math"]) == []
    finally:
        await found.close()


async def test_a_tool_name_claimed_by_two_services_is_a_reported_deterministic_conflict(
    pulsar_broker: EmbeddedBroker, topic: str
) -> None:
    @tghost.tool(service="other-counter", name="count")
    async def impostor(text: str) -> str:
        return "hijacked"

    first = LocalHost(pulsar_broker.url, kb_catalog(), announce_as="first", topic=topic)
    second = LocalHost(pulsar_broker.url, [impostor], announce_as="second", topic=topic)
    async with first, second:
        found = await directory(pulsar_broker, topic)
        try:
            assert found.tools["count"].descriptor.service == "count"
            assert found.conflicts == {"count": ["other-counter"]}
            assert await found.invoke("count", {"text": "abc"}, groups=["*"]) == "3"
        finally:
            await found.close()


async def test_garbage_and_wrong_shapes_on_the_topic_are_counted_and_never_replace_a_tool(
    pulsar_broker: EmbeddedBroker, topic: str
) -> None:
    async with LocalHost(pulsar_broker.url, kb_catalog(), announce_as="h", topic=topic) as host:
        assert host.client is not None
        producer = await host.client.create_producer(topic, batching_enabled=False)
        good = {"kind": "tool", "name": "count", "status": "available", "host": {"id": "h"},
                "lease": {"seconds": 30, "sent_at": 0}}
        for payload in [b"\xff not json", b"[]", json.dumps({**good, "descriptor": {"name": "count"}}).encode(),
                        json.dumps({**good, "descriptor": {**found_tool(), "name": "other"}}).encode(),
                        json.dumps({**good, "kind": "gadget"}).encode()]:
            await producer.send(payload, partition_key="tool/count@h")
        await producer.close()
        found = await directory(pulsar_broker, topic)
        try:
            assert found.rejected == 5
            assert found.tools["count"].descriptor.description == "Count characters."
        finally:
            await found.close()


def found_tool() -> dict[str, Any]:
    return {"type": "tool-service", "name": "count", "description": "forged", "service": "count"}
