"""arguments: the one argument policy of both authoring styles (``@tghost.tool`` and ``ToolService``).

Every service has one JSON Schema for its arguments (its ``input_schema``, the signature's, or
one derived from its seed 000 ``arguments``,
:func:`tghost.protocol.descriptors.schema_of_arguments`). Before ``invoke`` the host, in this order:

1. converts, at the top level only, a string holding a JSON number for a ``number`` or
   ``integer`` argument (``"10"`` -> ``10``, ``"2.5"`` -> ``2.5``; an integer only if integral)
   and ``"true"``/``"false"`` (any case) for a ``boolean`` one, and an integral float for an
   ``integer`` one (``10.0`` -> ``10``). Nothing else is converted (:func:`coerce`);
2. rejects arguments the schema does not name, unless the service allows unknown arguments
   (:func:`unknown`);
3. checks the rest against the schema: pydantic in strict JSON mode for a function, jsonschema
   for a class service.

The rules and why are in docs/reference/plugin-api.md, "Arguments". Never touches Pulsar.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

__all__ = ["Problem", "closed_schema", "coerce", "jsonschema_problems", "unknown"]

#: One argument problem: the field path (empty: the arguments object) and the message.
Problem = tuple[Sequence[str | int], str]

#: A JSON number, as JSON writes it (no leading ``+``, no ``nan``/``inf``, no spaces).
_JSON_NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")


def closed_schema(schema: dict[str, Any], allow_unknown: bool) -> dict[str, Any]:
    """``schema`` with ``"additionalProperties": false`` added, unless ``allow_unknown`` or the
    schema sets ``additionalProperties`` itself (its own word wins)."""
    if allow_unknown or "additionalProperties" in schema:
        return schema
    return {**schema, "additionalProperties": False}


def unknown(arguments: dict[str, Any], schema: dict[str, Any]) -> list[Problem]:
    """A problem per argument a closed schema (``additionalProperties: false``) does not name,
    in the order given; none for an open schema."""
    if schema.get("additionalProperties") is not False:
        return []
    known = schema.get("properties", {})
    patterns = [re.compile(p) for p in schema.get("patternProperties", {})]
    takes = ", ".join(known) or "no arguments"
    return [((name,), f"not an argument of this tool (it takes: {takes})") for name in arguments
            if name not in known and not any(p.search(name) for p in patterns)]


def coerce(arguments: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` with the top-level conversions of the policy (see the module docstring)
    applied by each property's JSON type; values it does not convert stay as they are."""
    properties = schema.get("properties", {})
    converted = dict(arguments)
    for name, value in arguments.items():
        kind = _json_type(properties.get(name))
        if kind is not None:
            converted[name] = _convert(value, kind)
    return converted


def _json_type(prop: Any) -> str | None:
    """The one non-null JSON type of a property (``type``, a ``type`` list or an ``anyOf``)."""
    if not isinstance(prop, dict):
        return None
    kinds = prop.get("type")
    if kinds is None and isinstance(prop.get("anyOf"), list):
        kinds = [branch.get("type") for branch in prop["anyOf"] if isinstance(branch, dict)]
    if isinstance(kinds, str):
        return kinds
    if isinstance(kinds, list):
        rest = [k for k in kinds if k != "null"]
        return rest[0] if len(rest) == 1 and isinstance(rest[0], str) else None
    return None


def _convert(value: Any, kind: str) -> Any:
    if kind == "boolean" and isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if kind in ("number", "integer") and isinstance(value, str) and _JSON_NUMBER.fullmatch(value):
        value, text = json.loads(value), value
        if kind == "integer" and not (isinstance(value, int) or value.is_integer()):
            return text  # "2.5" for an integer: left as given, so the error shows what was sent
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def jsonschema_problems(errors: Iterable[Any]) -> Iterator[Problem]:
    """jsonschema errors as problems, a missing required property named by its own path."""
    for error in errors:
        path = list(error.absolute_path)
        if error.validator == "required" and isinstance(error.instance, dict):
            for name in error.validator_value:
                if name not in error.instance and f"'{name}'" in error.message:
                    yield [*path, name], "required, but not given"
            continue
        yield path, error.message
