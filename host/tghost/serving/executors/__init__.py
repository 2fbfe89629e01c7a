"""executors: how a service's ``invoke`` runs, behind one small interface (:class:`.base.Executor`), as
Celery's pools are: in the host's worker threads (:mod:`.thread`) or in worker processes
(:mod:`.process`, whose child runs :mod:`.child`).

The endpoint hands a checked call to an executor and never asks which kind it is. Never touches
Pulsar, never checks or answers a request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tghost.serving.executors.base import ISOLATIONS, PROCESS, THREAD, Executor, WorkerLimits

if TYPE_CHECKING:
    from tghost.author.service import ToolService
    from tghost.protocol.descriptors import ToolServiceDescriptor

__all__ = ["create"]


def create(service: ToolService, descriptor: ToolServiceDescriptor, max_workers: int, isolation: str,
           limits: WorkerLimits) -> Executor:
    """The executor for ``service``: its own ``isolation`` if it sets one, else the host's.

    Raises:
        ValueError: the isolation is not one of :data:`ISOLATIONS`.
    """
    chosen = service.isolation or isolation
    if chosen == PROCESS:
        from tghost.serving.executors.process import ProcessExecutor

        return ProcessExecutor(descriptor.id, _source(service, descriptor.id), max_workers, limits)
    if chosen == THREAD:
        from tghost.serving.executors.thread import ThreadExecutor

        return ThreadExecutor(service, descriptor.id, max_workers)
    raise ValueError(f"service {descriptor.id!r}: isolation {chosen!r} is not one of {', '.join(ISOLATIONS)}")


def _source(service: ToolService, service_id: str) -> Any:
    from tghost.serving.executors.child import EntryPointSource, ObjectSource

    origin = service._tghost_entry_point
    if origin is not None:
        return EntryPointSource(*origin[:2], service_id, origin[2])
    return ObjectSource(service)
