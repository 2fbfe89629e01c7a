"""toolsets: a running host follows its plugins' toolsets (:class:`tghost.ToolSet`). Each
``replace()`` wakes :class:`ToolSets` on the host's event loop, which applies the latest content
as a small live plugin change: withdraw what left and stop serving it (its calls in flight get
the grace, in the background), serve and announce what came, at once.

One change of the catalog at a time: :attr:`ToolSets.changing` is the lock the plugin watch
(:mod:`tghost.operate.plugin_watch`) holds too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from tghost.announcing.announcer import Announcer
from tghost.discovery.catalog import Catalog, PluginReport, ToolSetReport
from tghost.discovery.discover import toolset_part
from tghost.serving.server import Server
from tghost.system.tasks import cancel_and_wait

if TYPE_CHECKING:
    from tghost.serving.endpoint import ServiceEndpoint

__all__ = ["ToolSets", "lose_tools", "toolset_services"]

log = logging.getLogger(__name__)


def toolset_services(reports: Iterable[PluginReport]) -> set[str]:
    """The ids of the services the toolsets of ``reports`` serve: they run in the host process."""
    return {sid for report in reports for entry in report.toolsets for sid in entry.services}


def lose_tools(part: Catalog, names: Iterable[str]) -> None:
    """Tell the owner of each of ``names`` (tools of ``part``, a sub-catalog being withdrawn,
    over services of another plugin or toolset) that it goes with its service."""
    for name in names:
        part.tool_origin[name].lose_tool(name, part.tools[name].service)


def _part(source: Catalog, report: PluginReport, services: Iterable[str], tools: Iterable[str]) -> Catalog:
    """The sub-catalog of ``source`` with just these services and tools (those it has), of ``report``."""
    part = Catalog(plugins=[report])
    for sid in services:
        if sid in source.descriptors:
            part.services[sid], part.descriptors[sid] = source.services[sid], source.descriptors[sid]
            part.service_origin[sid] = report
    for name in tools:
        if name in source.tools:
            part.tools[name], part.tool_origin[name] = source.tools[name], report
    return part


class ToolSets:
    """Applies the changes of the toolsets of a running host's plugins to its ``catalog``,
    ``server`` and ``announcer`` (``None``: a host that does not announce). :meth:`start` it on
    the host's event loop once the host serves and announces; :meth:`bind` and :meth:`unbind`
    follow a plugin installed or uninstalled meanwhile; :meth:`stop`, then :meth:`retired`."""

    def __init__(self, catalog: Catalog, server: Server, announcer: Announcer | None) -> None:
        self.catalog = catalog
        self.server = server
        self.announcer = announcer
        self.changing = asyncio.Lock()
        """Held while the catalog changes: by a toolset's change, and by the plugin watch."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._bound: dict[int, tuple[ToolSetReport, Callable[[], None]]] = {}
        self._due: dict[int, tuple[PluginReport, ToolSetReport]] = {}
        self._task: asyncio.Task[None] | None = None
        self._retiring: set[asyncio.Task[None]] = set()

    def start(self) -> ToolSets:
        """Follow the toolsets of every plugin in the catalog (on the running loop); returns ``self``."""
        for report in list(self.catalog.plugins):
            self.bind(report)
        return self

    def bind(self, report: PluginReport) -> None:
        """Apply every change of ``report``'s toolsets from now on, and at once what changed
        since the catalog took their content. A toolset another host in this process follows
        already is served as it was and not followed (logged). Call it on the host's loop."""
        self._loop = asyncio.get_running_loop()
        for entry in report.toolsets:
            notify = functools.partial(self._notified, report, entry)
            if not entry.toolset._bind(notify):
                log.error("plugin %r: toolset %r is followed by another host in this process: this host serves "
                          "what it held when loaded and none of its changes", report.name, entry.toolset.name)
                continue
            self._bound[id(entry)] = (entry, notify)
            self._wake(report, entry)

    def unbind(self, report: PluginReport) -> None:
        """Follow ``report``'s toolsets no more (the plugin was uninstalled)."""
        for entry in report.toolsets:
            bound = self._bound.pop(id(entry), None)
            if bound is not None:
                entry.toolset._unbind(bound[1])
            self._due.pop(id(entry), None)

    def _notified(self, report: PluginReport, entry: ToolSetReport) -> None:
        """From ``replace()``, in any thread: apply the change on the host's loop."""
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop closed: the host is gone
            self._loop.call_soon_threadsafe(self._wake, report, entry)

    def _wake(self, report: PluginReport, entry: ToolSetReport) -> None:
        if id(entry) not in self._bound:
            return
        self._due[id(entry)] = (report, entry)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="apply toolset changes")

    async def _run(self) -> None:
        """Apply the latest content of each toolset that changed, one at a time, in turn; not
        that of a toolset unbound meanwhile (its plugin was uninstalled while it waited)."""
        while self._due:
            report, entry = self._due.pop(next(iter(self._due)))
            try:
                async with self.changing:
                    if id(entry) in self._bound:
                        await self._apply(report, entry)
            except Exception as exc:
                log.exception("plugin %r: toolset %r: could not apply its change; its next replace() tries again",
                              report.name, entry.toolset.name)
                failure = f"could not apply its latest change ({type(exc).__name__}: {exc})"
                entry.errors = [*(error for error in entry.errors if not error.startswith("could not apply")), failure]

    async def _apply(self, report: PluginReport, entry: ToolSetReport) -> None:
        """Serve the toolset's latest content in place of what it serves now, and announce the
        difference: withdraw what left and stop serving it in the background; serve what came,
        a new object of a served id before its old one stops; announce it. An announcement that
        fails is one of the toolset's errors (the announcer restates everything once it can)."""
        content = entry.toolset._snapshot()
        if content[0] != entry.version:
            old = _part(self.catalog, report, entry.services, entry.tools)
            new, errors = toolset_part(self.catalog, report, entry, content)
            changed = {sid for sid in old.descriptors.keys() & new.descriptors.keys()
                       if old.services[sid] is not new.services[sid] or old.descriptors[sid] != new.descriptors[sid]}
            errors += await self._withdraw(_part(old, report, old.descriptors.keys() - new.descriptors.keys(),
                                                 old.tools.keys() - new.tools.keys()))
            coming = _part(new, report, (new.descriptors.keys() - old.descriptors.keys()) | changed,
                           [name for name, tool in new.tools.items() if old.tools.get(name) != tool])
            try:
                await self._serve(coming, changed)
            except Exception as exc:
                new = coming = Catalog(plugins=[report])
                errors.append(f"its services could not be served ({type(exc).__name__}: {exc}); it serves nothing "
                              "until its next change")
                errors += await self._withdraw(_part(self.catalog, report, entry.services, entry.tools))
            self.catalog.merge(coming)
            entry.record(report, new, content[0], errors)
            errors += await self._announce(coming, "available")
            log.info("plugin %s: toolset %s: serving %s; tools: %s", report.name, entry.toolset.name,
                     ", ".join(entry.services) or "-", ", ".join(entry.tools) or "-")
        entry.toolset._mark_applied(content[0])

    async def _serve(self, coming: Catalog, changed: set[str]) -> None:
        """Start serving ``coming``'s services, those of ``changed`` ids in place of the ones
        served now (which stop in the background). Runs to its end if the host stops meanwhile,
        so no endpoint is left half started: the server stops those it serves.

        Raises:
            Exception: what :meth:`tghost.serving.server.Server.add` raises (nothing changed).
        """
        adding = asyncio.ensure_future(self.server.add(coming.services, coming.descriptors,
                                                       in_process=coming.descriptors, replace=changed))
        try:
            replaced = await asyncio.shield(adding)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                self._retire_later(await adding)
            raise
        self._retire_later(replaced)

    async def _withdraw(self, gone: Catalog) -> list[str]:
        """Drop ``gone`` and every tool over its services (telling such a tool's owner), announce
        them withdrawn, and stop serving the services in the background. Returns the problem
        with the announcement, if any (one line)."""
        lose_tools(gone, self.catalog.take_tools_over(gone))
        problems = await self._announce(gone, "withdrawn")
        self.catalog.drop(gone)
        self._retire_later(self.server.detach(gone.descriptors))
        return problems

    def _retire_later(self, endpoints: list[ServiceEndpoint]) -> None:
        """Stop serving ``endpoints`` (taken out of the server) in the background, within the grace."""
        if endpoints:
            task = asyncio.create_task(self._retire(endpoints), name="stop serving a toolset's services")
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retire(self, endpoints: list[ServiceEndpoint]) -> None:
        ids = ", ".join(endpoint.descriptor.id for endpoint in endpoints)
        cancelled = await self.server.retire(endpoints)
        log.info("stopped serving %s%s", ids,
                 f" ({cancelled} call(s) cancelled at the end of the grace)" if cancelled else "")

    async def _announce(self, part: Catalog, status: str) -> list[str]:
        """Announce ``part`` as ``status`` (``available``, ``withdrawn``), if the host announces
        and ``part`` has anything. Returns ``[]``, or the failure as one line (logged)."""
        if self.announcer is None or not (part.descriptors or part.tools):
            return []
        try:
            await self.announcer.publish(part, status)
        except Exception as exc:
            problem = (f"could not announce its latest change ({type(exc).__name__}: {exc}); the host announces "
                       "everything again once the broker takes its announcements")
            log.warning("%s", problem)
            return [problem]
        return []

    async def stop(self) -> None:
        """Follow no toolset any more; a change being applied is cut short (the host is stopping),
        though never while it starts services."""
        for entry, notify in self._bound.values():
            entry.toolset._unbind(notify)
        self._bound.clear()
        self._due.clear()
        await cancel_and_wait(self._task)

    async def retired(self) -> None:
        """Wait until the services the toolsets stopped serving have drained (each within the grace)."""
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
