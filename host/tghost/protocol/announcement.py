"""announcement: the announcement message format and the epoch topics it travels on
(docs/protocol.md §4): :func:`announcement_value` builds a message as the announcer (host side)
sends it, :class:`Announcement` parses it as the directory (agent side) reads it. The topics and
their epochs are :mod:`tghost.protocol.epochs`' (re-exported here).

Pure data: never does I/O, never knows about Pulsar clients, hosts or directories.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tghost.protocol.descriptors import ToolDescriptor, ToolServiceDescriptor
from tghost.protocol.epochs import (
    DEFAULT_TOPIC,
    EPOCH_SECONDS,
    MAX_LEASE,
    RESTATEMENT_MARGIN,
    current_topic,
    epoch_of,
    epoch_topic,
    read_window,
)

__all__ = [
    "DEFAULT_TOPIC",
    "EPOCH_SECONDS",
    "KINDS",
    "MAX_LEASE",
    "RESTATEMENT_MARGIN",
    "Announcement",
    "Entries",
    "HostInfo",
    "Lease",
    "announcement_key",
    "announcement_value",
    "current_topic",
    "epoch_of",
    "epoch_topic",
    "parse_descriptor",
    "read_window",
]

#: What an announcement may announce: a host (its lease and manifest), a tool service or a tool.
KINDS = ("host", "tool-service", "tool")


def announcement_key(kind: str, name: str, host_id: str) -> str:
    """The message key: ``<kind>/<name>@<host-id>``, one per provider, so compaction keeps each
    provider's latest state. ``kind`` is ``tool-service``, ``tool`` or ``host`` (name = host id)."""
    return f"{kind}/{name}@{host_id}"


def announcement_value(
    kind: str, name: str, status: str, *, host: dict[str, Any], lease: float, sent_at: float, since: float,
    descriptor: dict[str, Any] | None = None, plugin: dict[str, Any] | None = None,
    entries: dict[str, list[str]] | None = None, health: str | None = None, external: bool = False,
    access: dict[str, Any] | None = None, access_policy: str | None = None,
) -> dict[str, Any]:
    """One message value (docs/protocol.md §4.3), as a host sends it (``json.dumps`` of it is the
    wire format, keys in this order) and :class:`Announcement` parses it.

    ``host`` is the sender's identity object (``id``, ``hostname``, ``pid``, ``version``,
    ``instance``, optionally ``session-key``); ``lease`` is seconds, ``sent_at`` and ``since``
    unix seconds; ``descriptor`` and ``plugin`` are sent as ``null`` when ``None``. The OPTIONAL
    fields are sent only when given: ``entries`` (the manifest, ``{"tool-service": [ids], "tool":
    [names]}``) and ``health`` (a URL) on host messages, ``external`` (when true) on tool-service
    messages, ``access`` (``{"anonymous": bool, "keys": [key ids], "names": {key id: name}}``) on
    tool messages, ``access-policy`` (a fingerprint of the service's access rules, or ``"none"``) on
    tool-service messages.
    """
    value: dict[str, Any] = {"kind": kind, "name": name, "status": status, "descriptor": descriptor, "host": host,
                             "plugin": plugin, "lease": {"seconds": lease, "sent_at": sent_at}, "since": since}
    optional = {"entries": entries, "health": health, "external": external or None, "access": access,
                "access-policy": access_policy}
    return value | {key: field for key, field in optional.items() if field is not None}


class Lease(BaseModel):
    """``lease``: how long (``seconds``) this message keeps its host instance alive, and when the
    host sent it (``sent_at``, unix seconds by the host's clock)."""

    model_config = ConfigDict(strict=True)
    seconds: float = Field(gt=0, le=86_400, allow_inf_nan=False)
    sent_at: float = Field(ge=0, allow_inf_nan=False)


class HostInfo(BaseModel):
    """``host``: who serves. ``id`` is stable across restarts; ``instance`` is new on every
    process start (empty from hosts that predate it)."""

    model_config = ConfigDict(extra="allow")
    id: str = Field(min_length=1)
    hostname: str = ""
    pid: int = 0
    version: str = ""
    instance: str = Field(default="", max_length=128)


class Entries(BaseModel):
    """``entries``: a host message's manifest, the names of every tool service and tool the
    instance announces now (docs/protocol.md §4.4)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    tool_service: tuple[str, ...] = Field(default=(), alias="tool-service")
    tool: tuple[str, ...] = ()

    def keys(self) -> set[tuple[str, str]]:
        """The (kind, name) pairs listed."""
        return {("tool-service", n) for n in self.tool_service} | {("tool", n) for n in self.tool}


class Announcement(BaseModel):
    """One message value on an announcement topic (docs/protocol.md §4.3). The ``signature``
    field, if any, is checked before this model (:mod:`tghost.protocol.trust`) and ignored by it.

    ``since`` (unix seconds) is when this host instance first announced the entry (for a host
    message: when the instance started), for people to read: a directory never orders claims
    by it (docs/protocol.md §4.8). ``entries`` is the
    manifest and ``health`` the URL of the host's health endpoint (OPTIONAL); both belong on
    ``host`` messages only.
    """

    kind: Literal["host", "tool-service", "tool"]
    name: str = Field(min_length=1)
    status: Literal["available", "withdrawn"]
    descriptor: dict[str, Any] | None = None
    host: HostInfo
    plugin: dict[str, Any] | None = None
    lease: Lease
    since: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    entries: Entries | None = None
    health: str | None = Field(default=None, min_length=1, max_length=2048)
    """Host messages only, OPTIONAL: the URL of the host's health JSON (``tghost run --metrics-port``'s
    ``/health``), for ``tghost status``. A loopback address is only of use on the host's own machine."""
    external: bool = False
    access: dict[str, Any] | None = None
    """Tool messages of a host with an ``[access]`` policy: who may call the tool,
    ``{"anonymous": bool, "keys": [key ids], "names": {key id: name}}`` (:class:`tghost.protocol.access.ToolAccess`)."""
    access_policy: str | None = Field(default=None, alias="access-policy", min_length=1, max_length=64)
    """Tool-service messages of a host that serves the service: the fingerprint of the access
    rules it applies to it (:func:`tghost.protocol.access.policy_fingerprint`), ``"none"``
    without a policy; absent from hosts that predate it."""

    @model_validator(mode="after")
    def _consistent(self) -> Announcement:
        for name in ("entries", "health"):
            if getattr(self, name) is not None and self.kind != "host":
                raise ValueError(f"a {self.kind} announcement carries {name!r}: only host messages do")
        if self.kind == "host" and self.name != self.host.id:
            raise ValueError(f"a host announcement names {self.name!r}, not its host id {self.host.id!r}")
        return self


def parse_descriptor(announcement: Announcement) -> ToolDescriptor | ToolServiceDescriptor | None:
    """The validated descriptor an ``available`` tool or tool-service announcement carries
    (``None`` for host messages and withdrawals).

    Raises:
        ValueError (pydantic's ValidationError too): the descriptor is missing, invalid, or
            names another tool or service than the announcement does.
    """
    if announcement.kind == "host" or announcement.status == "withdrawn":
        return None
    if announcement.descriptor is None:
        raise ValueError(f"{announcement.kind} {announcement.name!r} is announced without a descriptor")
    model = ToolDescriptor if announcement.kind == "tool" else ToolServiceDescriptor
    descriptor = model.model_validate(announcement.descriptor)
    identity = descriptor.name if isinstance(descriptor, ToolDescriptor) else descriptor.id
    if identity != announcement.name:
        raise ValueError(f"announcement for {announcement.name!r} carries a descriptor for {identity!r}")
    return descriptor
