"""plugin_watch: live plugin install for ``tghost run --watch-plugins``. Polls the ``tghost.plugins``
entry points; serves and announces a new plugin, withdraws and stops an uninstalled one.
Never re-imports a module, and never overwrites a name another plugin already serves.

Why an upgrade is reported, not reloaded: Python cannot safely replace a module in place.
``importlib.reload`` re-runs the new code inside the old module object, but every object the old
code made lives on: service instances held by endpoints and executors, closures, classes other modules
imported, sub-modules the new code no longer has, threads still in a call. A reloaded plugin is
therefore a mix of both versions, and a plugin's import-time state (clients, caches, open files)
would leak or run twice. So an upgraded distribution (same entry point, new version) keeps
serving its old code and the host logs ``plugin X upgraded from A to B: restart needed`` once.
For the same reason a plugin uninstalled and installed again at another version, and a new
plugin that implements ``tghost_authorize`` (its access check would apply only to calls that
start after it), wait for a restart too.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import site
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from tghost.announcing.announcer import Announcer
from tghost.discovery.catalog import Catalog, PluginReport
from tghost.discovery.discover import ENTRY_POINT_GROUP, PluginSelection, discover
from tghost.operate.toolsets import ToolSets, lose_tools, toolset_services
from tghost.serving.server import Server
from tghost.system.tasks import cancel_and_wait

__all__ = ["PluginWatcher", "WatchSettings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchSettings:
    """``interval``: seconds between two reads of the installed entry points. ``selection``: the
    host's ``--load-plugins``/``--disable-plugins``, applied to new plugins as at start. ``config``:
    the host's TOML config file as a dict, given to new plugins as at start. ``isolate_imports``:
    import each new plugin in a probe process first (``--isolation process``)."""

    interval: float = 2.0
    selection: PluginSelection = field(default_factory=PluginSelection)
    config: dict[str, Any] = field(default_factory=dict)
    isolate_imports: bool = False


def _path_files() -> set[tuple[str, str]]:
    """Every ``(site dir, name)`` of a ``.pth`` file in this interpreter's site-packages dirs."""
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return {(d, name) for d in dirs if os.path.isdir(d) for name in os.listdir(d) if name.endswith(".pth")}


#: The ``.pth`` files ``site`` had processed when this module was imported (at start-up).
_PROCESSED_PATH_FILES = _path_files()


def _process_new_path_files() -> None:
    """Process the ``.pth`` files installed since start-up, as ``site`` does at start-up. An
    editable install (``pip install -e``) puts its import path in one, and a running
    interpreter reads none by itself: without this, its entry point would not import."""
    for sitedir, name in sorted(_path_files() - _PROCESSED_PATH_FILES):
        site.addpackage(sitedir, name, None)  # type: ignore[attr-defined]
        _PROCESSED_PATH_FILES.add((sitedir, name))


def installed_plugins() -> dict[str, EntryPoint]:
    """The ``tghost.plugins`` entry points installed now, by name, read afresh from disk
    (``.pth`` files new since start-up processed, and ``importlib.invalidate_caches()``
    first: importlib.metadata caches directory listings)."""
    _process_new_path_files()
    importlib.invalidate_caches()
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _version(ep: EntryPoint) -> str | None:
    return ep.dist.version if ep.dist is not None else None


def plugin_part(catalog: Catalog, report: PluginReport) -> Catalog:
    """What ``catalog`` serves for one plugin: its services, and every tool of it or over one of
    its services (a ``--config`` tool too), with their origins."""
    part = Catalog(plugins=[report])
    for sid in report.services:
        part.services[sid], part.descriptors[sid] = catalog.services[sid], catalog.descriptors[sid]
        part.service_origin[sid] = report
    for name, tool in catalog.tools.items():
        if catalog.tool_origin[name] is report:
            part.tools[name], part.tool_origin[name] = tool, report
    catalog.take_tools_over(part)
    return part


def _collision(catalog: Catalog, part: Catalog) -> str | None:
    """Why ``part`` cannot be served next to ``catalog``: a service id or tool name taken, or ``None``."""
    for kind, names, origins in (("service id", part.descriptors, catalog.service_origin),
                                 ("tool name", part.tools, catalog.tool_origin)):
        for name in names:
            if name in origins:
                return (f"{kind} {name!r} is already served by plugin {origins[name].name!r}; plugin skipped "
                        "(uninstall or disable one of them)")
    return None


def _skip(report: PluginReport, problem: str, exc: BaseException | None = None) -> None:
    """Record (and log) why a plugin serves nothing after all."""
    report.fail(problem, exc)
    report.services.clear()
    report.tools.clear()
    report.toolsets.clear()


class PluginWatcher:
    """Keeps a running host's catalog in step with the installed plugins, every ``interval`` s.

    - A new entry point is discovered on its own (:func:`tghost.discovery.discover.discover` with just it),
      checked against what the host serves (a collision is reported, never overwrites), then
      served on the host's Pulsar client and announced ``available``.
    - An entry point gone (its distribution uninstalled) has its tools and services announced
      ``withdrawn``, then its services stop (in-flight calls get the host's grace).
    - An entry point whose distribution version changed is logged once as "restart needed".

    ``catalog`` is the host's own, shared with the announcer; its ``plugins`` list gains the new
    reports, so ``/metrics`` counts them. ``toolsets`` follows the toolsets of the host's plugins
    (default: one of the watcher's own, for the plugins it installs); the watcher follows those of
    a plugin it installs, and changes the catalog under its lock. Start with :meth:`start`, end
    with :meth:`stop`.
    """

    def __init__(self, catalog: Catalog, server: Server, announcer: Announcer | None,
                 settings: WatchSettings, toolsets: ToolSets | None = None) -> None:
        self.catalog = catalog
        self.server = server
        self.announcer = announcer
        self.settings = settings
        self.toolsets = toolsets or ToolSets(catalog, server, announcer)
        #: entry point name -> version of what the host has seen (served, failed or blocked).
        self.known: dict[str, str | None] = {}
        self._reported: dict[str, str | None] = {}
        self._unloaded: dict[str, str | None] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> PluginWatcher:
        """Take the plugins the catalog was discovered from as seen, then poll in a background
        task; returns ``self``. An entry point installed since discovery counts as new."""
        installed = installed_plugins()
        self.known = {r.name: r.version for r in self.catalog.plugins if r.installed and r.name in installed}
        self._task = asyncio.create_task(self._run(), name="watch plugins")
        log.info("watching for plugins installed or uninstalled (every %ss)", self.settings.interval)
        return self

    async def stop(self) -> None:
        """Stop polling; what is served stays served (the host shuts it down)."""
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.interval)
            try:
                await self.poll()
            except Exception:
                log.exception("watching plugins failed; trying again in %ss", self.settings.interval)

    async def poll(self) -> None:
        """Compare the installed entry points with :attr:`known` once, and act on the difference."""
        installed = await asyncio.to_thread(installed_plugins)
        for name in sorted(set(self.known) - set(installed)):
            await self._uninstalled(name)
        for name in sorted(set(self.known) & set(installed)):
            self._check_version(name, _version(installed[name]))
        new = [ep for name, ep in sorted(installed.items()) if name not in self.known]
        if new:
            await self._installed(new)

    def _check_version(self, name: str, version: str | None) -> None:
        before = self.known[name]
        if version != before and self._reported.get(name) != version:
            self._reported[name] = version
            log.warning("plugin %s upgraded from %s to %s: restart needed (the host keeps serving %s; Python "
                        "cannot safely reload a changed module; 'tghost run --reload' serves each change anew)",
                        name, before, version, before)

    async def _installed(self, eps: list[EntryPoint]) -> None:
        """Discover each new entry point on its own, in name order, and serve what it brings."""
        for ep in eps:
            self.known[ep.name] = _version(ep)
            reason = self._not_loadable(ep)
            if reason is not None:
                log.warning("plugin %s installed, not loaded: %s", ep.name, reason)
                continue
            found = await asyncio.to_thread(discover, [ep], strict=False, selection=self.settings.selection,
                                            config=self.settings.config, isolate_imports=self.settings.isolate_imports)
            if found.authorize is not None:
                log.warning("plugin %s installed, not loaded: its tghost_authorize hook would check only the "
                            "calls after it loads: restart needed", ep.name)
                await asyncio.to_thread(found.shutdown)
                continue
            self.catalog.shutdown_hooks += found.shutdown_hooks
            for report in found.plugins:
                if report.installed:  # not the names the host's --load-plugins gives for others
                    async with self.toolsets.changing:
                        await self._serve(report, plugin_part(found, report))

    def _not_loadable(self, ep: EntryPoint) -> str | None:
        blocked = self.settings.selection.blocked_reason(ep.name)
        if blocked is not None:
            return blocked
        if ep.name in self._unloaded and self._unloaded[ep.name] != _version(ep):
            return (f"it was uninstalled at version {self._unloaded[ep.name]} and its old code is still imported: "
                    "restart needed")
        return None

    async def _serve(self, report: PluginReport, part: Catalog) -> None:
        self.catalog.plugins.append(report)
        problem = _collision(self.catalog, part)
        if problem is not None:
            _skip(report, problem)
        if report.failed:
            return  # discover or _skip logged why
        try:
            await self.server.add(part.services, part.descriptors, in_process=toolset_services([report]))
        except Exception as exc:
            _skip(report, f"installed, but its services could not be served: {type(exc).__name__}: {exc}", exc)
            return
        self.catalog.merge(part)
        if self.announcer is not None:
            await self.announcer.publish(part, "available")
        self.toolsets.bind(report)
        log.info("plugin %s (%s %s) installed: serving %s; tools: %s", report.name, report.distribution,
                 report.version, ", ".join(part.descriptors) or "-", ", ".join(part.tools) or "-")

    async def _uninstalled(self, name: str) -> None:
        self._unloaded[name] = self.known.pop(name)
        self._reported.pop(name, None)
        leaving = [r for r in self.catalog.plugins if r.name == name or r.added_by == name]
        for report in leaving:
            await self._withdraw(report)
        await asyncio.to_thread(self.catalog.shutdown, [r.name for r in leaving])

    async def _withdraw(self, report: PluginReport) -> None:
        """Withdraw and stop serving what one uninstalled plugin (or a plugin it added) served;
        the catalog changes under the lock, the drain after it."""
        name = report.name
        async with self.toolsets.changing:
            self.toolsets.unbind(report)
            self.catalog.plugins.remove(report)
            part = plugin_part(self.catalog, report)
            lose_tools(part, [name for name in part.tools if part.tool_origin[name] is not report])
            if self.announcer is not None and (part.descriptors or part.tools):
                await self.announcer.publish(part, "withdrawn")
            self.catalog.drop(part)
            leaving = self.server.detach(part.descriptors)
        cancelled = await self.server.retire(leaving)
        log.info("plugin %s uninstalled: withdrew %s and stopped serving %s%s", name,
                 ", ".join(part.tools) or "no tools", ", ".join(part.descriptors) or "nothing",
                 f" ({cancelled} call(s) cancelled at the end of the grace)" if cancelled else "")
