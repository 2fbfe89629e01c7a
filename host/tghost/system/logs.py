"""logs: summaries of repeated log events, so that a flood of bad input costs one log line a
minute instead of one per message (:class:`LogSummary`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

__all__ = ["LogSummary"]


class LogSummary:
    """Counts events by reason in :attr:`counts` (:meth:`add`) and logs them as warnings when
    :meth:`flush` is called, one line per reason with its count and an example, at most once
    per ``interval`` seconds; each event itself at debug level. The first flush is due at once.

    ``line`` is a %-format with ``count``, ``reason`` and ``example`` keys, e.g.
    ``"ignored %(count)d announcement(s): %(reason)s (e.g. %(example)s)"``. Reasons in
    ``silent`` are counted, never summarised. Thread-safe: the thread lane's workers and the
    event loop share one (two threads flushing at once still log one summary).
    """

    def __init__(self, logger: logging.Logger, line: str, interval: float = 60.0,
                 counts: Counter[str] | None = None, silent: frozenset[str] = frozenset()) -> None:
        self.logger = logger
        self.line = line
        self.interval = interval
        self.counts: Counter[str] = Counter() if counts is None else counts
        """Every event so far, by reason."""
        self.silent = silent
        self._pending: Counter[str] = Counter()
        self._examples: dict[str, str] = {}
        self._last = float("-inf")
        self._lock = threading.Lock()

    def add(self, reason: str, example: str) -> None:
        """Count one event of ``reason``; ``example`` describes it (logged at debug level, and
        in the summary if it is the first of its reason since the last one)."""
        self.logger.debug("%s: %s", reason, example)
        with self._lock:
            self.counts[reason] += 1
            if reason not in self.silent:
                self._pending[reason] += 1
                self._examples.setdefault(reason, example)

    def flush(self, now: float | None = None, force: bool = False) -> None:
        """Log what was counted since the last summary, if ``interval`` seconds have passed (or
        ``force``); ``now`` is seconds on any one clock the caller keeps to (default: monotonic)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if not self._pending or (not force and now - self._last < self.interval):
                return
            pending, examples = sorted(self._pending.items()), dict(self._examples)
            self._pending.clear()
            self._examples.clear()
            self._last = now
        for reason, count in pending:
            self.logger.warning(self.line, {"count": count, "reason": reason, "example": examples[reason]})
