"""stalls: a stall detector for the serving event loop. A daemon thread pings the loop and,
when a ping waits longer than a threshold, logs once per stall whose code holds the loop.

Never changes the loop or the code it samples: it only reads the loop thread's stack.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

__all__ = ["Stall", "StallDetector"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stall:
    """What held the event loop when a stall crossed the threshold.

    ``owner`` is the label of the innermost owner object (a service's thread executor) on the loop
    thread's stack, or ``None`` when the blocking code runs outside any. ``entry`` is
    ``file:line in function`` of the first frame the owner called (the plugin's code), and
    ``where`` the same for the innermost Python frame (``entry`` again when that is it).
    """

    owner: str | None
    entry: str
    where: str

    def describe(self) -> str:
        """``service 'x' at file:line in f`` (plus ``, inside file:line in g`` when deeper)."""
        who = f"service {self.owner!r}" if self.owner is not None else "code outside any service"
        inside = "" if self.where == self.entry else f", inside {self.where}"
        return f"{who} at {self.entry}{inside}"


def _place(frame: FrameType) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


class StallDetector:
    """Measures the lag of one asyncio event loop from a daemon thread.

    Every ``interval`` seconds it schedules a no-op on the loop with ``call_soon_threadsafe``.
    When that waits more than ``threshold`` seconds, the loop is stalled: the detector walks
    the loop thread's stack (``sys._current_frames``) for the innermost frame of a method of
    ``owner_type`` whose ``self`` is an ``owner_type`` (named by ``label(self)``), logs ONE
    warning for the stall naming it and the code's ``file:line``, then waits for the loop to
    answer again before it measures anew. ``stalls`` counts stalls, ``stalls_by_owner`` per
    owner label (``None``: outside any owner), ``last`` is the latest :class:`Stall`.
    """

    def __init__(
        self,
        threshold: float,
        *,
        owner_type: type,
        label: Callable[[Any], str],
        interval: float = 0.1,
    ) -> None:
        self.threshold = threshold
        self.interval = interval
        self.stalls = 0
        self.stalls_by_owner: Counter[str | None] = Counter()
        self.last: Stall | None = None
        self._owner_type = owner_type
        self._label = label
        self._codes = _method_codes(owner_type)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> StallDetector:
        """Sample the running loop (call from its thread); returns ``self``.

        Raises:
            RuntimeError: no event loop runs in this thread.
        """
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._sample, args=(loop, threading.get_ident()), name="tghost-stall-detector", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling; returns within about one ``interval``."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    def _sample(self, loop: asyncio.AbstractEventLoop, loop_thread: int) -> None:
        while not self._stop.wait(self.interval):
            pong = threading.Event()
            sent = time.monotonic()
            try:
                loop.call_soon_threadsafe(pong.set)
            except RuntimeError:  # the loop is closed
                return
            if pong.wait(self.threshold):
                continue
            self._report(self._blame(loop_thread))
            while not pong.wait(self.interval):
                if self._stop.is_set():
                    return
            log.info("event loop answers again after %.2fs", time.monotonic() - sent)

    def _report(self, stall: Stall) -> None:
        self.stalls += 1
        self.stalls_by_owner[stall.owner] += 1
        self.last = stall
        log.warning("event loop blocked for more than %ss by %s: async code must not block "
                    "(await, or make invoke a plain def so it runs in a worker thread)",
                    self.threshold, stall.describe())

    def _blame(self, loop_thread: int) -> Stall:
        """Who holds the loop thread now: walk out from the innermost frame to an owner's method."""
        innermost = sys._current_frames().get(loop_thread)
        if innermost is None:
            return Stall(None, "?", "?")
        called: FrameType = innermost
        frame: FrameType | None = innermost
        while frame is not None:
            if frame.f_code in self._codes:
                owner = frame.f_locals.get("self")
                if isinstance(owner, self._owner_type):
                    return Stall(self._label(owner), _place(called), _place(innermost))
            called, frame = frame, frame.f_back
        return Stall(None, _place(innermost), _place(innermost))

def _method_codes(owner_type: type) -> frozenset[CodeType]:
    """The code objects of ``owner_type``'s own functions (plain, async and generators)."""
    return frozenset(
        member.__code__ for klass in owner_type.__mro__ for member in vars(klass).values()
        if inspect.isfunction(member)
    )
