"""catalog: what discovery hands the stages after it: a :class:`Catalog` of the services and
tools this host serves (with their plugins' hooks and the ``[access]`` policy), a
:class:`PluginReport` per plugin, what it contributed or why it did not, and a
:class:`ToolSetReport` per toolset a plugin registered, what of it is served now.

Plain data, filled by :mod:`tghost.discovery.discover` and :mod:`tghost.discovery.config`; read by
the announcer, the server, ``tghost plugins`` and live plugin install. Never loads a plugin.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tghost.author import hookspecs
from tghost.author.service import ToolService
from tghost.author.toolset import ToolSet
from tghost.protocol.access import AccessPolicy
from tghost.protocol.descriptors import ToolDescriptor, ToolServiceDescriptor

__all__ = ["Catalog", "PluginReport", "ToolSetReport"]

#: A plugin's failures are discovery's log lines, whoever records them (the logger users filter on).
log = logging.getLogger("tghost.discovery.discover")


@dataclass
class ToolSetReport:
    """One :class:`tghost.ToolSet` of a plugin: the services and tools of it the host serves,
    from the content of ``version`` (0: none applied yet), and what of that content it refused
    (one line each)."""

    toolset: ToolSet
    version: int = 0
    services: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def record(self, plugin: PluginReport, part: Catalog, version: int, errors: list[str]) -> None:
        """The host serves ``part`` for this toolset now, from the content of ``version``, and
        refused ``errors`` of it: note it here and in ``plugin``'s lists, and log each refusal
        that is new since the content before (a plugin may offer the same one again and again)."""
        for error in errors:
            if error not in self.errors:
                log.error("plugin %r: toolset %r: %s", plugin.name, self.toolset.name, error)
        plugin.services = [sid for sid in plugin.services if sid not in self.services] + list(part.descriptors)
        plugin.tools = [name for name in plugin.tools if name not in self.tools] + list(part.tools)
        self.services, self.tools, self.version, self.errors = list(part.descriptors), list(part.tools), version, errors

    def problems(self, plugin: str) -> list[str]:
        """The toolset's :attr:`~tghost.ToolSet.problem` and refusals, each naming it and ``plugin``."""
        who = f"toolset {self.toolset.name!r} of plugin {plugin!r}"
        problem = self.toolset.problem
        return [f"{who}: {line}" for line in ([problem] if problem else []) + self.errors]

    def to_json(self) -> dict[str, Any]:
        """``{"name", "services", "tools", "problem", "errors"}``."""
        return {"name": self.toolset.name, "services": self.services, "tools": self.tools,
                "problem": self.toolset.problem, "errors": self.errors}


@dataclass
class PluginReport:
    """What one entry point contributed, or why it did not: the answer of ``tghost plugins``."""

    name: str
    value: str
    distribution: str | None = None
    version: str | None = None
    fingerprint: str | None = None
    """The SHA-256 of the code it serves (:func:`tghost.discovery.fingerprint.fingerprint`), or ``None``:
    a plugin given in process, another plugin added, or no files found."""
    services: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    blocked: str | None = None
    """Why the entry point was not imported (which setting blocked it), or ``None``."""
    installed: bool = True
    """False for a name given to a plugin setting that no installed entry point has."""
    kind: str = "tghost"
    """The plugin system it comes from: ``tghost`` for a ``tghost.plugins`` entry point, else the
    ``kind`` a ``tghost_register_plugins`` hook gave (``amplifier``)."""
    added_by: str | None = None
    """The plugin whose ``tghost_register_plugins`` hook added this one, or ``None``."""
    toolsets: list[ToolSetReport] = field(default_factory=list)
    """The toolsets it registered; their services and tools are in :attr:`services` and :attr:`tools` too."""

    @property
    def failed(self) -> bool:
        """True when the plugin contributes nothing because it failed as a whole."""
        return bool(self.errors) and not self.services and not self.tools

    @property
    def status(self) -> str:
        """``loaded``, ``failed``, ``blocked`` (by a plugin setting) or ``missing`` (named, not installed)."""
        if not self.installed:
            return "missing"
        if self.blocked is not None:
            return "blocked"
        return "failed" if self.failed else "loaded"

    def fail(self, message: str, exc: BaseException | None = None) -> None:
        """Record an error as one line (and the traceback of ``exc``, the exception the plugin's
        own code raised, if any); log it with the plugin's name, once."""
        message = " ".join(line.strip() for line in message.splitlines() if line.strip())
        self.errors.append(message)
        if exc is not None:
            self.tracebacks.append("".join(traceback.format_exception(exc)))
        named = message if message.startswith(f"plugin {self.name!r}: ") else f"plugin {self.name!r}: {message}"
        log.error("%s", named, exc_info=exc)

    def lose_tool(self, name: str, service: str) -> None:
        """Tool ``name`` of this plugin was withdrawn with its service ``service``, which another
        plugin or toolset stopped serving: no longer list it, and say so (logged) in the errors
        of the toolset that gave it, or else of the plugin."""
        entry = next((entry for entry in self.toolsets if name in entry.tools), None)
        how = "the toolset's next replace() serves it again" if entry is not None else "a restart serves it again"
        message = f"tool {name!r} withdrawn: its service {service!r} is no longer served; {how} once it is back"
        self.tools = [tool for tool in self.tools if tool != name]
        if entry is None:
            self.fail(message)
            return
        entry.tools.remove(name)
        entry.errors.append(message)
        log.error("plugin %r: toolset %r: %s", self.name, entry.toolset.name, message)

    def origin_json(self) -> dict[str, Any]:
        """Where an announced descriptor came from (docs/protocol.md §4.3 ``plugin``): entry point,
        distribution, version, and ``fingerprint`` when known."""
        origin = {"entry_point": self.name, "distribution": self.distribution, "version": self.version}
        return origin | ({"fingerprint": self.fingerprint} if self.fingerprint else {})

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-able dict (``tghost plugins --json``)."""
        return {"name": self.name, "value": self.value, "distribution": self.distribution,
                "version": self.version, "fingerprint": self.fingerprint, "kind": self.kind,
                "added_by": self.added_by, "status": self.status,
                "blocked": self.blocked, "services": self.services, "tools": self.tools,
                "toolsets": [toolset.to_json() for toolset in self.toolsets], "errors": self.errors,
                "tracebacks": self.tracebacks}


@dataclass
class Catalog:
    """Everything this host serves: services by id, tools by name, and a report per plugin."""

    services: dict[str, ToolService] = field(default_factory=dict)
    descriptors: dict[str, ToolServiceDescriptor] = field(default_factory=dict)
    tools: dict[str, ToolDescriptor] = field(default_factory=dict)
    plugins: list[PluginReport] = field(default_factory=list)
    service_origin: dict[str, PluginReport] = field(default_factory=dict)
    tool_origin: dict[str, PluginReport] = field(default_factory=dict)
    external: dict[str, ToolServiceDescriptor] = field(default_factory=dict)
    """Tool services served elsewhere (e.g. a TrustGraph ``DynamicToolService``), declared in the
    config file: announced with this host's identity and lease, never served here (their origin
    is in ``service_origin`` too)."""
    authorize: hookspecs.Authorize | None = None
    """Every plugin's ``tghost_authorize`` in one check (see :func:`tghost.discovery.discover.authorizer`);
    ``None`` when no plugin implements the hook, so serving pays nothing for it."""
    shutdown_hooks: list[tuple[str, Callable[[], object]]] = field(default_factory=list)
    """``(plugin name, function)`` of every ``tghost_shutdown`` implementation not yet run."""
    access: AccessPolicy | None = None
    """Who may call what (the config file's ``[access]`` table); ``None``: every caller, every tool."""

    def merge(self, part: Catalog) -> None:
        """Add the services and tools of ``part`` (a sub-catalog, with their origins)."""
        self.services.update(part.services)
        self.descriptors.update(part.descriptors)
        self.service_origin.update(part.service_origin)
        self.tools.update(part.tools)
        self.tool_origin.update(part.tool_origin)

    def take_tools_over(self, part: Catalog) -> list[str]:
        """Add to ``part`` (a sub-catalog this one is to drop) every tool of this catalog over one
        of ``part``'s services that ``part`` lacks, with its origin: it cannot stay when they
        leave. Returns the names added, in catalog order."""
        taken = [name for name, tool in self.tools.items()
                 if tool.service in part.descriptors and name not in part.tools]
        for name in taken:
            part.tools[name], part.tool_origin[name] = self.tools[name], self.tool_origin[name]
        return taken

    def drop(self, part: Catalog) -> None:
        """Remove the services and tools of ``part`` (a sub-catalog); those already gone are skipped."""
        for sid in part.descriptors:
            for entries in (self.services, self.descriptors, self.service_origin):
                entries.pop(sid, None)
        for name in part.tools:
            self.tools.pop(name, None)
            self.tool_origin.pop(name, None)

    def toolset_problems(self) -> list[str]:
        """What every plugin's toolsets say is wrong and what of them was refused (``/health``)."""
        return [problem for plugin in list(self.plugins) for toolset in list(plugin.toolsets)
                for problem in toolset.problems(plugin.name)]

    def shutdown(self, plugins: Iterable[str] | None = None) -> None:
        """Run the ``tghost_shutdown`` hooks of ``plugins`` (names; default: every plugin), each
        once, in the reverse order of loading. One that raises is logged with its plugin's name
        and the others still run. Blocks: call it in a worker thread from an event loop."""
        names = None if plugins is None else set(plugins)
        leaving = [(name, fn) for name, fn in self.shutdown_hooks if names is None or name in names]
        self.shutdown_hooks = [hook for hook in self.shutdown_hooks if hook not in leaving]
        for name, fn in reversed(leaving):
            try:
                fn()
            except Exception:
                log.exception("plugin %r: tghost_shutdown raised", name)
