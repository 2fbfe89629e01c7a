"""web: what every HTTP face of the directory shares (``tghost mcp --transport http`` and
``tghost inspect``): the ``Host``/``Origin`` checks against DNS rebinding and cross-site
requests, on every bind, with the MCP SDK's own checker, and the warning for a bind that no
client can name.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings

from tghost.pulsar.clients import is_loopback

__all__ = ["LOOPBACK_HOSTS", "TransportSecurityMiddleware", "transport_security", "warn_if_unreachable_by_name"]

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


def warn_if_unreachable_by_name(what: str, host: str, port: int, allowed_hosts: Sequence[str]) -> None:
    """Bound off loopback with no allowed host: clients elsewhere reach the port, but every
    name they could use is refused; say so once (``what``: ``MCP``, ``the inspector``)."""
    if allowed_hosts or is_loopback(host):
        return
    log.warning("serving %s on %s:%d, but only loopback Host names (%s) are accepted: requests with any other "
                "Host header are refused (421 Invalid Host header). Pass --allowed-host for each name clients use, "
                "e.g. --allowed-host tools.example.com:%d", what, host, port, ", ".join(LOOPBACK_HOSTS), port)
