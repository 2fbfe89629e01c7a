"""discover: entry points in group ``tghost.plugins`` -> a checked
:class:`~tghost.discovery.catalog.Catalog` of services and tools.

Each plugin is loaded, registered and called in its own ``try``; a failure is reported
and the rest go on (unless ``TGHOST_STRICT_PLUGINS=1``). ``TGHOST_LOAD_PLUGINS`` and
``TGHOST_DISABLE_PLUGINS`` (:class:`PluginSelection`) choose which entry points are imported
at all. A toolset's content is checked item by item (:func:`toolset_part`), at registration and
at each change while the host runs. Never touches Pulsar.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, NoReturn

import pluggy
from pydantic import ValidationError

from tghost.author import hookspecs
from tghost.author.service import ToolService, served_tool
from tghost.author.toolset import Content, ToolSet
from tghost.discovery.catalog import Catalog, PluginReport, ToolSetReport
from tghost.discovery.fingerprint import fingerprint
from tghost.protocol.callers import Caller
from tghost.protocol.descriptors import (
    DescriptorError,
    ToolDescriptor,
    ToolServiceDescriptor,
    describe_validation_error,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginLoadError",
    "PluginSelection",
    "authorizer",
    "catalog_of",
    "catalog_of_plugin",
    "describe_service",
    "describe_tool",
    "discover",
    "load_in_probe",
    "report_of",
    "toolset_part",
]

ENTRY_POINT_GROUP = "tghost.plugins"
log = logging.getLogger(__name__)


class PluginLoadError(RuntimeError):
    """Raised in strict mode (``TGHOST_STRICT_PLUGINS=1``) when any plugin failed to load."""


LOAD_ENV = "TGHOST_LOAD_PLUGINS"
DISABLE_ENV = "TGHOST_DISABLE_PLUGINS"


def _names(text: str) -> frozenset[str]:
    return frozenset(name.strip() for name in text.split(",") if name.strip())


@dataclass(frozen=True)
class PluginSelection:
    """Which entry points may be imported: only those in ``load`` (``None``: all), never those
    in ``disable``. ``*_source`` names the setting each came from, for the blocked reason.
    """

    load: frozenset[str] | None = None
    disable: frozenset[str] = frozenset()
    load_source: str = LOAD_ENV
    disable_source: str = DISABLE_ENV

    @classmethod
    def from_settings(cls, load: str | None = None, disable: str | None = None) -> PluginSelection:
        """From comma lists given on the command line (``--load-plugins``/``--disable-plugins``),
        each falling back to its env var (``TGHOST_LOAD_PLUGINS``/``TGHOST_DISABLE_PLUGINS``).

        An unset load list means all plugins; a set but empty one means none.
        """
        load_source, disable_source = (
            "--load-plugins" if load is not None else LOAD_ENV,
            "--disable-plugins" if disable is not None else DISABLE_ENV,
        )
        load = os.environ.get(LOAD_ENV) if load is None else load
        disable = os.environ.get(DISABLE_ENV, "") if disable is None else disable
        return cls(None if load is None else _names(load), _names(disable), load_source, disable_source)

    def blocked_reason(self, name: str, added_by: str | None = None) -> str | None:
        """Why plugin ``name`` must not be imported, or ``None`` when it may be. A plugin another
        one adds (``added_by``) passes the load list when either name is in it."""
        if name in self.disable:
            return f"disabled by {self.disable_source}"
        if self.load is not None and name not in self.load and added_by not in self.load:
            return f"not listed in {self.load_source}" if self.load else f"{self.load_source} is empty"
        return None

    def missing(self, installed: Iterable[str]) -> list[PluginReport]:
        """A ``missing`` report, with an error saying so, for each name no installed entry point has."""
        reports = []
        present = set(installed)
        for names, source in ((self.load or frozenset(), self.load_source), (self.disable, self.disable_source)):
            for name in sorted(names - present):
                report = PluginReport(name, "(not installed)", installed=False)
                report.fail(f"{source} names entry point {name!r}, but no installed plugin has it "
                            f"(run 'tghost plugins' to see the installed names)")
                reports.append(report)
        return reports


@dataclass
class _Contribution:
    services: list[tuple[ToolService, ToolServiceDescriptor]] = field(default_factory=list)
    tools: list[ToolDescriptor] = field(default_factory=list)
    toolsets: list[ToolSet] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """Descriptor errors ``register()`` found, one line each, even if the plugin caught the raise."""


def _strict_from_env() -> bool:
    return os.environ.get("TGHOST_STRICT_PLUGINS", "").lower() in ("1", "true", "yes")


def discover(
    eps: Iterable[EntryPoint] | None = None, *, strict: bool | None = None,
    selection: PluginSelection | None = None, config: dict[str, Any] | None = None,
    isolate_imports: bool = False,
) -> Catalog:
    """Load every selected ``tghost.plugins`` entry point, one at a time, into a :class:`Catalog`,
    with the plugins their ``tghost_register_plugins`` hooks add (given ``config``, the host's
    TOML config file as a dict; default ``{}``).

    Plugins are taken in entry-point name order, so on a service-id or tool-name collision
    the first name wins and the later plugin is skipped and reported, never overwritten.
    Entry points ``selection`` (default: from the env vars) blocks are never imported; they are
    reported ``blocked`` with the reason, and names it gives that are not installed ``missing``;
    an added plugin it blocks is never loaded. Call :meth:`Catalog.shutdown` when done.
    With ``isolate_imports``, each plugin is first imported (with ``config``) in a child process
    (:func:`tghost.discovery.probe.probe`): one that kills or hangs it is reported ``failed`` and never
    imported here.

    Raises:
        PluginLoadError: ``strict`` (default: ``TGHOST_STRICT_PLUGINS=1``) and any plugin failed.
    """
    selection = selection or PluginSelection.from_settings()
    pm = _plugin_manager()
    installed = sorted(entry_points(group=ENTRY_POINT_GROUP) if eps is None else eps,
                       key=lambda ep: ep.name)
    blocked = [_blocked(ep, reason) for ep in installed if (reason := selection.blocked_reason(ep.name))]
    selected = [ep for ep in installed if selection.blocked_reason(ep.name) is None]
    fatal = _probe(selected, config or {}) if isolate_imports else {}
    reports = {ep.name: _register(pm, ep, fatal.get(ep.name)) for ep in selected}
    added = _add_plugins(pm, reports, selection, config or {})
    blocked += [report for report in added if report.blocked is not None]
    reports |= {report.name: report for report in added if report.blocked is None}
    missing = selection.missing([*(ep.name for ep in installed), *(report.name for report in added)])
    catalog = _assemble(pm, reports, [*blocked, *missing])
    roots = {report.name: report for report in catalog.plugins}
    for sid, service in catalog.services.items():
        origin = catalog.service_origin[sid]
        _mark_entry_point(service, roots.get(origin.added_by or origin.name, origin), config or {})
    failures = [f"{r.name}: {e}" for r in catalog.plugins for e in r.errors]
    if failures and (_strict_from_env() if strict is None else strict):
        catalog.shutdown()
        raise PluginLoadError("TGHOST_STRICT_PLUGINS is set and plugins failed:\n" + "\n".join(failures))
    return catalog


def _plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("tghost")
    pm.add_hookspecs(hookspecs)
    return pm


def _assemble(pm: pluggy.PluginManager, reports: dict[str, PluginReport], others: Iterable[PluginReport]) -> Catalog:
    """Call the registration hooks of the registered plugins (``reports``, by name) and admit
    what they contribute into a catalog that also lists ``others`` (blocked or missing plugins),
    with their ``tghost_authorize`` and ``tghost_shutdown`` hooks."""
    contributions = _call_hooks(pm, reports)
    catalog = Catalog(plugins=sorted([*reports.values(), *others], key=lambda r: r.name))
    for name, contribution in contributions.items():
        _admit(catalog, reports[name], contribution)
    _check_tool_references(catalog)
    _admit_toolsets(catalog)
    catalog.authorize = authorizer((impl.plugin_name, impl.function)
                                   for impl in pm.hook.tghost_authorize.get_hookimpls())
    catalog.shutdown_hooks = [(impl.plugin_name, impl.function) for impl in pm.hook.tghost_shutdown.get_hookimpls()]
    return catalog


def catalog_of_plugin(plugin: object, name: str | None = None) -> Catalog:
    """The catalog one plugin contributes, loaded as :func:`discover` loads an entry point's
    module: its ``tghost_register_services`` and ``tghost_register_tools`` hooks (tools and their
    config values included), ``tghost_authorize`` and ``tghost_shutdown``. For tests: no entry
    point, no install. ``plugin`` is the module (or any object) with the hook implementations;
    ``name`` defaults to its ``__name__``. ``tghost_register_plugins`` is not called.

    Raises:
        ValueError: the plugin failed to register; the message is its errors, one line each.
    """
    pm = _plugin_manager()
    plugin_name = name or str(getattr(plugin, "__name__", type(plugin).__name__))
    pm.register(plugin, name=plugin_name)
    catalog = _assemble(pm, {plugin_name: PluginReport(plugin_name, "(in process)")}, [])
    errors = [error for report in catalog.plugins for error in report.errors]
    if errors:
        catalog.shutdown()
        raise ValueError("; ".join(errors))
    return catalog


def catalog_of(
    services: Iterable[Any], tools: Iterable[Any] = (), name: str = "local",
    authorize: Callable[..., Any] | None = None,
) -> Catalog:
    """A catalog of service objects and tools registered in-process, as plugin ``name`` would
    register them (for tests and embedding; no entry points). ``authorize`` is a function
    with the contract of the ``tghost_authorize`` hook, as plugin ``name``'s.

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
    catalog = Catalog(plugins=[report], authorize=authorizer([(name, authorize)] if authorize else []))
    _admit(catalog, report, contribution)
    _check_tool_references(catalog)
    _admit_toolsets(catalog)
    if any(r.errors for r in catalog.plugins):
        raise ValueError("; ".join(catalog.plugins[0].errors))
    return catalog


_AUTHORIZE_ARGS = ("user", "service", "config", "arguments", "caller")


def authorizer(checks: Iterable[tuple[str, Callable[..., Any]]]) -> hookspecs.Authorize | None:
    """Combine ``tghost_authorize`` implementations, given as ``(plugin name, function)``, into
    the one :data:`tghost.author.hookspecs.Authorize` the host calls per request; ``None`` for none.

    Each function gets, by keyword, only the arguments it names. ``None`` or ``True`` is no
    objection; ``False``, a string (the reason) or anything else denies, and the first deny
    wins. A function that raises denies too (fail closed); it is logged with its plugin name.
    """
    named = [(name, fn, _accepted_args(fn)) for name, fn in checks]
    if not named:
        return None

    def authorize(user: str, service: str, config: dict[str, Any], arguments: dict[str, Any],
                  caller: Caller | None = None) -> str | None:
        given = {"user": user, "service": service, "config": config, "arguments": arguments, "caller": caller}
        for name, fn, args in named:
            try:
                verdict = fn(**{arg: given[arg] for arg in args})
            except Exception:
                log.exception("plugin %r: tghost_authorize raised; call to %r denied", name, service)
                return f"the access check of plugin {name!r} failed, so the call is denied"
            if verdict is not None and verdict is not True:
                return verdict if isinstance(verdict, str) and verdict else f"denied by plugin {name!r}"
        return None

    return authorize


def _accepted_args(fn: Callable[..., Any]) -> tuple[str, ...]:
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return _AUTHORIZE_ARGS
    return tuple(arg for arg in _AUTHORIZE_ARGS if arg in params)


def _blocked(ep: EntryPoint, reason: str) -> PluginReport:
    """The report of an entry point a plugin setting blocked; read from metadata, never imported."""
    dist = ep.dist
    log.info("plugin %r blocked: %s", ep.name, reason)
    return PluginReport(ep.name, ep.value, dist.name if dist else None, dist.version if dist else None,
                        blocked=reason)


def _probe(eps: list[EntryPoint], config: dict[str, Any]) -> dict[str, str]:
    from tghost.discovery.probe import probe  # here, not at import: only isolated imports start a probe process

    return probe(eps, load_in_probe, config=config)


def load_in_probe(name: str, value: str, config: dict[str, Any]) -> str | None:
    """In the probe process: discover one entry point; what would have ended the importer, or ``None``."""
    logging.disable(logging.CRITICAL)  # the host reports the plugin's ordinary errors itself
    try:
        catalog = discover([EntryPoint(name, value, ENTRY_POINT_GROUP)], strict=False, selection=PluginSelection(),
                           config=config)
        catalog.shutdown()
    except Exception:
        return None
    except BaseException as exc:  # SystemExit, KeyboardInterrupt: they would end the host
        return f"importing it raised {type(exc).__name__}({exc})"
    return None


def _mark_entry_point(service: ToolService, root: PluginReport, config: dict[str, Any]) -> None:
    """Note on the service which entry point registered it (itself, or through a plugin it added)
    and with which config: a worker process loads it from there (:mod:`tghost.serving.executors.child`).
    A service that takes no attributes is sent pickled instead."""
    with contextlib.suppress(AttributeError, TypeError):
        service._tghost_entry_point = (root.name, root.value, config)


def report_of(ep: EntryPoint) -> PluginReport:
    """What is known of the installed entry point ``ep`` before it is imported: its name, value,
    distribution, version and fingerprint (:meth:`PluginReport.origin_json` is what a host serving
    it announces). Reads its files; imports nothing."""
    dist = ep.dist
    return PluginReport(ep.name, ep.value, dist.name if dist else None, dist.version if dist else None,
                        fingerprint(dist, ep.module))


def _register(pm: pluggy.PluginManager, ep: EntryPoint, fatal: str | None = None) -> PluginReport:
    """Import an entry point and register it with ``pm``; ``fatal``: the probe's reason not to."""
    report = report_of(ep)
    if fatal is not None:
        report.fail(fatal)
        return report
    try:
        pm.register(ep.load(), name=ep.name)
    except Exception as exc:
        report.fail(f"cannot load entry point {ep.value!r}: {type(exc).__name__}: {exc}", exc)
    return report


def _add_plugins(
    pm: pluggy.PluginManager, reports: dict[str, PluginReport], selection: PluginSelection, config: dict[str, Any]
) -> list[PluginReport]:
    """Call each plugin's ``tghost_register_plugins`` on its own, then load and register the
    plugins it adds (unless ``selection`` blocks them); returns their reports, in name order.

    A hook that raises, or names a plugin that is already there, is an error of its plugin:
    none of the plugins it adds are loaded then.
    """
    added: dict[str, PluginReport] = {}
    for impl in pm.hook.tghost_register_plugins.get_hookimpls():
        parent = reports[impl.plugin_name]
        if parent.errors:
            continue
        pending: list[tuple[PluginReport, Callable[[], object]]] = []
        kwargs = {"register": _plugin_registrar(parent, pending), "config": config}
        try:
            impl.function(*(kwargs[arg] for arg in impl.argnames))
        except Exception as exc:
            parent.fail(f"tghost_register_plugins raised {type(exc).__name__}: {exc}", exc)
            continue
        names = [report.name for report, _ in pending]
        taken = sorted({name for name in names if name in reports or name in added or names.count(name) > 1})
        if taken:
            parent.fail(f"tghost_register_plugins added plugin name(s) {taken} that are already taken; "
                        "none of its plugins loaded")
            continue
        for report, load in pending:
            added[report.name] = _load_added(pm, report, load, selection)
    return sorted(added.values(), key=lambda r: r.name)


def _plugin_registrar(
    parent: PluginReport, into: list[tuple[PluginReport, Callable[[], object]]]
) -> Callable[..., None]:
    def register(name: str, load: Callable[[], object], *, kind: str, value: str,
                 distribution: str | None = None, version: str | None = None) -> None:
        if not isinstance(name, str) or not name or not callable(load):
            raise TypeError(f"register() takes a plugin name and a load() function, got {name!r}, {load!r}")
        into.append((PluginReport(name, value, distribution, version, kind=kind, added_by=parent.name), load))

    return register


def _load_added(
    pm: pluggy.PluginManager, report: PluginReport, load: Callable[[], object], selection: PluginSelection
) -> PluginReport:
    report.blocked = selection.blocked_reason(report.name, report.added_by)
    if report.blocked is not None:
        log.info("plugin %r (added by %r) blocked: %s", report.name, report.added_by, report.blocked)
        return report
    try:
        pm.register(load(), name=report.name)
    except Exception as exc:
        report.fail(f"cannot load {report.kind} plugin {report.value!r}: {type(exc).__name__}: {exc}", exc)
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
            except DescriptorError as exc:  # a bad descriptor, from register() or service.tool(): not a raise
                pending.errors = pending.errors or [str(exc)]
            except Exception as exc:
                report.fail(f"{hook_name} raised {type(exc).__name__}: {exc}", exc)
                contributions.pop(impl.plugin_name, None)
                continue
            if pending.errors:
                for error in pending.errors:
                    report.fail(f"plugin {report.name!r}: {error}; plugin skipped")
                contributions.pop(impl.plugin_name, None)
                continue
            contributions[impl.plugin_name].services += pending.services
            contributions[impl.plugin_name].tools += pending.tools
            contributions[impl.plugin_name].toolsets += pending.toolsets
    return contributions


def describe_service(service: Any, version: str | None) -> tuple[ToolServiceDescriptor, list[ToolDescriptor]]:
    """A registered service's descriptor (its version, if it sets none, the plugin
    distribution's ``version``) and its default tools.

    Raises:
        DescriptorError: ``service`` is no ``ToolService``, or its descriptor is invalid.
    """
    if not isinstance(service, ToolService):
        raise DescriptorError(f"register() takes a ToolService, @tghost.tool function or ToolSet, got {service!r}")
    descriptor = service.descriptor
    if descriptor.version is None and version:
        descriptor = descriptor.model_copy(update={"version": version})
    return descriptor, service.default_tools()


def describe_tool(tool: Any) -> ToolDescriptor:
    """A registered tool (a ``ToolDescriptor``, or a dict of its JSON keys) as a descriptor.

    Raises:
        DescriptorError: the dict is no valid descriptor (one line per field).
    """
    if isinstance(tool, ToolDescriptor):
        return tool
    origin = f"tool '{tool.get('name', '?') if isinstance(tool, dict) else '?'}'"
    try:
        return ToolDescriptor.model_validate(tool)
    except ValidationError as exc:
        raise describe_validation_error(exc, origin) from None


def _service_registrar(report: PluginReport, into: _Contribution) -> Callable[[Any], None]:
    def register(service: Any) -> None:
        if isinstance(service, ToolSet):
            into.toolsets.append(service)
            return
        try:
            descriptor, defaults = describe_service(service, report.version)
        except DescriptorError as exc:
            _refuse(into, str(exc))
        into.services.append((service, descriptor))
        into.tools.extend(defaults)

    return register


def _tool_registrar(report: PluginReport, into: _Contribution) -> Callable[[Any], None]:
    def register(tool: Any) -> None:
        try:
            into.tools.append(describe_tool(tool))
        except DescriptorError as exc:
            _refuse(into, str(exc))

    return register


def _refuse(into: _Contribution, message: str) -> NoReturn:
    """Note a descriptor error (one line) and raise it into the plugin's hook, which ends there."""
    into.errors.append(message)
    raise DescriptorError(message)


def _admit(catalog: Catalog, report: PluginReport, contribution: _Contribution) -> None:
    """Add a plugin's services and tools unless one collides with an earlier plugin's."""
    claims = [("service id", d.id, catalog.service_origin) for _, d in contribution.services]
    claims += [("tool name", t.name, catalog.tool_origin) for t in contribution.tools]
    claims += [("toolset name", toolset.name, {}) for toolset in contribution.toolsets]
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
    report.toolsets += [ToolSetReport(toolset) for toolset in contribution.toolsets]


def _check_tool_references(catalog: Catalog) -> None:
    """Drop (and report) the tools :func:`_served` refuses; the others get their service's output schema."""
    for name, tool in list(catalog.tools.items()):
        try:
            catalog.tools[name] = _served(catalog, tool)
            continue
        except DescriptorError as exc:
            problem = str(exc)
        report = catalog.tool_origin[name]
        report.fail(problem + "; tool skipped")
        del catalog.tools[name], catalog.tool_origin[name]
        report.tools.remove(name)


def _served(catalog: Catalog, tool: ToolDescriptor) -> ToolDescriptor:
    """``tool`` as a tool of its service, which ``catalog`` serves (:func:`tghost.author.service.served_tool`).

    Raises:
        DescriptorError: its service is not served, it lacks a required config param of it, or
            it gives an output schema that is not the service's.
    """
    descriptor = catalog.descriptors.get(tool.service)
    if descriptor is None:
        raise DescriptorError(f"tool {tool.name!r} references service {tool.service!r}, which no loaded plugin serves")
    missing = [p for p in descriptor.required_config if p not in tool.config]
    if missing:
        raise DescriptorError(f"tool {tool.name!r} lacks required config param(s) {missing} of service "
                              f"{tool.service!r}")
    return served_tool(tool, catalog.services[tool.service])


def _admit_toolsets(catalog: Catalog) -> None:
    """Add what each toolset holds now (once every plugin's registered services and tools are
    in: a toolset never takes a name one of them has), item by item, in plugin name order."""
    for report in catalog.plugins:
        for entry in report.toolsets:
            content = entry.toolset._snapshot()
            part, errors = toolset_part(catalog, report, entry, content)
            catalog.merge(part)
            entry.record(report, part, content[0], errors)


def toolset_part(
    catalog: Catalog, report: PluginReport, entry: ToolSetReport, content: Content
) -> tuple[Catalog, list[str]]:
    """What toolset ``entry`` of plugin ``report`` serves with ``content`` (a
    :meth:`tghost.ToolSet.replace`'s) beside the rest of ``catalog``, as a sub-catalog, and what
    of it is refused, one line each. Each item is checked as a registered one is; a bad one, one
    whose name another plugin or toolset serves or the content gives twice, a service that asks
    for worker processes, and a tool over no service served here (or without its required config
    params) is skipped alone. Never changes ``catalog``."""
    _, services, tools = content
    part = Catalog(plugins=[report])
    errors: list[str] = []
    offered: list[Any] = []
    for service in services:
        try:
            descriptor, defaults = describe_service(service, report.version)
        except DescriptorError as exc:
            errors.append(f"{exc}; service skipped")
            continue
        problem = _taken(catalog, part, entry, "service id", descriptor.id) or _in_process(service, descriptor.id)
        if problem is not None:
            errors.append(f"{problem}; service skipped")
            continue
        part.services[descriptor.id], part.descriptors[descriptor.id] = service, descriptor
        part.service_origin[descriptor.id] = report
        offered += defaults
    served = _beside(catalog, part, entry)
    for tool in [*offered, *tools]:
        try:
            described = describe_tool(tool)
            problem = _taken(catalog, part, entry, "tool name", described.name)
            described = _served(served, described) if problem is None else described
        except DescriptorError as exc:
            problem = str(exc)
        if problem is not None:
            errors.append(f"{problem}; tool skipped")
            continue
        part.tools[described.name], part.tool_origin[described.name] = described, report
    return part, errors


def _beside(catalog: Catalog, part: Catalog, entry: ToolSetReport) -> Catalog:
    """The services a toolset's tool may be over: those of its new content (``part``), and the
    others ``catalog`` serves but its old content's."""
    kept = [sid for sid in catalog.descriptors if sid not in entry.services]
    return Catalog(services={**{sid: catalog.services[sid] for sid in kept}, **part.services},
                   descriptors={**{sid: catalog.descriptors[sid] for sid in kept}, **part.descriptors})


def _taken(catalog: Catalog, part: Catalog, entry: ToolSetReport, kind: str, name: str) -> str | None:
    """Why ``name`` (a service id or tool name) is not the toolset's to take, or ``None``."""
    here, origins, mine = ((part.descriptors, catalog.service_origin, entry.services) if kind == "service id"
                           else (part.tools, catalog.tool_origin, entry.tools))
    if name in here:
        return f"{kind} {name!r} is given twice"
    if name not in origins or name in mine:
        return None
    owner = origins[name]
    other = next((t.toolset.name for t in owner.toolsets if name in (t.services if kind == "service id" else t.tools)),
                 None)
    by = f"toolset {other!r} of plugin {owner.name!r}" if other is not None else f"plugin {owner.name!r}"
    return f"{kind} {name!r} is already served by {by}"


def _in_process(service: ToolService, sid: str) -> str | None:
    if service.isolation == "process":
        return (f"service {sid!r} asks for worker processes (isolation 'process'), but a toolset's "
                "services run in the host process: a worker process imports the plugin anew and cannot follow a "
                "live toolset")
    return None
