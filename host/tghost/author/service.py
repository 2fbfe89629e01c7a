"""service: what a plugin writes. A ``ToolService`` subclass (seed 000's DynamicToolService)
or a typed function under ``@tghost.tool`` (as FastMCP and llm derive tools from signatures).

This module only describes and invokes; serving is :mod:`tghost.serving`'s job.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import inspect
import json
import math
import re
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, NamedTuple, get_type_hints, overload

import docstring_parser
import typing_extensions
from pydantic import BaseModel, ConfigDict, Field, PydanticUserError, TypeAdapter, ValidationError, create_model
from pydantic_core import PydanticSerializationError, to_jsonable_python

from tghost.author.arguments import Problem, closed_schema, coerce, jsonschema_problems, unknown
from tghost.protocol import wire
from tghost.protocol.callers import Caller
from tghost.protocol.descriptors import (
    ADDED_TOOL_KEYS,
    Argument,
    ConfigParam,
    DescriptorError,
    ToolDescriptor,
    ToolServiceDescriptor,
    describe_validation_error,
    request_queue,
    response_queue,
    schema_of_arguments,
)

__all__ = ["HINTS", "Call", "Context", "InvalidArguments", "ToolError", "ToolService", "arguments_from_schema",
           "check_param_name", "current_caller", "current_context", "invoke", "observation", "served_tool", "tool"]


class ToolError(Exception):
    """Raise from ``invoke`` to answer with an error of your choosing.

    The reply is ``{"error": {"type": error_type, "message": str(self)}}``; the default type
    is TrustGraph's ``tool-service-error``. Any other exception gets that type too.
    """

    def __init__(self, message: str, error_type: str = wire.TOOL_SERVICE_ERROR) -> None:
        super().__init__(message)
        self.error_type = error_type


class InvalidArguments(ToolError):
    """The arguments do not match the tool's input schema; the message names the field."""

    def __init__(self, message: str) -> None:
        super().__init__(message, wire.INVALID_ARGUMENTS)

    @classmethod
    def at(cls, problems: Iterable[tuple[Sequence[str | int], str]]) -> InvalidArguments:
        """One error for several ``(field path, message)`` problems, each as ``argument 'a.b': message``
        (``arguments: message`` for the object itself), joined by ``; ``."""
        return cls("; ".join(
            f"argument '{'.'.join(str(p) for p in path)}': {message}" if path else f"arguments: {message}"
            for path, message in problems
        ))


@dataclass(frozen=True)
class Context:
    """Per-call facts, injected into a ``@tool`` function parameter annotated ``tghost.Context``.

    ``user`` is the request's user, as the caller asserted it (nothing checks it); ``config``
    the tool's config values (seed 000); ``caller`` the verified caller (name and key id), when
    the host has an ``[access]`` policy and the request was signed by one of its callers, else
    ``None`` (docs/guides/security.md "Who may call what").
    """

    user: str
    config: dict[str, Any] = field(default_factory=dict)
    caller: Caller | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    """Set once the caller cancels the call (docs/protocol.md §2.11). An ``async def`` tool is
    cancelled as an asyncio task; a plain ``def`` one runs on in its thread, so a long one
    should check ``ctx.cancelled.is_set()`` between steps and stop. Its caller is answered
    ``cancelled`` at once either way."""
    report: Callable[[wire.Progress], None] | None = field(default=None, repr=False, compare=False)
    """Where :meth:`progress` sends its updates (the host sets it; ``None``: nowhere)."""

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Tell the caller how far the call has got: ``done`` units of ``total`` (``None``:
        unknown), and a short ``message`` for a person (docs/protocol.md §2.12). Cheap: the host
        sends an update only to a caller that asked for them, at most 10 a second (and always
        the one that reaches ``total``, and the latest one held back just before the answer);
        outside a call, or unasked, it does nothing.

        Raises:
            TypeError: ``done`` or ``total`` is not a number, or ``message`` not a string.
            ValueError: ``done`` is negative or not finite, or ``total`` is not positive and finite.
        """
        _check_progress(done, total, message)
        if self.report is not None:
            self.report(wire.Progress(done, total, message[:MAX_PROGRESS_MESSAGE] if message else message))


#: Characters of a progress message sent to the caller; the rest is cut.
MAX_PROGRESS_MESSAGE = 200


def _check_progress(done: Any, total: Any, message: Any) -> None:
    for name, value in (("done", done), ("total", total)):
        if value is None and name == "total":
            continue
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise TypeError(f"progress {name} must be a number, not {type(value).__name__}")
        if not math.isfinite(value) or value < 0 or (name == "total" and value == 0):
            raise ValueError(f"progress {name} must be {'a positive' if name == 'total' else 'a non-negative'} "
                             f"finite number, not {value!r}")
    if message is not None and not isinstance(message, str):
        raise TypeError(f"progress message must be a string, not {type(message).__name__}")


class Call(NamedTuple):
    """One call to make: the request's asserted ``user``, its ``config`` values, the checked
    ``arguments`` (seed 000 envelope), the verified ``caller`` (``None``: anonymous), the event
    set when the caller cancels it and where its progress updates go (both ``None`` when
    nobody listens: in a worker process, ``cancelled`` is replaced by killing the worker)."""

    user: str
    config: dict[str, Any]
    arguments: dict[str, Any]
    caller: Caller | None = None
    cancelled: threading.Event | None = None
    report: Callable[[wire.Progress], None] | None = None


_CALL: ContextVar[Call | None] = ContextVar("tghost_call", default=None)


def current_caller() -> Caller | None:
    """The verified caller of the call whose ``invoke`` is running (``None``: anonymous, or not
    in a call): for a :class:`ToolService` subclass, whose ``invoke`` has no :class:`Context`."""
    call = _CALL.get()
    return None if call is None else call.caller


def current_context() -> Context | None:
    """The :class:`Context` of the call whose ``invoke`` is running (``None``: not in a call): for
    a :class:`ToolService` subclass, whose ``invoke`` has no ``Context`` parameter. Its
    ``progress`` and ``cancelled`` are the call's, as a ``@tool`` function's are."""
    call = _CALL.get()
    return None if call is None else _context(call.user, call.config)


def invoke(service: ToolService, call: Call) -> Any:
    """``service.invoke(user, config, arguments)`` with ``call`` current while it runs (for
    :func:`current_caller`, :func:`current_context` and a ``@tool`` function's :class:`Context`;
    an ``async`` invoke's coroutine is built here and returned wrapped, so the call is current
    while it is awaited too). For a service with an :attr:`~ToolService.output_schema`,
    returns the result's JSON text once it is checked against it (for an ``async`` invoke, a
    coroutine that awaits it first). Every executor and the thread lane run this, so the check is
    written once and made where the plugin runs (in a worker process, there).

    Raises:
        ToolError: ``tool-service-error``: the result does not match the output schema (the
            message names the field), or streams.
    """
    token = _CALL.set(call)
    try:
        result = service.invoke(call.user, call.config, call.arguments)
    finally:
        _CALL.reset(token)
    if inspect.iscoroutine(result):
        result = _with_call(call, result)
    return result if service.output_schema is None else _structured(service, result)


async def _with_call(call: Call, coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Await ``coroutine`` with ``call`` current (in the awaiting task's context)."""
    token = _CALL.set(call)
    try:
        return await coroutine
    finally:
        _CALL.reset(token)


def _structured(service: ToolService, result: Any) -> Any:
    """:meth:`ToolService._observation` of ``result``, or a coroutine of it for an awaitable."""
    if inspect.isawaitable(result):
        return _awaited_structured(service, result)
    if inspect.isgenerator(result) or inspect.isasyncgen(result):
        raise ToolError(f"service {service.id!r}: invoke returned a stream, but the service has an output schema; "
                        "return one value")
    return service._observation(result)


async def _awaited_structured(service: ToolService, awaitable: Any) -> str:
    return service._observation(await awaitable)


def _context(user: str, config: dict[str, Any]) -> Context:
    """The :class:`Context` of the current call (a bare one outside a call)."""
    call = _CALL.get()
    if call is None:
        return Context(user=user, config=config)
    return Context(user=user, config=config, caller=call.caller, cancelled=call.cancelled or threading.Event(),
                   report=call.report)


class ToolService:
    """Base class for a tool service, in the manner of seed 000's ``DynamicToolService``.

    Set ``id`` (required) and optionally ``topic`` (default: ``id``), ``description``,
    ``config_params`` (``ConfigParam`` or plain names, meaning optional), ``arguments`` (seed 000
    ``Argument`` list, each one required), ``input_schema`` (a JSON Schema object; default: derived
    from ``arguments``), ``allow_unknown_arguments`` (default ``False``: arguments the schema does
    not name are answered ``invalid-arguments``), ``timeout`` (seconds), ``max_concurrency``,
    ``version``, ``persistent`` and ``isolation``. The host checks every call's arguments against
    :attr:`arguments_schema` before ``invoke`` (:mod:`tghost.author.arguments`; docs/reference/plugin-api.md). Override
    ``invoke(user, config, arguments)``: plain or ``async``, returning a string or a
    JSON-able value, or a (sync or async) generator to stream chunks.

    ``persistent = True`` serves the requests from ``persistent://tg/request/<topic>``
    instead of the non-persistent topic: a request waits in the broker until a host takes
    it, and one whose host dies mid-call is delivered again to another host (at least once,
    so ``invoke`` should be safe to repeat). Responses stay non-persistent.

    ``isolation = "process"`` runs ``invoke`` in worker processes whatever the host's default
    (``tghost run --isolation``): a call that crashes, hangs or leaks costs one worker, never the
    host. ``"thread"`` keeps it in the host's threads; ``None`` (default) takes the host's choice.

    ``title`` (a name for people) and the behaviour hints ``read_only``, ``destructive``,
    ``idempotent`` and ``open_world`` (each ``True``, ``False`` or ``None``: unset, left out of
    the descriptor, so MCP's defaults apply) are what the service's tools carry, unless
    :meth:`tool` gives a tool its own. ``output_schema`` (a JSON Schema whose root ``"type"`` is
    ``"object"``) makes the service's result typed: every one of its tools announces it as its
    ``output-schema``, and the host checks what ``invoke`` returns (a dict, or a pydantic model)
    against it and sends it as JSON text, or answers ``tool-service-error`` naming the field.
    """

    id: str
    topic: str | None = None
    description: str | None = None
    config_params: Sequence[ConfigParam | str] = ()
    arguments: Sequence[Argument] = ()
    input_schema: dict[str, Any] | None = None
    allow_unknown_arguments: bool = False
    timeout: float | None = None
    max_concurrency: int | None = None
    version: str | None = None
    persistent: bool = False
    isolation: str | None = None
    title: str | None = None
    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None
    open_world: bool | None = None
    output_schema: dict[str, Any] | None = None
    #: Set by discovery: ``(name, value, config)`` of the entry point that registered this service.
    _tghost_entry_point: tuple[str, str, dict[str, Any]] | None = None

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        """Answer one request; see the class docstring for what may be returned.

        The host passes the ``arguments`` that :meth:`check_arguments` returned.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement invoke()")

    @functools.cached_property
    def arguments_schema(self) -> dict[str, Any]:
        """The JSON Schema the arguments are checked against and every tool announces as its
        ``input-schema``: ``input_schema``, else one derived from ``arguments`` (every argument
        required), with ``additionalProperties: false`` unless ``allow_unknown_arguments`` or the
        schema sets it itself."""
        schema = self.input_schema if self.input_schema is not None else schema_of_arguments(self.arguments)
        return closed_schema(schema, self.allow_unknown_arguments)

    def check_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check ``arguments`` against :attr:`arguments_schema` and return what ``invoke`` receives:
        the arguments with the policy's conversions (``"10"`` for a number is ``10``;
        :func:`tghost.author.arguments.coerce`). The validator is compiled once per service (JSON Schema
        draft from the schema's ``$schema``, default the latest).

        Raises:
            InvalidArguments: an argument is unknown, missing or breaks the schema; the message
                names each field path.
            jsonschema.SchemaError: the schema itself is not a valid JSON Schema.
        """
        arguments = self._converted_and_known(arguments)
        errors = sorted(self._arguments_validator.iter_errors(arguments), key=lambda e: list(map(str, e.absolute_path)))
        problems = list(jsonschema_problems(errors))
        if problems:
            raise InvalidArguments.at(problems[:_MAX_ERRORS])
        return arguments

    def _converted_and_known(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The first two steps of the policy, shared by both styles: ``arguments`` with the
        conversions applied (:func:`tghost.author.arguments.coerce`).

        Raises:
            InvalidArguments: an argument the schema does not name (:func:`tghost.author.arguments.unknown`).
        """
        arguments = coerce(arguments, self.arguments_schema)
        problems = unknown(arguments, self.arguments_schema)
        if problems:
            raise InvalidArguments.at(problems[:_MAX_ERRORS])
        return arguments

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the compiled validator (it holds local functions); a worker process
        compiles its own on first use."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_arguments_validator", "_output_validator")}

    @functools.cached_property
    def _arguments_validator(self) -> Any:
        return _validator(self.arguments_schema)

    @functools.cached_property
    def _output_validator(self) -> Any:
        return _validator(self.output_schema or {})

    def _observation(self, result: Any) -> str:
        """The JSON text of ``result`` (a pydantic model dumped as JSON data), checked against
        :attr:`output_schema` with jsonschema.

        Raises:
            ToolError: ``tool-service-error``: the result is not JSON data, or does not match
                the schema (the message names each field).
        """
        try:
            value = to_jsonable_python(result)
        except PydanticSerializationError as exc:
            raise _not_json(self.id, exc) from None
        errors = sorted(self._output_validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))
        if errors:
            raise _mismatch(self.id, jsonschema_problems(errors))
        return _json_text(self.id, value)

    @property
    def _code(self) -> Callable[..., Any]:
        """The function a call runs: whether it is async or a generator tells how to run it."""
        return type(self).invoke

    @property
    def runs_in_thread(self) -> bool:
        """True when ``invoke`` is plain (blocking) code that the host runs in a worker thread."""
        return not _is_async(self._code)

    @property
    def descriptor(self) -> ToolServiceDescriptor:
        """The seed 000 tool-service descriptor.

        Raises:
            DescriptorError: a field is invalid, ``input_schema`` (or a type in ``arguments``) is
                not a valid JSON Schema, ``isolation`` is not ``"thread"``, ``"process"`` or
                ``None``, a config param is named after a tool key (``title``, ``annotations``,
                ``output-schema``), or ``output_schema`` is not a JSON Schema object or belongs
                to an ``invoke`` that streams; one line naming the service and the field.
        """
        import jsonschema  # here, not at import: registration needs it, a plugin's import does not

        origin = f"service '{getattr(self, 'id', '?')}'"
        self._check_declared(origin)
        try:
            _ = self._arguments_validator  # compiled here, so a bad schema fails at registration
            topic = self.topic or self.id
            fields = {
                "id": self.id,
                "request-queue": _persistent_queue(topic) if self.persistent else request_queue(topic),
                "response-queue": response_queue(topic),
                "config-params": [_config_param(p) for p in self.config_params],
                "description": self.description,
                "timeout": self.timeout,
                "max-concurrency": self.max_concurrency,
                "version": self.version,
            }
            return ToolServiceDescriptor.model_validate({k: v for k, v in fields.items() if v is not None})
        except ValidationError as exc:
            raise describe_validation_error(exc, origin) from None
        except AttributeError as exc:  # no ``id``
            raise DescriptorError(f"{origin}: field '{exc.name}': not set (a ToolService needs an id)") from None
        except jsonschema.SchemaError as exc:
            raise _schema_error(origin, "input_schema" if self.input_schema is not None else "arguments", exc) from None

    def _check_declared(self, origin: str) -> None:
        """Raises :class:`DescriptorError` (``origin``: the service) for an ``isolation`` that is not
        one, a config param a directory of the first release would fill with a tool key
        (:data:`~tghost.protocol.descriptors.ADDED_TOOL_KEYS`), or a bad ``output_schema``."""
        if self.isolation not in (None, "thread", "process"):
            raise DescriptorError(f"{origin}: field 'isolation': {self.isolation!r} is not 'thread' or 'process'")
        for name in (_config_param(p)["name"] for p in self.config_params):
            check_param_name(origin, name)
        if self.output_schema is not None:
            self._check_output_schema(origin)

    def _check_output_schema(self, origin: str) -> None:
        import jsonschema

        where = f"{origin}: field 'output_schema'"
        if not isinstance(self.output_schema, dict) or self.output_schema.get("type") != "object":
            raise DescriptorError(f'{where}: an output schema describes a JSON object: its "type" must be "object"')
        if inspect.isgeneratorfunction(self._code) or inspect.isasyncgenfunction(self._code):
            raise DescriptorError(f"{where}: invoke streams (it is a generator), and a stream's chunks have no output "
                                  "schema; return one value, or drop the output schema")
        try:
            _ = self._output_validator  # compiled here, so a bad schema fails at registration
        except jsonschema.SchemaError as exc:
            raise _schema_error(origin, "output_schema", exc) from None

    def tool(self, name: str, description: str | None = None, **fields: Any) -> ToolDescriptor:
        """A tool descriptor over this service, with this service's ``arguments`` (derived from
        the schema when empty), :attr:`arguments_schema` as its ``input-schema`` and
        :attr:`output_schema` as its ``output-schema``.

        ``fields`` holds seed 000/001 keys (``group``, ``state``, ``available_in_states``), the
        tool's ``title`` and hints (``read_only``, ``destructive``, ``idempotent``,
        ``open_world``: each, given, overrides the service's for this tool; ``None`` unsets it)
        and its config values, e.g. ``collection="customers"``.

        Raises:
            DescriptorError: a field is invalid, a hint is not ``True``, ``False`` or ``None``, or
                ``fields`` gives an output schema that is not the service's; one line naming
                the tool and the field.
        """
        origin = f"service '{self.id}': tool '{name}'"
        declared = {key: fields.pop(key, getattr(self, key)) for key in ("title", *HINTS)}
        if "output_schema" in fields:  # by its Python name: the wire key, so it is the one checked
            fields["output-schema"] = fields.pop("output_schema")
        schema = self.arguments_schema
        base: dict[str, Any] = {
            "name": name,
            "description": description or self.description,
            "service": self.id,
            "arguments": [a.model_dump() for a in self.arguments or arguments_from_schema(schema)],
            "input-schema": schema,
            **_declared(declared, self.output_schema, origin),
        }
        try:
            tool = ToolDescriptor.model_validate(base | fields)
        except ValidationError as exc:
            raise describe_validation_error(exc, origin) from None
        _check_output_schema_of(tool, self)
        return tool

    def default_tools(self) -> list[ToolDescriptor]:
        """Tools registered together with the service. None for a class-based service."""
        return []


def check_param_name(origin: str, name: str) -> None:
    """Raises :class:`DescriptorError` (``origin``: the service) for a config param ``name``
    that a directory of the first release would fill with a tool key
    (:data:`~tghost.protocol.descriptors.ADDED_TOOL_KEYS`)."""
    if name in ADDED_TOOL_KEYS:
        keys = ", ".join(sorted(ADDED_TOOL_KEYS))
        raise DescriptorError(f"{origin}: config param {name!r}: a tool key of the protocol ({keys}), which a "
                              "host drops from a request's config; give the param another name")


def served_tool(tool: ToolDescriptor, service: ToolService) -> ToolDescriptor:
    """``tool`` (a dict's or a config file's) as a tool of ``service``, which this host serves:
    with the service's ``title``, hints (``annotations``) and output schema where it gives none.
    A service's output schema is every one of its tools' (the host checks the service's result
    against it, whichever tool was called). Over a service without one, a tool's own output
    schema is announced as given, unchecked: the service must answer that tool with the JSON
    text of a matching object.

    Raises:
        DescriptorError: the tool gives an output schema that is not its service's, or the
            service's hints are not booleans.
    """
    _check_output_schema_of(tool, service)
    given = tool.to_json_dict()
    declared = {key: getattr(service, key) for key in ("title", *HINTS)}
    missing = {k: v for k, v in _declared(declared, service.output_schema, f"service '{service.id}'").items()
               if k not in given}
    return ToolDescriptor.model_validate(given | missing) if missing else tool


def _check_output_schema_of(tool: ToolDescriptor, service: ToolService) -> None:
    """Raises :class:`DescriptorError`: ``tool`` gives an output schema, and ``service`` has another."""
    if service.output_schema is not None and tool.output_schema not in (None, service.output_schema):
        raise DescriptorError(f"tool '{tool.name}': field 'output-schema': a tool's output schema is its service's, "
                              f"and service '{service.id}' has another; leave the key out")


#: At most this many argument problems are named in one ``invalid-arguments`` reply.
_MAX_ERRORS = 10


def _persistent_queue(topic: str) -> str:
    """The persistent request topic of a ``persistent`` service: ``persistent://tg/request/T``."""
    return "persistent" + request_queue(topic).removeprefix("non-persistent")


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)


#: A tool's behaviour hints, by their Python names (``ToolAnnotations``' fields; wire keys
#: ``read-only``, ``destructive``, ``idempotent``, ``open-world``).
HINTS = ("read_only", "destructive", "idempotent", "open_world")


def _declared(declared: dict[str, Any], output_schema: dict[str, Any] | None, origin: str) -> dict[str, Any]:
    """A tool's ``title``, ``annotations`` and ``output-schema`` keys, each only when set (an
    unset hint is left out, so MCP's default applies).

    Raises:
        DescriptorError: a hint is not ``True``, ``False`` or ``None`` (``origin``: the tool).
    """
    hints = {key: declared[key] for key in HINTS if declared[key] is not None}
    for key, value in hints.items():
        if not isinstance(value, bool):
            raise DescriptorError(f"{origin}: field '{key}': {value!r} is not True, False or None")
    keys = {"title": declared["title"], "annotations": hints or None, "output-schema": output_schema}
    return {key: value for key, value in keys.items() if value is not None}


def _validator(schema: dict[str, Any]) -> Any:
    """A jsonschema validator of ``schema`` (its draft from ``$schema``, default the latest).

    Raises:
        jsonschema.SchemaError: ``schema`` is not a valid JSON Schema.
    """
    import jsonschema  # here, not at import: only class services and explicit output schemas need it

    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def _schema_error(origin: str, field: str, exc: Any) -> DescriptorError:
    """A ``jsonschema.SchemaError`` of ``field``'s schema as one line naming where it is wrong."""
    where = "/".join(map(str, exc.path)) or "(schema)"
    return DescriptorError(f"{origin}: field '{field}': not a valid JSON Schema at {where}: {exc.message}")


def _mismatch(service_id: str, problems: Iterable[Problem]) -> ToolError:
    """The ``tool-service-error`` of a result that breaks its service's output schema, naming
    each field (at most :data:`_MAX_ERRORS`)."""
    named = [f"field '{'.'.join(map(str, path))}': {message}" if path else message
             for path, message in list(problems)[:_MAX_ERRORS]]
    return ToolError(f"service {service_id!r}: the tool's result does not match its output schema: {'; '.join(named)}")


def _json_text(service_id: str, value: Any) -> str:
    """``value`` (JSON data) as JSON text: the one way both styles send a typed result.

    Raises:
        ToolError: ``tool-service-error``: it holds NaN or an infinity, which JSON has no number for.
    """
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError as exc:
        raise _not_json(service_id, exc) from None


def observation(service_id: str, result: Any) -> str:
    """The observation of a result (or one chunk) of service ``service_id``, one without an
    output schema: a string as it is, anything else as its JSON text (docs/protocol.md §2.5).

    Raises:
        ToolError: ``tool-service-error``: JSON cannot hold the result; the message names the type
            the tool returned (``service 'x': the tool returned a set, which is not JSON: ...``).
    """
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result)  # the encoder json keeps ready: no cost on the common path
    except (TypeError, ValueError):
        pass

    def refuse(value: Any) -> Any:
        held = "" if value is result else f"{_a(type(result).__name__)} holding "
        raise ToolError(f"service {service_id!r}: the tool returned {held}{_a(type(value).__name__)}, which is not "
                        "JSON: return a str, list, dict, number, bool or None")

    try:  # again, to say what it holds that JSON cannot
        return json.dumps(result, default=refuse)
    except (TypeError, ValueError) as exc:  # a key JSON cannot hold, a cycle
        raise _not_json(service_id, exc) from None


def _a(noun: str) -> str:
    """``noun`` with its indefinite article: ``a set``, ``an int``."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _not_json(service_id: str, exc: Exception) -> ToolError:
    """The ``tool-service-error`` of a result that JSON cannot hold (``exc`` says why)."""
    return ToolError(f"service {service_id!r}: the tool's result is not JSON data: {exc}")


def _config_param(param: ConfigParam | str) -> dict[str, Any]:
    return {"name": param, "required": False} if isinstance(param, str) else param.model_dump()


class FunctionService(ToolService):
    """A tool service made by :func:`tool` from a typed function. Built by the decorator."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        service: str,
        tool_name: str,
        topic: str | None,
        description: str | None,
        config: Sequence[str],
        tool_fields: dict[str, Any],
        timeout: float | None,
        max_concurrency: int | None,
        persistent: bool = False,
        isolation: str | None = None,
        allow_unknown_arguments: bool = False,
        title: str | None = None,
        behaviour: dict[str, bool | None] | None = None,
        output_schema: dict[str, Any] | None = None,
    ) -> None:
        doc = docstring_parser.parse(fn.__doc__ or "")
        signature = inspect.signature(fn)
        hints = get_type_hints(fn, include_extras=True)
        self.fn = fn
        self.__doc__ = fn.__doc__
        self.id = service
        self.topic = topic
        self.description = description or _summary(doc) or f"The {tool_name} tool."
        self.timeout = timeout
        self.max_concurrency = max_concurrency
        self.persistent = persistent
        self.isolation = isolation
        self.allow_unknown_arguments = allow_unknown_arguments
        self.title = title
        for hint, value in (behaviour or {}).items():
            setattr(self, hint, value)
        self._result, derived = _typed_result(hints.get("return"), service) if output_schema is None else (None, None)
        self.output_schema = output_schema if output_schema is not None else derived
        self._tool_name = tool_name
        self._tool_fields = tool_fields
        self._context_param = next((n for n in signature.parameters if hints.get(n) is Context), None)
        self._config = tuple(
            ConfigParam(name=n, required=signature.parameters[n].default is inspect.Parameter.empty)
            for n in config
        )
        self.config_params = self._config
        skipped = {*config, self._context_param}
        self.model = _arguments_model(fn, signature, hints, doc, skipped, allow_unknown_arguments)
        self.input_schema = self.model.model_json_schema()
        self.arguments = arguments_from_schema(self.input_schema)

    @property
    def _code(self) -> Callable[..., Any]:
        return self.fn

    @functools.cached_property
    def _arguments_validator(self) -> Any:
        """None: the pydantic model checks the arguments, and the JSON Schema derived from it
        is valid by construction (compiling it for jsonschema cost 2 ms per plugin at start-up)."""
        return None

    @functools.cached_property
    def _output_validator(self) -> Any:
        """None for a result typed by the return annotation (its adapter checks it), as for the
        arguments; else the explicit ``output_schema``'s validator."""
        return None if self._result is not None else super()._output_validator

    def _observation(self, result: Any) -> str:
        """The result as its return annotation's JSON text (``TypeAdapter.validate_python``, then
        dumped as JSON data, :func:`_json_text`), or as :meth:`ToolService._observation` for an
        explicit ``output_schema``.

        Raises:
            ToolError: ``tool-service-error``: the result does not match (the message names each field).
        """
        if self._result is None:
            return super()._observation(result)
        try:
            value = self._result.dump_python(self._result.validate_python(result), mode="json")
        except ValidationError as exc:
            raise _mismatch(self.id, _pydantic_problems(exc)) from None
        except PydanticSerializationError as exc:
            raise _not_json(self.id, exc) from None
        return _json_text(self.id, value)

    def check_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check ``arguments`` by the same policy as a class service (:mod:`tghost.author.arguments`:
        conversions, then unknown names), then with the signature's pydantic model in strict JSON
        mode (a JSON value of the JSON type the schema says; a string for a ``datetime`` or an
        enum, an array for a tuple). Returns the parsed values, by parameter name.

        Raises:
            InvalidArguments: an argument is unknown, missing or of the wrong type (names the field).
        """
        arguments = self._converted_and_known(arguments)
        try:
            checked = self.model.model_validate_json(json.dumps(arguments), strict=True)
            return dict(checked.__dict__)  # the fields (unknown names are refused or ignored, never kept)
        except ValidationError as exc:
            raise InvalidArguments.at(_pydantic_problems(exc)) from None

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        """Call the function with ``arguments`` as :meth:`check_arguments` returned them, plus
        its config params from ``config`` and the :class:`Context` parameter, if any."""
        values = dict(arguments)
        for param in self._config:
            if param.name in config:
                values[param.name] = config[param.name]
        if self._context_param:
            values[self._context_param] = _context(user, config)
        return self.fn(**values)

    def default_tools(self) -> list[ToolDescriptor]:
        if any(p.required for p in self._config):
            return []
        return [self.tool(self._tool_name, **self._tool_fields)]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the undecorated function directly, as in unit tests."""
        return self.fn(*args, **kwargs)

    def __reduce__(self) -> tuple[Callable[[str, str], Any], tuple[str, str]]:
        """Pickled by reference, as a function is (module and qualified name), so a worker process
        can receive a service registered in-process; the decorated function must be a module global."""
        return _module_attribute, (self.fn.__module__, self.fn.__qualname__)


#: The most characters of a refused value an argument error echoes.
_MAX_ECHO = 60


def _pydantic_problems(exc: ValidationError) -> list[Problem]:
    """pydantic's errors as problems, a missing field worded as jsonschema's are (one policy),
    and a wrong value echoed as jsonschema's are (``Input should be a valid integer, got 'two'``)."""
    return [(e["loc"], "required, but not given" if e["type"] == "missing" else e["msg"] + _got(e.get("input")))
            for e in exc.errors()[:_MAX_ERRORS]]


def _got(value: Any) -> str:
    """``, got 'two'``: a scalar value that was refused, shortened to :data:`_MAX_ECHO` characters
    (nothing for an object or a list: the field path already says where)."""
    if isinstance(value, dict | list | tuple):
        return ""
    shown = repr(value)
    return f", got {shown if len(shown) <= _MAX_ECHO else shown[:_MAX_ECHO - 3] + '...'}"


def _typed_result(annotation: Any, service: str) -> tuple[TypeAdapter[Any] | None, dict[str, Any] | None]:
    """The pydantic adapter of a return annotation that types a result (a pydantic model, a
    ``TypedDict`` or a dataclass) and the JSON Schema of what it dumps (serialization mode);
    ``(None, None)`` for any other annotation (the result is sent as it is, untyped).

    Raises:
        DescriptorError: pydantic cannot build its schema (``typing.TypedDict`` before Python 3.12,
            a field of a type JSON cannot hold).
    """
    typed = typing_extensions.is_typeddict(annotation) or (
        isinstance(annotation, type) and (issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)))
    if not typed:
        return None, None
    try:
        adapter = TypeAdapter(annotation)
        return adapter, adapter.json_schema(mode="serialization")
    except PydanticUserError as exc:
        raise DescriptorError(f"service '{service}': field 'output_schema': the return annotation "
                              f"{annotation.__name__} has no JSON Schema: {str(exc).splitlines()[0]}") from None


def _module_attribute(module: str, qualname: str) -> Any:
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _summary(doc: docstring_parser.Docstring) -> str:
    """The docstring's summary and body as a tool description: paragraphs kept, the line wraps
    inside a paragraph undone (an agent reads it as prose, not as source)."""
    paragraphs = "\n\n".join(p for p in (doc.short_description, doc.long_description) if p)
    return re.sub(r"(?<!\n)\n(?!\n)", " ", paragraphs)


def _arguments_model(
    fn: Callable[..., Any],
    signature: inspect.Signature,
    hints: dict[str, Any],
    doc: docstring_parser.Docstring,
    skipped: set[str | None],
    allow_unknown: bool,
) -> type[BaseModel]:
    descriptions = {p.arg_name: p.description for p in doc.params}
    fields: dict[str, Any] = {}
    for name, param in signature.parameters.items():
        if name in skipped or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[name] = (hints.get(name, str), Field(default, description=descriptions.get(name)))
    model_name = re.sub(r"\W", "_", fn.__name__) + "Arguments"
    config = ConfigDict(extra="ignore" if allow_unknown else "forbid")
    return create_model(model_name, __config__=config, **fields)


def arguments_from_schema(schema: dict[str, Any]) -> tuple[Argument, ...]:
    """The seed 000 ``arguments`` list of a JSON Schema object: one :class:`Argument` per top-level
    property, with its ``type`` (the first non-null one of an ``anyOf``; ``string`` if none) and
    ``description`` (``""`` if none)."""
    return tuple(
        Argument(name=name, type=_json_type(prop), description=prop.get("description", ""))
        for name, prop in schema.get("properties", {}).items()
    )


def _json_type(prop: dict[str, Any]) -> str:
    if "type" in prop:
        return str(prop["type"])
    types = [p.get("type") for p in prop.get("anyOf", []) if p.get("type") not in (None, "null")]
    return str(types[0]) if types else "string"


@overload
def tool(fn: Callable[..., Any], /) -> FunctionService: ...


@overload
def tool(fn: None = None, /, **options: Any) -> Callable[[Callable[..., Any]], FunctionService]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    service: str | None = None,
    topic: str | None = None,
    description: str | None = None,
    config: Sequence[str] = (),
    timeout: float | None = None,
    max_concurrency: int | None = None,
    persistent: bool = False,
    isolation: str | None = None,
    allow_unknown_arguments: bool = False,
    title: str | None = None,
    read_only: bool | None = None,
    destructive: bool | None = None,
    idempotent: bool | None = None,
    open_world: bool | None = None,
    output_schema: dict[str, Any] | None = None,
    **tool_fields: Any,
) -> FunctionService | Callable[[Callable[..., Any]], FunctionService]:
    """Turn a typed function into a tool service (and, usually, its tool).

    Usable bare (``@tool``) or with options (``@tool(name="add")``). The tool name defaults
    to the function name with ``_`` as ``-``; the service id defaults to the tool name; the
    description to the docstring. Parameters become the tool's arguments and JSON Schema
    (pydantic model ``<fn>Arguments``; unannotated means ``str``); parameter descriptions
    come from the docstring's Args section. Parameters named in ``config`` are filled from
    the tool's config values instead (required when they have no default); a parameter
    annotated :class:`Context` receives the user and config. ``timeout`` (seconds),
    ``max_concurrency``, ``persistent``, ``isolation`` and ``allow_unknown_arguments`` (unknown
    arguments are then dropped, as the function has no parameter for them) are as on
    :class:`ToolService`, and so are ``title`` and the hints ``read_only``, ``destructive``,
    ``idempotent`` and ``open_world`` (``None``: unset, left out).

    A return annotation that is a pydantic model, a ``TypedDict`` or a dataclass types the
    result: its JSON Schema is the service's ``output_schema``, and what the function returns is
    validated by it (pydantic) and sent as JSON text. ``output_schema`` (a JSON Schema object)
    given explicitly wins: the result is then checked against it with jsonschema.

    ``tool_fields`` are keys of the function's own tool: seed 001's ``group``, ``state`` and
    ``available_in_states`` (``applicable-states``), and values of the parameters named in ``config``.

    Returns:
        a ``FunctionService`` (bare use), or a decorator that makes one; call a
        ``FunctionService`` like the original function.

    Raises:
        TypeError: a keyword in ``tool_fields`` is none of these (the message names the closest one).
        DescriptorError: the return annotation has no JSON Schema (at decoration).
    """
    _check_tool_fields(tool_fields, config)
    behaviour = {"read_only": read_only, "destructive": destructive, "idempotent": idempotent, "open_world": open_world}

    def decorate(func: Callable[..., Any]) -> FunctionService:
        tool_name = name or func.__name__.replace("_", "-")
        return FunctionService(
            func,
            service=service or tool_name,
            tool_name=tool_name,
            topic=topic,
            description=description,
            config=config,
            tool_fields=tool_fields,
            timeout=timeout,
            max_concurrency=max_concurrency,
            persistent=persistent,
            isolation=isolation,
            allow_unknown_arguments=allow_unknown_arguments,
            title=title,
            behaviour=behaviour,
            output_schema=output_schema,
        )

    return decorate(fn) if fn is not None else decorate


#: The seed 001 keys of a function's own tool that ``@tghost.tool`` takes besides its options.
_TOOL_KEYS = ("group", "state", "available_in_states", "applicable-states")


def _check_tool_fields(tool_fields: dict[str, Any], config: Sequence[str]) -> None:
    """Raises ``TypeError`` for a keyword of ``@tghost.tool`` that is neither a seed 001 tool key
    nor a config value of a parameter named in ``config``, naming the closest valid name."""
    for key in tool_fields:
        if key in _TOOL_KEYS or key in config:
            continue
        options = [p for p in inspect.signature(tool).parameters if p not in ("fn", "tool_fields")]
        close = difflib.get_close_matches(key, [*options, *_TOOL_KEYS, *config], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise TypeError(f"tghost.tool() got an unexpected keyword argument {key!r}{hint} (it takes its options, the "
                        f"tool keys {', '.join(_TOOL_KEYS[:3])}, and values of the parameters named in config=)")
