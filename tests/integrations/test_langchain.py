"""langchain: tghost.integrations.langchain on the embedded broker, with LangChain's own fake
chat model (no LLM, no network). An agent built with ``create_agent`` calls a live tool and gets
its answer; ``directory_tools`` are async tools with the tool's JSON Schema, hints and (for a
typed tool) the object as artifact, sharing one seed 001 state; a tool error reaches the model as
an error ``ToolMessage``; the middleware offers a tool whose host started after the agent was
built, stops offering a withdrawn one, and follows the state; progress arrives as a custom event,
and cancelling the agent's task cancels the call on its host. The page's script runs too."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import pytest
from pydantic import Field

pytest.importorskip("langchain")

from langchain.agents import create_agent
from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool

import tghost
from tests.agent import test_view
from tests.test_docs import block, module_of
from tghost.integrations.langchain import PROGRESS_EVENT, DirectoryMiddleware, directory_tools
from tghost.testing import EmbeddedBroker, LocalHost

PAGE = "docs/integrations/langchain.md"
#: The shop of tests/agent/test_view.py, and a way out of its "in" state.
SHOP = [*test_view.TOOLS, {"name": "shop-logout", "description": "Log out of the shop", "service": "shop",
                      "step": "logout", "group": ["shop"], "available_in_states": ["in"], "state": "out"}]


@dataclass
class Notes:
    topic: str
    notes: int


@tghost.tool(read_only=True, title="Calculate")
def calculate(expression: str) -> str:
    """Work out an arithmetic expression."""
    return {"2 * (3 + 4)": "14", "1 + 1": "2"}[expression]


@tghost.tool
def count_notes(topic: str) -> Notes:
    """Count the notes on a topic."""
    return Notes(topic, 3)


@tghost.tool
def divide(a: float, b: float) -> str:
    """Divide a by b."""
    if b == 0:
        raise tghost.ToolError("cannot divide by zero")
    return f"{a / b:g}"


@tghost.tool
def echo(config: str, run_manager: str) -> str:
    """Say back two arguments whose names LangChain uses for its own."""
    return f"{config} {run_manager}"


@tghost.tool
async def survey(steps: int, ctx: tghost.Context) -> str:
    """Survey in steps, saying how far it has got."""
    for step in range(1, steps + 1):
        ctx.progress(step, steps, f"step {step}")
        await asyncio.sleep(0.15)  # progress is paced: one update may be held back by a later one
    return "surveyed"


#: Set by ``nap`` when it starts, and when its host cancels it.
NAPPING, WOKEN = asyncio.Event(), asyncio.Event()


@tghost.tool
async def nap(seconds: float) -> str:
    """Sleep, then say so."""
    NAPPING.set()
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        WOKEN.set()
        raise
    return "rested"


@tghost.tool
def late(city: str) -> str:
    """Say the weather in a city (served by a host that starts late)."""
    return f"sunny in {city}"


SERVED = [calculate, count_notes, divide, echo, survey, nap]


class ScriptedModel(GenericFakeChatModel):
    """LangChain's fake chat model, answering from a script, with the ``bind_tools`` a tool-calling
    agent needs: it records the names of the tools it is offered at each model call."""

    offered: list[list[str]] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        self.offered.append(sorted(convert_to_openai_tool(tool)["function"]["name"] for tool in tools))
        return self


def scripted(*replies: AIMessage | str) -> ScriptedModel:
    return ScriptedModel(messages=iter(replies))


def call(name: str, **arguments: Any) -> AIMessage:
    """A model reply that calls tool ``name``."""
    return AIMessage(content="", tool_calls=[{"name": name, "args": arguments, "id": f"call-{name}"}])


async def ask(agent: Any, question: str = "go") -> list[Any]:
    return list((await agent.ainvoke({"messages": [{"role": "user", "content": question}]}))["messages"])


def tool_messages(messages: list[Any]) -> list[tuple[str, str, str]]:
    return [(m.name, m.status, m.content) for m in messages if isinstance(m, ToolMessage)]


@pytest.fixture
async def directory(pulsar_broker: EmbeddedBroker, topic: str) -> Any:
    async with (LocalHost(pulsar_broker.url, [*SERVED, test_view.Shop()], tools=SHOP, announce_as="langchain-host",
                          topic=topic),
                tghost.ToolDirectory(tghost.PulsarSettings(pulsar_broker.url), topic) as directory):
        for name in ["calculate", "count-notes", "divide", "echo", "survey", "nap", *(t["name"] for t in SHOP)]:
            await directory.wait_for(name)
        yield directory


async def test_an_agent_calls_a_live_tool_and_gets_its_answer(directory: Any) -> None:
    model = scripted(call("calculate", expression="2 * (3 + 4)"), "It is 14.")
    agent = create_agent(model, tools=directory_tools(directory, include=["calculate"]))
    messages = await ask(agent, "What is 2 * (3 + 4)?")
    assert tool_messages(messages) == [("calculate", "success", "14")]
    assert messages[-1].content == "It is 14." and model.offered == [["calculate"], ["calculate"]]


async def test_directory_tools_are_async_tools_with_the_schema_hints_and_artifact(directory: Any) -> None:
    tools = {tool.name: tool for tool in directory_tools(directory, exclude=["survey", "nap"])}
    assert sorted(tools) == ["calculate", "count-notes", "divide", "echo", "weather"]
    calc = tools["calculate"]
    assert calc.args_schema == tghost.input_schema(directory.tools["calculate"].descriptor)
    assert calc.metadata == {"title": "Calculate", "annotations": {"read-only": True}}
    assert await calc.ainvoke({"expression": "1 + 1"}) == "2"
    assert await tools["count-notes"].ainvoke({"topic": "pulsar"}) == '{"topic": "pulsar", "notes": 3}'
    message = await tools["count-notes"].ainvoke(call("count-notes", topic="pulsar").tool_calls[0])
    assert message.artifact == {"topic": "pulsar", "notes": 3}
    assert [t.name for t in directory_tools(directory, read_only=True)] == ["calculate"]
    assert await tools["echo"].ainvoke({"config": "a", "run_manager": "b"}) == "a b"


async def test_a_tool_error_is_the_tool_message_the_model_reads_and_the_run_goes_on(directory: Any) -> None:
    model = scripted(call("divide", a=1, b=0), call("divide", a="one", b=2), "I cannot divide by zero.")
    agent = create_agent(model, tools=directory_tools(directory, include=["divide"]))
    messages = await ask(agent)
    (_, failed, refusal), (_, invalid, complaint) = tool_messages(messages)
    assert (failed, refusal) == ("error", "tool-service-error: cannot divide by zero")
    assert invalid == "error" and complaint.startswith("invalid-arguments: ")
    assert messages[-1].content == "I cannot divide by zero."


async def test_the_tools_share_one_seed_001_state(directory: Any) -> None:
    tools = {tool.name: tool for tool in directory_tools(directory, groups=["shop"], state="in",
                                                         include=["shop-browse", "shop-logout"], user="bob")}
    assert await tools["shop-browse"].ainvoke({}) == "browse done for bob"
    assert await tools["shop-logout"].ainvoke({}) == "logout done for bob"
    assert (await tools["shop-browse"].ainvoke({})).startswith("not-allowed: ")


async def test_the_fixed_list_holds_the_tools_a_state_move_makes_available(directory: Any) -> None:
    model = scripted(call("shop-login"), call("shop-browse"), "Browsed.")
    tools = directory_tools(directory, groups=["shop"], exclude=["shop-broken"], user="carol")
    assert [tool.name for tool in tools] == ["shop-browse", "shop-buy", "shop-login", "shop-logout"]
    messages = await ask(create_agent(model, tools=tools))
    assert tool_messages(messages) == [("shop-login", "success", "login done for carol"),
                                       ("shop-browse", "success", "browse done for carol")]


async def test_the_middleware_offers_the_live_tools_at_each_model_call(
    directory: Any, pulsar_broker: EmbeddedBroker, topic: str,
) -> None:
    model = scripted("nothing to do yet", call("late", city="Paris"), "Sunny.", "no weather tool now")
    view = tghost.ToolView(directory, include=["late", "calculate"])
    agent = create_agent(model, middleware=[DirectoryMiddleware(view)])
    assert (await ask(agent))[-1].content == "nothing to do yet" and model.offered == [["calculate"]]
    async with LocalHost(pulsar_broker.url, [late], announce_as="late-host", topic=topic):
        await directory.wait_for("late")
        messages = await ask(agent, "Weather in Paris?")
    assert tool_messages(messages) == [("late", "success", "sunny in Paris")] and messages[-1].content == "Sunny."
    await directory.wait_for("late", present=False)
    assert (await ask(agent))[-1].content == "no weather tool now"
    assert model.offered == [["calculate"], ["calculate", "late"], ["calculate", "late"], ["calculate"]]


async def test_the_middleware_follows_the_views_seed_001_state(directory: Any) -> None:
    model = scripted(call("shop-login"), call("shop-browse"), "Browsed.")
    view = tghost.ToolView(directory, groups=["shop"], exclude=["shop-broken"], user="alice")
    agent = create_agent(model, middleware=[DirectoryMiddleware(view)])
    messages = await ask(agent)
    assert tool_messages(messages) == [("shop-login", "success", "login done for alice"),
                                       ("shop-browse", "success", "browse done for alice")]
    signed_in = ["shop-browse", "shop-buy", "shop-login", "shop-logout"]
    assert model.offered == [["shop-login"], signed_in, signed_in]
    assert view.state == "in" and view.fork().state is None


class Progress(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []

    async def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        if name == PROGRESS_EVENT:
            self.updates.append(data)


async def test_progress_arrives_as_a_custom_event(directory: Any) -> None:
    [tool] = directory_tools(directory, include=["survey"])
    handler = Progress()
    assert await tool.ainvoke({"steps": 2}, config={"callbacks": [handler]}) == "surveyed"
    assert handler.updates and handler.updates[-1] == {"tool": "survey", "done": 2, "total": 2, "message": "step 2"}


async def test_cancelling_the_agents_task_cancels_the_call_on_its_host(directory: Any) -> None:
    NAPPING.clear()
    WOKEN.clear()
    agent = create_agent(scripted(call("nap", seconds=60)), tools=directory_tools(directory, include=["nap"]))
    run = asyncio.create_task(ask(agent))
    await asyncio.wait_for(NAPPING.wait(), 10)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await asyncio.wait_for(WOKEN.wait(), 10)


async def test_the_pages_agent_answers_with_a_live_tool(directory: Any) -> None:
    page = module_of(block(PAGE, "# shop_agent.py"), "tghost_langchain_page")
    model = scripted(call("calculate", expression="2 * (3 + 4)"), "2 * (3 + 4) is 14.")
    assert await page.ask(page.build_agent(directory, model), "What is 2 * (3 + 4)?") == "2 * (3 + 4) is 14."
    assert await page.calculate_directly(directory) == "14"


def test_without_langchain_the_import_error_says_what_to_install() -> None:
    probe = "import sys; sys.modules['langchain'] = None\nimport tghost.integrations.langchain"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and 'pip install "tghost[langchain]"' in result.stderr.splitlines()[-1]
