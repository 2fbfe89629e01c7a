"""net: addresses and ports of this machine: whether a host name is its loopback, and a free
TCP port on it.
"""

from __future__ import annotations

import socket

__all__ = ["LOOPBACK", "free_port", "is_loopback"]

#: Host names of this machine's loopback interface (besides every ``127.x.y.z``).
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 without brackets) names this machine's
    loopback interface (where the embedded broker runs)."""
    return host in LOOPBACK or host.startswith("127.")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (another process may take it next)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
