"""deadlines: the timeouts of a service's calls on the event loop, one loop timer for them all.

Never knows about Pulsar, requests or replies: it cancels tasks and tells why.
"""

from __future__ import annotations

import asyncio
import weakref

__all__ = ["Deadlines"]


class Deadlines:
    """The timeouts of one service's running calls on the event loop: each call gets ``timeout``
    seconds from :meth:`start`; then its task is cancelled, and :meth:`expired` tells that
    cancellation from any other. One loop timer serves every call: the calls are kept in start
    order, which is deadline order, and the timer is armed for the earliest (``asyncio.timeout``
    per call cost a timer, a context and two running-loop lookups each: docs/internals/performance.md §1).

    Used by :class:`tghost.serving.loop.LoopDriver` for calls on the event loop; the thread lane
    (:mod:`tghost.serving.lane`) times its calls from a thread of its own.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._running: dict[asyncio.Task[None], float] = {}  # task -> loop time of its deadline
        self._expired: weakref.WeakSet[asyncio.Task[None]] = weakref.WeakSet()  # a plugin may swallow it
        self._timer: asyncio.TimerHandle | None = None

    def start(self, task: asyncio.Task[None]) -> None:
        """Start ``task``'s clock (on the loop that runs it)."""
        loop = task.get_loop()
        self._running[task] = deadline = loop.time() + self.timeout
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._sweep, loop)

    def stop(self, task: asyncio.Task[None]) -> None:
        """``task`` ended (or stopped needing a deadline) before it expired."""
        self._running.pop(task, None)

    def expired(self, task: asyncio.Task[None]) -> bool:
        """Whether ``task``'s cancellation is its timeout alone (then it is no longer cancelling);
        False for any other cancellation, also one that came on top of the timeout."""
        if task not in self._expired:
            return False
        self._expired.discard(task)
        return task.uncancel() == 0

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = loop.time()
        while self._running:
            task, deadline = next(iter(self._running.items()))
            if deadline > now:
                self._timer = loop.call_at(deadline, self._sweep, loop)
                return
            del self._running[task]
            self._expired.add(task)
            task.cancel()
