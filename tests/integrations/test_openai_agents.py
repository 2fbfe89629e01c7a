"""openai_agents: tghost's live tools in OpenAI Agents SDK agents, on the embedded broker, each run
driven by the SDK's own scripted test model (``agents.testing.ScriptedModel``: no LLM, no network;
tracing off). An agent calls a live tool and reads its answer; a tool error reaches the model as
text and the run goes on; a successful call moves the seed 001 state and the next turn offers
what it allows; a tool announced after the agent was built is offered at the next turn through
``DirectoryServer``; cancelling the run cancels the call on its host. The guide's script runs too.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, FunctionTool, Runner, set_tracing_disabled
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

import tghost
from tests.test_docs import block, module_of
from tghost.integrations.openai_agents import DirectoryServer, directory_tools
from tghost.testing import EmbeddedBroker, LocalHost

#: Set in the test that waits on a call, to see its host cancel it.
STARTED, CANCELLED = threading.Event(), threading.Event()


class Shop(tghost.ToolService):
    id = "shop"
    description = "A tiny shop."
    config_params = (tghost.ConfigParam(name="step", required=True),)
    arguments = (tghost.Argument(name="item", type="string", description="What to act on"),)

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        step = config["step"]
        if step == "fail":
            raise tghost.ToolError("the till is closed")
        if step == "count":
            return json.dumps({"item": arguments["item"], "count": 3})
        if step == "wait":
            STARTED.set()
            if tghost.current_context().cancelled.wait(30):
                CANCELLED.set()
        return f"{step} {arguments['item']} done for {user or 'nobody'}"


COUNTED = {"type": "object", "properties": {"item": {"type": "string"}, "count": {"type": "integer"}}}
TOOLS = [
    {"name": "shop-login", "description": "Log in to the shop", "service": "shop", "step": "login",
     "group": ["shop"], "state": "in", "annotations": {"read-only": True}},
    {"name": "shop-browse", "description": "Browse the shop's goods", "service": "shop", "step": "browse",
     "group": ["shop"], "available_in_states": ["in"], "annotations": {"read-only": True}},
    {"name": "shop-count", "description": "Count an item in stock", "service": "shop", "step": "count",
     "group": ["shop"], "title": "Count stock", "output-schema": COUNTED},
    {"name": "shop-broken", "description": "A till that is closed", "service": "shop", "step": "fail",
     "group": ["shop"]},
    {"name": "shop-wait", "description": "Wait until cancelled", "service": "shop", "step": "wait",
     "group": ["shop"]},
]


def test_without_the_sdk_the_import_error_says_what_to_install() -> None:
    probe = ("import sys\nsys.modules['agents'] = None\ntry:\n    import tghost.integrations.openai_agents\n"
             "except ImportError as missing:\n    print(missing)")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert 'pip install "tghost[openai-agents]"' in shown


@pytest.fixture(autouse=True)
def no_tracing() -> None:
    set_tracing_disabled(True)


@pytest.fixture
async def directory(pulsar_broker: EmbeddedBroker, topic: str) -> AsyncIterator[tghost.ToolDirectory]:
    async with (LocalHost(pulsar_broker.url, [Shop()], tools=TOOLS, announce_as="shop-host", topic=topic),
                tghost.ToolDirectory(tghost.PulsarSettings(pulsar_broker.url), topic) as directory):
        for tool in TOOLS:
            await directory.wait_for(tool["name"])
        yield directory


def observations(call: ModelCall) -> list[Any]:
    """The tool outputs the model was given in ``call``, in order."""
    return [item["output"] for item in call.input
            if isinstance(item, dict) and item.get("type") == "function_call_output"]


def text_of(output: Any) -> str:
    """The text of one tool output: a string, or the SDK's text item(s) of an MCP result."""
    if isinstance(output, str):
        return output
    items = output if isinstance(output, list) else [output]
    return "".join(item["text"] for item in items)


def say_last_observation() -> ModelStep:
    """A model turn that answers with the last tool output it was given."""
    return ModelStep.respond(lambda call: [assistant_message(text_of(observations(call)[-1]))])


def offered(call: ModelCall) -> list[str]:
    return sorted(tool.name for tool in call.tools)


def calling(name: str, arguments: dict[str, Any],
            check: Callable[[ModelCall], None] = lambda call: None) -> ModelStep:
    """A model turn that checks what it is given, then calls tool ``name``."""
    def turn(call: ModelCall) -> list[Any]:
        check(call)
        return [function_call(name, arguments, call_id=f"call-{name}")]
    return ModelStep.respond(turn)


async def test_an_agent_calls_a_live_tool_and_reads_its_answer(directory: tghost.ToolDirectory) -> None:
    tools = directory_tools(directory, groups=["shop"], user="alice")
    assert [tool.name for tool in tools] == ["shop-broken", "shop-browse", "shop-count", "shop-login", "shop-wait"]
    assert all(isinstance(tool, FunctionTool) and not tool.strict_json_schema for tool in tools)
    assert tools[2].params_json_schema == tghost.input_schema(directory.tools["shop-count"].descriptor)
    model = ScriptedModel([calling("shop-login", {"item": "door"}), say_last_observation()])
    result = await Runner.run(Agent(name="shopper", model=model, tools=tools), "Log me in")
    assert result.final_output == "login door done for alice"


async def test_a_structured_observation_reaches_the_model_as_json_text(directory: tghost.ToolDirectory) -> None:
    model = ScriptedModel([calling("shop-count", {"item": "tea"}), say_last_observation()])
    result = await Runner.run(Agent(name="shopper", model=model, tools=directory_tools(directory, groups=["shop"])),
                              "How much tea?")
    assert json.loads(result.final_output) == {"item": "tea", "count": 3}


@pytest.mark.parametrize(("name", "arguments", "said"), [
    ("shop-broken", {"item": "tea"}, "tool-service-error: the till is closed"),
    ("shop-count", {"item": 7}, "invalid-arguments: "),
])
async def test_a_tool_error_reaches_the_model_as_text_and_the_run_goes_on(
        directory: tghost.ToolDirectory, name: str, arguments: dict[str, Any], said: str) -> None:
    model = ScriptedModel([calling(name, arguments), say_last_observation()])
    result = await Runner.run(Agent(name="shopper", model=model, tools=directory_tools(directory, groups=["shop"])),
                              "Go")
    assert result.final_output.startswith(said), result.final_output


async def test_arguments_that_are_not_a_json_object_are_an_error_the_model_reads(
        directory: tghost.ToolDirectory) -> None:
    [count] = [tool for tool in directory_tools(directory, groups=["shop"]) if tool.name == "shop-count"]
    model = ScriptedModel([[function_call("shop-count", "[1, 2]", call_id="bad")], say_last_observation()])
    result = await Runner.run(Agent(name="shopper", model=model, tools=[count]), "Count")
    assert result.final_output.startswith("invalid-arguments: the arguments are not a JSON object")


async def test_a_call_moves_the_state_and_the_next_turn_offers_what_it_allows(
        directory: tghost.ToolDirectory) -> None:
    def before(call: ModelCall) -> None:
        assert "shop-browse" not in offered(call)

    def after(call: ModelCall) -> None:
        assert "shop-browse" in offered(call)

    tools = directory_tools(directory, groups=["shop"], user="bob")
    model = ScriptedModel([calling("shop-login", {"item": "door"}, before),
                           calling("shop-browse", {"item": "tea"}, after), say_last_observation()])
    result = await Runner.run(Agent(name="shopper", model=model, tools=tools), "Log in, then browse")
    assert result.final_output == "browse tea done for bob"


async def test_a_withdrawn_tool_is_not_offered_at_the_next_turn(pulsar_broker: EmbeddedBroker,
                                                                 directory: tghost.ToolDirectory, topic: str) -> None:
    extra = [{"name": "shop-gift", "description": "Wrap a gift", "service": "shop", "step": "gift", "group": ["shop"]}]
    async with LocalHost(pulsar_broker.url, [Shop()], tools=extra, announce_as="gift-host", topic=topic):
        await directory.wait_for("shop-gift")
        tools = directory_tools(directory, groups=["shop"])
    await directory.wait_for("shop-gift", present=False)
    model = ScriptedModel([ModelStep.respond(lambda call: [assistant_message(" ".join(offered(call)))])])
    result = await Runner.run(Agent(name="shopper", model=model, tools=tools), "What can you do?")
    assert "shop-gift" in [tool.name for tool in tools] and "shop-gift" not in result.final_output.split()


async def test_the_server_offers_a_tool_announced_after_the_agent_was_built_at_the_next_turn(
        pulsar_broker: EmbeddedBroker, directory: tghost.ToolDirectory, topic: str) -> None:
    late = [{"name": "shop-late", "description": "Open late", "service": "shop", "step": "late", "group": ["shop"]}]
    host = LocalHost(pulsar_broker.url, [Shop()], tools=late, announce_as="late-host", topic=topic)

    async def first(call: ModelCall) -> list[Any]:
        assert "shop-late" not in offered(call)
        await host.__aenter__()
        await directory.wait_for("shop-late")
        return [function_call("shop-login", {"item": "door"}, call_id="login")]

    server = DirectoryServer(directory, groups=["shop"], user="carol")
    model = ScriptedModel([ModelStep.respond(first), calling("shop-late", {"item": "tea"}), say_last_observation()])
    try:
        result = await Runner.run(Agent(name="shopper", model=model, mcp_servers=[server]), "Shop late")
    finally:
        await host.__aexit__(None, None, None)
    assert result.final_output == "late tea done for carol" and server.view.state == "in"


async def test_the_server_keeps_title_hints_and_structure_and_returns_errors_as_results(
        directory: tghost.ToolDirectory) -> None:
    server = DirectoryServer(directory, groups=["shop"])
    tools = {tool.name: tool for tool in await server.list_tools()}
    assert tools["shop-count"].title == "Count stock" and tools["shop-login"].annotations.model_dump(
        exclude_none=True, by_alias=True) == {"readOnlyHint": True}
    counted = (await server.call_tool("shop-count", {"item": "tea"})).model_dump(by_alias=True)
    assert (counted["structuredContent"], counted["isError"]) == ({"item": "tea", "count": 3}, False)
    model = ScriptedModel([calling("shop-broken", {"item": "tea"}), say_last_observation()])
    result = await Runner.run(Agent(name="shopper", model=model, mcp_servers=[server]), "Buy tea")
    assert result.final_output == "tool-service-error: the till is closed"


async def test_cancelling_the_run_cancels_the_call_on_its_host(directory: tghost.ToolDirectory) -> None:
    STARTED.clear()
    CANCELLED.clear()
    model = ScriptedModel([calling("shop-wait", {"item": "tea"}), say_last_observation()])
    run = asyncio.create_task(Runner.run(Agent(name="waiter", model=model,
                                               tools=directory_tools(directory, groups=["shop"])), "Wait"))
    assert await asyncio.to_thread(STARTED.wait, 30)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert await asyncio.to_thread(CANCELLED.wait, 30)


async def test_the_guides_agent_calls_a_live_tool_and_its_live_form_a_tool_announced_later(
        pulsar_broker: EmbeddedBroker, topic: str) -> None:
    source = (block("docs/integrations/openai-agents.md", "# calculator_agent.py") + "\n"
              + block("docs/integrations/openai-agents.md", "# calculator_agent.py, continued"))
    settings = "tghost.PulsarSettings(url)"
    assert source.count(settings) == 2
    script = module_of(source.replace(settings, f"tghost.PulsarSettings(url), {topic!r}"), "calculator_agent")
    async with LocalHost(pulsar_broker.url, [calculate], announce_as="calculator-host", topic=topic):
        model = ScriptedModel([calling("calculate", {"expression": "2 * (3 + 4)"}), say_last_observation()])
        assert await script.main(pulsar_broker.url, model) == "14"
        model = ScriptedModel([calling("calculate", {"expression": "2 * (3 + 4)"}), say_last_observation()])
        assert await script.main_live(pulsar_broker.url, model) == "14"


@tghost.tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression: a stand-in for the calculator plugin's tool, which knows one."""
    return {"2 * (3 + 4)": "14"}[expression]
