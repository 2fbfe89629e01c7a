"""langchain: the live tool directory as LangChain tools, and a middleware that offers a
``create_agent`` agent the live set on each model call (``pip install "tghost[langchain]"``).

Both are built on :class:`tghost.ToolView`: its groups, its seed 001 state (moved by each
successful call), its name globs and read-only hint. A tool is an async ``StructuredTool``
whose ``args_schema`` is the tool's JSON Schema; a failed call raises ``ToolException``,
handled as LangChain's convention has it (``handle_tool_error``): the model reads the error,
the run goes on. Docs: docs/integrations/langchain.md.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import tghost

try:
    from langchain.agents.middleware import AgentMiddleware, ModelRequest, ToolCallRequest
    from langchain_core.callbacks import adispatch_custom_event
    from langchain_core.tools import BaseTool, StructuredTool, ToolException
except ImportError as missing:
    raise ImportError(f'tghost.integrations.langchain needs LangChain ({missing.name} is missing): '
                      'pip install "tghost[langchain]"') from missing

__all__ = ["PROGRESS_EVENT", "DirectoryMiddleware", "directory_tools"]

#: The name of the LangChain custom event each progress update of a running call is sent as
#: (``agent.astream_events(...)``, a callback handler's ``on_custom_event``); its data is
#: ``{"tool": name, "done": float, "total": float | None, "message": str | None}``.
PROGRESS_EVENT = "tghost-progress"


def directory_tools(directory: tghost.ToolDirectory, *, groups: Sequence[str] | None = None,
                    state: str | None = None, include: Sequence[str] = (), exclude: Sequence[str] = (),
                    read_only: bool = False, user: str | None = None,
                    timeout: float | None = None) -> list[BaseTool]:
    """The live tools of ``directory`` that an agent with ``groups`` (``None``: the ``default``
    group; ``["*"]``: every group) may use in seed 001 ``state`` or in a state its calls can move
    to (:meth:`tghost.ToolView.reachable`), narrowed by ``include``/``exclude`` name globs and
    ``read_only``, as async LangChain tools sorted by name (the arguments are
    :class:`tghost.ToolView`'s). They share one view, so a call that moves the state moves it for
    the next call of any of them; a call of one the current state does not allow is refused
    (``not-allowed``). The list itself is fixed: for the live set, give an agent a
    :class:`DirectoryMiddleware`, which also offers only what the current state allows.

    Each tool: ``name`` and ``description`` the tool's, ``args_schema`` its JSON Schema
    (:func:`tghost.input_schema`), ``metadata`` its ``title`` and ``annotations`` (the hints in
    the wire's spelling, e.g. ``{"read-only": True}``; ``None`` and ``{}`` without them). Await it
    (``await tool.ainvoke({...})``); it has no sync form. Its observation is the tool's text;
    for a tool with an output schema, the JSON text, and in a ``ToolMessage`` the object as
    its ``artifact``. A failed call (:class:`tghost.ToolCallError`) becomes the text
    ``"<error type>: <message>"`` in a ``ToolMessage`` with ``status="error"``.
    """
    view = tghost.ToolView(directory, groups=groups, state=state, include=include, exclude=exclude,
                           read_only=read_only, user=user, timeout=timeout)
    return [_tool(view, descriptor) for descriptor in view.reachable()]


def _tool(view: tghost.ToolView, descriptor: tghost.ToolDescriptor) -> StructuredTool:
    """The tool ``descriptor`` as a LangChain tool that calls it through ``view`` (see
    :func:`directory_tools` for its shape)."""
    name = descriptor.name

    async def progress(update: tghost.Progress) -> None:
        await adispatch_custom_event(PROGRESS_EVENT, {"tool": name, **update._asdict()})

    async def call(arguments: dict[str, Any]) -> str | tuple[str, dict[str, Any]]:
        try:
            observation = await view.invoke(name, arguments, progress=progress)
        except tghost.ToolCallError as error:
            raise ToolException(str(error)) from error
        if isinstance(observation, dict):
            return json.dumps(observation), observation
        return observation

    structured = descriptor.output_schema is not None
    return _Tool(name=name, description=descriptor.description, args_schema=tghost.input_schema(descriptor),
                 coroutine=call, handle_tool_error=True, metadata=_hints(descriptor),
                 response_format="content_and_artifact" if structured else "content")


class _Tool(StructuredTool):  # type: ignore[misc]  # Any when LangChain is not installed
    """A ``StructuredTool`` whose coroutine gets the arguments as one dict, so an argument named
    ``config`` or ``run_manager`` (which LangChain passes a tool's function itself) reaches the tool."""

    def _to_args_and_kwargs(self, tool_input: str | dict[str, Any], tool_call_id: str | None) -> Any:
        _, arguments = super()._to_args_and_kwargs(tool_input, tool_call_id)  # no args: text input is refused
        return (arguments,), {}


def _hints(descriptor: tghost.ToolDescriptor) -> dict[str, Any]:
    """``{"title", "annotations"}``: the tool's title (``None`` without one) and its hints in the
    wire's spelling, unset ones left out (``{}`` without any), as the other integrations give them."""
    annotations = {} if descriptor.annotations is None else descriptor.annotations.model_dump(
        by_alias=True, exclude_none=True)
    return {"title": descriptor.title, "annotations": annotations}


class DirectoryMiddleware(AgentMiddleware):  # type: ignore[misc]  # Any when LangChain is not installed
    """Agent middleware for ``langchain.agents.create_agent(model, middleware=[...])`` that
    offers the model, at each model call, the tools ``view`` offers then: a tool a host
    announces mid-run is offered at the next model call, a withdrawn one is not, and a seed 001
    state move (the view's) changes what is offered next. The agent's tool node runs the tools
    it offered through ``view``; the tools passed to ``create_agent`` are offered beside them.

    The agent must run asynchronously (``ainvoke``, ``astream``). The view's state is the
    agent's: for another conversation, build the agent with ``DirectoryMiddleware(view.fork())``.
    """

    def __init__(self, view: tghost.ToolView) -> None:
        super().__init__()
        self.view = view
        self.tools: list[BaseTool] = []  # none registered up front: each model call is offered the live ones
        self.offered: dict[str, StructuredTool] = {}
        """The tools offered at the last model call, by name: those the tool node may be asked to run."""

    async def awrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[Any]]) -> Any:
        """Offer the model the view's tools now, beside the agent's own."""
        self.offered = {descriptor.name: _tool(self.view, descriptor) for descriptor in self.view.tools()}
        own = [tool for tool in request.tools if getattr(tool, "name", None) not in self.offered]
        return await handler(request.override(tools=[*own, *self.offered.values()]))

    async def awrap_tool_call(self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[Any]]
                              ) -> Any:
        """Run a tool this middleware offered through the view; hand any other to the agent."""
        tool = self.offered.get(request.tool_call["name"])
        return await handler(request if tool is None else request.override(tool=tool))
