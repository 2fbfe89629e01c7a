"""hosts: what a directory knows of every live host (``tghost status``): its instances, lease,
signature, the tool services and tools it announces, its conflicts, its skewed services and the health URL its host
message names (docs/protocol.md §4.3). Pure reads of a started directory: never talks to Pulsar.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from tghost.agent.directory import ToolDirectory
from tghost.agent.ledger import InstanceView, is_late

__all__ = ["LiveHost", "late_hosts", "live_hosts"]


@dataclass(frozen=True)
class LiveHost:
    """A host id with at least one live instance (two or more: a clash, docs/protocol.md §4.7).

    ``host`` is the announced ``host`` object of its newest instance (``hostname``, ``pid``,
    ``version`` ...); ``lease_end`` (unix seconds) when its last lease ends and ``lease_seconds``
    its length; ``signed_by`` the key id its last message names (``None``: unsigned), checked
    against trusted keys if ``verified``; ``services`` the tool services it announces and serves,
    ``external`` those it announces but are served elsewhere, ``tools`` its tools; ``conflicts``
    the names among them that are contested (a tool name, or ``tool-service/<id>``: the keys of
    :attr:`ToolDirectory.conflicts`); ``health`` the URL of its health JSON, if announced;
    ``skewed`` the services among its own whose providers serve different versions of their code
    (:attr:`tghost.agent.entries.ServiceEntry.skew`). :attr:`heard` is when it was last heard and
    :meth:`late` whether it is silent past half its lease (docs/protocol.md §4.9).
    """

    id: str
    instances: tuple[str, ...]
    host: dict[str, Any]
    lease_end: float
    lease_seconds: float
    signed_by: str | None
    verified: bool
    services: tuple[str, ...]
    external: tuple[str, ...]
    tools: tuple[str, ...]
    conflicts: tuple[str, ...]
    health: str | None
    skewed: tuple[str, ...] = ()

    @property
    def heard(self) -> float:
        """When (unix seconds) the host was last heard: its lease last renewed."""
        return self.lease_end - self.lease_seconds

    def late(self, now: float) -> bool:
        """Whether, at unix time ``now``, the host is late: silent for more than half its lease,
        a heartbeat overdue; perhaps stopped without withdrawing (:func:`tghost.agent.ledger.is_late`)."""
        return is_late(self.heard, self.lease_seconds, now)

    def to_json(self, now: float) -> dict[str, Any]:
        """The host for programs at unix time ``now`` (see ``tghost status --help``); no ``null``."""
        shape: dict[str, Any] = {
            "id": self.id, "instances": list(self.instances), "hostname": self.host.get("hostname") or None,
            "version": self.host.get("version") or None, "lease_seconds": self.lease_seconds,
            "lease_remaining": round(max(0.0, self.lease_end - now), 1),
            "heard_ago": round(max(0.0, now - self.heard), 1), "late": self.late(now),
            "signed": self.signed_by is not None,
            "signed_by": self.signed_by, "verified": self.verified if self.signed_by is not None else None,
            "services": list(self.services), "external": list(self.external), "tools": len(self.tools),
            "conflicts": list(self.conflicts), "skewed": list(self.skewed), "health_url": self.health,
        }
        return {key: value for key, value in shape.items() if value is not None}


def live_hosts(directory: ToolDirectory) -> list[LiveHost]:
    """Every host id with a live instance in ``directory`` (started), by id."""
    by_id: dict[str, list[InstanceView]] = defaultdict(list)
    for view in directory.ledger.instances():
        if view.state == "active":
            by_id[str(view.host.get("id"))].append(view)
    return [_live_host(directory, host_id, views) for host_id, views in sorted(by_id.items())]


def _live_host(directory: ToolDirectory, host_id: str, views: list[InstanceView]) -> LiveHost:
    newest = max(views, key=lambda v: v.lease_end)
    announced = {(kind, name) for view in views for kind, name, available in view.entries if available}
    external = sorted({name for view in views for name in view.external})
    return LiveHost(
        id=host_id, instances=tuple(str(v.host.get("instance", "")) for v in views), host=newest.host,
        lease_end=newest.lease_end, lease_seconds=newest.seconds, signed_by=newest.signed_by,
        verified=newest.verified,
        services=tuple(sorted(n for k, n in announced if k == "tool-service" and n not in external)),
        external=tuple(external), tools=tuple(sorted(n for k, n in announced if k == "tool")),
        conflicts=tuple(sorted(name if kind == "tool" else f"{kind}/{name}" for kind, name in announced
                               if _is_contested(directory, kind, name))),
        health=newest.health, skewed=tuple(sorted(name for kind, name in announced if kind == "tool-service"
                                                  and name in directory.services and directory.services[name].skew)))


def _is_contested(directory: ToolDirectory, kind: str, name: str) -> bool:
    if kind == "tool":
        tool = directory.tools.get(name)
        return name in directory.conflicts or (tool is not None and tool.contested)
    service = directory.services.get(name)
    return f"tool-service/{name}" in directory.conflicts or (service is not None and bool(service.rivals))



def late_hosts(directory: ToolDirectory, now: float) -> dict[str, float]:
    """Host id -> when it was last heard (unix seconds), for each live host of ``directory`` that
    is late at ``now``: silent for half its lease (docs/protocol.md §4.9)."""
    return {host: lease.heard for host, lease in sorted(directory.hosts.items()) if lease.late(now)}
