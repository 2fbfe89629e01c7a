"""config: the host's TOML config file: extra tools declared over services this host serves or
over external tool services it announces (served elsewhere, e.g. by a TrustGraph
``DynamicToolService``), and tables plugins read (``tghost_register_plugins`` gets the whole file).

A deployment adds ``query-orders`` over the knowledge-base service without touching plugin
code. Each bad entry is reported (file and key) and skipped. Never touches Pulsar.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tghost.author.service import check_param_name, served_tool
from tghost.discovery.catalog import Catalog, PluginReport
from tghost.protocol.access import AccessError, AccessPolicy
from tghost.protocol.descriptors import (
    DescriptorError,
    ToolDescriptor,
    ToolServiceDescriptor,
    describe_validation_error,
)
from tghost.system.paths import config_path, default_config_path

__all__ = ["ConfigError", "config_path", "default_config_path", "load_config_tools", "read_config"]

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """The config file cannot be read or is not TOML; the message names the file."""


def load_access(catalog: Catalog, path: Path, document: dict[str, Any]) -> None:
    """Set ``catalog.access`` from the ``[access]`` table of the config file at ``path`` (its
    parsed ``document``), if it has one; key paths are relative to the file's directory. A
    tool granted to callers who still may not call it (a request for it is also for a tool
    with the same config values that they are not granted) is a warning, one line per tool.

    Raises:
        ConfigError: the table is wrong, a key file is missing or not a public key, or it names a
            tool this host does not serve (the message names the file, the table and the field).
    """
    if "access" not in document:
        return
    try:
        policy = AccessPolicy.from_table(document["access"], path.parent, f"{path}: [access]")
    except AccessError as exc:
        raise ConfigError(str(exc)) from None
    unknown = policy.unknown_tools(catalog.tools)
    if unknown:
        raise ConfigError(f"{path}: [access] names tool(s) {unknown} that this host does not serve "
                          f"(it serves {sorted(catalog.tools)}); fix the name or install the plugin")
    for sentence in policy.ungranted(catalog.tools):
        log.warning("%s: [access]: %s", path, sentence)
    catalog.access = policy


def read_config(path: Path) -> dict[str, Any]:
    """The TOML document at ``path`` as a dict.

    Raises:
        ConfigError: the file cannot be read, or is not valid TOML (the message says where).
    """
    try:
        return tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def _tool_fields(catalog: Catalog, name: str, entry: dict[str, Any]) -> dict[str, Any]:
    """The entry as seed JSON, with ``arguments``/``input-schema`` defaulted from a plugin tool
    of the same service, so a config tool asks the LLM for what the service expects."""
    fields = {"type": "tool-service", "name": name, **entry}
    sibling = next((t for t in catalog.tools.values() if t.service == entry.get("service")), None)
    if sibling is not None:
        fields.setdefault("arguments", [a.model_dump() for a in sibling.arguments])
        if sibling.input_schema is not None:
            fields.setdefault("input-schema", sibling.input_schema)
    return fields


def _admitted(catalog: Catalog, tool: ToolDescriptor) -> ToolDescriptor:
    """``tool`` as the host announces it: over a service served here, with its output schema
    (:func:`tghost.author.service.served_tool`); over an external one, as it is.

    Raises:
        DescriptorError: its service is neither, it lacks a required config param of it, its name
            is taken, or it gives an output schema that is not its served service's.
    """
    descriptor = catalog.descriptors.get(tool.service) or catalog.external.get(tool.service)
    if descriptor is None:
        raise DescriptorError(f"service {tool.service!r} is not served here (served: {sorted(catalog.descriptors)}; "
                              f"external: {sorted(catalog.external)})")
    missing = [p for p in descriptor.required_config if p not in tool.config]
    if missing:
        raise DescriptorError(f"lacks required config param(s) {missing} of service {tool.service!r}")
    if tool.name in catalog.tools:
        raise DescriptorError(f"tool name {tool.name!r} is already provided by plugin "
                              f"{catalog.tool_origin[tool.name].name!r}")
    service = catalog.services.get(tool.service)
    return tool if service is None else served_tool(tool, service)


def _tables(report: PluginReport, path: Path, key: str, tables: Any) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Each ``[<key>.<name>]`` table of the file as (name, where it is, table); one that is not a
    table, or a ``key`` that is not a table of tables, is reported and skipped."""
    if not isinstance(tables, dict):
        report.fail(f"{path}: {key!r} must be a table of [{key}.<name>] tables")
        return
    for name, entry in tables.items():
        origin = f"{path}: [{key}.{name}]"
        if isinstance(entry, dict):
            yield name, origin, entry
        else:
            report.fail(f"{origin}: must be a table")


def _load_external(catalog: Catalog, report: PluginReport, path: Path, tables: Any) -> None:
    """Add each ``[external-services.<id>]`` table (a seed 000 tool-service descriptor) to
    ``catalog.external``; a bad one, or one whose id is served here, is reported and skipped."""
    for sid, origin, entry in _tables(report, path, "external-services", tables):
        try:
            descriptor = ToolServiceDescriptor.model_validate({**entry, "id": sid})
            for param in descriptor.config_params:
                check_param_name(origin, param.name)
        except ValidationError as exc:
            report.fail(str(describe_validation_error(exc, origin)))
            continue
        except DescriptorError as exc:
            report.fail(f"{exc}; service skipped")
            continue
        if sid in catalog.service_origin:
            report.fail(f"{origin}: service id {sid!r} is already served by plugin "
                        f"{catalog.service_origin[sid].name!r}; service skipped")
            continue
        catalog.external[sid] = descriptor
        catalog.service_origin[sid] = report
        report.services.append(sid)


def load_config_tools(catalog: Catalog, path: Path, document: dict[str, Any] | None = None) -> PluginReport:
    """Add the ``[external-services.<id>]`` and ``[tools.<name>]`` tables of the TOML file at
    ``path`` (``document``, if already read with :func:`read_config`) to ``catalog``.

    An external service is a tool service served elsewhere, such as a TrustGraph
    ``DynamicToolService``: seed 000 tool-service keys (``request-queue``, ``response-queue``,
    ``config-params``; ``description``, ``timeout``), announced by this host, never served::

        [external-services.tgpeer]
        request-queue = "non-persistent://tg/request/tgpeer"
        response-queue = "non-persistent://tg/response/tgpeer"
        config-params = [{name = "style", required = true}]

    Each tool table holds seed 000/001 tool keys (``service``, ``description``, ``group``,
    ``state``, ``available_in_states``, ``arguments``), tghost's ``title``, ``annotations`` (a
    table of ``read-only``, ``destructive``, ``idempotent``, ``open-world``) and ``output-schema``
    (over a service served here, its service's, which it gets when left out), and the tool's
    config values, over a service served here or an external one::

        [tools.query-orders]
        service = "custom-rag"
        description = "Query the order knowledge base"
        collection = "orders"
        annotations = {read-only = true}

    Returns a report (name ``config:<path>``) listing the external services and tools added
    and one error per bad entry; an unreadable file is one error and adds nothing.
    """
    report = PluginReport(name=f"config:{path}", value=str(path))
    catalog.plugins.append(report)
    try:
        document = read_config(path) if document is None else document
    except ConfigError as exc:
        report.fail(str(exc))
        return report
    _load_external(catalog, report, path, document.get("external-services", {}))
    for name, origin, entry in _tables(report, path, "tools", document.get("tools", {})):
        try:
            tool = _admitted(catalog, ToolDescriptor.model_validate(_tool_fields(catalog, name, entry)))
        except ValidationError as exc:
            report.fail(str(describe_validation_error(exc, origin)))
            continue
        except DescriptorError as exc:
            report.fail(f"{origin}: {exc}; tool skipped")
            continue
        catalog.tools[name] = tool
        catalog.tool_origin[name] = report
        report.tools.append(name)
    return report
