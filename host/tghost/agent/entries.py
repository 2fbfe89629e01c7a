"""entries: what a directory holds once it has resolved the hosts' claims: a live tool service
(:class:`ServiceEntry`), a live tool (:class:`DirectoryTool`), and a change to the live tool set
(:class:`Change`). Plain data, shared by the directory and its calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tghost.agent.ledger import Claim, Provider
from tghost.protocol.descriptors import ToolDescriptor, ToolServiceDescriptor

__all__ = ["Change", "DirectoryTool", "ServiceEntry", "describe_side"]


@dataclass(frozen=True)
class ServiceEntry:
    """A live tool service and every host whose lease on it is alive. ``conflicting``: the live
    claims on its id with other queues or config params, seen after the winning ones
    (docs/protocol.md §4.8)."""

    descriptor: ToolServiceDescriptor
    providers: tuple[Provider, ...]
    conflicting: tuple[Claim, ...] = ()


@dataclass(frozen=True)
class DirectoryTool:
    """A live tool: its descriptor, its service, and the hosts announcing it. ``conflicting``:
    the live claims on its name over another service or with other config values, seen after
    the winning ones (docs/protocol.md §4.8)."""

    descriptor: ToolDescriptor
    service: ServiceEntry
    providers: tuple[Provider, ...]
    conflicting: tuple[Claim, ...] = ()

    @property
    def contested(self) -> bool:
        """Whether another host claims this tool's name or its service id differently."""
        return bool(self.conflicting or self.service.conflicting)

    def rivals(self) -> list[dict[str, str]]:
        """The other side of each conflict, seen after this tool's claims: ``{"host": id,
        "service": id, "request_queue": topic}``, per claim of this tool's name over another
        service (``request_queue`` is then ``""``) and per claim of this tool's service id with
        other queues or config params."""
        return [{"host": str(c.provider.host.get("id")), "service": c.descriptor.service, "request_queue": ""}
                for c in self.conflicting if isinstance(c.descriptor, ToolDescriptor)] + [
                {"host": str(c.provider.host.get("id")), "service": c.descriptor.id,
                 "request_queue": c.descriptor.request_queue}
                for c in self.service.conflicting if isinstance(c.descriptor, ToolServiceDescriptor)]

    def sides(self) -> list[dict[str, str]]:
        """Every side of its conflicts, as :meth:`rivals` gives them: first the claims seen first
        (``host``: their host ids, comma-separated), then :meth:`rivals`."""
        first = {"host": ",".join(sorted({str(p.host.get("id")) for p in self.providers})),
                 "service": self.service.descriptor.id, "request_queue": self.service.descriptor.request_queue}
        return [first, *self.rivals()]


def describe_side(side: dict[str, str]) -> str:
    """One side of a conflict (:meth:`DirectoryTool.sides`) in words: ``service 'x' on TOPIC from host h``."""
    where = f" on {side['request_queue']}" if side["request_queue"] else ""
    return f"service {side['service']!r}{where} from host {side['host']}"


@dataclass(frozen=True)
class Change:
    """A change to the live tool set: ``added``, ``updated``, ``removed`` (withdrawn) or ``expired``."""

    kind: Literal["added", "updated", "removed", "expired"]
    name: str
    tool: DirectoryTool | None

    def to_json(self) -> dict[str, Any]:
        tool = self.tool
        return {"change": self.kind, "tool": self.name,
                "descriptor": tool.descriptor.to_json_dict() if tool else None,
                "providers": [p.host["id"] for p in tool.providers] if tool else []}
