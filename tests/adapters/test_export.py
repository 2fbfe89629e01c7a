"""export: ``tghost export`` from a live host over the embedded broker, and the schema builder."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from mcp import types

from tests.conftest import HostProcess, PluginDir, tghost_cli
from tghost import ToolDescriptor, ToolServiceDescriptor
from tghost.adapters.export import MCP_HINTS, input_schema, mcp_tool, trustgraph_tool
from tghost.broker import EmbeddedBroker
from tghost.protocol import ADDED_TOOL_KEYS, ToolAnnotations

#: The output schema of WEATHER's ``forecast`` tool.
FORECAST = {"type": "object", "required": ["summary"], "properties": {"summary": {"type": "string"}}}
#: A class-based service described by a seed 000 ``arguments`` list only (no JSON Schema), and
#: a decorated one whose schema comes from its signature; ``forecast`` declares a title, hints
#: and an output schema as tool keys.
WEATHER = f"FORECAST = {FORECAST!r}\n" + """
import tghost
from tghost import Argument, ToolService

class Weather(tghost.ToolService):
    id = "weather"
    description = "Weather by city."
    config_params = ["units"]
    arguments = [Argument(name="city", type="string", description="The city."),
                 Argument(name="days", type="integer", description="Days ahead.")]

    def invoke(self, user, config, arguments):
        return f"{arguments['city']} in {arguments['days']} days: sunny, 20 degrees {config['units']}"

@tghost.tool
def greet(name: str) -> str:
    '''Greet someone by name.

    Args:
        name: Who to greet.
    '''
    return f"hello {name}"

@tghost.hookimpl
def tghost_register_services(register):
    register(Weather())
    register(greet)

@tghost.hookimpl
def tghost_register_tools(register):
    register(Weather().tool("forecast", "Forecast the weather in a city.", units="celsius", group=["outdoor"],
                            state="forecasted", available_in_states=["undefined", "planning"],
                            title="Weather forecast", annotations={"read-only": True, "open-world": True},
                            **{"output-schema": FORECAST}))
"""


@pytest.fixture
def env(pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, tmp_path: Path) -> dict[str, str]:
    """The WEATHER plugin installed, this broker, a fresh descriptors topic, a private config dir."""
    plugin_dir.add("weather", WEATHER)
    return plugin_dir.user_env(pulsar_broker.url, tmp_path / "config", "export")


@pytest.fixture
def live(env: dict[str, str], host_process: Callable[..., HostProcess]) -> Iterator[dict[str, str]]:
    """A running host serving WEATHER; stopped with Ctrl-C (and checked to exit 0) at the end."""
    host = host_process(env=env)
    host.wait_for("announced")
    yield env
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


def export(env: dict[str, str], *args: str) -> Any:
    result = tghost_cli("export", *args, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_trustgraph_export_round_trips_through_the_descriptor_models(live: dict[str, str]) -> None:
    config = export(live, "--format", "trustgraph")
    assert set(config) == {"tool-service", "tool"}
    assert set(config["tool"]) == {"forecast", "greet"}
    assert set(config["tool-service"]) == {"weather", "greet"}
    for name, value in config["tool"].items():
        assert value["type"] == "tool-service"  # seed 000: required
        assert not ADDED_TOOL_KEYS & set(value)  # TrustGraph's agent would take them for config values
        assert "available_in_states" not in value and None not in value.values()
        tool = ToolDescriptor.model_validate(value)  # reads TrustGraph's "applicable-states" back
        assert tool.name == name and trustgraph_tool(tool) == value
        assert tool.service in config["tool-service"]
    for service_id, value in config["tool-service"].items():
        service = ToolServiceDescriptor.model_validate(value)
        assert service.id == service_id and service.to_json_dict() == value
    forecast = config["tool"]["forecast"]
    assert forecast["service"] == "weather"
    assert forecast["units"] == "celsius" and forecast["group"] == ["outdoor"]  # config value at the top level
    # seed 001 as TrustGraph's agent names it (trustgraph-flow agent/tool_filter.py)
    assert forecast["state"] == "forecasted" and forecast["applicable-states"] == ["undefined", "planning"]
    assert "state" not in config["tool"]["greet"] and "applicable-states" not in config["tool"]["greet"]
    assert config["tool-service"]["weather"]["request-queue"] == "non-persistent://tg/request/weather"
    assert config["tool-service"]["weather"]["config-params"] == [{"name": "units", "required": False}]


def test_trustgraph_export_with_a_group_holds_only_that_groups_tools_and_their_services(
        live: dict[str, str]) -> None:
    config = export(live, "--format", "trustgraph", "--group", "outdoor")
    assert set(config["tool"]) == {"forecast"} and set(config["tool-service"]) == {"weather"}


def test_openai_export_gives_the_schema_the_host_checks_for_an_arguments_list_or_a_signature(
        live: dict[str, str]) -> None:
    definitions = {d["function"]["name"]: d for d in export(live, "--format", "openai")}
    assert set(definitions) == {"forecast", "greet"}
    assert all(d["type"] == "function" for d in definitions.values())
    forecast = definitions["forecast"]["function"]
    assert set(forecast) == {"name", "description", "parameters"}  # OpenAI's format has no title, hints or output
    assert forecast["description"] == "Forecast the weather in a city."
    assert forecast["parameters"] == {
        "type": "object", "required": ["city", "days"], "additionalProperties": False,
        "properties": {"city": {"type": "string", "description": "The city."},
                       "days": {"type": "integer", "description": "Days ahead."}}}
    greet = definitions["greet"]["function"]["parameters"]
    assert greet["required"] == ["name"] and greet["properties"]["name"]["type"] == "string"
    jsonschema.validate({"name": "Ada"}, greet)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({}, greet)
    with pytest.raises(jsonschema.ValidationError):  # unknown arguments are refused, as the host refuses them
        jsonschema.validate({"name": "Ada", "mood": "sunny"}, greet)


def test_mcp_export_lists_tool_objects_filtered_by_group(live: dict[str, str]) -> None:
    tools = export(live, "--format", "mcp", "--group", "default")
    assert [t["name"] for t in tools] == ["greet"]
    (greet,) = tools
    assert greet["description"].startswith("Greet someone by name.")
    assert greet["inputSchema"]["properties"]["name"]["description"] == "Who to greet."
    assert greet["title"] == "Greet" and greet["annotations"] == {"title": "Greet"}  # derived; no hints set
    assert "outputSchema" not in greet


def test_mcp_export_carries_the_title_hints_and_output_schema_a_tool_declares(live: dict[str, str]) -> None:
    [forecast] = export(live, "--format", "mcp", "--group", "outdoor")
    assert forecast["title"] == "Weather forecast"
    assert forecast["annotations"] == {"title": "Weather forecast", "readOnlyHint": True, "openWorldHint": True}
    assert forecast["outputSchema"] == FORECAST
    tool = types.Tool.model_validate(forecast)  # as an MCP client reads it
    hints = tool.annotations
    assert hints is not None and hints.read_only_hint and hints.destructive_hint is None


def test_input_schema_prefers_the_tools_own_schema() -> None:
    own = {"type": "object", "properties": {"q": {"type": "string", "minLength": 1}}, "required": ["q"]}
    tool = ToolDescriptor.model_validate({"name": "ask", "description": "Ask.", "service": "kb",
                                          "arguments": [{"name": "other", "type": "number"}], "input-schema": own})
    assert input_schema(tool) == own


def test_input_schema_from_arguments_requires_each_and_skips_empty_descriptions() -> None:
    tool = ToolDescriptor.model_validate({"name": "add_up", "description": "Add.", "service": "calc",
                                          "arguments": [{"name": "a", "type": "number"},
                                                        {"name": "b", "type": "number", "description": "B."}]})
    schema = input_schema(tool)
    assert schema == {"type": "object", "required": ["a", "b"],
                      "properties": {"a": {"type": "number"}, "b": {"type": "number", "description": "B."}}}
    jsonschema.Draft202012Validator.check_schema(schema)
    assert mcp_tool(tool)["annotations"] == {"title": "Add up"}


def test_mcp_tool_gives_each_hint_set_false_ones_included_and_leaves_out_the_unset() -> None:
    tool = ToolDescriptor.model_validate({"name": "drop-table", "description": "Drop.", "service": "db",
                                          "annotations": {"read-only": False, "destructive": True}})
    assert mcp_tool(tool)["annotations"] == {"title": "Drop table", "readOnlyHint": False, "destructiveHint": True}
    assert set(MCP_HINTS.values()) == {"readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"}
    assert set(MCP_HINTS) == set(ToolAnnotations.model_fields)  # every hint tghost carries reaches MCP


def test_trustgraph_tool_is_the_same_with_or_without_the_added_keys() -> None:
    plain = {"name": "kb", "description": "Ask.", "service": "kb", "collection": "docs"}
    added = {**plain, "title": "Knowledge base", "annotations": {"read-only": True},
             "output-schema": {"type": "object"}}
    without = trustgraph_tool(ToolDescriptor.model_validate(plain))
    assert trustgraph_tool(ToolDescriptor.model_validate(added)) == without == {"type": "tool-service", **plain}
