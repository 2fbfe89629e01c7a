"""names: the tghost name of an MCP tool, and which mounted server holds each name.

A tghost tool name is letters, digits, ``_``, ``.`` and ``-``, starts with a letter or digit, and
has at most 128 characters; an MCP tool's name may be anything. :func:`tool_name` maps one to the
other by a fixed rule, and :class:`Claims` keeps two servers from serving one name.
"""

from __future__ import annotations

import re
import threading

__all__ = ["MAX_NAME", "Claims", "tool_name"]

#: The longest tghost tool name.
MAX_NAME = 128
_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9_.-]")
_NOT_A_START = re.compile(r"^[^A-Za-z0-9]+")


def tool_name(prefix: str, name: str) -> str | None:
    """The tghost tool name of the MCP tool ``name`` of a server with ``prefix``: ``prefix + name``
    with each character a tghost name cannot hold replaced by ``-``, the characters before its
    first letter or digit and the ``-`` at its end trimmed, cut to 128 characters. ``None`` when
    no letter or digit is left (the tool is not served). ``read_file`` stays ``read_file``;
    ``get weather`` is ``get-weather``, ``café/menu?`` is ``caf--menu``, ``_private`` is ``private``.
    """
    mapped = _NOT_A_START.sub("", _NOT_IN_A_NAME.sub("-", prefix + name))[:MAX_NAME].rstrip("-")
    return mapped or None


class Claims:
    """Which mounted server serves each tghost tool name, across the servers of one host: the
    first server to claim a name keeps it until it lists its tools without it, or is unmounted.
    Thread-safe."""

    def __init__(self) -> None:
        self._owners: dict[str, str] = {}
        self._lock = threading.Lock()

    def claim(self, server: str, names: list[str]) -> dict[str, str]:
        """``server`` now offers ``names``: it keeps or takes each one no other server holds, and
        lets go of those it held and no longer offers. Returns the names another server holds,
        each with that server."""
        with self._lock:
            self._release(server, keep=set(names))
            return {name: owner for name in names if (owner := self._owners.setdefault(name, server)) != server}

    def release(self, server: str) -> None:
        """``server`` is unmounted: every name it holds is free."""
        with self._lock:
            self._release(server, keep=set())

    def _release(self, server: str, keep: set[str]) -> None:
        for name in [name for name, owner in self._owners.items() if owner == server and name not in keep]:
            del self._owners[name]
