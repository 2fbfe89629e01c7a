"""host: one ``tghost run``. Connect, start serving a discovered catalog, wait for a signal,
then stop taking requests, drain in-flight calls and close. Never parses the command line.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

from .broker import PulsarSettings
from .discover import Catalog
from .serve import Server, ServeSettings

__all__ = ["run_host"]

log = logging.getLogger(__name__)


def _log_catalog(catalog: Catalog, url: str) -> None:
    for sid, descriptor in catalog.descriptors.items():
        tools = sorted(name for name, tool in catalog.tools.items() if tool.service == sid)
        log.info("serving %s on %s (plugin %s) tools: %s", sid, descriptor.request_queue,
                 catalog.service_origin[sid].name, ", ".join(tools) or "-")
    log.info("%d service(s), %d tool(s) on %s; Ctrl-C to stop",
             len(catalog.descriptors), len(catalog.tools), url)


async def run_host(
    catalog: Catalog,
    pulsar_settings: PulsarSettings,
    serve_settings: ServeSettings,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[Server], Awaitable[None]] | None = None,
) -> int:
    """Serve ``catalog`` until ``stop`` is set or SIGINT/SIGTERM arrives.

    On stop the host stops taking requests, gives in-flight calls ``serve_settings.grace``
    seconds, then closes. Returns the number of calls cancelled at the end of the grace.

    Raises:
        pulsar.asyncio.PulsarException: the broker refused a subscription or producer.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    client = await pulsar_settings.connect()
    server = Server(catalog.services, catalog.descriptors, serve_settings)
    try:
        await server.start(client)
        _log_catalog(catalog, pulsar_settings.url)
        if on_ready is not None:
            await on_ready(server)
        await stop.wait()
        log.info("stopping: no new requests; waiting up to %ss for %d in-flight call(s)",
                 serve_settings.grace, sum(w.in_flight for w in server.workers))
        cancelled = await server.stop()
        if cancelled:
            log.warning("%d call(s) cancelled at the end of the grace period", cancelled)
        return cancelled
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await client.close()
