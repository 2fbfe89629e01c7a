"""pydantic_ai: a Pydantic AI agent with a DirectoryToolset, driven by the framework's
FunctionModel (no network, no LLM), on the embedded broker. The agent calls a live tool and reads
its answer; it is offered only its groups' tools in the run's state, and the tool a call moves it
to; a tool of a host started mid-run is offered at the next step; a tool error reaches the model
as a result it reads; progress reaches the run's events and a cancelled run cancels the call on
its host; the directory's search finds deferred tools. Skipped unless Pydantic AI is installed
(``tox -e frameworks``)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent
from pydantic_ai.capabilities import ToolSearch
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import tghost
from tests.agent.test_view import Shop
from tests.test_docs import block, module_of
from tghost.broker import EmbeddedBroker
from tghost.integrations.pydantic_ai import DirectoryToolset, ToolProgress
from tghost.testing import LocalHost


@dataclass
class Sky:
    city: str
    sky: str


@tghost.tool(title="Forecast", read_only=True)
def forecast(city: str, ctx: tghost.Context) -> Sky:
    """Say tomorrow's weather."""
    ctx.progress(1, 2, "reading the sky")
    return Sky(city=city, sky="clear")


TOOLS = [
    {"name": "shop-login", "description": "Log in to the shop", "service": "shop", "step": "login",
     "group": ["shop"], "state": "in", "annotations": {"read-only": True}},
    {"name": "shop-browse", "description": "Browse the shop's goods", "service": "shop", "step": "browse",
     "group": ["shop"], "available_in_states": ["in"], "annotations": {"read-only": True}},
    {"name": "shop-buy", "description": "Buy the goods in the basket", "service": "shop", "step": "buy",
     "group": ["shop"], "available_in_states": ["in"], "annotations": {"destructive": True}},
    {"name": "shop-broken", "description": "A tool whose till is closed", "service": "shop", "step": "fail",
     "group": ["shop"]},
]


@pytest.fixture
async def directory(pulsar_broker: EmbeddedBroker, topic: str) -> AsyncIterator[tghost.ToolDirectory]:
    async with (LocalHost(pulsar_broker.url, [Shop(), forecast], tools=TOOLS, announce_as="shop-host", topic=topic),
                tghost.ToolDirectory(tghost.PulsarSettings(pulsar_broker.url), topic) as directory):
        for name in ["forecast", *(tool["name"] for tool in TOOLS)]:
            await directory.wait_for(name)
        yield directory


Call = tuple[str, dict[str, Any]]


class Script:
    """A FunctionModel's turns: each turn's tool calls (once they run out, it answers ``done``).
    Records the tools it was offered and the tool results it read at each turn."""

    def __init__(self, *turns: list[Call]) -> None:
        self.turns = list(turns)
        self.offered: list[list[str]] = []
        self.read: list[list[ToolReturnPart]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.offered.append(sorted(tool.name for tool in info.function_tools))
        self.read.append([part for part in messages[-1].parts if isinstance(part, ToolReturnPart)])
        calls = self.turns.pop(0) if self.turns else []
        return ModelResponse(parts=[ToolCallPart(name, arguments) for name, arguments in calls] or [TextPart("done")])


def agent(script: Script, toolset: Any, **options: Any) -> Agent[None, str]:
    return Agent(FunctionModel(script), toolsets=[toolset], **options)


async def test_an_agent_calls_a_live_tool_and_reads_its_answer(directory: tghost.ToolDirectory) -> None:
    script = Script([("forecast", {"city": "Oslo"})])
    result = await agent(script, DirectoryToolset(directory)).run("Weather in Oslo?")
    assert result.output == "done" and script.offered[0] == ["forecast"]
    assert [part.content for part in script.read[1]] == [{"city": "Oslo", "sky": "clear"}]


async def test_each_tool_is_defined_by_its_descriptor(directory: tghost.ToolDirectory) -> None:
    toolset = DirectoryToolset(directory, groups=["*"], state="in")
    offered: dict[str, Any] = {}

    def look(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        offered.update({tool.name: tool for tool in info.function_tools})
        return ModelResponse(parts=[TextPart("done")])

    await Agent(FunctionModel(look), toolsets=[toolset]).run("What can you do?")
    weather, login = offered["forecast"], offered["shop-login"]
    assert weather.description == "Say tomorrow's weather."
    assert weather.parameters_json_schema == tghost.input_schema(directory.tools["forecast"].descriptor)
    assert weather.metadata == {"title": "Forecast", "annotations": {"read-only": True}}
    assert not weather.sequential and login.sequential  # shop-login moves the state
    assert offered["shop-buy"].metadata["annotations"] == {"destructive": True}
    assert toolset.view.state == "in"  # the run had its own view
    await Agent(FunctionModel(look), toolsets=[toolset.include_return_schemas()]).run("What can you do?")
    assert "Return schema:" in offered["forecast"].description  # FunctionModel's way: in the description
    assert offered["shop-login"].description == "Log in to the shop"  # a text tool has no return schema


async def test_a_group_filter_offers_only_the_groups_tools_in_the_runs_state(directory: tghost.ToolDirectory) -> None:
    script = Script()
    await agent(script, DirectoryToolset(directory, groups=["shop"])).run("Shop")
    assert script.offered == [["shop-broken", "shop-login"]]  # not forecast (group default), nor what needs "in"


async def test_the_state_a_call_moves_to_is_the_next_calls_and_a_new_run_starts_afresh(
        directory: tghost.ToolDirectory) -> None:
    script = Script([("shop-login", {})], [("shop-buy", {})])
    shop = agent(script, DirectoryToolset(directory, groups=["shop"], user="alice"))
    await shop.run("Buy it")
    assert script.offered[:2] == [["shop-broken", "shop-login"],
                                  ["shop-broken", "shop-browse", "shop-buy", "shop-login"]]
    assert [part.content for part in script.read[2]] == ["buy done for alice"]
    await shop.run("Again")
    assert script.offered[3] == ["shop-broken", "shop-login"]


async def test_globs_and_the_read_only_hint_narrow_the_tools(directory: tghost.ToolDirectory) -> None:
    script = Script()
    toolset = DirectoryToolset(directory, groups=["*"], state="in", include=["shop-*"], exclude=["*-broken"],
                               read_only=True)
    await agent(script, toolset).run("Look around")
    assert script.offered == [["shop-browse", "shop-login"]]


async def test_a_tool_of_a_host_started_mid_run_is_offered_at_the_next_step(
        pulsar_broker: EmbeddedBroker, directory: tghost.ToolDirectory, topic: str) -> None:
    @tghost.tool
    def greet(name: str) -> str:
        """Greet someone."""
        return f"hello {name}"

    offered: list[list[str]] = []
    async with contextlib.AsyncExitStack() as later:

        async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            offered.append(sorted(tool.name for tool in info.function_tools))
            if len(offered) == 1:  # a host starts while the agent runs
                await later.enter_async_context(
                    LocalHost(pulsar_broker.url, [greet], announce_as="late-host", topic=topic))
                await directory.wait_for("greet")
                return ModelResponse(parts=[ToolCallPart("forecast", {"city": "Rome"})])
            if len(offered) == 2:
                return ModelResponse(parts=[ToolCallPart("greet", {"name": "Ada"})])
            return ModelResponse(parts=[TextPart(str(messages[-1].parts[0].content))])

        result = await Agent(FunctionModel(model), toolsets=[DirectoryToolset(directory)]).run("Hi")
    assert offered[0] == ["forecast"] and offered[1] == ["forecast", "greet"]
    assert result.output == "hello Ada"


async def test_a_tool_error_reaches_the_model_as_a_result_it_reads(directory: tghost.ToolDirectory) -> None:
    script = Script([("forecast", {"town": "Oslo"}), ("shop-broken", {})])
    result = await agent(script, DirectoryToolset(directory, groups=["*"])).run("Try")
    wrong, broken = script.read[1]
    assert result.output == "done"
    assert wrong.outcome == "retried" and str(wrong.content).startswith("invalid-arguments: argument 'town'")
    assert (broken.outcome, broken.content) == ("failed", "tool-service-error: the till is closed")


async def test_progress_reaches_the_runs_events(directory: tghost.ToolDirectory) -> None:
    shop = agent(Script([("forecast", {"city": "Oslo"})]), DirectoryToolset(directory))
    told: list[ToolProgress] = []
    async with shop.iter("Weather?") as run:
        async for node in run:
            if Agent.is_call_tools_node(node):
                async with node.stream(run.ctx) as events:
                    told.extend([event async for event in events if isinstance(event, ToolProgress)])
    assert [(p.done, p.total, p.message, p.tool_name) for p in told] == [(1, 2, "reading the sky", "forecast")]


async def test_outside_a_run_a_call_still_answers_and_its_progress_goes_nowhere(
        directory: tghost.ToolDirectory) -> None:
    from pydantic_ai import RunContext
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.usage import RunUsage

    toolset, ctx = DirectoryToolset(directory), RunContext(deps=None, model=TestModel(), usage=RunUsage())
    tool = (await toolset.get_tools(ctx))["forecast"]
    assert await toolset.call_tool("forecast", {"city": "Oslo"}, ctx, tool) == {"city": "Oslo", "sky": "clear"}


async def test_a_cancelled_run_cancels_the_call_on_its_host(pulsar_broker: EmbeddedBroker, topic: str) -> None:
    started, stopped = threading.Event(), threading.Event()

    @tghost.tool
    async def nap(seconds: float) -> str:
        """Sleep, then say so."""
        started.set()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return "rested"

    async with (LocalHost(pulsar_broker.url, [nap], announce_as="nap-host", topic=topic),
                tghost.ToolDirectory(tghost.PulsarSettings(pulsar_broker.url), topic) as directory):
        await directory.wait_for("nap")
        run = asyncio.create_task(agent(Script([("nap", {"seconds": 600})]), DirectoryToolset(directory)).run("Nap"))
        assert await asyncio.to_thread(started.wait, 30)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        assert await asyncio.to_thread(stopped.wait, 30)


async def test_the_directorys_search_finds_deferred_tools(directory: tghost.ToolDirectory) -> None:
    toolset = DirectoryToolset(directory, groups=["*"])
    # "city" is only in forecast's arguments, which the directory's search reads and keyword matching does not
    script = Script([("search_tools", {"queries": ["city"]})], [("forecast", {"city": "Oslo"})])
    await agent(script, toolset.defer_loading(), capabilities=[ToolSearch(strategy=toolset.search)]).run("Weather?")
    assert script.offered[0] == ["search_tools"] and "forecast" in script.offered[1]
    assert script.read[1][0].content == {"discovered_tools": [{"name": "forecast"}]}
    assert script.read[2][0].content == {"city": "Oslo", "sky": "clear"}


PAGE = "docs/integrations/pydantic-ai.md"


async def test_the_pages_agent_answers_with_a_live_tool(pulsar_broker: EmbeddedBroker, topic: str) -> None:
    @tghost.tool(group=["default", "compute"])
    def calculate(expression: str) -> str:
        """Evaluate an arithmetic expression (a stand-in for the example calculator)."""
        return {"2 * (3 + 4)": "14"}[expression]

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        answers = [part for part in messages[-1].parts if isinstance(part, ToolReturnPart)]
        if answers:
            return ModelResponse(parts=[TextPart(str(answers[0].content))])
        return ModelResponse(parts=[ToolCallPart("calculate", {"expression": "2 * (3 + 4)"})])

    source = block(PAGE, "# agent.py: a Pydantic AI agent whose tools are tghost's live tools")
    settings = 'tghost.PulsarSettings("pulsar://localhost:6650")'
    assert settings in source
    page = module_of(source.replace(settings, f"tghost.PulsarSettings({pulsar_broker.url!r}), {topic!r}"),
                     "pydantic_ai_page_agent")
    async with LocalHost(pulsar_broker.url, [calculate], announce_as="calculator-host", topic=topic):
        assert await page.main(FunctionModel(model), "What is 2 * (3 + 4)?") == "14"


async def test_the_pages_search_set_up_finds_a_tool(directory: tghost.ToolDirectory) -> None:
    script = Script([("search_tools", {"queries": ["weather"]})], [("forecast", {"city": "Oslo"})])
    page: dict[str, Any] = {"directory": directory, "model": FunctionModel(script)}
    exec(block(PAGE, "# many tools: the model finds them with the directory's search"), page)
    await page["agent"].run("Weather in Oslo?")
    assert script.offered[0] == ["search_tools"] and script.read[2][0].content == {"city": "Oslo", "sky": "clear"}


def test_without_pydantic_ai_the_import_error_names_the_extra() -> None:
    probe = "import sys; sys.modules['pydantic_ai'] = None; import tghost.integrations.pydantic_ai"
    failed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert failed.returncode == 1
    assert 'ImportError: tghost.integrations.pydantic_ai needs Pydantic AI: pip install "tghost[pydantic-ai]"' \
        in failed.stderr
