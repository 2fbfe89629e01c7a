"""descriptors: the two descriptor tiers of seed 000 (tool service, tool) plus seed 001's group/state,
tghost's additions to a tool (a title, behaviour hints and an output schema: docs/protocol.md §3.3),
and the JSON Schema of a seed 000 ``arguments`` list (:func:`schema_of_arguments`: a host checks
arguments against it, a caller shows it).

Pure data: JSON keys are exactly the seed's (``request-queue``, ``config-params`` ...).
No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from tghost.protocol.deployment import REQUEST_NAMESPACE, RESPONSE_NAMESPACE

__all__ = [
    "ADDED_TOOL_KEYS",
    "DEFAULT_TIMEOUT",
    "Argument",
    "ConfigParam",
    "DescriptorError",
    "ToolAnnotations",
    "ToolDescriptor",
    "ToolServiceDescriptor",
    "describe_validation_error",
    "request_queue",
    "response_queue",
    "schema_of_arguments",
]

#: Service ids and tool names: what Pulsar topics and MCP tool names both accept.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
#: Seconds a call may take when its service announces no ``timeout``: what a host serves with
#: unless told otherwise (``tghost run --timeout``), and what a caller waits.
DEFAULT_TIMEOUT = 30.0
#: The tool keys tghost added after its first release (docs/protocol.md §3.3). A directory of
#: that release took every unknown tool key for a config value and sent it in a request's
#: config; so a host drops these keys from a request's config before anything reads it, and
#: no service names a config param so.
ADDED_TOOL_KEYS = frozenset({"title", "annotations", "output-schema"})


def request_queue(topic: str) -> str:
    """Full request topic for a short topic ``T``: ``non-persistent://tg/request/T`` (seed 000)."""
    return f"non-persistent://{REQUEST_NAMESPACE}/{topic}"


def response_queue(topic: str) -> str:
    """Full response topic for a short topic ``T``: ``non-persistent://tg/response/T`` (seed 000)."""
    return f"non-persistent://{RESPONSE_NAMESPACE}/{topic}"


class DescriptorError(ValueError):
    """A descriptor failed validation. The message names the origin (plugin or file) and field."""


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True)

    def to_json_dict(self) -> dict[str, Any]:
        """The descriptor as seed JSON: aliased keys, only the fields that were set."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class ConfigParam(_Model):
    """One entry of a tool service's ``config-params`` list (seed 000): ``{name, required}``."""

    name: str = Field(min_length=1)
    required: bool = False


class Argument(_Model):
    """One entry of a tool's ``arguments`` list (seed 000): ``{name, type, description}``.

    ``type`` is a JSON Schema type name such as ``"string"`` or ``"number"``.
    """

    name: str = Field(min_length=1)
    type: str = "string"
    description: str = ""


def schema_of_arguments(arguments: Iterable[Argument]) -> dict[str, Any]:
    """The JSON Schema object of a seed 000 ``arguments`` list: every argument required, each
    property with its ``type`` and (if not empty) ``description``."""
    arguments = list(arguments)
    properties: dict[str, Any] = {}
    for argument in arguments:
        prop: dict[str, Any] = {"type": argument.type}
        if argument.description:
            prop["description"] = argument.description
        properties[argument.name] = prop
    return {"type": "object", "properties": properties, "required": [a.name for a in arguments]}


class ToolServiceDescriptor(_Model):
    """Tier 1 of seed 000: a Pulsar request/response interface and the config it accepts.

    Required keys: ``id``, ``request-queue``, ``response-queue``. tghost adds
    ``description``, ``timeout`` (seconds per call), ``max-concurrency`` (calls in flight
    per host) and ``version``; TrustGraph ignores them.
    """

    model_config = ConfigDict(extra="ignore")

    id: str = Field(pattern=NAME_PATTERN)
    request_queue: str = Field(alias="request-queue", min_length=1)
    response_queue: str = Field(alias="response-queue", min_length=1)
    config_params: tuple[ConfigParam, ...] = Field(default=(), alias="config-params")
    description: str | None = None
    timeout: float | None = Field(default=None, gt=0)
    max_concurrency: int | None = Field(default=None, alias="max-concurrency", ge=1)
    version: str | None = None

    @property
    def required_config(self) -> tuple[str, ...]:
        """Names of the config params every tool of this service must supply."""
        return tuple(p.name for p in self.config_params if p.required)


class ToolAnnotations(_Model):
    """A tool's behaviour hints (docs/protocol.md §3.3), MCP's ``ToolAnnotations`` in the wire's
    spelling: ``read-only`` (it changes nothing), ``destructive`` (it may destroy or overwrite),
    ``idempotent`` (calling it again with the same arguments does nothing more) and
    ``open-world`` (it reaches beyond the host: the web, other systems). Each is a boolean, or
    left out when unset: a client then applies MCP's default. Keys it does not know are ignored,
    so hints added later reach older directories without harm."""

    model_config = ConfigDict(extra="ignore")

    read_only: bool | None = Field(default=None, alias="read-only")
    destructive: bool | None = None
    idempotent: bool | None = None
    open_world: bool | None = Field(default=None, alias="open-world")


class ToolDescriptor(_Model):
    """Tier 2 of seed 000: a tool the agent sees, bound to a service with config values.

    Config-param values sit at the top level (``"collection": "customers"``); every key
    that is not a known field is one, available as :attr:`config`. Seed 001 adds
    ``group`` (default ``["default"]``), ``state`` and ``available_in_states`` (input
    alias ``applicable-states``). tghost adds ``input-schema`` (JSON Schema) and, in
    :data:`ADDED_TOOL_KEYS`, ``title`` (a name for people), ``annotations``
    (:class:`ToolAnnotations`) and ``output-schema`` (the JSON Schema of a structured
    observation: an object schema; docs/protocol.md §3.3).
    """

    model_config = ConfigDict(extra="allow")

    type: Literal["tool-service"] = "tool-service"
    name: str = Field(pattern=NAME_PATTERN)
    description: str = Field(min_length=1)
    service: str = Field(pattern=NAME_PATTERN)
    arguments: tuple[Argument, ...] = ()
    group: tuple[str, ...] = ("default",)
    state: str | None = None
    available_in_states: tuple[str, ...] | None = Field(
        default=None,
        validation_alias=AliasChoices("available_in_states", "applicable-states"),
        serialization_alias="available_in_states",
    )
    input_schema: dict[str, Any] | None = Field(default=None, alias="input-schema")
    title: str | None = Field(default=None, min_length=1)
    annotations: ToolAnnotations | None = None
    output_schema: dict[str, Any] | None = Field(default=None, alias="output-schema")

    @field_validator("output_schema")
    @classmethod
    def _an_object_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type") != "object":
            raise ValueError('an output schema describes a JSON object: its "type" must be "object"')
        return value

    @property
    def read_only(self) -> bool:
        """Whether the tool is hinted read-only (``annotations.read-only`` is true)."""
        return self.annotations is not None and self.annotations.read_only is True

    @field_validator("group", mode="before")
    @classmethod
    def _group_as_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @property
    def config(self) -> dict[str, Any]:
        """The tool's config-param values: every top-level key that is not a known field."""
        return dict(self.model_extra or {})


def describe_validation_error(error: ValidationError, origin: str) -> DescriptorError:
    """Turn a pydantic error into one line per field: ``origin: field 'x': message``."""
    lines = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(descriptor)"
        lines.append(f"{origin}: field '{field}': {item['msg']}")
    return DescriptorError("; ".join(lines))
