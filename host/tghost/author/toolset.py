"""toolset: :class:`ToolSet`, a set of tool services and tools that a plugin changes while the host
runs (a bridge to a server whose tools come and go). The plugin registers it as a service and
calls :meth:`ToolSet.replace` from any thread; the host that serves it applies each change on its
own event loop (:mod:`tghost.operate.toolsets`) and re-announces at once.

Plain data and a hand-off: never touches Pulsar, never checks a descriptor (the host does).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tghost.author.service import ToolService
    from tghost.protocol.descriptors import ToolDescriptor

__all__ = ["Content", "ToolSet"]

#: What a toolset holds at one moment: ``(version, services, tools)``; the version counts the
#: :meth:`ToolSet.replace` calls so far.
Content = tuple[int, tuple["ToolService", ...], tuple["ToolDescriptor | dict[str, Any]", ...]]


class ToolSet:
    """Tool services and tools a plugin changes while the host runs, under a ``name`` (unique
    among the plugin's toolsets; shown by ``tghost plugins`` and in ``/health``).

    Register it as a service (``register(toolset)`` in ``tghost_register_services``, or among a
    ``LocalHost``'s services); it starts empty. Each :meth:`replace` says what it serves from then
    on, and the host applies the latest one at once: it serves the services that came, stops
    the ones that left (their calls in flight get the host's grace), and announces the change
    without waiting for the heartbeat. Set :attr:`problem` to say what is wrong behind it.

    Raises:
        ValueError: ``name`` is not a non-empty string.
    """

    name: str
    problem: str | None
    """What is wrong behind the toolset now, in words (``"server down, restarting in 4 s"``), or
    ``None``. The host shows it in ``/health`` ``problems`` and ``tghost plugins``."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a ToolSet takes a non-empty name, got {name!r}")
        self.name = name
        self.problem = None
        self._lock = threading.Lock()
        self._content: Content = (0, (), ())
        self._applied = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._notify: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return f"ToolSet({self.name!r})"

    def replace(self, services: Iterable[ToolService], tools: Iterable[ToolDescriptor | dict[str, Any]] = ()) -> None:
        """Serve exactly ``services`` (``ToolService`` instances and ``@tghost.tool`` functions,
        each with its own default tools, as ``register(service)`` gives them) and ``tools`` (tool
        descriptors or dicts, over these services or others the host serves) from now on.
        ``replace([])`` withdraws everything.

        Thread-safe, from any thread or the host's event loop: it hands the change to the host
        and returns at once (:meth:`wait_applied` waits for it). Before a host serves the
        toolset, it sets what the host starts with. The host checks each item as it checks a
        registered one: a bad one, or a name another plugin or toolset serves, is reported and
        skipped, and the rest are served.
        """
        services, tools = tuple(services), tuple(tools)
        with self._lock:
            self._content = (self._content[0] + 1, services, tools)
            notify = self._notify
        if notify is not None:
            notify()

    async def wait_applied(self) -> None:
        """Return once a running host serves and announces the content of the latest
        :meth:`replace` made before this call (at once if it does already); an announcement
        that fails is one of the toolset's errors, not a wait. Await it on any event loop. It
        waits until a host serves the toolset, and never returns when the host stops first or
        could not apply the change (logged; the next :meth:`replace` tries again): give it a
        timeout where either may happen."""
        with self._lock:
            version = self._content[0]
            if self._applied >= version:
                return
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append((version, waiter))
        await waiter

    # -- the host's side (tghost.operate.toolsets) --------------------------------------------

    def _snapshot(self) -> Content:
        """The latest content, as ``(version, services, tools)``."""
        with self._lock:
            return self._content

    def _bind(self, notify: Callable[[], None]) -> bool:
        """Have ``notify()`` called (in the thread that called :meth:`replace`) after each
        change. Returns ``False``, binding nothing, when another host has it bound already."""
        with self._lock:
            if self._notify is not None:
                return False
            self._notify = notify
            return True

    def _unbind(self, notify: Callable[[], None]) -> None:
        """Stop calling ``notify`` (if it is the one bound): its host no longer serves the toolset."""
        with self._lock:
            if self._notify == notify:
                self._notify = None

    def _mark_applied(self, version: int) -> None:
        """The host serves and announces the content of ``version``: wake who waits for it."""
        with self._lock:
            self._applied = max(self._applied, version)
            done = [waiter for wanted, waiter in self._waiters if wanted <= self._applied]
            self._waiters = [(wanted, waiter) for wanted, waiter in self._waiters if wanted > self._applied]
        for waiter in done:
            if not waiter.get_loop().is_closed():
                waiter.get_loop().call_soon_threadsafe(_resolve, waiter)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
