"""web: what every HTTP face of the directory shares (``tghost mcp --transport http`` and
``tghost inspect``): the ``Host``/``Origin`` checks against DNS rebinding and cross-site
requests, on every bind, with the MCP SDK's own checker (and, for the inspector, whose only
client is its own page, the stricter same-origin rule of :func:`is_own_origin`), the warning
for a bind that no client can name, and the server itself (:func:`serve_app`: bound by tghost, so a port in use is
a clear error, and announced once it listens).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings

from tghost.system.net import is_loopback

__all__ = ["LOOPBACK_HOSTS", "TransportSecurityMiddleware", "bind", "is_own_origin", "serve_app",
           "transport_security", "warn_if_unreachable_by_name"]

log = logging.getLogger(__name__)

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
"""The ``Host`` names always accepted over HTTP, bare or with any port (the SDK's loopback list)."""


def transport_security(allowed_hosts: Sequence[str] = ()) -> TransportSecuritySettings:
    """The SDK's DNS-rebinding protection, on whatever address the server binds.

    ``allowed_hosts`` are ``Host`` header values (``name``, ``name:port``, or ``name:*`` for
    ``name`` with any port) accepted besides :data:`LOOPBACK_HOSTS`. The ``Origin`` headers
    accepted (a request without one is too) are ``http://`` of the loopback names, as the
    SDK's own loopback settings, and ``http://`` and ``https://`` of each allowed host. The
    SDK answers any other ``Host`` with 421 and any other ``Origin`` with 403.
    """
    loopback = [f"{name}{port}" for name in LOOPBACK_HOSTS for port in ("", ":*")]
    origins = [f"http://{name}" for name in loopback]
    origins += [f"{scheme}://{name}" for name in allowed_hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                     allowed_hosts=[*loopback, *allowed_hosts], allowed_origins=origins)


def is_own_origin(origin: str, host: str) -> bool:
    """Whether a request's ``Origin`` header is the origin of the server it was sent to, as its
    ``Host`` header names it: ``http`` or ``https`` with the same name and port, or with a
    loopback name (:func:`tghost.system.net.is_loopback`) at the same port when ``Host`` is one
    too (a page opened as ``localhost`` calling ``127.0.0.1``). Any other page's origin, another
    loopback port's included, is foreign: its requests come from another site."""
    scheme, _, authority = origin.partition("://")
    theirs, ours = urlsplit(f"//{authority}"), urlsplit(f"//{host}")
    if scheme not in ("http", "https") or not authority or theirs.netloc != authority:
        return False
    if authority.lower() == host.lower():
        return True
    try:
        same_port = theirs.port == ours.port
    except ValueError:  # not a port
        return False
    return same_port and is_loopback(theirs.hostname or "") and is_loopback(ours.hostname or "")


def warn_if_unreachable_by_name(what: str, host: str, port: int, allowed_hosts: Sequence[str]) -> None:
    """Bound off loopback with no allowed host: clients elsewhere reach the port, but every
    name they could use is refused; say so once (``what``: ``MCP``, ``the inspector``)."""
    if allowed_hosts or is_loopback(host):
        return
    log.warning("serving %s on %s:%d, but only loopback Host names (%s) are accepted: requests with any other "
                "Host header are refused (421 Invalid Host header). Pass --allowed-host for each name clients use, "
                "e.g. --allowed-host tools.example.com:%d", what, host, port, ", ".join(LOOPBACK_HOSTS), port)


def bind(what: str, host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on ``host``:``port`` (0: any free port) for ``what`` (``the
    inspector``, ...).

    Raises:
        OSError: the port is in use or the address is not this machine's; the message says what
            to pass instead.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot serve {what} on {host}:{port}: {exc.strerror or exc}; choose another --port "
                      "(or --host)") from None
    return sock


async def serve_app(app: Any, what: str, host: str, port: int, *, lifespan: Literal["on", "off"] = "off",
                    path: str = "/", on_ready: Callable[[str], None] | None = None) -> None:
    """Serve the ASGI ``app`` with uvicorn on ``host``:``port`` until cancelled; ``on_ready`` gets
    its URL (``http://HOST:PORT`` + ``path``; ``localhost`` for a loopback address) once it listens.

    Raises:
        OSError: see :func:`bind`.
    """
    import uvicorn  # only the commands that serve HTTP pay for it

    sock = bind(what, host, port)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan=lifespan))
    serving = asyncio.create_task(server.serve(sockets=[sock]), name=f"{what} http")
    try:
        while not server.started and not serving.done():
            await asyncio.sleep(0.02)
        if server.started and on_ready is not None:
            name = "localhost" if is_loopback(host) else f"[{host}]" if ":" in host else host
            on_ready(f"http://{name}:{sock.getsockname()[1]}{path}")
        await serving
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        for listening in getattr(server, "servers", ()):  # cancelled, uvicorn does not close them itself
            listening.close()  # the loop stops watching the socket before it is closed
        sock.close()
