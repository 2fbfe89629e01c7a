"""service: one mounted Amplifier tool as a tghost tool service of the same name.

Calls the tool as an Amplifier orchestrator does (seed 002): ``tool:pre``, ``execute()``, then
``tool:post`` (or ``tool:error``), on the module's own loop; and turns its ``ToolResult`` into
a seed 000 observation or error reply. Never touches Pulsar: the host serves it.
"""

from __future__ import annotations

import json
from typing import Any

from amplifier_core.events import TOOL_ERROR, TOOL_POST, TOOL_PRE
from pydantic_core import to_jsonable_python

from tghost import ToolDescriptor, ToolError, ToolService
from tghost.protocol import NOT_ALLOWED, TOOL_SERVICE_ERROR

from .runtime import ModuleRuntime

__all__ = ["AmplifierToolService", "input_schema_of", "observation"]


def input_schema_of(tool: Any) -> dict[str, Any] | None:
    """The tool's JSON Schema for its input: its ``input_schema`` (the Tool protocol of
    amplifier-core), else its ``get_schema()`` (seed 002's recommendation), else ``None``.

    Raises:
        TypeError: what the tool gives is not a dict.
    """
    schema = getattr(tool, "input_schema", None)
    if not schema and callable(getattr(tool, "get_schema", None)):
        schema = tool.get_schema()
    if schema and not isinstance(schema, dict):
        raise TypeError(f"the input schema of tool {getattr(tool, 'name', '?')!r} is a {type(schema).__name__}, "
                        "not a JSON Schema object")
    return dict(schema) if schema else None


def observation(name: str, result: Any) -> str:
    """The seed 000 observation of a ``ToolResult``: ``output`` as it is if a string, else as JSON
    (pydantic's conversion; what JSON cannot hold, as its ``str``).

    Raises:
        ToolError: ``success`` is false: type the error dict's ``type`` (default
            ``tool-service-error``), message its ``message`` (else the output, else a default).
        TypeError: ``result`` is not a ``ToolResult`` (it has no ``success``).
    """
    if not hasattr(result, "success"):
        raise TypeError(f"tool {name!r} returned {type(result).__name__}, not a ToolResult")
    if not result.success:
        error = result.error if isinstance(result.error, dict) else {}
        error_type = error.get("type")
        message = error.get("message") or (result.output if isinstance(result.output, str) else None)
        raise ToolError(str(message or f"tool {name!r} reported a failure without a message"),
                        error_type if isinstance(error_type, str) and error_type else TOOL_SERVICE_ERROR)
    output = result.output
    return output if isinstance(output, str) else json.dumps(to_jsonable_python(output, fallback=str))


class AmplifierToolService(ToolService):
    """A tool ``name`` mounted by an Amplifier module, served as the tool service ``name``.

    ``description`` and ``input_schema`` are the tool's (see :func:`input_schema_of`); the host
    checks the arguments against the schema before :meth:`invoke`. The seed 000 ``arguments``
    list of its tool is derived from the schema (:meth:`tghost.ToolService.tool`), for TrustGraph agents.
    """

    def __init__(self, name: str, tool: Any, coordinator: Any, runtime: ModuleRuntime) -> None:
        self.id = name
        self.tool_object = tool
        self.coordinator = coordinator
        self.runtime = runtime
        self.description = str(getattr(tool, "description", "") or "").strip() or f"The Amplifier tool {name}."
        self.input_schema = input_schema_of(tool)
        # Served unchanged (its schema as the module wrote it): an Amplifier session hands a tool its
        # input as is, so arguments its schema does not close off reach it here too.
        self.allow_unknown_arguments = True

    def default_tools(self) -> list[ToolDescriptor]:
        """The tool of the same name, registered with the service (``read_file`` stays ``read_file``)."""
        return [self.tool(self.id)]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        """Execute the tool on its module's loop and return the observation (:func:`observation`).

        Raises:
            ToolError: ``not-allowed`` when a ``tool:pre`` hook of the module denies the call, or
                the failure the ``ToolResult`` reports.
            Exception: what ``execute()`` raised (answered ``tool-service-error``).
        """
        return await self.runtime.call(self._execute(arguments))

    async def _execute(self, arguments: dict[str, Any]) -> str:
        """One call, as Amplifier's orchestrators make it, with their event payloads."""
        verdict = await self._emit(TOOL_PRE, {"tool_name": self.id, "tool_input": arguments})
        if getattr(verdict, "action", None) == "deny":
            raise ToolError(getattr(verdict, "reason", None) or f"a tool:pre hook denied {self.id!r}", NOT_ALLOWED)
        try:
            result = await self.tool_object.execute(arguments)
        except Exception as exc:
            await self._emit(TOOL_ERROR, {"tool_name": self.id, "error": {"type": type(exc).__name__, "msg": str(exc)}})
            raise
        if self._heard(TOOL_POST):  # the payload's result costs a dump: only when someone listens
            await self._emit(TOOL_POST, {"tool_name": self.id, "tool_input": arguments, "result": _dump(result)})
        return observation(self.id, result)

    def _heard(self, event: str) -> bool:
        """Whether a handler is registered for ``event`` on the module's hooks."""
        return bool(self.coordinator.hooks.list_handlers(event).get(event))

    async def _emit(self, event: str, data: dict[str, Any]) -> Any:
        """Emit ``event`` if a handler is registered for it: amplifier-core 2.0.2's ``emit()`` took
        about 3 ms even with none (measured on the development machine), and an emit no handler
        hears changes nothing. Returns the ``HookResult``, or ``None``."""
        return await self.coordinator.hooks.emit(event, data) if self._heard(event) else None


def _dump(result: Any) -> Any:
    """A ``ToolResult`` as the ``tool:post`` payload's ``result`` (JSON-able)."""
    dump = getattr(result, "model_dump", None)
    return dump() if callable(dump) else to_jsonable_python(result, fallback=str)
