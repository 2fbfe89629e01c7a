"""audit: one JSON line per call, for ``tghost run --audit-log`` (host side) or a
:class:`tghost.agent.directory.ToolDirectory` listener (agent side). Off by default.

Never logs config values or tokens, nor argument values unless asked; never lets a failing
sink break serving.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

__all__ = ["AuditLog", "audit_entry"]

log = logging.getLogger(__name__)

#: Attributes every line has (``None`` when the record lacks one: a directory ToolCallRecord has no
#: request id), then those only a directory-side ToolCallRecord has.
_ALWAYS = ("request_id", "user", "service")
_INVOKE = ("tool", "groups", "allowed_groups")


def audit_entry(record: Any, arguments: bool = False) -> dict[str, Any]:
    """The audit line of a ``tghost.serving.request.CallRecord`` or ``tghost.agent.calls.ToolCallRecord``,
    matched on attributes, as a JSON-able dict::

        {"time": ISO 8601 UTC, "kind": "call" | "invoke", "request_id", "user", "caller", "service",
         ["tool", "groups", "allowed_groups", "state": {"before", "after"}], "status",
         "duration_ms": float, ["trace_id"], "argument_names": [sorted names] | "arguments": {...}}

    ``kind`` is ``invoke`` for a directory-side record (it has ``tool``). ``user`` is what the
    request asserted, never checked; ``caller`` is the verified caller of a host with an
    ``[access]`` policy, ``{"name", "key_id"}``, or ``null`` (anonymous). Argument values appear
    only with ``arguments=True``; otherwise only their names (none when the request was not decoded).
    ``trace_id`` (32 hex digits) is there when the host traced the call (``--otel``), so a slow
    or failed call's line leads to its trace.
    """
    entry: dict[str, Any] = {"time": datetime.now(UTC).isoformat(timespec="milliseconds"),
                             "kind": "invoke" if hasattr(record, "tool") else "call"}
    for name in _ALWAYS:
        entry[name] = getattr(record, name, None)
    caller = getattr(record, "caller", None)
    entry["caller"] = caller.to_json() if caller is not None else None
    for name in _INVOKE:
        if hasattr(record, name):
            value = getattr(record, name)
            entry[name] = value if value is None or isinstance(value, str) else list(value)
    if hasattr(record, "state_before"):
        entry["state"] = {"before": record.state_before, "after": record.state_after}
    entry["status"] = record.status
    entry["duration_ms"] = round(float(record.duration) * 1000, 3)
    if getattr(record, "trace_id", None):
        entry["trace_id"] = record.trace_id
    given = getattr(record, "arguments", None)
    if isinstance(given, dict):
        if arguments:
            entry["arguments"] = given
        else:
            entry["argument_names"] = sorted(given)
    return entry


class AuditLog:
    """A call listener (host :data:`~tghost.serving.request.CallListener` or directory
    :data:`~tghost.agent.calls.ToolCallListener`) writing :func:`audit_entry` lines to ``stream``,
    flushed per call. A write that fails is logged once (at ERROR) and the line dropped; the
    call it describes goes on.
    """

    def __init__(self, stream: TextIO, *, arguments: bool = False, owned: bool = False) -> None:
        """``arguments``: log argument values, not only names. ``owned``: :meth:`close` closes ``stream``."""
        self.stream = stream
        self.arguments = arguments
        self.failures = 0
        self._owned = owned
        self._lock = threading.Lock()

    @classmethod
    def open(cls, target: str, *, arguments: bool = False) -> AuditLog:
        """``-`` for stderr, else a file path opened for appending (UTF-8, created if missing).

        Raises:
            OSError: the file cannot be opened.
        """
        if target == "-":
            return cls(sys.stderr, arguments=arguments)
        return cls(Path(target).open("a", encoding="utf-8"), arguments=arguments, owned=True)

    def __call__(self, record: Any) -> None:
        """Write one line for ``record``; safe from any thread (the thread lane's workers call it)."""
        try:
            line = json.dumps(audit_entry(record, self.arguments), default=repr)
            with self._lock:
                self.stream.write(line + "\n")
                self.stream.flush()
        except Exception as exc:
            self.failures += 1
            if self.failures == 1:
                log.error("audit log: cannot write (%s: %s); calls go on, further failures are not logged",
                          type(exc).__name__, exc)

    def close(self) -> None:
        """Close the file (not stderr). Idempotent."""
        if self._owned and not self.stream.closed:
            self.stream.close()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()
