"""service: a ToolResult becomes an observation (a string as is, anything else JSON) or an error
reply; a tool's input schema comes from its input_schema, else get_schema()."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

import pytest
from amplifier_core import ToolResult
from tghost_amplifier.service import input_schema_of, observation

from tghost import ToolError


@pytest.mark.parametrize(("output", "expected"), [
    ("plain text", "plain text"),
    ({"a": [1, 2]}, '{"a": [1, 2]}'),
    ([1, "two"], '[1, "two"]'),
    (42, "42"),
    (True, "true"),
    (None, "null"),
    ({"price": Decimal("9.99"), "path": Path("/srv/x")}, '{"price": "9.99", "path": "/srv/x"}'),
])
def test_a_successful_result_is_its_output_as_is_if_a_string_else_as_json(output: Any, expected: str) -> None:
    text = observation("t", ToolResult(success=True, output=output))
    assert text == expected
    if not isinstance(output, str):
        json.loads(text)


@pytest.mark.parametrize(("error", "output", "error_type", "message"), [
    ({"message": "Path not found: x"}, None, "tool-service-error", "Path not found: x"),
    ({"message": "too big", "type": "FileTooLarge"}, None, "FileTooLarge", "too big"),
    ({"type": ""}, "the output says why", "tool-service-error", "the output says why"),
    (None, None, "tool-service-error", "tool 't' reported a failure without a message"),
])
def test_a_failed_result_is_an_error_of_its_type_with_its_message(
    error: dict[str, Any] | None, output: Any, error_type: str, message: str
) -> None:
    with pytest.raises(ToolError) as raised:
        observation("t", ToolResult(success=False, output=output, error=error))
    assert (raised.value.error_type, str(raised.value)) == (error_type, message)


def test_anything_but_a_tool_result_is_refused() -> None:
    with pytest.raises(TypeError, match="tool 't' returned dict, not a ToolResult"):
        observation("t", {"success": True})


class WithProperty:
    name = "p"

    @property
    def input_schema(self) -> dict[str, Any]:
        return {"type": "object", "properties": {"a": {"type": "string"}}}


class WithGetSchema:
    name = "g"
    input_schema: ClassVar[dict[str, Any]] = {}  # the Tool protocol's default: none given

    def get_schema(self) -> dict[str, Any]:
        return {"type": "object", "properties": {"b": {"type": "integer"}}}


class WithNone:
    name = "n"


class WithBadSchema:
    name = "bad"
    input_schema: ClassVar[list[str]] = ["not", "a", "schema"]


def test_the_input_schema_is_the_tools_input_schema_else_get_schema_else_none() -> None:
    assert input_schema_of(WithProperty()) == {"type": "object", "properties": {"a": {"type": "string"}}}
    assert input_schema_of(WithGetSchema()) == {"type": "object", "properties": {"b": {"type": "integer"}}}
    assert input_schema_of(WithNone()) is None
    with pytest.raises(TypeError, match="the input schema of tool 'bad' is a list"):
        input_schema_of(WithBadSchema())
