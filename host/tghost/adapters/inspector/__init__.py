"""inspector: the live directory as one web page (``tghost inspect``): every live tool, by its
title and with its hints, with its hosts, leases, conflicts and rejections as the directory
sees them, updated as announcements arrive (server-sent events), and a call form per tool drawn
from its ``input-schema`` whose calls go through the directory as an agent's do (a destructive
tool's once confirmed), streamed chunk by chunk; a structured result is drawn as a tree.

The page's script and style ship in this package (``static/``): nothing is fetched from
elsewhere, and nothing is built.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from tghost.adapters.inspector.app import Inspector
from tghost.adapters.web import serve_app, warn_if_unreachable_by_name
from tghost.agent.directory import ToolDirectory
from tghost.system.tasks import cancel_and_wait

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
        try:
            await serve_app(inspector.app, "the inspector", host, port, on_ready=on_ready)
        finally:
            await cancel_and_wait(follower)
