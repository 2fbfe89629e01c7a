"""calls: how long a call waits, and what a call of a tool that no live host serves says."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest

import tghost
from tghost.agent.client import ToolCallError, call_timeout
from tghost.agent.directory import ToolCallRecord, ToolDirectory
from tghost.announcing.announcer import announcement_key
from tghost.broker import EmbeddedBroker
from tghost.discovery.discover import catalog_of
from tghost.protocol.announcement import current_topic
from tghost.protocol.descriptors import DEFAULT_TIMEOUT, ToolServiceDescriptor
from tghost.pulsar.clients import PulsarSettings
from tghost.serving.settings import ServeSettings
from tghost.testing import LocalHost


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
            with pytest.raises(ToolCallError, match=r"^timeout: tool 'hush' \(tool service '[^']+'\) gave no "
                                                    r"complete answer within 0\.3s"):
                await found.invoke("hush", {})


# -- a tool that no live host serves, and one that nobody has --------------------------------


@tghost.tool(service="kb", config=["collection"])
async def search(question: str, collection: str) -> str:
    """Search a collection."""
    return f"{collection}: {question}"


@tghost.tool
async def count(text: str) -> int:
    """Count characters."""
    return len(text)


def kb_catalog() -> Any:
    return catalog_of([search, count], [search.tool("query-customers", collection="customers")])


async def test_a_name_a_tool_begins_with_suggests_that_tool_first(pulsar_broker: EmbeddedBroker, topic: str) -> None:
    @tghost.tool
    def calculate(expression: str) -> str:
        """Work out an arithmetic expression."""
        return expression

    @tghost.tool
    def crawl(url: str) -> str:
        """Fetch a page and the pages it links to."""
        return url

    async with LocalHost(pulsar_broker.url, [calculate, crawl], announce_as="h", topic=topic), \
            ToolDirectory(PulsarSettings(pulsar_broker.url), topic) as found:
        await found.wait_for("crawl")
        with pytest.raises(tghost.UnknownTool) as short:
            await found.invoke("calc", {})
    assert short.value.suggestions[0] == "calculate"


async def test_an_unknown_tool_is_answered_with_the_closest_live_names(
    pulsar_broker: EmbeddedBroker, topic: str
) -> None:
    async with LocalHost(pulsar_broker.url, kb_catalog(), announce_as="h", topic=topic), \
            ToolDirectory(PulsarSettings(pulsar_broker.url), topic) as found:
        with pytest.raises(tghost.UnknownTool) as typo:
            await found.invoke("query-customer", {"question": "q"})
        assert typo.value.error_type == "unknown-tool" and typo.value.suggestions == ("query-customers",)
        assert typo.value.message == ("no live tool named 'query-customer'; did you mean 'query-customers'? "
                                      "see 'tghost tools'")
        with pytest.raises(tghost.UnknownTool) as nothing_close:
            [chunk async for chunk in found.stream("zzz", {})]
        assert nothing_close.value.suggestions == () and "did you mean" not in nothing_close.value.message
        assert found.refusals == {"unknown-tool": 2}


async def test_a_tool_whose_hosts_left_fails_at_once_saying_no_live_host_serves_it_until_one_is_back(
    pulsar_broker: EmbeddedBroker, topic: str
) -> None:
    records: list[ToolCallRecord] = []
    async with ToolDirectory(PulsarSettings(pulsar_broker.url), topic, listeners=[records.append]) as found:
        async with LocalHost(pulsar_broker.url, kb_catalog(), announce_as="h", topic=topic):
            await found.wait_for("count")
        await found.wait_for("count", present=False)  # withdrawn: the ledger remembers who announced it
        async with asyncio.timeout(5):  # at once: nothing is sent, nothing waited for
            with pytest.raises(tghost.NoProvider) as gone:
                await found.invoke("count", {"text": "abc"})
        assert (gone.value.error_type, gone.value.kind, gone.value.name, gone.value.hosts) == (
            "no-provider", "tool", "count", ("h",))
        assert str(gone.value).startswith("no-provider: no live host serves tool 'count': host(s) h announced it "
                                          "lately, and none serves it now. Start one ('tghost run'")
        assert isinstance(gone.value, ToolCallError) and records[-1].status == "no-provider"
        assert found.calls.unserved("tool-service", "kb") is not None
        with pytest.raises(tghost.UnknownTool) as typo:
            await found.invoke("cont", {"text": "abc"})
        assert typo.value.suggestions == ("count",) and typo.value.unserved == {"count"}
        assert "did you mean 'count' (no live host serves it)?" in typo.value.message
        assert found.refusals == {"no-provider": 1, "unknown-tool": 1}

        starting = asyncio.create_task(found.wait_for("kb", kind="tool-service"))  # a caller that waits...
        async with LocalHost(pulsar_broker.url, kb_catalog(), announce_as="h2", topic=topic):
            await starting  # ...for a host that is starting
            await found.wait_for("count")
            assert await found.invoke("count", {"text": "abc"}) == "3"


def test_a_tool_installed_here_that_no_host_serves_is_no_provider_and_is_suggested() -> None:
    asked: list[int] = []

    def installed() -> set[tuple[str, str]]:
        asked.append(1)
        return {("tool", "nap"), ("tool-service", "sleeper")}

    found = ToolDirectory(PulsarSettings("pulsar://127.0.0.1:1"), "unused", installed=installed)  # never started
    assert found.calls.unserved("tool", "count") is None and asked == [1]
    with pytest.raises(tghost.NoProvider) as installed_only:
        found.check("nap")
    assert installed_only.value.hosts == () and "its plugin is installed here, but no host runs it" in str(
        installed_only.value)
    with pytest.raises(tghost.UnknownTool) as typo:
        found.check("nao")
    assert typo.value.suggestions == ("nap",) and typo.value.unserved == {"nap"}
    assert found.calls.unserved("tool-service", "sleeper") is not None


def test_among_many_names_only_those_like_the_typo_are_compared() -> None:
    from tghost.agent.calls import MAX_COMPARED, _alike

    names = {f"name-{i:05d}" for i in range(3 * MAX_COMPARED)} | {"tell-joke", "tell-a-very-long-story", "xtell-joke"}
    alike = set(_alike("tell-jok", names))
    assert "tell-joke" in alike and not alike & {"tell-a-very-long-story", "xtell-joke"}
    assert len(alike) < MAX_COMPARED and _alike("t", {"a", "b"}) == {"a", "b"}  # few names: all compared


def test_a_given_timeout_of_zero_is_kept() -> None:
    service = ToolServiceDescriptor.model_validate({"id": "s", "request-queue": "rq", "response-queue": "rs",
                                                    "timeout": 120})
    assert call_timeout(service, 0) == 0 and call_timeout(service, None) == 120
