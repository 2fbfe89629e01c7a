"""export: the live tool set in the shapes other agents load: TrustGraph config items, OpenAI
function definitions and MCP ``Tool`` objects. Pure functions of directory entries: never talks
to Pulsar and never imports the ``mcp`` SDK (the MCP bridge imports this, not the other way).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tghost.agent.directory import DirectoryTool, ToolDirectory
from tghost.agent.entries import input_schema
from tghost.protocol.descriptors import ADDED_TOOL_KEYS, ToolAnnotations, ToolDescriptor

__all__ = [
    "FORMATS", "MCP_HINTS", "input_schema", "mcp_tool", "mcp_tools", "openai_tools", "select_tools", "title",
    "trustgraph_config", "trustgraph_tool",
]


def select_tools(
    directory: ToolDirectory, groups: Sequence[str] | None, state: str | None,
) -> list[DirectoryTool]:
    """The live tools of ``directory`` that a seed 001 request with ``groups`` and ``state`` may
    use, sorted by name; with neither given, every live tool (as ``tghost tools`` lists them).
    Either way only the tools the directory's identity (anonymous without one) is admitted to.
    Without trusted keys a contested tool is left out (docs/protocol.md §4.8): whoever loads
    the export would call its queues directly, with nothing to tell which claim is real."""
    if groups is None and state is None:
        tools = [tool for _, tool in sorted(directory.tools.items()) if directory.calls.admits(tool)]
    else:
        tools = [directory.tools[d.name] for d in directory.available(["*"] if groups is None else groups, state)]
    return [t for t in tools if not (t.contested and directory.calls.refuse_conflicts)]


def title(tool: ToolDescriptor) -> str:
    """A human title for the tool: its descriptor's ``title``, else one from its name:
    ``ask-staff`` -> ``Ask staff``."""
    if tool.title is not None:
        return tool.title
    words = tool.name.replace("_", " ").replace("-", " ").split()
    return " ".join(words).capitalize() or tool.name


#: :class:`~tghost.protocol.ToolAnnotations` field -> MCP's ``ToolAnnotations`` key.
MCP_HINTS = {"read_only": "readOnlyHint", "destructive": "destructiveHint", "idempotent": "idempotentHint",
             "open_world": "openWorldHint"}


def mcp_tool(tool: ToolDescriptor) -> dict[str, Any]:
    """The tool as an MCP ``Tool`` object (JSON): ``name``, ``title`` (:func:`title`),
    ``description``, ``inputSchema`` (:func:`input_schema`), ``annotations`` with the same
    ``title`` and each hint the descriptor sets (``readOnlyHint``, ``destructiveHint``,
    ``idempotentHint``, ``openWorldHint``; an unset one is left out, so MCP's default applies),
    and ``outputSchema`` when the tool has an output schema."""
    shown, annotations = title(tool), tool.annotations or ToolAnnotations()
    hints = {key: getattr(annotations, field) for field, key in MCP_HINTS.items()}
    value: dict[str, Any] = {
        "name": tool.name, "title": shown, "description": tool.description, "inputSchema": input_schema(tool),
        "annotations": {"title": shown, **{key: hint for key, hint in hints.items() if hint is not None}}}
    if tool.output_schema is not None:
        value["outputSchema"] = tool.output_schema
    return value


def openai_tools(tools: Iterable[DirectoryTool]) -> list[dict[str, Any]]:
    """OpenAI function-calling definitions: ``[{"type": "function", "function": {"name",
    "description", "parameters": <JSON Schema>}}]``. OpenAI's format has no place for a
    tool's title, hints or output schema, so they are left out."""
    return [{"type": "function", "function": {"name": t.descriptor.name, "description": t.descriptor.description,
                                              "parameters": input_schema(t.descriptor)}} for t in tools]


def mcp_tools(tools: Iterable[DirectoryTool]) -> list[dict[str, Any]]:
    """The tools as a list of MCP ``Tool`` objects (:func:`mcp_tool`)."""
    return [mcp_tool(t.descriptor) for t in tools]


def trustgraph_tool(tool: ToolDescriptor) -> dict[str, Any]:
    """The value of the ``tool/<name>`` config item a TrustGraph agent loads for ``tool``: its
    seed 000 JSON with ``type: "tool-service"`` (required by TrustGraph, but a default that
    ``to_json_dict()`` leaves out when unset), and seed 001's ``available_in_states`` under
    the name TrustGraph's agent reads, ``applicable-states`` (trustgraph-flow 2.11,
    ``agent/tool_filter.py``). Unset ``state``/``applicable-states`` are left out, never
    ``null``: the agent rejects a ``state`` that is not a string. The keys of
    :data:`~tghost.protocol.ADDED_TOOL_KEYS` are left out too: TrustGraph's agent would take
    them for config values."""
    value = {key: v for key, v in {"type": tool.type, **tool.to_json_dict()}.items() if key not in ADDED_TOOL_KEYS}
    states = value.pop("available_in_states", None)
    if states is not None:
        value["applicable-states"] = states
    for key in ("state", "input-schema"):
        if value.get(key, "") is None:
            del value[key]
    return value


def trustgraph_config(tools: Iterable[DirectoryTool]) -> dict[str, dict[str, Any]]:
    """The config items a TrustGraph agent loads (seed 000: ``tg-put-config-item
    tool-service/<id>`` and ``tool/<name>``): ``{"tool-service": {<id>: <service descriptor>},
    "tool": {<name>: <tool value>}}``, holding the services behind ``tools`` only. Services
    are the announced descriptors' JSON (TrustGraph ignores tghost's extra keys); tools are
    :func:`trustgraph_tool`'s values."""
    config: dict[str, dict[str, Any]] = {"tool-service": {}, "tool": {}}
    for tool in tools:
        service = tool.service.descriptor
        config["tool-service"][service.id] = service.to_json_dict()
        config["tool"][tool.descriptor.name] = trustgraph_tool(tool.descriptor)
    return config


#: ``tghost export --format`` name -> the function that renders the selected tools as JSON.
FORMATS: dict[str, Callable[[list[DirectoryTool]], Any]] = {
    "trustgraph": trustgraph_config,
    "openai": openai_tools,
    "mcp": mcp_tools,
}
