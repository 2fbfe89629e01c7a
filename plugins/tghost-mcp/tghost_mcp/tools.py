"""tools: what maps to what between an MCP server's tools and tghost's. An MCP ``Tool`` becomes a
tghost tool over its server's tool service (:func:`offer`); a ``CallToolResult`` becomes the
observation or a tool error (:func:`observation`).

Pure data: never talks to a server.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from mcp import types

import tghost

__all__ = ["TOOL", "ArgumentCheck", "Offered", "hints", "observation", "offer", "text_of"]

#: The config param of a server's tool service that names the MCP tool a call is for.
TOOL = "tool"

#: MCP's behaviour hints (``ToolAnnotations``) by the key of a tghost tool's ``annotations``.
_HINTS = {"read-only": "read_only_hint", "destructive": "destructive_hint", "idempotent": "idempotent_hint",
          "open-world": "open_world_hint"}


class ArgumentCheck(tghost.ToolService):
    """One MCP tool's ``inputSchema`` as the tghost argument policy applies it (conversions such as
    ``"10"`` for a number, then the schema), and the maker of its tool descriptor (with the
    ``arguments`` list derived from the schema). Never served: its ``id`` is the server's, whose
    tool service serves the tool.

    The schema is the server's, unchanged: an argument it does not name is passed on, and the
    server decides (``allow_unknown_arguments``).
    """

    allow_unknown_arguments = True

    def __init__(self, service: str, schema: dict[str, Any]) -> None:
        self.id = service
        self.input_schema = schema


class Offered(NamedTuple):
    """One MCP tool as served: its tghost ``descriptor``, the MCP ``tool`` and its ``check``."""

    descriptor: tghost.ToolDescriptor
    tool: types.Tool
    check: ArgumentCheck


def hints(tool: types.Tool) -> dict[str, bool]:
    """The tool's MCP hints as a tghost tool's ``annotations`` (``readOnlyHint`` is ``read-only``,
    ``destructiveHint`` ``destructive``, ``idempotentHint`` ``idempotent``, ``openWorldHint``
    ``open-world``); the hints it leaves unset are left out, so MCP's defaults still apply."""
    annotations = tool.annotations
    if annotations is None:
        return {}
    return {key: value for key, field in _HINTS.items() if (value := getattr(annotations, field)) is not None}


def offer(server: str, name: str, tool: types.Tool, group: list[str] | None = None) -> Offered:
    """The MCP ``tool`` of ``server`` as the tghost tool ``name`` over the service ``server``: its
    description (else its title, else one naming the server), its ``inputSchema`` as the
    ``input-schema`` (and the seed 000 ``arguments`` derived from it), its title, its hints as
    ``annotations``, its ``outputSchema`` as the ``output-schema``, ``group`` (default
    ``["default"]``) and the config value :data:`TOOL`, the MCP tool's name.

    Raises:
        tghost.DescriptorError: the tool cannot be served: its input schema is not a valid JSON
            Schema, or its output schema does not describe an object.
    """
    check = ArgumentCheck(server, tool.input_schema)
    _ = check.descriptor  # compiles the schema: a bad one is refused here, not at the first call
    title = tool.title or (tool.annotations.title if tool.annotations else None)
    fields: dict[str, Any] = {TOOL: tool.name}
    if group is not None:
        fields["group"] = group
    if title:
        fields["title"] = title
    if annotations := hints(tool):
        fields["annotations"] = annotations
    if tool.output_schema is not None:
        fields["output-schema"] = tool.output_schema
    description = (tool.description or "").strip() or title or f"The tool {tool.name} of the MCP server {server}."
    return Offered(check.tool(name, description, **fields), tool, check)


def text_of(block: Any) -> str:
    """One content block of a result as text: a text block's text, an embedded text resource's
    text; any other block (image, audio, a binary resource, a resource link) as a line naming it,
    which says it is not carried (``[image image/png: not carried]``)."""
    if isinstance(block, types.TextContent):
        return block.text
    resource = getattr(block, "resource", None)
    if isinstance(resource, types.TextResourceContents):
        return resource.text
    named = [str(part) for part in (getattr(block, "uri", None) or getattr(resource, "uri", None),
                                     getattr(block, "mime_type", None) or getattr(resource, "mime_type", None)) if part]
    return f"[{' '.join([getattr(block, 'type', 'content'), *named])}: not carried]"


def observation(server: str, tool: types.Tool, result: types.CallToolResult) -> str:
    """The observation of a call of ``tool``: for a tool with an ``outputSchema``, the JSON text of
    its ``structuredContent`` (a structured observation); else its content blocks'
    :func:`text_of`, one per line.

    Raises:
        tghost.ToolError: ``tool-service-error``: the result has ``isError``; the message names
            the server and the tool, then says what the server said.
    """
    text = "\n".join(text_of(block) for block in result.content)
    if result.is_error:
        raise tghost.ToolError(f"MCP server {server!r}, tool {tool.name!r}: {text or 'failed, saying nothing'}")
    if tool.output_schema is not None and isinstance(result.structured_content, dict):
        return json.dumps(result.structured_content)
    return text
