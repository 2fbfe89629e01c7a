"""Helpers for the tghost-mcp tests: the notes server (``notes_server.py``) as a stdio server's
table and as a streamable-HTTP server in a process of its own, this distribution's tghost plugin
alone, and waiting for a condition."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from tghost import Catalog, PluginSelection, discover

#: The MCP server the tests mount (stdio: ``python notes_server.py``).
NOTES = Path(__file__).resolve().parent / "notes_server.py"


def notes_table(**settings: Any) -> dict[str, Any]:
    """An ``[mcp-servers.<name>]`` table of the notes server on stdio, with more ``settings``."""
    return {"command": sys.executable, "args": [str(NOTES)], **settings}


def mcp_plugin() -> list[EntryPoint]:
    """The ``tghost.plugins`` entry point of this distribution, alone (no other tghost plugin)."""
    return [ep for ep in entry_points(group="tghost.plugins") if ep.name == "mcp"]


def mount(servers: dict[str, Any], selection: PluginSelection | None = None) -> Catalog:
    """Discover this plugin alone, with a config file holding ``servers`` as [mcp-servers.*]."""
    return discover(mcp_plugin(), config={"mcp-servers": servers}, selection=selection or PluginSelection())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class HttpNotes:
    """The notes server on streamable HTTP at :attr:`url`, in a process of its own, answering
    only requests with ``Bearer <token>``: :meth:`start`, :meth:`stop`, and start again on the
    same port."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> HttpNotes:
        self.process = subprocess.Popen([sys.executable, str(NOTES), "--http", str(self.port), self.token],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                assert self.process.poll() is None and time.monotonic() < deadline, "the HTTP server did not start"
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


async def eventually(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Wait until ``check()`` is truthy (polled); returns it.

    Raises:
        AssertionError: not within ``timeout`` seconds (names ``what``).
    """
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)
    return found

