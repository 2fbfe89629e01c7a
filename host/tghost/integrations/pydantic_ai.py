"""pydantic_ai: the live tool directory as a Pydantic AI toolset. :class:`DirectoryToolset` offers
an agent, at each run step, the tools a :class:`tghost.ToolView` offers then, and calls them through
it: each run on its own fork of the view, so the seed 001 state a call moves to is the next call's,
and the next run starts afresh. A tool error reaches the model as a tool result it can act on.
Needs the framework: ``pip install "tghost[pydantic-ai]"`` (docs/integrations/pydantic-ai.md).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from weakref import WeakValueDictionary

import tghost
from tghost import protocol

try:
    from pydantic_ai import CustomEvent, ModelRetry, RunContext, ToolDefinition, ToolFailed, UserError
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
except ImportError as missing:
    needs = 'tghost.integrations.pydantic_ai needs Pydantic AI: pip install "tghost[pydantic-ai]"'
    raise ImportError(needs) from missing
from pydantic_core import SchemaValidator, core_schema

__all__ = ["DirectoryToolset", "ToolProgress"]

#: The error types a model can put right by calling again with other arguments: these reach it as
#: a retry prompt (:class:`pydantic_ai.ModelRetry`, which spends the tool's retries); every other
#: error type as a failed tool result (:class:`pydantic_ai.ToolFailed`), which ends nothing.
RETRY = frozenset({protocol.INVALID_ARGUMENTS})
#: Pydantic AI's check of the arguments before a call: a JSON object. The host checks them
#: against the tool's input schema and answers ``invalid-arguments``, which :data:`RETRY` holds.
ARGUMENTS = SchemaValidator(core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema()))
#: The most tools the directory ranks for one search (:meth:`tghost.ToolView.search`).
MOST_FOUND = 1000


# The type: ignores are for mypy where Pydantic AI is not installed (tox -e type), where its classes are Any.
@dataclass(repr=False, kw_only=True)
class ToolProgress(CustomEvent, name="tghost_progress"):  # type: ignore[misc, call-arg]
    """A running tghost call's progress update (docs/protocol.md §2.12), emitted into the run's
    event stream (``agent.run_stream_events``, ``event_stream_handler``) with the ``tool_call_id``
    and ``tool_name`` of its call: ``done`` units of ``total`` (``None``: unknown) and a short
    ``message`` for a person (or ``None``). Never shown to the model."""

    done: float
    total: float | None = None
    message: str | None = None


class DirectoryToolset(AbstractToolset[Any]):  # type: ignore[misc]
    """The live tools of ``directory`` (a started :class:`tghost.ToolDirectory`) as a Pydantic AI
    toolset: at each run step, the tools a request with ``groups`` (``None``: the ``default``
    group; ``["*"]``: every group) in the run's current seed 001 state may use, narrowed by
    ``include``/``exclude`` name globs and ``read_only`` (:class:`tghost.ToolView`), called as
    ``user`` with ``timeout`` (seconds; ``None``: the service's own). A tool a host announces
    mid-run is offered at the next step; one withdrawn is no longer offered.

    Each run gets a fork of the view at ``state`` (:meth:`for_run`), so the state a call moves
    to is carried to the next call of the same run, and each run starts afresh.

    Each tool's definition has its name, description and input schema
    (:func:`tghost.input_schema`); its output schema as ``return_schema``, which reaches the
    model where the agent includes return schemas (``toolset.include_return_schemas()``);
    ``metadata`` ``{"title", "annotations"}``, the hints in the wire's spelling (e.g.
    ``{"read-only": True}``); and ``sequential`` when a call moves the state, so the calls the
    model asked for after it are made in the new state.

    ``max_retries`` is each tool's retry budget (``None``: the agent's); ``id`` names the
    toolset among an agent's (durable execution needs one).
    """

    def __init__(self, directory: tghost.ToolDirectory, *, groups: Sequence[str] | None = None,
                 state: str | None = None, include: Sequence[str] = (),
                 exclude: Sequence[str] = (), read_only: bool = False, user: str | None = None,
                 timeout: float | None = None, max_retries: int | None = None, id: str | None = None) -> None:
        self.view = tghost.ToolView(directory, groups=groups, state=state, include=include,
                                    exclude=exclude, read_only=read_only, user=user, timeout=timeout)
        self.max_retries = max_retries
        self._id = id
        self._runs: WeakValueDictionary[str, tghost.ToolView] = WeakValueDictionary()

    @property
    def id(self) -> str | None:
        """The ``id`` it was given, or ``None``."""
        return self._id

    async def for_run(self, ctx: RunContext[Any]) -> DirectoryToolset:
        """A copy of this toolset for one agent run, on a fork of its view at the starting state
        (:meth:`tghost.ToolView.fork`). Pydantic AI calls it once per run."""
        run = copy.copy(self)
        run.view = self.view.fork()
        if ctx.run_id is not None:
            self._runs[ctx.run_id] = run.view
        return run

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """The tools the view offers now, by name (:meth:`tghost.ToolView.tools`)."""
        retries = ctx.max_retries if self.max_retries is None else self.max_retries
        return {tool.name: ToolsetTool(toolset=self, tool_def=definition(tool), max_retries=retries,
                                       args_validator=ARGUMENTS) for tool in self.view.tools()}

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> str | dict[str, Any]:
        """Call tool ``name`` with ``tool_args`` through the view (:meth:`tghost.ToolView.invoke`)
        and return its observation: text, or the JSON object of a tool with an output schema.
        Its progress updates go to the run's event stream as :class:`ToolProgress`; cancelling
        the run cancels the call on its host.

        Raises:
            pydantic_ai.ModelRetry: the call failed with an error type in :data:`RETRY`
                (``invalid-arguments``); the model reads ``"type: message"`` and may try again.
            pydantic_ai.ToolFailed: the call failed otherwise (``tool-service-error``,
                ``unauthorized``, ``not-allowed``, ``no-provider``, ``timeout``, ...); the model
                reads ``"type: message"`` as the tool's failed result.
        """

        async def progress(update: tghost.Progress) -> None:
            with contextlib.suppress(UserError):  # a context with no event stream (outside a run): no one to tell
                await ctx.emit(ToolProgress(done=update.done, total=update.total, message=update.message))

        try:
            return await self.view.invoke(name, tool_args, progress=progress)
        except tghost.ToolCallError as error:
            if error.error_type in RETRY:
                raise ModelRetry(str(error)) from error
            raise ToolFailed(str(error)) from error

    async def search(self, ctx: RunContext[Any], queries: Sequence[str], tools: Sequence[ToolDefinition]) -> list[str]:
        """The names of ``tools`` that the directory's search ranks for ``queries`` (joined into
        one plain-language query), best first (:meth:`tghost.ToolView.search`: BM25 over name,
        description and arguments), in the run's current state: a ``strategy`` for Pydantic AI's
        tool search, ``ToolSearch(strategy=toolset.search)``, over this toolset's deferred tools
        (``toolset.defer_loading()``). Tools of ``tools`` from other toolsets are never found.

        Raises:
            pydantic_ai.ModelRetry: the queries have no words to search for.
        """
        view = self._runs.get(ctx.run_id or "", self.view)
        searched = {tool.name for tool in tools}
        try:
            found = view.search(" ".join(queries), MOST_FOUND)
        except tghost.SearchError as error:
            raise ModelRetry(str(error)) from error
        return [hit.tool.descriptor.name for hit in found if hit.tool.descriptor.name in searched]


def definition(tool: tghost.ToolDescriptor) -> ToolDefinition:
    """Pydantic AI's definition of ``tool`` (see :class:`DirectoryToolset`)."""
    hints = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else {}
    return ToolDefinition(name=tool.name, description=tool.description,
                          parameters_json_schema=tghost.input_schema(tool), return_schema=tool.output_schema,
                          include_return_schema=None if tool.output_schema else False,
                          sequential=tool.state is not None, metadata={"title": tool.title, "annotations": hints})
