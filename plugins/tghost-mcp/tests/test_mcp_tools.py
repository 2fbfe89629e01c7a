"""tools: an MCP tool as a tghost tool (description, input schema and the seed 000 arguments,
title, hints, output schema, group, the config value naming it), its argument check, and a call's
result as the observation or a tool error."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp import types
from tghost_mcp.tools import hints, observation, offer, text_of

import tghost

SCHEMA = {"type": "object", "properties": {"key": {"type": "string", "description": "Where"},
                                           "count": {"type": "integer"}}, "required": ["key"]}
OUTPUT = {"type": "object", "properties": {"words": {"type": "integer"}}, "required": ["words"]}


def mcp_tool(**fields: Any) -> types.Tool:
    return types.Tool.model_validate({"name": "recall", "inputSchema": SCHEMA, **fields})


def test_an_mcp_tool_is_a_tool_over_its_servers_service_with_everything_it_says() -> None:
    tool = mcp_tool(description="Recall a note.", title="Recall", outputSchema=OUTPUT, annotations={
        "readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False})
    descriptor = offer("notes", "notes-recall", tool, ["default", "memory"]).descriptor
    assert descriptor.to_json_dict() == {
        "name": "notes-recall", "description": "Recall a note.", "service": "notes", "tool": "recall",
        "arguments": [{"name": "key", "type": "string", "description": "Where"},
                      {"name": "count", "type": "integer", "description": ""}],
        "input-schema": SCHEMA, "group": ["default", "memory"], "title": "Recall",
        "annotations": {"read-only": True, "destructive": False, "idempotent": True, "open-world": False},
        "output-schema": OUTPUT,
    }


def test_unset_hints_and_a_missing_description_title_or_group_are_left_to_the_defaults() -> None:
    tool = mcp_tool(annotations={"title": "Recall a note", "readOnlyHint": True})
    assert hints(tool) == {"read-only": True}
    descriptor = offer("notes", "recall", tool).descriptor
    assert (descriptor.description, descriptor.title, descriptor.group) == ("Recall a note", "Recall a note",
                                                                            ("default",))
    bare = offer("notes", "recall", mcp_tool()).descriptor
    assert (bare.description, bare.title, bare.annotations, bare.output_schema) == (
        "The tool recall of the MCP server notes.", None, None, None)


@pytest.mark.parametrize(("fields", "problem"), [
    ({"inputSchema": {"type": "object", "properties": {"n": {"type": "nonsense"}}}}, "not a valid JSON Schema"),
    ({"outputSchema": {"type": "array"}}, "output-schema"),
])
def test_a_tool_that_cannot_be_described_is_refused(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(tghost.DescriptorError, match=problem):
        offer("notes", "recall", mcp_tool(**fields))


def test_the_arguments_are_checked_against_the_tools_own_schema_with_the_conversions() -> None:
    check = offer("notes", "recall", mcp_tool()).check
    assert check.check_arguments({"key": "a", "count": "3"}) == {"key": "a", "count": 3}
    assert check.check_arguments({"key": "a", "extra": 1}) == {"key": "a", "extra": 1}  # the server decides
    with pytest.raises(tghost.InvalidArguments, match="argument 'key': required, but not given"):
        check.check_arguments({"count": 1})


def result(*content: Any, structured: Any = None, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=list(content), structured_content=structured, is_error=error)


def text(value: str) -> types.TextContent:
    return types.TextContent(type="text", text=value)


def test_the_observation_is_the_text_one_block_a_line_or_the_structured_content_of_a_typed_tool() -> None:
    plain, typed = mcp_tool(), mcp_tool(outputSchema=OUTPUT)
    assert observation("notes", plain, result(text("first"), text("second"))) == "first\nsecond"
    assert observation("notes", plain, result(text('{"words": 2}'), structured={"words": 2})) == '{"words": 2}'
    assert json.loads(observation("notes", typed, result(text("2 words"), structured={"words": 2}))) == {"words": 2}
    assert observation("notes", plain, result()) == ""


def test_an_is_error_result_is_a_tool_service_error_naming_the_server_and_the_tool() -> None:
    with pytest.raises(tghost.ToolError) as failed:
        observation("notes", mcp_tool(), result(text("no such key"), error=True))
    assert (failed.value.error_type, str(failed.value)) == ("tool-service-error",
                                                            "MCP server 'notes', tool 'recall': no such key")


def test_blocks_without_text_are_named_as_not_carried() -> None:
    image = types.ImageContent(type="image", data="iVBO", mime_type="image/png")
    link = types.ResourceLink(type="resource_link", uri="file:///srv/a.txt", name="a.txt")
    embedded = types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
        uri="file:///srv/b.txt", text="the text of b"))
    assert [text_of(block) for block in (image, link, embedded)] == [
        "[image image/png: not carried]", "[resource_link file:///srv/a.txt: not carried]", "the text of b"]
