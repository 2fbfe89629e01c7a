"""inspector: the live directory as one web page (``tghost inspect``): every live tool with its
hosts, leases, conflicts and rejections as the directory sees them, updated as announcements
arrive (server-sent events), and a call form per tool drawn from its ``input-schema`` whose calls
go through the directory as an agent's do, streamed chunk by chunk.

The page's script and style ship in this package (``static/``): nothing is fetched from
elsewhere, and nothing is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

import uvicorn

from tghost.adapters.inspector.app import Inspector
from tghost.adapters.web import warn_if_unreachable_by_name
from tghost.agent.directory import ToolDirectory

__all__ = ["Inspector", "serve"]

log = logging.getLogger(__name__)


async def serve(directory: ToolDirectory, host: str, port: int, allowed_hosts: Sequence[str] = (),
                token: str | None = None, on_ready: Callable[[str], None] | None = None) -> None:
    """Start ``directory``, follow it and serve the inspector at ``http://host:port/`` until
    cancelled. ``on_ready`` is called with the page's URL once the port is bound.

    Raises:
        tghost.pulsar.clients.BrokerError: no broker answered within the directory's ``connect_timeout``.
        OSError: the port could not be bound.
    """
    async with directory:
        inspector = Inspector(directory, token, allowed_hosts)
        follower = asyncio.create_task(inspector.follow(), name="inspector follow")
        warn_if_unreachable_by_name("the inspector", host, port, allowed_hosts)
        server = uvicorn.Server(uvicorn.Config(inspector.app, host=host, port=port, log_config=None,
                                               access_log=False, lifespan="off"))
        try:
            serving = asyncio.create_task(server.serve(), name="inspector http")
            while not server.started and not serving.done():
                await asyncio.sleep(0.02)
            if server.started and on_ready is not None:
                on_ready(f"http://{'localhost' if host in ('127.0.0.1', '::1') else host}:{port}/")
            await serving
            if not server.started:
                raise OSError(f"cannot serve the inspector on {host}:{port}: the address is in use or not this "
                              "machine's; choose another --port or --host")
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
