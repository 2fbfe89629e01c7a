"""web: what every HTTP face of the directory shares (``tghost mcp --transport http`` and
``tghost inspect``): which ``Host`` headers they answer, on every bind, against DNS rebinding
(:func:`allowed_host_patterns`, :func:`is_allowed_host`: the MCP bridge hands the same patterns to
the MCP SDK's own checker), the inspector's same-origin rule (:func:`is_own_origin`), the warning
for a bind that no client can name, and the server itself (:func:`serve_app`: bound by tghost, so
a port in use is a clear error, and announced once it listens). Nothing here needs the MCP SDK.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

from tghost.system.net import is_loopback

__all__ = ["LOOPBACK_HOSTS", "allowed_host_patterns", "bind", "is_allowed_host", "is_own_origin", "serve_app",
           "warn_if_unreachable_by_name"]

log = logging.getLogger(__name__)

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
"""The ``Host`` names always accepted over HTTP, bare or with any port (the MCP SDK's loopback list)."""


def allowed_host_patterns(allowed_hosts: Sequence[str] = ()) -> list[str]:
    """The ``Host`` patterns a server answers: each of :data:`LOOPBACK_HOSTS` bare and as
    ``name:*``, then ``allowed_hosts`` (``name``, ``name:port``, or ``name:*`` for ``name`` with
    any port), as :func:`is_allowed_host` and the MCP SDK's ``TransportSecuritySettings`` read them."""
    return [f"{name}{port}" for name in LOOPBACK_HOSTS for port in ("", ":*")] + list(allowed_hosts)


def is_allowed_host(host: str, patterns: Sequence[str]) -> bool:
    """Whether the ``Host`` header value ``host`` matches one of ``patterns``
    (:func:`allowed_host_patterns`): equal to one (case-sensitive), or ``NAME:`` and any port
    for a ``NAME:*``; the MCP SDK's rule, so the bridge and the inspector answer the same names.
    An empty ``host`` (no header) matches none."""
    return any(host == pattern or (pattern.endswith(":*") and host.startswith(pattern[:-1])) for pattern in patterns)


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
