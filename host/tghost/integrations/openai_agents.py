"""openai_agents: the live tool directory as the OpenAI Agents SDK's tools. :func:`directory_tools`
gives one ``FunctionTool`` per tool an agent may use, each offered to the model only while it may;
:class:`DirectoryServer` gives the live set at every turn, tools announced later included, as the
SDK asks a remote MCP server for its tools. Both call through one :class:`tghost.ToolView`, so
seed 001 state moves from call to call, and a tool error reaches the model as text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import tghost
from tghost.protocol import INVALID_ARGUMENTS

try:
    from agents import AgentBase, FunctionTool, RunContextWrapper
    from agents.mcp import MCPServer
    from mcp.types import CallToolResult, GetPromptResult, ListPromptsResult, Tool
except ImportError as missing:  # pragma: no cover - the frameworks env has it; the default env skips
    raise ImportError('tghost.integrations.openai_agents needs the OpenAI Agents SDK: '
                      'pip install "tghost[openai-agents]"') from missing

__all__ = ["DirectoryServer", "directory_tools"]

#: MCP's name of each tghost hint (tghost.protocol.ToolAnnotations).
HINTS = {"read_only": "readOnlyHint", "destructive": "destructiveHint", "idempotent": "idempotentHint",
         "open_world": "openWorldHint"}


async def observe(view: tghost.ToolView, name: str,
                  arguments: str | dict[str, Any] | None) -> tuple[str | dict[str, Any], bool]:
    """Call tool ``name`` through ``view`` with ``arguments`` (a JSON object, or its text as a
    model wrote it) and return ``(observation, failed)``: the observation (a JSON object for a
    structured one), or for a :class:`tghost.ToolCallError` its text, ``"type: message"`` (e.g.
    ``"invalid-arguments: ..."``), for the model to act on, and ``True``."""
    try:
        parsed = json.loads(arguments or "{}") if isinstance(arguments, str) else arguments or {}
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return f"{INVALID_ARGUMENTS}: the arguments are not a JSON object: {arguments!r:.200}", True
    try:
        return await view.invoke(name, parsed), False
    except tghost.ToolCallError as error:
        return str(error), True


def text(observation: str | dict[str, Any]) -> str:
    """What the model reads of ``observation``: a structured one as JSON text."""
    return json.dumps(observation) if isinstance(observation, dict) else observation


def function_tool(view: tghost.ToolView, tool: tghost.ToolDescriptor) -> FunctionTool:
    """``tool`` as a ``FunctionTool`` that calls through ``view`` and is enabled while ``view``
    offers it. Its schema is not made "strict" (:func:`directory_tools`)."""

    async def invoke(context: RunContextWrapper[Any], arguments: str) -> str:
        return text((await observe(view, tool.name, arguments))[0])

    def enabled(context: RunContextWrapper[Any], agent: AgentBase[Any]) -> bool:
        return view.offers(tool.name)

    return FunctionTool(name=tool.name, description=tool.description, params_json_schema=tghost.input_schema(tool),
                        on_invoke_tool=invoke, strict_json_schema=False, is_enabled=enabled)


def directory_tools(directory: tghost.ToolDirectory, *, groups: Sequence[str] | None = None,
                    state: str | None = None, include: Sequence[str] = (), exclude: Sequence[str] = (),
                    read_only: bool = False, user: str | None = None,
                    timeout: float | None = None) -> list[FunctionTool]:
    """A ``FunctionTool`` for each live tool of ``directory`` that an agent with ``groups``
    (``None``: the ``default`` group; ``["*"]``: every group) may use in seed 001 ``state`` or in
    a state its calls can move to, narrowed by ``include``/``exclude`` name globs and
    ``read_only`` (the tool's hint), sorted by name: the arguments of :class:`tghost.ToolView`,
    one of which the tools share. Give the list to one conversation's agent (``Agent(tools=...)``);
    build another for the next.

    Each tool has the tghost tool's name, description and input schema (``strict_json_schema``
    is false: a tghost schema need not meet OpenAI's strict mode), and:

    - is enabled at a turn only while the view offers it: a tool withdrawn, or not allowed in
      the state the last call moved to, is not shown to the model (a tool announced after the
      list was built is not in it: :class:`DirectoryServer` offers those);
    - calls the tool as ``user`` (``timeout`` seconds; ``None``: the service's own), and returns
      the observation as text (a structured one as JSON); a successful call moves the state;
    - returns a :class:`tghost.ToolCallError` as its text, ``"type: message"``, for the model to
      read and act on: the run goes on. Cancelling the run's task cancels the call on its host.
    """
    view = tghost.ToolView(directory, groups=groups, state=state, include=include, exclude=exclude,
                           read_only=read_only, user=user, timeout=timeout)
    return [function_tool(view, tool) for tool in view.reachable()]


def mcp_tool(tool: tghost.ToolDescriptor) -> Tool:
    """``tool`` as the MCP ``Tool`` the SDK turns into a ``FunctionTool``: name, title,
    description, input schema, output schema and hints (unset hints left out)."""
    hints = tool.annotations.model_dump() if tool.annotations is not None else {}
    shape: dict[str, Any] = {
        "name": tool.name, "title": tool.title, "description": tool.description,
        "inputSchema": tghost.input_schema(tool), "outputSchema": tool.output_schema,
        "annotations": {HINTS[hint]: value for hint, value in hints.items() if hint in HINTS and value is not None}}
    return Tool.model_validate(shape)


class DirectoryServer(MCPServer):  # type: ignore[misc]  # Any where the SDK is not installed
    """The live tools of ``directory`` as an Agents SDK MCP server, for ``Agent(mcp_servers=[...])``:
    the SDK asks it for its tools at every turn, so a tool announced after the agent was built
    is offered at the next turn, and one withdrawn, or no longer allowed in the state the last
    call moved to, is not. The arguments are :func:`directory_tools`' (one :class:`tghost.ToolView`,
    held as :attr:`view`); ``name`` is the server's, as the SDK logs and traces it.

    Each tool keeps its title, input schema, output schema and hints (``FunctionTool.mcp_annotations``);
    a structured observation reaches the model as JSON text, and a :class:`tghost.ToolCallError`
    as an error result with its text, ``"type: message"``: the run goes on. Cancelling the run's
    task cancels the call on its host. Nothing is opened or closed by :meth:`connect` and
    :meth:`cleanup`: the directory is the caller's to start and stop. One server per conversation:
    :attr:`view` holds its state.
    """

    def __init__(self, directory: tghost.ToolDirectory, *, groups: Sequence[str] | None = None,
                 state: str | None = None, include: Sequence[str] = (), exclude: Sequence[str] = (),
                 read_only: bool = False, user: str | None = None, timeout: float | None = None,
                 name: str = "tghost") -> None:
        super().__init__(use_structured_content=True)
        self.view = tghost.ToolView(directory, groups=groups, state=state, include=include, exclude=exclude,
                                    read_only=read_only, user=user, timeout=timeout)
        self._name = name

    @property
    def name(self) -> str:
        """The server's name, as the SDK logs and traces it."""
        return self._name

    async def connect(self) -> None:
        """Nothing to open: the directory is started by its owner."""

    async def cleanup(self) -> None:
        """Nothing to close: the directory is stopped by its owner."""

    async def list_tools(self, run_context: RunContextWrapper[Any] | None = None,
                         agent: AgentBase[Any] | None = None) -> list[Tool]:
        """The tools :attr:`view` offers now, as MCP ``Tool`` objects, sorted by name."""
        return [mcp_tool(tool) for tool in self.view.tools()]

    async def call_tool(self, tool_name: str, arguments: dict[str, Any] | None,
                        meta: dict[str, Any] | None = None) -> CallToolResult:
        """Call ``tool_name`` through :attr:`view`: the observation as a text result (a structured
        one also as ``structuredContent``), or a tghost error as an error result (``isError``)."""
        observation, failed = await observe(self.view, tool_name, arguments)
        result: dict[str, Any] = {"content": [{"type": "text", "text": text(observation)}], "isError": failed}
        if isinstance(observation, dict):
            result["structuredContent"] = observation
        return CallToolResult.model_validate(result)

    async def list_prompts(self) -> ListPromptsResult:
        """No prompts: a tghost directory serves tools only."""
        return ListPromptsResult.model_validate({"prompts": []})

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None) -> GetPromptResult:
        """Never: a tghost directory serves no prompts.

        Raises:
            LookupError: always, naming the prompt.
        """
        raise LookupError(f"prompt {name!r}: a tghost directory serves tools only, no prompts")
