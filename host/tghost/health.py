"""health: what ``tghost status`` and ``GET /health`` report about a running host: connected to
Pulsar or not, the services served, uptime, and the last error logged (``tghost``, ``pulsar``).
Never changes what the host does; it only reads live objects and the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = ["DEGRADED", "OK", "STARTING", "ErrorCapture", "Health"]

OK = "ok"
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


class Health:
    """The health of one host. ``connected`` is asked at each :meth:`snapshot` (``None``: not yet
    known); ``services`` lists the service ids served. Records at ERROR and above are captured
    from ``loggers`` (the host's own, and the Pulsar client's, which says why it cannot connect)
    between :meth:`attach` and :meth:`detach`.
    """

    def __init__(self, services: Callable[[], Sequence[str]] = lambda: (),
                 connected: Callable[[], bool | None] = lambda: None,
                 loggers: Sequence[str] = ("tghost", "pulsar")) -> None:
        self.services = services
        self.connected = connected
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
             "uptime_seconds": float, "last_error": null | {"message", "logger", "time" (ISO 8601 UTC)}}

        ``degraded`` means not connected to Pulsar; ``starting`` that the connection is not known yet.
        """
        connected = self._ask_connected()
        last = self.errors.last
        return {
            "status": STARTING if connected is None else OK if connected else DEGRADED,
            "connected": connected,
            "services": list(self.services()),
            "uptime_seconds": round(time.monotonic() - self.started, 3),
            "last_error": None if last is None else {
                "message": last.message, "logger": last.logger,
                "time": datetime.fromtimestamp(last.at, UTC).isoformat(timespec="seconds")},
        }

    def _ask_connected(self) -> bool | None:
        try:
            return self.connected()
        except Exception:
            return False
