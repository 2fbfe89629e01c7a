"""log: pulsar-lite's log. Its output and tghost's notes go to ``broker.log`` in the data
dir (rotated; a full disk drops lines quietly, and says so once) and, in the foreground, to the
terminal, routine warnings and repeats held back; what the lines say about a full disk or a
damaged store is kept for the broker to act on.

Never starts or talks to a broker: it writes the lines it is given.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import logging.handlers
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import IO

__all__ = [
    "DISK_FULL",
    "LOG_BACKUPS",
    "LOG_MAX_BYTES",
    "REPEAT_WINDOW",
    "ROUTINE_WARNINGS",
    "STORE_DAMAGED",
    "BrokerLog",
    "LogPump",
    "words",
]

#: Bytes of ``broker.log`` before it is rotated to ``broker.log.1``.
LOG_MAX_BYTES = 10 * 1024 * 1024
#: Rotated logs kept (``broker.log.1`` .. ``.2``): at most 30 MiB of log per broker.
LOG_BACKUPS = 2
#: pulsar-lite 0.2.0 warnings that are routine, not a problem: never echoed to a terminal, and
#: kept in ``broker.log`` once per :data:`REPEAT_WINDOW` each, with the count of those held back.
#: It warns once per message published to a topic whose reader has gone (every directory's
#: readers: each ``tghost tools`` or ``tghost call`` leaves two, and each heartbeat after it then
#: warns): written one by one, they were nearly all of a month's log.
ROUTINE_WARNINGS = ("No dispatcher found for subscription 'reader-",)
#: What pulsar-lite 0.2.0 logs when its disk refuses a write (at each persistent publish, which
#: it answers by closing the client's connection).
DISK_FULL = "No space left on device"
#: What pulsar-lite 0.2.0 logs (or exits with at start) when it cannot read its store: an entry
#: log record torn by a failed write, RocksDB's own checks, a metadata file it cannot parse.
STORE_DAMAGED = ("invalid entrylog magic", "entrylog checksum mismatch", "entrylog length does not match index",
                 "entrylog position does not match index", "Corruption:", "Failed to parse metadata file")
#: Seconds during which the foreground broker echoes a pulsar-lite line only once, with the
#: count of the ones like it (the same words but for numbers) it held back.
REPEAT_WINDOW = 60.0


class _QuietFileHandler(logging.handlers.RotatingFileHandler):
    """``broker.log``, rotated, that never prints Python's "--- Logging error ---" report: when a
    write fails (a full disk) it says so once on ``complaints`` (stderr when ``None``), drops
    lines until a write works again, and then logs how many it dropped. ``failed`` is the
    error of the write that failed, while writes fail."""

    def __init__(self, path: Path, complaints: IO[str] | None = None) -> None:
        super().__init__(path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS, delay=True)
        self.setFormatter(logging.Formatter("%(message)s"))
        self.failed: str | None = None
        self.dropped = 0
        self._complaints = complaints
        self._error = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed is not None and not self._resume():
            self.dropped += 1
            return
        self._error = False
        super().emit(record)
        if self._error:
            self.dropped += 1

    def _resume(self) -> bool:
        """After failed writes, try again: end the line a failed write left half-written, and
        log how many lines were dropped. Returns whether that worked."""
        _end_line(self.baseFilename)
        self._error = False
        note = f"[{_utc_now()} tghost] the log is written again; {self.dropped} line(s) were dropped meanwhile"
        super().emit(logging.makeLogRecord({"msg": note, "levelno": logging.WARNING}))
        if self._error:
            return False
        self.failed, self.dropped = None, 0
        return True

    def handleError(self, record: logging.LogRecord) -> None:
        self._error = True
        error = sys.exc_info()[1]
        with contextlib.suppress(Exception):
            if self.stream is not None:
                self.stream.close()  # reopened at the next line: nothing half-written stays buffered
        self.stream = None  # type: ignore[assignment]
        if self.failed is None:
            self.failed = str(error) or type(error).__name__
            with contextlib.suppress(OSError, ValueError):
                print(f"tghost broker: cannot write its log {self.baseFilename} ({self.failed}); dropping its "
                      "lines until it can", file=self._complaints or sys.stderr, flush=True)


def _end_line(path: str) -> None:
    """Add a newline to the file ``path`` unless it is empty or ends with one (best effort)."""
    with contextlib.suppress(OSError), open(path, "rb+") as file:
        if file.seek(0, os.SEEK_END) == 0:
            return
        file.seek(-1, os.SEEK_END)
        if file.read(1) != b"\n":
            file.write(b"\n")


def words(line: str | None) -> str:
    """What a pulsar-lite log line says, without its ``[time LEVEL module]`` prefix."""
    return (line or "").partition("] ")[2] or line or "no detail"


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class _Repeats:
    """Which pulsar-lite lines to echo: one of each kind (the same words but for numbers) per
    :data:`REPEAT_WINDOW` seconds, the next one with a count of those held back."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, int]] = {}

    def admit(self, line: str, kind: str | None = None) -> str | None:
        """``line`` to pass on (with a count appended), or ``None`` to hold it back. Lines of one
        ``kind`` count together; by default, the lines with the same words but for numbers."""
        kind = kind or re.sub(r"\d+", "#", line.partition("] ")[2] or line)
        now = time.monotonic()
        since, held = self._seen.get(kind, (-REPEAT_WINDOW, 0))
        if now - since < REPEAT_WINDOW:
            self._seen[kind] = (since, held + 1)
            return None
        if len(self._seen) > 1000:
            self._seen.clear()
        self._seen[kind] = (now, 0)
        return line + (f" ({held} more like it held back)" if held else "")


class BrokerLog:
    """Where pulsar-lite's lines and tghost's notes go: ``broker.log`` (:class:`_QuietFileHandler`;
    each of :data:`ROUTINE_WARNINGS` once per :data:`REPEAT_WINDOW`, with a count) and ``echo``
    (every line but :data:`ROUTINE_WARNINGS`, repeats held back). Keeps the last lines
    for error messages, and what they said about the disk and the store: ``disk_full`` and
    ``damaged`` are the first such line since :meth:`clear_trouble` (``None``: none)."""

    def __init__(self, path: Path, echo: IO[str] | None) -> None:
        self._handler = _QuietFileHandler(path)
        self._echo = echo
        self._repeats = _Repeats()
        self._routine = _Repeats()
        self._last: collections.deque[str] = collections.deque(maxlen=20)
        self.disk_full: str | None = None
        self.damaged: str | None = None

    def pulsar_lite(self, line: str) -> None:
        """A line of pulsar-lite's output."""
        self._last.append(line)
        if self.disk_full is None and DISK_FULL in line:
            self.disk_full = line
        if self.damaged is None and any(mark in line for mark in STORE_DAMAGED):
            self.damaged = line
        routine = next((warning for warning in ROUTINE_WARNINGS if warning in line), None)
        if routine is not None:
            self._write(self._routine.admit(line, routine))
            return
        self._write(line)
        self._show(self._repeats.admit(line))

    def note(self, message: str) -> None:
        """A line from tghost, always echoed."""
        line = f"[{_utc_now()} tghost] {message}"
        self._write(line)
        self._show(line)

    def _write(self, line: str | None) -> None:
        if line is not None:
            self._handler.handle(logging.makeLogRecord({"msg": line, "levelno": logging.INFO}))

    def _show(self, line: str | None) -> None:
        if self._echo is not None and line is not None:
            with contextlib.suppress(OSError, ValueError):
                print(line, file=self._echo, flush=True)

    def last_lines(self) -> list[str]:
        """The last 20 lines of pulsar-lite's output since :meth:`forget_lines`."""
        return list(self._last)

    def forget_lines(self) -> None:
        self._last.clear()

    def clear_trouble(self) -> None:
        self.disk_full = self.damaged = None

    def close(self) -> None:
        self._handler.close()


class LogPump:
    """Copies one pulsar-lite process's output, line by line, into a :class:`BrokerLog` in a
    daemon thread."""

    def __init__(self, source: IO[bytes], sink: BrokerLog) -> None:
        self._source = source
        self._sink = sink
        self._thread = threading.Thread(target=self._run, name="pulsar-lite log", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for raw in self._source:
            self._sink.pulsar_lite(raw.decode(errors="replace").rstrip())

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
