"""discover: entry points in group ``tghost.plugins`` -> a checked :class:`Catalog` of services and tools.

Each plugin is loaded, registered and called in its own ``try``; a failure is reported
and the rest go on (unless ``TGHOST_STRICT_PLUGINS=1``). Never touches Pulsar.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import pluggy
from pydantic import ValidationError

from . import hookspecs
from .descriptors import ToolDescriptor, ToolServiceDescriptor, describe_validation_error
from .service import ToolService

__all__ = ["ENTRY_POINT_GROUP", "Catalog", "PluginLoadError", "PluginReport", "catalog_of", "discover"]

ENTRY_POINT_GROUP = "tghost.plugins"
log = logging.getLogger(__name__)


class PluginLoadError(RuntimeError):
    """Raised in strict mode (``TGHOST_STRICT_PLUGINS=1``) when any plugin failed to load."""


@dataclass
class PluginReport:
    """What one entry point contributed, or why it did not: the answer of ``tghost plugins``."""

    name: str
    value: str
    distribution: str | None = None
    version: str | None = None
    services: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """True when the plugin contributes nothing because it failed as a whole."""
        return bool(self.errors) and not self.services and not self.tools

    def fail(self, message: str, exc: BaseException | None = None) -> None:
        """Record an error (and its traceback); log it with the plugin's name."""
        self.errors.append(message)
        if exc is not None:
            self.tracebacks.append("".join(traceback.format_exception(exc)))
        log.error("plugin %r: %s", self.name, message, exc_info=exc)

    def origin_json(self) -> dict[str, Any]:
        """Where an announced descriptor came from: entry point, distribution, version."""
        return {"entry_point": self.name, "distribution": self.distribution, "version": self.version}

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-able dict (``tghost plugins --json``)."""
        status = "failed" if self.failed else "loaded"
        return {"name": self.name, "value": self.value, "distribution": self.distribution,
                "version": self.version, "status": status, "services": self.services,
                "tools": self.tools, "errors": self.errors, "tracebacks": self.tracebacks}


@dataclass
class _Contribution:
    services: list[tuple[ToolService, ToolServiceDescriptor]] = field(default_factory=list)
    tools: list[ToolDescriptor] = field(default_factory=list)


@dataclass
class Catalog:
    """Everything this host serves: services by id, tools by name, and a report per plugin."""

    services: dict[str, ToolService] = field(default_factory=dict)
    descriptors: dict[str, ToolServiceDescriptor] = field(default_factory=dict)
    tools: dict[str, ToolDescriptor] = field(default_factory=dict)
    plugins: list[PluginReport] = field(default_factory=list)
    service_origin: dict[str, PluginReport] = field(default_factory=dict)
    tool_origin: dict[str, PluginReport] = field(default_factory=dict)


def _strict_from_env() -> bool:
    return os.environ.get("TGHOST_STRICT_PLUGINS", "").lower() in ("1", "true", "yes")


def discover(
    eps: Iterable[EntryPoint] | None = None, *, strict: bool | None = None
) -> Catalog:
    """Load every ``tghost.plugins`` entry point, one at a time, into a :class:`Catalog`.

    Plugins are taken in entry-point name order, so on a service-id or tool-name collision
    the first name wins and the later plugin is skipped and reported, never overwritten.

    Raises:
        PluginLoadError: ``strict`` (default: ``TGHOST_STRICT_PLUGINS=1``) and any plugin failed.
    """
    pm = pluggy.PluginManager("tghost")
    pm.add_hookspecs(hookspecs)
    selected = sorted(entry_points(group=ENTRY_POINT_GROUP) if eps is None else eps,
                      key=lambda ep: ep.name)
    reports = {ep.name: _register(pm, ep) for ep in selected}
    contributions = _call_hooks(pm, reports)
    catalog = Catalog(plugins=list(reports.values()))
    for name, contribution in contributions.items():
        _admit(catalog, reports[name], contribution)
    _check_tool_references(catalog)
    failures = [f"{r.name}: {e}" for r in catalog.plugins for e in r.errors]
    if failures and (_strict_from_env() if strict is None else strict):
        raise PluginLoadError("TGHOST_STRICT_PLUGINS is set and plugins failed:\n" + "\n".join(failures))
    return catalog


def catalog_of(services: Iterable[Any], tools: Iterable[Any] = (), name: str = "local") -> Catalog:
    """A catalog of service objects and tools registered in-process, as plugin ``name`` would
    register them (for tests and embedding; no entry points).

    Raises:
        DescriptorError: a descriptor is invalid.
        ValueError: the same service id or tool name is given twice.
    """
    report = PluginReport(name, "(in process)")
    contribution = _Contribution()
    for service in services:
        _service_registrar(report, contribution)(service)
    for tool in tools:
        _tool_registrar(report, contribution)(tool)
    catalog = Catalog(plugins=[report])
    _admit(catalog, report, contribution)
    _check_tool_references(catalog)
    if any(r.errors for r in catalog.plugins):
        raise ValueError("; ".join(catalog.plugins[0].errors))
    return catalog


def _register(pm: pluggy.PluginManager, ep: EntryPoint) -> PluginReport:
    dist = ep.dist
    report = PluginReport(ep.name, ep.value, dist.name if dist else None, dist.version if dist else None)
    try:
        pm.register(ep.load(), name=ep.name)
    except Exception as exc:
        report.fail(f"cannot load entry point {ep.value!r}: {type(exc).__name__}: {exc}", exc)
    return report


def _call_hooks(
    pm: pluggy.PluginManager, reports: dict[str, PluginReport]
) -> dict[str, _Contribution]:
    """Call each plugin's hook implementations on their own, so one failure skips one plugin."""
    contributions = {name: _Contribution() for name, r in reports.items() if not r.errors}
    hooks: list[tuple[str, Callable[[PluginReport, _Contribution], Callable[[Any], None]]]] = [
        ("tghost_register_services", _service_registrar),
        ("tghost_register_tools", _tool_registrar),
    ]
    for hook_name, registrar in hooks:
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            report = reports[impl.plugin_name]
            if report.errors:
                continue
            pending = _Contribution()
            kwargs = {"register": registrar(report, pending)}
            try:
                impl.function(*(kwargs[arg] for arg in impl.argnames))
            except Exception as exc:
                report.fail(f"{hook_name} raised {type(exc).__name__}: {exc}", exc)
                contributions.pop(impl.plugin_name, None)
                continue
            contributions[impl.plugin_name].services += pending.services
            contributions[impl.plugin_name].tools += pending.tools
    return contributions


def _service_registrar(report: PluginReport, into: _Contribution) -> Callable[[Any], None]:
    def register(service: Any) -> None:
        if not isinstance(service, ToolService):
            raise TypeError(f"register() takes a ToolService or @tghost.tool function, got {service!r}")
        origin = f"plugin '{report.name}': service '{getattr(service, 'id', '?')}'"
        try:
            descriptor = service.descriptor
            if descriptor.version is None and report.version:
                descriptor = descriptor.model_copy(update={"version": report.version})
            defaults = service.default_tools()
        except ValidationError as exc:
            raise describe_validation_error(exc, origin) from None
        into.services.append((service, descriptor))
        into.tools.extend(defaults)

    return register


def _tool_registrar(report: PluginReport, into: _Contribution) -> Callable[[Any], None]:
    def register(tool: Any) -> None:
        if isinstance(tool, ToolDescriptor):
            into.tools.append(tool)
            return
        origin = f"plugin '{report.name}': tool '{tool.get('name', '?') if isinstance(tool, dict) else '?'}'"
        try:
            into.tools.append(ToolDescriptor.model_validate(tool))
        except ValidationError as exc:
            raise describe_validation_error(exc, origin) from None

    return register


def _admit(catalog: Catalog, report: PluginReport, contribution: _Contribution) -> None:
    """Add a plugin's services and tools unless one collides with an earlier plugin's."""
    claims = [("service id", d.id, catalog.service_origin) for _, d in contribution.services]
    claims += [("tool name", t.name, catalog.tool_origin) for t in contribution.tools]
    seen: set[tuple[str, str]] = set()
    for kind, name, taken in claims:
        if name in taken:
            report.fail(f"{kind} {name!r} is already provided by plugin {taken[name].name!r}; "
                        "plugin skipped (uninstall or disable one of them)")
            return
        if (kind, name) in seen:
            report.fail(f"{kind} {name!r} is registered twice by this plugin; plugin skipped")
            return
        seen.add((kind, name))
    for service, descriptor in contribution.services:
        catalog.services[descriptor.id] = service
        catalog.descriptors[descriptor.id] = descriptor
        catalog.service_origin[descriptor.id] = report
        report.services.append(descriptor.id)
    for tool in contribution.tools:
        catalog.tools[tool.name] = tool
        catalog.tool_origin[tool.name] = report
        report.tools.append(tool.name)


def _check_tool_references(catalog: Catalog) -> None:
    """Drop (and report) tools whose service is not served or whose required config is missing."""
    for name, tool in list(catalog.tools.items()):
        report = catalog.tool_origin[name]
        descriptor = catalog.descriptors.get(tool.service)
        if descriptor is None:
            problem = f"tool {name!r} references service {tool.service!r}, which no loaded plugin serves"
        else:
            missing = [p for p in descriptor.required_config if p not in tool.config]
            if not missing:
                continue
            problem = f"tool {name!r} lacks required config param(s) {missing} of service {tool.service!r}"
        report.fail(problem + "; tool skipped")
        del catalog.tools[name], catalog.tool_origin[name]
        report.tools.remove(name)
