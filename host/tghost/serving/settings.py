"""settings: the host-wide serving limits of ``tghost run`` (:class:`ServeSettings`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tghost.protocol.descriptors import DEFAULT_TIMEOUT
from tghost.serving.executors.base import THREAD, WorkerLimits

__all__ = ["ERROR_DETAILS", "FULL", "NONE", "TYPE", "ServeSettings"]

#: How much of a tool's unexpected exception a caller is told (``ServeSettings.error_detail``):
#: ``full``, its class and message; ``type``, its class only; ``none``, neither. Each but
#: ``full`` says where the host's log has the traceback (host id and request id).
FULL = "full"
TYPE = "type"
NONE = "none"
ERROR_DETAILS = (FULL, TYPE, NONE)


@dataclass(frozen=True)
class ServeSettings:
    """Host-wide serving limits; a service descriptor's ``timeout``/``max-concurrency`` override.

    ``timeout``, ``grace`` and ``stall_threshold`` are seconds; ``max_payload`` is bytes.

    - ``max_queue``: requests per service that may wait for a free slot before new ones are
      answered ``overloaded`` (non-persistent topics; a persistent topic queues in the broker).
    - ``max_payload``: a larger request is answered ``bad-request`` and never decoded.
    - ``max_redeliveries``: how often a request on a persistent topic may be delivered again
      (its host died or shut down mid-call) and still be invoked; one more delivery is answered
      ``redelivery-limit``, and the client moves any later one to the dead-letter topic
      ``<request topic>-<subscription>-DLQ``.
    - ``stall_threshold``: the stall detector warns when the event loop is blocked longer;
      ``0`` turns it off.
    - ``isolation``: where ``invoke`` runs unless the service says (:data:`tghost.serving.executors.base.ISOLATIONS`):
      ``thread`` (the host's worker threads) or ``process`` (worker processes).
    - ``worker_limits``: when worker processes are recycled (:class:`tghost.serving.executors.base.WorkerLimits`).
    - ``error_detail``: what a caller is told of an exception the tool did not mean for it (any
      but ``tghost.ToolError``): ``"full"`` (``ZeroDivisionError: float division by zero``),
      ``"type"`` (``ZeroDivisionError``) or ``"none"``; the log keeps the traceback either way.

    Raises:
        ValueError: ``error_detail`` is not ``"full"``, ``"type"`` or ``"none"``.
    """

    timeout: float = DEFAULT_TIMEOUT
    max_concurrency: int = 16
    max_queue: int = 64
    grace: float = 10.0
    max_payload: int = 1024 * 1024
    max_redeliveries: int = 3
    stall_threshold: float = 0.5
    isolation: str = THREAD
    worker_limits: WorkerLimits = field(default_factory=WorkerLimits)
    error_detail: str = FULL

    def __post_init__(self) -> None:
        if self.error_detail not in ERROR_DETAILS:
            raise ValueError(f"error_detail {self.error_detail!r} is not one of {', '.join(ERROR_DETAILS)}")
