"""arguments: one policy for both authoring styles, over the real wire (an embedded broker).

A class service with only an ``arguments`` list, a class service with an ``input_schema`` and a
``@tghost.tool`` function with the same arguments answer the same calls the same way: the same
conversions, missing and mistyped arguments named, unknown ones refused unless the service opts
out; and what they announce (and so what the MCP and OpenAI exports give) is what they check.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import jsonschema
import pytest

import tghost
from tghost.adapters.export import input_schema
from tghost.agent.client import ToolCallError
from tghost.author.arguments import coerce
from tghost.broker import EmbeddedBroker
from tghost.testing import LocalHost


class ListedMetric(tghost.ToolService):
    """The shape docs/guides/writing-plugins.md shows: a class service with an ``arguments`` list and no schema."""

    id = "listed-metric"
    arguments = (tghost.Argument(name="value", type="number", description="How many"),
                 tghost.Argument(name="unit", type="string", description="mi or ft"),
                 tghost.Argument(name="exact", type="boolean", description="Round or not"))

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        return arguments


class SchemaMetric(tghost.ToolService):
    """The same arguments as a JSON Schema."""

    id = "schema-metric"
    input_schema: ClassVar[dict[str, Any]] = {
        "type": "object", "required": ["value", "unit", "exact"],
        "properties": {"value": {"type": "number"}, "unit": {"type": "string"}, "exact": {"type": "boolean"}}}

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        return arguments


@tghost.tool(name="function-metric")
async def function_metric(value: float, unit: str, exact: bool) -> dict[str, Any]:
    """The same arguments as a typed function."""
    return {"value": value, "unit": unit, "exact": exact}


class OpenMetric(ListedMetric):
    """Opts out: unknown arguments are passed to ``invoke`` as they are."""

    id = "open-metric"
    allow_unknown_arguments = True


@tghost.tool(name="open-function", allow_unknown_arguments=True)
async def open_function(value: float) -> float:
    """Opts out: unknown arguments are dropped (the function has no parameter for them)."""
    return value


SERVICES = ["listed-metric", "schema-metric", "function-metric"]
GOOD = {"value": 10, "unit": "mi", "exact": True}


@pytest.fixture(scope="module")
def services() -> list[tghost.ToolService]:
    return [ListedMetric(), SchemaMetric(), function_metric, OpenMetric(), open_function]


@pytest.mark.parametrize("service", SERVICES)
@pytest.mark.parametrize(("given", "received"), [
    ({"value": "10", "unit": "mi", "exact": "true"}, GOOD),     # a language model's strings
    ({"value": "2.5", "unit": "mi", "exact": "FALSE"}, {"value": 2.5, "unit": "mi", "exact": False}),
    ({"value": 10, "unit": "mi", "exact": True}, GOOD),
])
async def test_both_styles_convert_number_and_boolean_strings_alike(
    pulsar_broker: EmbeddedBroker, services: list[tghost.ToolService], service: str,
    given: dict[str, Any], received: dict[str, Any],
) -> None:
    async with LocalHost(pulsar_broker.url, services) as host:
        answer = await host.call(service, given)
    assert tghost_json(answer) == received


@pytest.mark.parametrize("service", SERVICES)
@pytest.mark.parametrize(("given", "message"), [
    ({"unit": "mi", "exact": True}, "argument 'value': required, but not given"),
    ({"value": "ten", "unit": "mi", "exact": True}, "argument 'value': "),
    ({"value": True, "unit": "mi", "exact": True}, "argument 'value': "),        # a boolean is no number
    ({"value": 10, "unit": 5, "exact": True}, "argument 'unit': "),              # a number is no string
    ({"value": 10, "unit": "mi", "exact": 1}, "argument 'exact': "),             # 1 is no boolean
    ({**GOOD, "foo": "bar"}, "argument 'foo': not an argument of this tool (it takes: value, unit, exact)"),
])
async def test_both_styles_answer_invalid_arguments_naming_the_field_and_the_value(
    pulsar_broker: EmbeddedBroker, services: list[tghost.ToolService], service: str,
    given: dict[str, Any], message: str,
) -> None:
    async with LocalHost(pulsar_broker.url, services) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call(service, given)
    assert info.value.error_type == "invalid-arguments"
    assert info.value.message.startswith(message)
    field = message.split("'")[1]
    if field in given and field in GOOD:  # a wrong value is echoed, as the caller sent it
        assert repr(given[field]) in info.value.message.removeprefix(message)


async def test_a_service_that_allows_unknown_arguments_gets_them_and_a_function_drops_them(
    pulsar_broker: EmbeddedBroker, services: list[tghost.ToolService],
) -> None:
    async with LocalHost(pulsar_broker.url, services) as host:
        assert tghost_json(await host.call("open-metric", {**GOOD, "foo": "bar"})) == {**GOOD, "foo": "bar"}
        assert await host.call("open-function", {"value": "3", "foo": "bar"}) == "3.0"
        with pytest.raises(ToolCallError, match="argument 'value': required"):
            await host.call("open-metric", {"foo": "bar"})  # known arguments are still checked


@pytest.mark.parametrize("service", [ListedMetric(), SchemaMetric(), function_metric, OpenMetric()])
def test_what_a_tool_announces_is_what_its_service_checks(service: tghost.ToolService) -> None:
    """The announced ``input-schema`` (and so the MCP ``inputSchema`` and OpenAI ``parameters``)
    accepts and refuses what the service does, once the policy's conversions are applied."""
    tool = service.tool("t", "a tool")
    announced = input_schema(tool)
    assert announced == service.arguments_schema
    assert [a.name for a in tool.arguments] == ["value", "unit", "exact"]
    for given in [GOOD, {"unit": "mi", "exact": True}, {**GOOD, "foo": 1}, {**GOOD, "value": "7"}]:
        try:
            service.check_arguments(given)
            accepted = True
        except tghost.InvalidArguments:
            accepted = False
        assert accepted == jsonschema.Draft202012Validator(announced).is_valid(coerce(given, announced)), given


def test_the_conversions_are_exactly_these() -> None:
    schema = {"properties": {"n": {"type": "number"}, "i": {"type": "integer"}, "b": {"type": "boolean"},
                             "s": {"type": "string"}, "o": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}
    assert coerce({"n": "-1.5e3", "i": "10", "b": "True", "s": "10", "o": "4"}, schema) == {
        "n": -1500.0, "i": 10, "b": True, "s": "10", "o": 4}
    assert coerce({"i": 10.0, "n": "1,5", "b": "yes"}, schema) == {"i": 10, "n": "1,5", "b": "yes"}
    assert coerce({"i": "2.5", "n": " 1", "s": 10, "b": 1}, schema) == {"i": "2.5", "n": " 1", "s": 10, "b": 1}
    assert coerce({"n": "NaN", "i": "+3", "x": "1"}, schema) == {"n": "NaN", "i": "+3", "x": "1"}


def tghost_json(answer: str) -> Any:
    return json.loads(answer)
