"""run: one ``tghost run``. Connect, serve a discovered catalog, announce it, wait for a
signal, then withdraw, stop taking requests, drain in-flight calls and close.
Never parses the command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Coroutine, Sequence
from typing import Protocol

from tghost.announcing.announcer import Announcer
from tghost.discovery.discover import Catalog
from tghost.operate.contest import ContestWatch
from tghost.operate.plugin_watch import PluginWatcher, WatchSettings
from tghost.pulsar.clients import PulsarSettings
from tghost.serving.access import Gate
from tghost.serving.request import CallListener
from tghost.serving.server import Server
from tghost.serving.settings import ServeSettings

__all__ = ["Monitor", "run_host"]

log = logging.getLogger(__name__)


class Monitor(Protocol):
    """Watches a serving host (metrics, health; :class:`tghost.operate.metrics.HostMonitor`)."""

    async def observe(self, catalog: Catalog, server: Server, announcer: Announcer | None,
                      contest: ContestWatch | None = None) -> None:
        """Start reading the live host; called once it serves and announces (``contest``: the
        host's tools that others contest, once it follows its announcement topics)."""


def _log_catalog(catalog: Catalog, url: str) -> None:
    for sid, descriptor in catalog.descriptors.items():
        tools = sorted(name for name, tool in catalog.tools.items() if tool.service == sid)
        log.info("serving %s on %s (plugin %s) tools: %s", sid, descriptor.request_queue,
                 catalog.service_origin[sid].name, ", ".join(tools) or "-")
    for sid, descriptor in catalog.external.items():
        tools = sorted(name for name, tool in catalog.tools.items() if tool.service == sid)
        log.info("announcing external service %s (served elsewhere, on %s; from %s) tools: %s", sid,
                 descriptor.request_queue, catalog.service_origin[sid].name, ", ".join(tools) or "-")
    log.info("%d service(s), %d tool(s) on %s; Ctrl-C to stop",
             len(catalog.descriptors) + len(catalog.external), len(catalog.tools), url)


async def _until_stopped(work: Coroutine[object, object, None], stop: asyncio.Event) -> bool:
    """Run ``work`` until it is done (True; raises what it raised) or ``stop`` is set first
    (False; ``work`` is cancelled): a host must stop on a signal even while the broker never
    confirms its first announcement (e.g. its disk is full)."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if task.done():
        task.result()
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False


def _received(server: Server) -> int:
    """Requests the host's services received so far."""
    return sum(endpoint.counters["received"] for endpoint in server.endpoints)


def _on_signal(stop: asyncio.Event, server: Server) -> None:
    """The first SIGINT/SIGTERM stops the host; a second one ends the grace period now."""
    if not stop.is_set():
        stop.set()
        return
    log.warning("second signal: ending the grace period now; calls still running are answered 'unavailable'")
    server.end_grace()


async def run_host(
    catalog: Catalog,
    pulsar_settings: PulsarSettings,
    serve_settings: ServeSettings,
    announcer: Announcer | None = None,
    stop: asyncio.Event | None = None,
    *,
    listeners: Sequence[CallListener] = (),
    monitor: Monitor | None = None,
    watch: WatchSettings | None = None,
) -> int:
    """Serve ``catalog`` (and announce it, given an ``announcer``) until ``stop`` is set or
    SIGINT/SIGTERM arrives.

    On stop the host first withdraws its announcements, so agents stop routing to it, then
    stops taking requests (answering those that did not start ``unavailable``, and leaving new
    ones to the other hosts: :meth:`tghost.serving.server.Server.drain`), gives in-flight calls
    ``serve_settings.grace`` seconds, runs the plugins' ``tghost_shutdown`` hooks, and closes
    its request consumers as the last step: a host that is the only one answers every request
    that reaches it ``unavailable`` until then. A second SIGINT/SIGTERM ends the grace at once
    (:meth:`tghost.serving.server.Server.end_grace`). Returns the number of calls cancelled at the end
    of the grace. ``listeners`` get
    every call's record (metrics, audit); ``monitor`` observes the host once it serves. With
    ``watch``, plugins installed or uninstalled meanwhile are served or withdrawn live
    (:class:`tghost.operate.plugin_watch.PluginWatcher`; ``catalog`` changes with them).

    Raises:
        tghost.pulsar.clients.BrokerError: no Pulsar broker answered at the URL (see ``PulsarSettings.connect``).
        pulsar.asyncio.PulsarException: the broker refused a subscription or producer.
    """
    stop = stop or asyncio.Event()
    server = Server(catalog.services, catalog.descriptors, serve_settings, listeners, authorize=catalog.authorize,
                    gate=Gate.of(catalog, announcer.identity.session if announcer else None))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _on_signal, stop, server)
    client = await pulsar_settings.connect()
    contest: ContestWatch | None = None
    try:
        await server.start(client)
        _log_catalog(catalog, pulsar_settings.url)
        if announcer is not None and not await _until_stopped(announcer.start(client), stop):
            log.warning("stopped before the broker confirmed the first announcement")
        if monitor is not None and announcer is not None:
            contest = ContestWatch.of(announcer, pulsar_settings, lambda: catalog.tools.keys()).start()
        if monitor is not None:
            await monitor.observe(catalog, server, announcer, contest)
        watcher = PluginWatcher(catalog, server, announcer, watch).start() if watch is not None else None
        await stop.wait()
        if watcher is not None:
            await watcher.stop()
        if announcer is not None:
            await announcer.withdraw()
        if in_flight := sum(w.in_flight for w in server.endpoints):
            log.info("stopping: no new requests; waiting up to %ss for %d in-flight call(s) (a second Ctrl-C ends "
                     "the wait)", serve_settings.grace, in_flight)
        else:
            log.info("stopping: no new requests; no call in flight")
        received = _received(server)
        cancelled = await server.drain()
        if cancelled:
            log.warning("%d call(s) cancelled at the end of the grace period", cancelled)
        await asyncio.to_thread(catalog.shutdown)  # the plugins' tghost_shutdown hooks: nothing runs their code now
        await server.close()  # the last step: until here, a lone host answers 'unavailable'
        log.info("stopped after %d request(s): %d answered 'unavailable' while stopping, %d cancelled at the end "
                 "of the grace", _received(server), _received(server) - received, cancelled)
        return cancelled
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if contest is not None:
            await contest.close()
        await client.close()
