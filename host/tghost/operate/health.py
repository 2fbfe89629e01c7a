"""health: what ``tghost status`` and ``GET /health`` report about a running host: connected to
Pulsar or not, the services served and their workers, uptime, and the last error logged (``tghost``, ``pulsar``).
Never changes what the host does; it only reads live objects and the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tghost.serving.executors.base import WorkerStats

__all__ = ["DEGRADED", "HEALTHY", "NOT_CONNECTED", "STARTING", "ErrorCapture", "Health"]

#: ``/health`` statuses: ``ok`` (connected, no problem), ``degraded``, ``starting``.
HEALTHY = "ok"
DEGRADED = "degraded"
STARTING = "starting"


@dataclass(frozen=True)
class _Error:
    message: str
    logger: str
    at: float


class ErrorCapture(logging.Handler):
    """Keeps the last record logged at ERROR or above (message, logger name, unix time)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.last: _Error | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.last = _Error(record.getMessage(), record.name, record.created)
        except Exception:
            self.handleError(record)


#: The problem ``/health`` names when the only thing wrong is a lost broker connection.
NOT_CONNECTED = "not connected to the Pulsar broker: the host reconnects on its own (its log says since when)"


class Health:
    """The health of one host. ``connected`` is asked at each :meth:`snapshot` (``None``: not yet
    known); ``services`` lists the service ids served, ``workers`` their executors' stats by
    service id (:class:`tghost.serving.executors.base.WorkerStats`), ``reports`` other problems in
    words (the announcer's: announcements that cannot be published). Records at ERROR and above
    are captured from ``loggers`` (the host's own, and the Pulsar client's, which says why it
    cannot connect) between :meth:`attach` and :meth:`detach`.
    """

    def __init__(self, services: Callable[[], Sequence[str]] = lambda: (),
                 connected: Callable[[], bool | None] = lambda: None,
                 loggers: Sequence[str] = ("tghost", "pulsar"),
                 workers: Callable[[], Mapping[str, WorkerStats]] = dict,
                 reports: Callable[[], Sequence[str]] = tuple) -> None:
        self.services = services
        self.connected = connected
        self.workers = workers
        self.reports = reports
        self.started = time.monotonic()
        self.errors = ErrorCapture()
        self._loggers = [logging.getLogger(name) for name in loggers]

    def attach(self) -> Health:
        """Start capturing errors logged under ``loggers``."""
        for logger in self._loggers:
            logger.addHandler(self.errors)
        return self

    def detach(self) -> None:
        """Stop capturing errors. Idempotent."""
        for logger in self._loggers:
            logger.removeHandler(self.errors)

    def snapshot(self) -> dict[str, Any]:
        """The JSON of ``GET /health``::

            {"status": "ok" | "degraded" | "starting", "connected": bool | null, "services": [ids],
             "workers": {id: WorkerStats.to_json()}, "problems": [str],
             "uptime_seconds": float, "last_error": null | {"message", "logger", "time" (ISO 8601 UTC)}}

        ``degraded`` means not connected to Pulsar, or there are ``problems``: a service's (worker
        threads stuck in calls that timed out), or a report's (announcements that cannot be
        published); degraded without another problem names the lost connection
        (:data:`NOT_CONNECTED`). ``starting``: the connection is not known yet.
        """
        connected = self._ask_connected()
        last = self.errors.last
        workers = dict(self.workers())
        problems = [f"service {sid!r}: {problem}" for sid, stats in workers.items()
                    if (problem := stats.problem()) is not None]
        problems += self._ask_reports()
        if connected is False and not problems:
            problems.append(NOT_CONNECTED)
        return {
            "status": STARTING if connected is None else HEALTHY if connected and not problems else DEGRADED,
            "connected": connected,
            "services": list(self.services()),
            "workers": {sid: stats.to_json() for sid, stats in workers.items()},
            "problems": problems,
            "uptime_seconds": round(time.monotonic() - self.started, 3),
            "last_error": None if last is None else {
                "message": last.message, "logger": last.logger,
                "time": datetime.fromtimestamp(last.at, UTC).isoformat(timespec="seconds")},
        }

    def _ask_reports(self) -> list[str]:
        try:
            return list(self.reports())
        except Exception as exc:  # a report must never take /health down
            return [f"could not ask for problems: {exc!r}"]

    def _ask_connected(self) -> bool | None:
        try:
            return self.connected()
        except Exception:
            return False
