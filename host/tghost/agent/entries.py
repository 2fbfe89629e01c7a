"""entries: what a directory holds once it has resolved the hosts' claims: a live tool service
(:class:`ServiceEntry`), a live tool (:class:`DirectoryTool`), and a change to the live tool set
(:class:`Change`). Plain data, shared by the directory and its calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tghost.agent.ledger import Provider
from tghost.protocol.descriptors import ToolDescriptor, ToolServiceDescriptor

__all__ = ["Change", "DirectoryTool", "ServiceEntry"]


@dataclass(frozen=True)
class ServiceEntry:
    """A live tool service and every host whose lease on it is alive."""

    descriptor: ToolServiceDescriptor
    providers: tuple[Provider, ...]


@dataclass(frozen=True)
class DirectoryTool:
    """A live tool: its descriptor, its service, and the hosts announcing it."""

    descriptor: ToolDescriptor
    service: ServiceEntry
    providers: tuple[Provider, ...]


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
