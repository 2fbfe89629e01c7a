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

if TYPE_CHECKING:
    from tghost.serving.endpoint import ServiceEndpoint

__all__ = ["ToolSets", "toolset_services"]

log = logging.getLogger(__name__)


def toolset_services(reports: Iterable[PluginReport]) -> set[str]:
    """The ids of the services the toolsets of ``reports`` serve: they run in the host process."""
    return {sid for report in reports for entry in report.toolsets for sid in entry.services}


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
        """Apply the latest content of each toolset that changed, one at a time, in turn."""
        while self._due:
            report, entry = self._due.pop(next(iter(self._due)))
            try:
                async with self.changing:
                    await self._apply(report, entry)
            except Exception as exc:
                log.exception("plugin %r: toolset %r: could not apply its change; its next replace() tries again",
                              report.name, entry.toolset.name)
                failure = f"could not apply its latest change ({type(exc).__name__}: {exc})"
                entry.errors = [*(error for error in entry.errors if not error.startswith("could not apply")), failure]

    async def _apply(self, report: PluginReport, entry: ToolSetReport) -> None:
        """Serve the toolset's latest content in place of what it serves now, and announce the
        difference: withdraw what left, stop serving it in the background, serve what came, announce it."""
        content = entry.toolset._snapshot()
        if content[0] != entry.version:
            old = _part(self.catalog, report, entry.services, entry.tools)
            new, errors = toolset_part(self.catalog, report, entry, content)
            changed = {sid for sid in old.descriptors.keys() & new.descriptors.keys()
                       if old.services[sid] is not new.services[sid] or old.descriptors[sid] != new.descriptors[sid]}
            await self._withdraw(_part(old, report, old.descriptors.keys() - new.descriptors.keys(),
                                       old.tools.keys() - new.tools.keys()), changed)
            coming = _part(new, report, (new.descriptors.keys() - old.descriptors.keys()) | changed,
                           [name for name, tool in new.tools.items() if old.tools.get(name) != tool])
            try:
                await self.server.add(coming.services, coming.descriptors, in_process=coming.descriptors)
            except Exception as exc:
                new = Catalog(plugins=[report])
                errors.append(f"its services could not be served ({type(exc).__name__}: {exc}); it serves nothing "
                              "until its next change")
                await self._withdraw(_part(self.catalog, report, entry.services, entry.tools), set())
            else:
                await self._publish(coming)
            entry.record(report, new, content[0], errors)
            log.info("plugin %s: toolset %s: serving %s; tools: %s", report.name, entry.toolset.name,
                     ", ".join(entry.services) or "-", ", ".join(entry.tools) or "-")
        entry.toolset._mark_applied(content[0])

    async def _withdraw(self, gone: Catalog, changed: set[str]) -> None:
        """Announce ``gone`` withdrawn and drop it; stop serving its services and the ``changed``
        ones (served anew under the same id) in the background."""
        if self.announcer is not None and (gone.descriptors or gone.tools):
            await self.announcer.publish(gone, "withdrawn")
        self.catalog.drop(gone)
        endpoints = self.server.detach([*gone.descriptors, *changed])
        if endpoints:
            task = asyncio.create_task(self._retire(endpoints), name="stop serving a toolset's services")
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retire(self, endpoints: list[ServiceEndpoint]) -> None:
        ids = ", ".join(endpoint.descriptor.id for endpoint in endpoints)
        cancelled = await self.server.retire(endpoints)
        log.info("stopped serving %s%s", ids,
                 f" ({cancelled} call(s) cancelled at the end of the grace)" if cancelled else "")

    async def _publish(self, coming: Catalog) -> None:
        """Add ``coming`` to the catalog and announce it."""
        self.catalog.merge(coming)
        if self.announcer is not None and (coming.descriptors or coming.tools):
            await self.announcer.publish(coming, "available")

    async def stop(self) -> None:
        """Follow no toolset any more; a change being applied is cut short (the host is stopping)."""
        for entry, notify in self._bound.values():
            entry.toolset._unbind(notify)
        self._bound.clear()
        self._due.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def retired(self) -> None:
        """Wait until the services the toolsets stopped serving have drained (each within the grace)."""
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
