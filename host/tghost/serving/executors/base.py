"""base: the one small interface every executor has, as Celery's pools share one.

What every executor is (:class:`Executor`), what it runs (:class:`tghost.author.service.Call`) and gives back
(:data:`Outcome`), and what it reports (:class:`WorkerStats`).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # the authoring modules load with the first plugin, not with the settings
    from tghost.author.service import Call

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = [
    "CANCELLED",
    "CRASH",
    "ISOLATIONS",
    "MEMORY",
    "PROCESS",
    "RECYCLED",
    "RESTART_REASONS",
    "THREAD",
    "TIMEOUT",
    "Executor",
    "Outcome",
    "WorkerLimits",
    "WorkerRaised",
    "WorkerStats",
]

#: Isolation modes: plugin code in the host's threads (fast) or in worker processes (safe).
THREAD = "thread"
PROCESS = "process"
ISOLATIONS = (THREAD, PROCESS)

#: Why a worker process was replaced. ``timeout``: its call outlived its timeout (or the shutdown
#: grace), so it was terminated, then killed. ``cancelled``: its caller cancelled the call
#: (docs/protocol.md §2.11), and it was terminated the same way. ``crash``: it died in a call
#: (signal, ``os._exit``, the OOM killer). ``memory``: it ran out of ``--max-worker-memory``.
#: ``recycled``: it served ``--max-calls-per-worker`` calls.
TIMEOUT = "timeout"
CANCELLED = "cancelled"
CRASH = "crash"
MEMORY = "memory"
RECYCLED = "recycled"
RESTART_REASONS = (TIMEOUT, CANCELLED, CRASH, MEMORY, RECYCLED)

#: What :meth:`Executor.run` gives back: one observation string, or a stream of them.
Outcome = str | AsyncGenerator[str, None]


class WorkerRaised(Exception):
    """A plugin's unexpected exception in a worker process, as the host learns it through the
    pipe: ``name`` is its class name, ``text`` its message, ``remote_traceback`` the traceback
    formatted in the worker and ``pid`` the worker's process id. The host logs and answers it as
    it does an exception raised in its own threads (:meth:`tghost.serving.request.Terms.failure`)."""

    def __init__(self, name: str, text: str, remote_traceback: str, pid: int | None) -> None:
        super().__init__(f"{name}: {text}")
        self.name = name
        self.text = text
        self.remote_traceback = remote_traceback
        self.pid = pid


@dataclass(frozen=True)
class WorkerLimits:
    """Recycling bounds of a worker process (process isolation only).

    ``max_calls``: calls a worker serves before it is replaced (``0``: no bound), as gunicorn's
    ``max_requests``. ``max_memory``: MiB; a worker whose resident memory is above it after a
    call is replaced, and its data segment is capped there (``RLIMIT_DATA``), so an allocation past
    it fails with ``MemoryError`` inside the call (``0``: no bound).
    """

    max_calls: int = 0
    max_memory: int = 0


@dataclass
class WorkerStats:
    """What one service's executor reports (``/health``, ``tghost status``, metrics).

    ``workers``: worker processes alive (process isolation) or threads started (thread isolation).
    ``busy``: calls running now. ``stuck``: threads still running a call whose caller was already
    answered (thread isolation: Python cannot stop a thread). ``restarts``: worker processes
    replaced, by reason (:data:`RESTART_REASONS`).
    """

    isolation: str
    max_workers: int
    workers: int = 0
    busy: int = 0
    stuck: int = 0
    restarts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESTART_REASONS, 0))

    def to_json(self) -> dict[str, Any]:
        """The stats as JSON: ``{"isolation", "max_workers", "workers", "busy", "stuck", "restarts"}``."""
        return {"isolation": self.isolation, "max_workers": self.max_workers, "workers": self.workers,
                "busy": self.busy, "stuck": self.stuck, "restarts": dict(self.restarts)}

    def problem(self) -> str | None:
        """Why the service is degraded (stuck threads), or ``None``."""
        if not self.stuck:
            return None
        return (f"{self.stuck} of its {2 * self.max_workers} worker threads are stuck in calls that timed out or "
                "were cancelled (Python cannot stop a thread; serve it with --isolation process to have such calls "
                "killed)")


class Executor(abc.ABC):
    """Runs one service's calls, at most ``max_workers`` at once (the service's max concurrency).

    A call is cancelled when its caller stops waiting (the call's timeout, or the end of the
    shutdown grace); an executor frees the slot at once and stops the plugin code if it can.
    """

    isolation: ClassVar[str]

    def __init__(self, service_id: str, max_workers: int) -> None:
        self.service_id = service_id
        self.max_workers = max_workers

    async def start(self) -> None:  # noqa: B027  (optional hook)
        """Get ready to take calls (a process executor starts its first worker in the background)."""

    @abc.abstractmethod
    async def run(self, call: Call, span: Span | None = None) -> Outcome:
        """Run ``invoke(*call)``; returns the observation (:func:`tghost.author.service.observation` of the result) or,
        for a generator, an async iterator of one observation per chunk, produced as the plugin
        yields them. Close the iterator (``aclosing``) when not reading it to the end. ``span`` is
        the call's ``invoke`` span while tracing is on: a worker process's part of the call gets a
        ``worker`` span under it.

        Raises:
            ToolError: what the plugin raised (its ``error_type`` kept), or why the call could
                not run: ``overloaded`` (no worker free), ``tool-service-error`` (the plugin
                raised another exception, or its worker process died).
        """

    @abc.abstractmethod
    def stats(self) -> WorkerStats:
        """The executor's workers now (read from any thread)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Let go of the workers: threads still in a plugin run on; processes are stopped."""


