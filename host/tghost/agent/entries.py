"""entries: what a directory holds once it has resolved the hosts' claims: a live tool service
(:class:`ServiceEntry`), a live tool (:class:`DirectoryTool`), and a change to the live tool set
(:class:`Change`). Plain data, shared by the directory and its calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tghost.agent.ledger import Provider
from tghost.protocol.descriptors import ToolDescriptor, ToolServiceDescriptor

__all__ = ["Change", "DirectoryTool", "ServiceEntry", "Side"]


@dataclass(frozen=True)
class Side:
    """One side of a conflict (docs/protocol.md §4.8): the ``host`` id(s) (comma-separated),
    the ``service`` id its claim names and, for a claim on a service id, its ``request_queue``."""

    host: str
    service: str
    request_queue: str = ""

    def describe(self) -> str:
        """``service 'x' on TOPIC from host h``."""
        where = f" on {self.request_queue}" if self.request_queue else ""
        return f"service {self.service!r}{where} from host {self.host}"

    def to_json(self) -> dict[str, str]:
        return {"host": self.host, "service": self.service, "request_queue": self.request_queue}


@dataclass(frozen=True)
class ServiceEntry:
    """A live tool service and every host whose lease on it is alive. ``rivals``: the hosts
    that announce its id, live or lately, with other queues or config params."""

    descriptor: ToolServiceDescriptor
    providers: tuple[Provider, ...]
    rivals: tuple[Side, ...] = ()


@dataclass(frozen=True)
class DirectoryTool:
    """A live tool: its descriptor, its service, and the hosts announcing it. ``rivals``: the
    hosts that announce its name, live or lately, over another service or with other config
    values (its service's rivals are in ``service.rivals``)."""

    descriptor: ToolDescriptor
    service: ServiceEntry
    providers: tuple[Provider, ...]
    rivals: tuple[Side, ...] = ()

    def admits(self, key_id: str | None) -> bool:
        """Whether a caller with this key id (``None``: anonymous) may call the tool on every host
        that provides it, as they announce it (docs/protocol.md §4.3 ``access``)."""
        return all(p.access is None or p.access.admits(key_id) for p in self.providers)

    def access(self) -> str:
        """Who may call it, in words: ``everyone``, ``anonymous``, or key ids (the first host's)."""
        announced = next((p.access for p in self.providers if p.access is not None), None)
        if announced is None:
            return "everyone"
        return ",".join((["anonymous"] if announced.anonymous else []) + list(announced.keys)) or "nobody"

    @property
    def contested(self) -> bool:
        """Whether another host claims this tool's name or its service id differently."""
        return bool(self.rivals or self.service.rivals)

    def sides(self) -> list[Side]:
        """Every side of its conflicts: first the live claims that win (the claims seen first),
        then the rivals of the tool and of its service."""
        first = Side(",".join(sorted({str(p.host.get("id")) for p in self.providers})), self.service.descriptor.id,
                     self.service.descriptor.request_queue)
        return [first, *self.rivals, *self.service.rivals]


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
