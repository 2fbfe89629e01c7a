"""search: ranked search over the live tools (``ToolDirectory.search``, ``tghost tools
--search``, ``tghost mcp --tool-search``): ranking on a small realistic set, the index following
hosts that come and go, seed 001 filtering inside search, both MCP meta-tools through the
official SDK client, and bad requests answered clearly."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from mcp import ClientSession, types
from mcp.shared.memory import create_client_server_memory_streams

import tghost
from tests.conftest import live_tools, tghost_cli
from tghost.adapters.mcp import CALL_TOOL, SEARCH_TOOLS, Bridge
from tghost.agent.directory import ToolDirectory
from tghost.agent.search import SearchError, ToolIndex
from tghost.broker import EmbeddedBroker
from tghost.protocol.descriptors import ToolDescriptor
from tghost.pulsar.clients import PulsarSettings
from tghost.testing import LocalHost

#: A small realistic set: (name, description, {argument: description}).
TOOLS = [
    ("get-weather", "Current weather conditions for a city: temperature, wind and humidity.", {"city": "City name"}),
    ("convert-currency", "Convert an amount of money from one currency to another at today's exchange rate.",
     {"amount": "The amount", "from_currency": "ISO code", "to_currency": "ISO code"}),
    ("send-email", "Send an email message to recipients, with a subject and body.",
     {"to": "Recipient addresses", "subject": "Subject line", "body": "Message text"}),
    ("create-ticket", "Open a support ticket in the helpdesk with a summary and priority.",
     {"summary": "Problem summary", "priority": "low, normal or urgent"}),
    ("translate-text", "Translate text from one language into another.", {"text": "Text", "target_language": "Into"}),
    ("track-package", "Track a parcel shipment by its tracking number.", {"tracking_number": "Carrier number"}),
    ("stock-quote", "Latest share price for a stock ticker symbol.", {"symbol": "Ticker symbol"}),
    ("tell-joke", "Tell a joke on a given topic.", {"topic": "What the joke is about"}),
]


def descriptor(name: str, description: str, arguments: dict[str, str]) -> ToolDescriptor:
    return ToolDescriptor.model_validate({
        "name": name, "description": description, "service": name,
        "arguments": [{"name": a, "type": "string", "description": d} for a, d in arguments.items()]})


@pytest.mark.parametrize(("request_text", "tool"), [
    ("what's the weather like in Oslo", "get-weather"),
    ("convert 100 euros to dollars", "convert-currency"),
    ("email the report to my team", "send-email"),
    ("raise a helpdesk ticket about the broken printer", "create-ticket"),
    ("translate this paragraph into German", "translate-text"),
    ("where is my parcel", "track-package"),
    ("share price of ACME", "stock-quote"),
    ("a funny joke about dogs", "tell-joke"),
])
def test_a_request_ranks_the_tool_that_answers_it_first(request_text: str, tool: str) -> None:
    index = ToolIndex()
    for name, description, arguments in TOOLS:
        index.put(name, descriptor(name, description, arguments))
    ranked = list(index.ranked(request_text, lambda _: True, 3))
    assert ranked[0][0] == tool, ranked
    assert [score for _, score in ranked] == sorted((score for _, score in ranked), reverse=True)


def test_stemming_matches_other_forms_of_a_word_and_a_name_splits_at_dashes() -> None:
    index = ToolIndex()
    index.put("track-package", descriptor(*TOOLS[5]))
    index.put("tell-joke", descriptor(*TOOLS[7]))
    assert [n for n, _ in index.ranked("tracking packages", lambda _: True, 5)] == ["track-package"]
    assert [n for n, _ in index.ranked("jokes", lambda _: True, 5)] == ["tell-joke"]


@pytest.mark.parametrize(("query", "limit", "says"), [
    ("", 10, "no words to search for"),
    ("   ", 10, "no words to search for"),
    ("?!#$%&*()[]{}<>", 10, "no words to search for"),
    ("weather", 0, "limit must be a whole number from 1 to 1000, not 0"),
    ("weather", -3, "not -3"),
    ("weather", 1001, "not 1001"),
])
def test_a_request_that_cannot_be_searched_says_what_to_send(query: str, limit: int, says: str) -> None:
    index = ToolIndex()
    index.put("get-weather", descriptor(*TOOLS[0]))
    with pytest.raises(SearchError, match=says.replace("(", r"\(")):
        list(index.ranked(query, lambda _: True, limit))


def test_a_long_or_non_ascii_request_is_searched() -> None:
    index = ToolIndex()
    index.put("get-weather", descriptor(*TOOLS[0]))
    german = descriptor("translate-text", "Übersetze Text in eine andere Sprache.", {"text": "Text"})
    index.put("translate-text", german)
    assert [n for n, _ in index.ranked("weather " + "x" * 10_240, lambda _: True, 5)] == ["get-weather"]
    assert [n for n, _ in index.ranked("übersetze 東京 text", lambda _: True, 5)] == ["translate-text"]
    assert list(index.ranked("nothing matches zzzz", lambda _: True, 5)) == []
    assert list(index.ranked("is it", lambda _: True, 5)) == []  # only stop words: nothing to look for


# -- on the broker: the live index, seed 001 filtering, the CLI and the MCP meta-tools ---------


@tghost.tool(name="get-weather", group=["default", "weather"])
def get_weather(city: str) -> str:
    """Current weather conditions for a city: temperature, wind and humidity."""
    return f"sunny in {city}"


@tghost.tool(name="convert-currency", group=["finance"])
def convert_currency(amount: float, to_currency: str) -> str:
    """Convert an amount of money into another currency at today's exchange rate."""
    return f"{amount} {to_currency}"


@tghost.tool(name="dig-deeper", available_in_states=["research"])
def dig_deeper(question: str) -> str:
    """Research a question in depth, for a conversation in the research state."""
    return question


@tghost.tool(name="tell-joke")
def tell_joke(topic: str) -> str:
    """Tell a joke on a given topic."""
    return f"a joke about {topic}"


@asynccontextmanager
async def directory_of(url: str, topic: str) -> AsyncIterator[ToolDirectory]:
    async with ToolDirectory(PulsarSettings(url), topic) as directory:
        yield directory


def topic() -> str:
    return f"persistent://tg/config/search-{uuid.uuid4().hex[:8]}"


async def test_the_index_follows_hosts_that_come_and_go(pulsar_broker: EmbeddedBroker) -> None:
    where = topic()
    async with LocalHost(pulsar_broker.url, [get_weather], announce_as="one", topic=where), \
            directory_of(pulsar_broker.url, where) as directory:
        await directory.wait_for("get-weather")
        assert [f.tool.descriptor.name for f in directory.search("joke about cats", groups=["*"])] == []
        async with LocalHost(pulsar_broker.url, [tell_joke], announce_as="two", topic=where):
            await directory.wait_for("tell-joke")
            [found] = directory.search("joke about cats", groups=["*"])
            assert found.tool is directory.tools["tell-joke"] and found.score > 0
        await directory.wait_for("tell-joke", present=False)
        assert directory.search("joke about cats", groups=["*"]) == []
        assert [f.tool.descriptor.name for f in directory.search("weather in Oslo")] == ["get-weather"]


async def test_search_ranks_only_what_the_requests_groups_and_state_allow(pulsar_broker: EmbeddedBroker) -> None:
    where = topic()
    async with LocalHost(pulsar_broker.url, [get_weather, convert_currency, tell_joke, dig_deeper],
                         announce_as="one", topic=where), directory_of(pulsar_broker.url, where) as directory:
        await directory.wait_for("dig-deeper")

        def names(query: str, **options: Any) -> list[str]:
            return [f.tool.descriptor.name for f in directory.search(query, **options)]

        money = "convert money into another currency"
        assert names(money) == []  # the default group: convert-currency is only in finance
        assert names(money, groups=["finance"]) == ["convert-currency"]
        assert names("weather or a joke", groups=["weather"]) == ["get-weather"]
        assert names("research a question in depth") == []  # the default state is not research
        assert names("research a question in depth", state="research") == ["dig-deeper"]
        assert len(directory.search("weather or a joke or currency", groups=["*"], limit=2)) == 2


async def test_tghost_tools_search_prints_the_same_rows_best_first_and_refuses_an_empty_query(
    pulsar_broker: EmbeddedBroker
) -> None:
    where = topic()
    env = {**os.environ, "TGHOST_PULSAR_URL": pulsar_broker.url, "TGHOST_DESCRIPTORS_TOPIC": where}
    async with LocalHost(pulsar_broker.url, [get_weather, convert_currency, tell_joke], announce_as="one",
                         topic=where):
        every = await asyncio.to_thread(live_tools, env)
        found = await asyncio.to_thread(tghost_cli, "tools", "--search", "weather for a city", "--json", env=env)
        table = await asyncio.to_thread(tghost_cli, "tools", "--search", "joke", env=env)
        empty = await asyncio.to_thread(tghost_cli, "tools", "--search", "  ", env=env)
        stop_words = await asyncio.to_thread(tghost_cli, "tools", "--search", "is it", env=env)
        stray = await asyncio.to_thread(tghost_cli, "tools", "--limit", "3", env=env)
    rows = json.loads(found.stdout)
    assert rows[0]["name"] == "get-weather" and rows[0]["score"] > 0
    assert {k: v for k, v in rows[0].items() if k != "score"} == every["get-weather"]
    assert table.stdout.splitlines()[0].split()[-1] == "SCORE" and table.stdout.splitlines()[1].startswith("tell-joke")
    assert empty.returncode == 2 and "no words to search for" in empty.stderr and "Traceback" not in empty.stderr
    assert "Invalid value for --search:" in empty.stderr
    assert (stop_words.returncode, stop_words.stdout) == (0, "no live tool matches the search\n"), stop_words.stderr
    assert stray.returncode == 2 and "--limit goes with --search" in stray.stderr


async def test_mcp_tool_search_lists_two_tools_that_find_and_call_any_tool(pulsar_broker: EmbeddedBroker) -> None:
    where = topic()
    async with LocalHost(pulsar_broker.url, [get_weather, convert_currency, tell_joke], announce_as="one",
                         topic=where), directory_of(pulsar_broker.url, where) as directory, \
            create_client_server_memory_streams() as (client_streams, (read, write)):
        await directory.wait_for("convert-currency")
        bridge = Bridge(directory, ["*"], None, tool_search=True)
        async with anyio.create_task_group() as group:
            group.start_soon(bridge.server.run, read, write, bridge.server.create_initialization_options())
            async with ClientSession(*client_streams) as session:
                await session.initialize()
                listed = [tool.name for tool in (await session.list_tools()).tools]
                found = await session.call_tool(SEARCH_TOOLS, {"query": "exchange money to yen", "limit": 2})
                called = await session.call_tool(CALL_TOOL, {"name": "convert-currency",
                                                             "arguments": {"amount": 5, "to_currency": "JPY"}})
                wrong = await session.call_tool(CALL_TOOL, {"name": "convert-currency", "arguments": {}})
                unknown = await session.call_tool(CALL_TOOL, {"name": "convert-curency", "arguments": {}})
                bad = await session.call_tool(SEARCH_TOOLS, {"query": "!!!", "limit": 0})
                not_text = await session.call_tool(SEARCH_TOOLS, {"query": 5})
                not_whole = await session.call_tool(SEARCH_TOOLS, {"query": "joke", "limit": 1.5})
                stop_words = await session.call_tool(SEARCH_TOOLS, {"query": "is it"})
            group.cancel_scope.cancel()
    assert listed == [SEARCH_TOOLS, CALL_TOOL]
    matches = json.loads(text(found))
    assert matches[0]["name"] == "convert-currency" and matches[0]["inputSchema"]["required"] == ["amount",
                                                                                                  "to_currency"]
    assert not called.is_error and text(called) == "5.0 JPY"
    assert wrong.is_error and text(wrong).startswith("invalid-arguments")
    assert unknown.is_error and text(unknown) == ("unknown-tool: no live tool named 'convert-curency'; "
                                                   "did you mean 'convert-currency'? find one with search_tools")
    assert bad.is_error and "no words to search for" in text(bad)
    assert not_text.is_error and "needs 'query', a string" in text(not_text)
    assert not_whole.is_error and "not 1.5" in text(not_whole)
    assert not stop_words.is_error and json.loads(text(stop_words)) == []


async def test_a_contested_name_shows_the_tool_the_directory_would_call_and_says_so(
    pulsar_broker: EmbeddedBroker
) -> None:
    where = topic()

    @tghost.tool(name="tell-joke", service="other-jokes")
    def rival(topic: str) -> str:
        """Tell a joke on a given topic, from another service."""
        return "rival"

    async with LocalHost(pulsar_broker.url, [tell_joke], announce_as="first", topic=where), \
            directory_of(pulsar_broker.url, where) as directory:
        await directory.wait_for("tell-joke")
        async with LocalHost(pulsar_broker.url, [rival], announce_as="second", topic=where):
            while not directory.tools["tell-joke"].contested:
                await asyncio.sleep(0.05)
            [found] = directory.search("joke", groups=["*"])
            assert found.tool.service.descriptor.id == "tell-joke" and found.tool.contested  # the first claim
            bridge = Bridge(directory, ["*"], None, tool_search=True)
            result = bridge._search({"query": "joke"})
    [match] = json.loads(text(result))
    assert "other hosts announce this name differently" in match["conflict"] and "other-jokes" in match["conflict"]


def text(result: types.CallToolResult) -> str:
    (content,) = result.content
    assert isinstance(content, types.TextContent)
    return content.text
