"""directory: the agent's live view of the ``tool-descriptors`` topic. Catches up from the
earliest message, follows live, expires providers whose lease ran out and filters by seed 001
group/state; calls by tool name are :mod:`tghost.invoke`'s. Never imports serve or discover,
and never lets a bad message on the topic raise or replace a live tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter, defaultdict
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pulsar
import pulsar.asyncio
import pulsar.exceptions
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import groups as seed001
from .announce import DEFAULT_TOPIC, announcement_key
from .broker import BrokerError, PulsarSettings
from .client import ToolServiceClient
from .descriptors import ToolDescriptor, ToolServiceDescriptor
from .invoke import (
    GROUPS_EXCEED_ALLOWED,
    NOT_AVAILABLE,
    OK,
    UNKNOWN_TOOL,
    InvokeListener,
    Invoker,
    InvokeRecord,
)
from .trust import TrustedKeys

__all__ = [
    "GROUPS_EXCEED_ALLOWED",
    "HIJACK",
    "INVALID",
    "MAX_ANNOUNCEMENT_BYTES",
    "MAX_DEPTH",
    "NOT_AVAILABLE",
    "OK",
    "STALE",
    "UNKNOWN_TOOL",
    "Change",
    "DirectoryTool",
    "InvokeListener",
    "InvokeRecord",
    "Provider",
    "ServiceEntry",
    "ToolDirectory",
]

log = logging.getLogger(__name__)

# Why a message on the topic was not applied (``ToolDirectory.rejections``); with trusted keys
# also tghost.trust's ``unsigned``, ``bad-signature`` and ``unknown-key``.
INVALID = "invalid"
"""Not an announcement: undecodable, wrong shape, invalid descriptor, too large, too deep, a
message key that does not match the value, or sent (by the host's clock) more than
``max_clock_skew`` after the broker published it."""
STALE = "stale"
"""Not newer (``lease.sent_at``) than one already applied for the same kind, name and host."""
HIJACK = "hijack"
"""Failed the signature check while naming a tool, tool service or host claimed by a trusted host."""

#: Announcements larger than this (bytes) are rejected as ``invalid``.
MAX_ANNOUNCEMENT_BYTES = 1 << 20
#: Announcements nested deeper than this (JSON objects and arrays) are rejected as ``invalid``.
MAX_DEPTH = 32


class _Lease(BaseModel):
    model_config = ConfigDict(strict=True)
    seconds: float = Field(gt=0, le=86_400, allow_inf_nan=False)
    sent_at: float = Field(ge=0, allow_inf_nan=False)


class _Host(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str = Field(min_length=1)
    hostname: str = ""
    pid: int = 0
    version: str = ""


class _Announcement(BaseModel):
    """One message on the topic (the announcement protocol in DESIGN.md; ``signature`` is
    checked before this model, see :mod:`tghost.trust`)."""

    kind: Literal["host", "tool-service", "tool"]
    name: str = Field(min_length=1)
    status: Literal["available", "withdrawn"]
    descriptor: dict[str, Any] | None = None
    host: _Host
    plugin: dict[str, Any] | None = None
    lease: _Lease


class _Rejected(Exception):
    """A message that is not applied: ``reason`` is the counter key, ``detail`` the log text."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Provider:
    """A host that announced an entry: its identity and the plugin the entry came from."""

    host: dict[str, Any]
    plugin: dict[str, Any] | None


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


@dataclass
class _Claim:
    descriptor: ToolDescriptor | ToolServiceDescriptor
    provider: Provider
    order: int


@dataclass
class _HostLease:
    expires_at: float
    seconds: float
    names: set[tuple[str, str]] = field(default_factory=set)


class ToolDirectory:
    """The live tool set announced on ``topic``.

    ``async with ToolDirectory(PulsarSettings(url)) as directory:`` catches up, then follows.
    ``expiry_interval`` is how often (seconds) leases are checked.

    Trust: with ``trusted`` keys only announcements signed by one of them are applied
    (format in :mod:`tghost.trust`); without, every well-formed one is (open mode). Every
    message that is not applied is logged and counted in :attr:`rejections` by reason:
    :data:`INVALID`, :data:`STALE`, ``unsigned``, ``bad-signature``, ``unknown-key``, or
    :data:`HIJACK` when a message failing the signature check names a tool, tool service
    or host that a trusted announcement claims now (one reason per message; the log names
    the signature reason too).
    Signatures protect the values, not the topic's key space: restrict who may publish on
    the topic (Pulsar authorization) so that compaction cannot drop a host's entries.

    Ordering and clocks: ``lease.sent_at`` (the host's clock) orders the messages of one
    (kind, name, host); one not newer than the newest applied is :data:`STALE`, so a replayed
    ``available`` never undoes a later ``withdrawn``. A lease runs from the broker's publish
    time (one clock for every host, capped at this directory's now), but never from later
    than ``sent_at + max_clock_skew``. The trade-off: hosts whose clocks are behind the
    broker's by up to ``max_clock_skew`` seconds keep their full lease; a host further
    behind gets a shorter one (logged once per host), and in exchange a verbatim replay of
    an old message can keep a dead host's entries alive for at most ``max_clock_skew`` plus
    its lease after the host sent it. A message sent more than ``max_clock_skew`` after its
    publish time is :data:`INVALID` (a clock far ahead would otherwise make every later
    message of that key stale). A host whose clock steps back across a restart is ignored
    as stale until its clock passes the last message it sent.

    While this directory's reader is disconnected from the broker it expires nothing (it
    cannot tell a dead host from its own outage); once back, each host gets at least a full
    lease plus the outage's length to be heard again (see :meth:`_resume_leases`).

    Calls (:meth:`check`, :meth:`invoke`, :meth:`stream`, :meth:`caller`) are made by an
    :class:`~tghost.invoke.Invoker` over the live tools: ``listeners`` get one
    :class:`~tghost.invoke.InvokeRecord` per call, and refusals are counted in :attr:`refusals`.
    """

    def __init__(
        self,
        pulsar_settings: PulsarSettings,
        topic: str = DEFAULT_TOPIC,
        *,
        expiry_interval: float = 0.25,
        trusted: TrustedKeys | None = None,
        listeners: Sequence[InvokeListener] = (),
        max_clock_skew: float = 60.0,
    ) -> None:
        self.pulsar = pulsar_settings
        self.topic = topic
        self.expiry_interval = expiry_interval
        self.trusted = trusted
        self.max_clock_skew = max_clock_skew
        self.tools: dict[str, DirectoryTool] = {}
        self.services: dict[str, ServiceEntry] = {}
        self.conflicts: dict[str, list[str]] = {}
        """Tool name -> the service ids that lost a name conflict (the winner is in ``tools``)."""
        self.rejections: Counter[str] = Counter()
        """Messages on the topic that were not applied, by reason (see the class docstring)."""
        self._claims: dict[tuple[str, str], dict[str, _Claim]] = defaultdict(dict)
        self._hosts: dict[str, _HostLease] = {}
        self._latest: dict[tuple[str, str, str], float] = {}
        self._skewed_hosts: set[str] = set()
        self._tools_of_service: dict[str, set[str]] = defaultdict(set)
        self._order = 0
        self._filtered: dict[tuple[tuple[str, ...] | None, str | None], list[ToolDescriptor]] = {}
        self._watchers: list[asyncio.Queue[Change]] = []
        self.calls = Invoker(self.tools, listeners)
        """Calls by tool name over :attr:`tools` (:mod:`tghost.invoke`)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._client: pulsar.asyncio.Client | None = None
        self._reader: pulsar.asyncio.Reader | None = None

    @property
    def rejected(self) -> int:
        """How many messages on the topic were not applied (the sum of :attr:`rejections`)."""
        return self.rejections.total()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> ToolDirectory:
        """Read the topic from the earliest message up to now, then follow it in the background.

        An agent may start before its broker: this waits up to the settings'
        ``connect_timeout`` seconds (:attr:`tghost.broker.PulsarSettings.connect_timeout`,
        default 30) for one to answer, logging one line per ``retry_interval``. Tools that
        arrive once it follows are ``added`` changes; :meth:`changes` with ``replay=True`` also
        gives those known before.

        Raises:
            tghost.broker.BrokerError: no broker answered in time (``BrokerUnavailable``), the
                URL is not a Pulsar broker (``NotPulsarBroker``), or reading the topic failed;
                the message names the URL.
        """
        self._client = self.calls.client = await self.pulsar.connect()
        try:
            self._reader = reader = await self._client.create_reader(self.topic, pulsar.MessageId.earliest)
            dirty = await self._catch_up(reader)
        except (pulsar.asyncio.PulsarException, pulsar.exceptions.PulsarException) as exc:
            await self.close()
            raise BrokerError(f"reading {self.topic} from the Pulsar broker at {self.pulsar.url} failed: "
                              f"{exc}") from exc
        dirty |= self._expire(time.time())  # hosts that died before we came
        self._resolve(dirty, "removed")  # nothing is live yet: all changes are "added"
        self._tasks = [asyncio.create_task(self._follow(reader), name="directory follow"),
                       asyncio.create_task(self._expire_loop(), name="directory expiry")]
        return self

    async def _catch_up(self, reader: pulsar.asyncio.Reader) -> set[tuple[str, str]]:
        """Apply every message already on the topic; returns what changed.

        The blocking C++ reader behind ``reader`` reads batches in a worker thread while the
        loop applies the previous batch: one thread hop per batch, where ``read_next`` costs
        two event-loop wake-ups per message (10,000 announcements: see docs/benchmarks.md).
        Falls back to the async reader if pulsar-client no longer exposes the blocking one.
        """
        dirty: set[tuple[str, str]] = set()
        blocking = getattr(reader, "_reader", None)
        if blocking is None:
            while await _has_message_available(reader):
                dirty |= self._apply_message(await reader.read_next())
            return dirty
        batch = await asyncio.to_thread(_read_batch, blocking)
        while batch:
            following = asyncio.ensure_future(asyncio.to_thread(_read_batch, blocking))
            for message in batch:
                dirty |= self._apply_message(message)
            batch = await following
        return dirty

    async def close(self) -> None:
        """Stop following and close every client."""
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.calls.close()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await self._reader.close()
        if self._client is not None:
            await self._client.close()

    async def __aenter__(self) -> ToolDirectory:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _follow(self, reader: pulsar.asyncio.Reader) -> None:
        while True:
            try:
                message = await reader.read_next()
            except pulsar.asyncio.PulsarException as exc:
                if exc.error() == pulsar.Result.AlreadyClosed:
                    return
                log.warning("reading %s failed (%s); retrying", self.topic, exc)
                await asyncio.sleep(0.5)
                continue
            self._resolve(self._apply_message(message), "removed")

    async def _expire_loop(self) -> None:
        outage_since: float | None = None
        while True:
            await asyncio.sleep(self.expiry_interval)
            now = time.time()
            if self._reader is not None and not self._reader.is_connected():
                if outage_since is None:
                    log.warning("lost the broker connection: expiring nothing until it is back")
                    outage_since = now
                continue
            if outage_since is not None:
                log.info("broker connection is back after %.1fs: every host gets a lease from now", now - outage_since)
                self._resume_leases(now, now - outage_since)
                outage_since = None
            self._resolve(self._expire(now), "expired")

    def _resume_leases(self, now: float, outage: float) -> None:
        """After an ``outage`` (seconds) of this directory's connection ending at ``now`` (unix
        seconds), give every host a full lease plus the outage's length from ``now`` to be heard
        again: a host's client backs off exponentially while the broker is away, so it may
        reconnect up to about an outage later than this directory's client."""
        for lease in self._hosts.values():
            lease.expires_at = max(lease.expires_at, now + lease.seconds + outage)

    def _expire(self, now: float) -> set[tuple[str, str]]:
        """Drop every host whose lease ended before ``now`` (unix seconds); returns what changed."""
        dirty: set[tuple[str, str]] = set()
        for host_id in [h for h, lease in self._hosts.items() if lease.expires_at < now]:
            log.info("host %s: lease expired", host_id)
            dirty |= self._drop_host(host_id)
        return dirty

    # -- applying messages -----------------------------------------------------------------

    def _apply_message(self, message: pulsar.Message) -> set[tuple[str, str]]:
        """:meth:`_apply` a message read from the topic."""
        return self._apply(message.data(), message.publish_timestamp() / 1000, message.partition_key())

    def _apply(self, data: bytes, publish_time: float, key: str) -> set[tuple[str, str]]:
        """Apply one message: its payload ``data``, the broker's ``publish_time`` (unix seconds;
        0 if unknown) and its message ``key``. Returns the (kind, name) pairs to re-resolve.

        Touches no Pulsar object, and never raises for any ``data``: a message that is not
        applied is logged and counted in :attr:`rejections`.
        """
        self._order += 1
        try:
            announcement, descriptor = self._accept(data, publish_time, key)
        except _Rejected as rejected:
            self.rejections[rejected.reason] += 1
            log.warning("ignored an announcement (key %r): %s: %s", key, rejected.reason, rejected.detail)
            return set()
        return self._record(announcement, descriptor, publish_time)

    def _accept(
        self, data: bytes, publish_time: float, key: str
    ) -> tuple[_Announcement, ToolDescriptor | ToolServiceDescriptor | None]:
        """Decode, check the signature, validate, check the key, the clock and the order; the
        announcement and its parsed descriptor.

        Raises:
            _Rejected: the message must not be applied (the reason says why).
        """
        value = _decode(data)
        if self.trusted is not None:
            reason = self.trusted.verify(value)
            if reason is not None:
                target = _target(value)
                if target is not None and self._is_live(*target):
                    raise _Rejected(HIJACK, f"{reason}, naming the live {target[0]} {target[1]!r}")
                raise _Rejected(reason, "not signed by a trusted key")
        try:
            announcement = _Announcement.model_validate(value)
            descriptor = _parse_descriptor(announcement)
        except (ValidationError, ValueError) as exc:
            raise _Rejected(INVALID, str(exc).splitlines()[0]) from None
        expected = announcement_key(announcement.kind, announcement.name, announcement.host.id)
        if key != expected:
            raise _Rejected(INVALID, f"the message key should be {expected!r}")
        sent_at = announcement.lease.sent_at
        if publish_time and sent_at > publish_time + self.max_clock_skew:
            raise _Rejected(INVALID, f"sent {sent_at - publish_time:.1f}s after the broker published it: the "
                                     f"host's clock is ahead by more than max_clock_skew ({self.max_clock_skew}s)")
        latest = self._latest.get(_order_key(announcement))
        if latest is not None and sent_at <= latest:
            raise _Rejected(STALE, f"sent at {sent_at}, not after {latest} (a replay?)")
        return announcement, descriptor

    def _is_live(self, kind: str, name: str) -> bool:
        """Whether an applied announcement claims this tool or tool service (by ``kind``), or
        this host, now; so it holds during catch-up too, before the live view is resolved."""
        if kind == "host":
            return name in self._hosts
        return bool(self._claims.get((kind, name)))

    def _lease_end(self, announcement: _Announcement, publish_time: float) -> float:
        """When (unix seconds) the lease this announcement grants ends: see the class docstring."""
        sent_at = announcement.lease.sent_at
        start = min(publish_time or sent_at, time.time())
        if start > sent_at + self.max_clock_skew:
            host_id = announcement.host.id
            if host_id not in self._skewed_hosts:
                self._skewed_hosts.add(host_id)
                log.warning("host %s: a message sent at %.3f was published %.1fs later, more than the %ss "
                            "max clock skew (a replay, or the host's clock is behind): its lease is shortened",
                            host_id, sent_at, start - sent_at, self.max_clock_skew)
            start = sent_at + self.max_clock_skew
        return start + announcement.lease.seconds

    def _record(
        self, announcement: _Announcement, descriptor: ToolDescriptor | ToolServiceDescriptor | None,
        publish_time: float,
    ) -> set[tuple[str, str]]:
        """Apply an accepted announcement to the claims and leases."""
        self._latest[_order_key(announcement)] = announcement.lease.sent_at
        host_id = announcement.host.id
        expires_at = self._lease_end(announcement, publish_time)
        if announcement.kind == "host":
            if announcement.status == "withdrawn":
                return self._drop_host(host_id)
            self._renew(host_id, expires_at, announcement.lease.seconds)
            return set()
        key = (announcement.kind, announcement.name)
        if announcement.status == "withdrawn":
            self._claims[key].pop(host_id, None)
            if host_id in self._hosts:
                self._hosts[host_id].names.discard(key)
            return {key}
        assert descriptor is not None
        provider = Provider(announcement.host.model_dump(), announcement.plugin)
        previous = self._claims[key].get(host_id)
        self._claims[key][host_id] = _Claim(descriptor, provider, previous.order if previous else self._order)
        self._renew(host_id, expires_at, announcement.lease.seconds).names.add(key)
        return {key}

    def _renew(self, host_id: str, expires_at: float, seconds: float) -> _HostLease:
        lease = self._hosts.setdefault(host_id, _HostLease(expires_at, seconds))
        lease.expires_at = max(lease.expires_at, expires_at)
        lease.seconds = seconds
        return lease

    def _drop_host(self, host_id: str) -> set[tuple[str, str]]:
        lease = self._hosts.pop(host_id, None)
        if lease is None:
            return set()
        for key in lease.names:
            self._claims[key].pop(host_id, None)
        return lease.names

    # -- resolving the live view -----------------------------------------------------------

    def _resolve(self, dirty: set[tuple[str, str]], gone: Literal["removed", "expired"]) -> None:
        """Recompute the entries named in ``dirty`` (and tools of changed services); emit changes."""
        tool_names = {name for kind, name in dirty if kind == "tool"}
        for kind, service_id in dirty:
            if kind == "tool-service":
                self._resolve_service(service_id)
                tool_names |= self._tools_of_service[service_id]
        for name in tool_names:
            self._resolve_tool(name, gone)

    def _resolve_service(self, service_id: str) -> None:
        claims = self._claims.get(("tool-service", service_id), {})
        if not claims:
            self.services.pop(service_id, None)
            return
        newest = max(claims.values(), key=lambda c: c.order)
        assert isinstance(newest.descriptor, ToolServiceDescriptor)
        self.services[service_id] = ServiceEntry(newest.descriptor, tuple(c.provider for c in claims.values()))

    def _resolve_tool(self, name: str, gone: Literal["removed", "expired"]) -> None:
        before = self.tools.get(name)
        after = self._winning_tool(name)
        if after is None:
            self.tools.pop(name, None)
        else:
            self.tools[name] = after
        if _shape(before) == _shape(after):
            return  # e.g. only a service's provider list moved: not a change to this tool
        change: Literal["added", "updated", "removed", "expired"] = (
            "added" if before is None else gone if after is None else "updated")
        self._filtered.clear()
        for queue in self._watchers:
            queue.put_nowait(Change(change, name, after or before))

    def _winning_tool(self, name: str) -> DirectoryTool | None:
        """Live claims grouped by service; the service claimed first (topic order) wins."""
        by_service: dict[str, list[_Claim]] = defaultdict(list)
        for claim in self._claims.get(("tool", name), {}).values():
            assert isinstance(claim.descriptor, ToolDescriptor)
            self._tools_of_service[claim.descriptor.service].add(name)
            if claim.descriptor.service in self.services:
                by_service[claim.descriptor.service].append(claim)
        if not by_service:
            self.conflicts.pop(name, None)
            return None
        ranked = sorted(by_service, key=lambda sid: min(c.order for c in by_service[sid]))
        if len(ranked) > 1:
            if self.conflicts.get(name) != ranked[1:]:
                log.warning("tool %r is claimed by services %s; %r wins (announced first)", name, ranked, ranked[0])
            self.conflicts[name] = ranked[1:]
        else:
            self.conflicts.pop(name, None)
        claims = by_service[ranked[0]]
        newest = max(claims, key=lambda c: c.order)
        assert isinstance(newest.descriptor, ToolDescriptor)
        return DirectoryTool(newest.descriptor, self.services[ranked[0]], tuple(c.provider for c in claims))

    # -- queries ---------------------------------------------------------------------------

    def available(self, groups: Sequence[str] | None = None, state: str | None = None) -> list[ToolDescriptor]:
        """Tools a request with these groups and state may use (seed 001), sorted by name.

        Cached per (groups, state) until the tool set changes.
        """
        key = (None if groups is None else tuple(groups), state)
        if key not in self._filtered:
            descriptors = (self.tools[name].descriptor for name in sorted(self.tools))
            self._filtered[key] = seed001.select(descriptors, groups, state)
        return self._filtered[key]

    async def changes(self, replay: bool = False) -> AsyncGenerator[Change, None]:
        """Yield every change to the live tool set from the first iteration on, until the caller
        stops (``aclose()`` it, or leave the ``async for``, to stop).

        With ``replay=True`` it first yields an ``added`` change for each tool live at that moment
        (sorted by name), then the changes after it: the snapshot and the changes meet with
        nothing lost or repeated, so an agent that only follows this sees every tool, whether
        its hosts started before it or after.
        """
        queue: asyncio.Queue[Change] = asyncio.Queue()
        if replay:
            for name in sorted(self.tools):
                queue.put_nowait(Change("added", name, self.tools[name]))
        self._watchers.append(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._watchers.remove(queue)

    async def wait_for(self, name: str, timeout: float = 10.0, present: bool = True) -> None:
        """Wait (seconds) until tool ``name`` is live (or, with ``present=False``, gone).

        Raises:
            TimeoutError: it did not happen in time.
        """
        async with asyncio.timeout(timeout):
            while (name in self.tools) != present:
                await asyncio.sleep(0.02)

    # -- calls (tghost.invoke) -------------------------------------------------------------

    @property
    def listeners(self) -> tuple[InvokeListener, ...]:
        """What gets an :class:`~tghost.invoke.InvokeRecord` per call."""
        return self.calls.listeners

    @property
    def refusals(self) -> Counter[str]:
        """Calls refused before anything was sent, by reason (:mod:`tghost.invoke`)."""
        return self.calls.refusals

    def check(self, name: str, groups: Sequence[str] | None = None, state: str | None = None,
              allowed_groups: Sequence[str] | None = None) -> DirectoryTool:
        """:meth:`tghost.invoke.Invoker.check`: the live tool ``name`` if this request may use it."""
        return self.calls.check(name, groups, state, allowed_groups)

    async def caller(self, descriptor: ToolServiceDescriptor) -> ToolServiceClient:
        """:meth:`tghost.invoke.Invoker.caller`: a started client for a service's queues."""
        return await self.calls.caller(descriptor)

    def stream(self, name: str, arguments: dict[str, Any], **options: Any) -> AsyncIterator[str]:
        """:meth:`tghost.invoke.Invoker.stream`: invoke tool ``name``, yield observation chunks."""
        return self.calls.stream(name, arguments, **options)

    async def invoke(self, name: str, arguments: dict[str, Any], **options: Any) -> str:
        """:meth:`tghost.invoke.Invoker.invoke`: invoke tool ``name``, return the observation."""
        return await self.calls.invoke(name, arguments, **options)

def _decode(data: bytes) -> dict[str, Any]:
    """The JSON object in ``data``; raises :class:`_Rejected` (``invalid``) for anything else."""
    if len(data) > MAX_ANNOUNCEMENT_BYTES:
        raise _Rejected(INVALID, f"{len(data)} bytes, more than {MAX_ANNOUNCEMENT_BYTES}")
    try:
        value = json.loads(data)
    except RecursionError:
        raise _Rejected(INVALID, "JSON nested too deeply") from None
    except ValueError as exc:
        raise _Rejected(INVALID, f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise _Rejected(INVALID, f"a JSON {type(value).__name__}, not an object")
    if data.count(b"{") + data.count(b"[") > MAX_DEPTH and _depth_exceeds(value, MAX_DEPTH):
        raise _Rejected(INVALID, f"JSON nested deeper than {MAX_DEPTH} levels")
    return value


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether objects/arrays in ``value`` nest deeper than ``limit`` (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _target(value: dict[str, Any]) -> tuple[str, str] | None:
    """The (kind, name) an unverified value claims, if it names one."""
    kind, name = value.get("kind"), value.get("name")
    return (kind, name) if isinstance(kind, str) and isinstance(name, str) else None


def _order_key(announcement: _Announcement) -> tuple[str, str, str]:
    """What ``lease.sent_at`` orders: one (kind, name, host id)."""
    return announcement.kind, announcement.name, announcement.host.id


def _shape(tool: DirectoryTool | None) -> tuple[Any, ...] | None:
    """What a change event is about: the tool, its providers and its service's descriptor."""
    return None if tool is None else (tool.descriptor, tool.providers, tool.service.descriptor)


#: Messages :func:`_read_batch` reads per worker-thread hop during catch-up.
CATCH_UP_BATCH = 500
#: Milliseconds :func:`_read_batch` waits for the next message before it asks whether the
#: topic has more (a message may still be on its way from the broker).
CATCH_UP_POLL_MS = 5


def _read_batch(reader: Any) -> list[Any]:
    """Up to :data:`CATCH_UP_BATCH` messages from a blocking ``_pulsar.Reader``; an empty list
    once the topic has no more. Runs in a worker thread: every call here blocks.

    Raises:
        pulsar.exceptions.PulsarException: the broker failed (not merely "no more messages").
    """
    batch: list[Any] = []
    while len(batch) < CATCH_UP_BATCH:
        try:
            batch.append(reader.read_next(CATCH_UP_POLL_MS))
        except pulsar.exceptions.Timeout:
            try:
                if not reader.has_message_available():
                    break
            except pulsar.exceptions.UnknownError:  # pulsar-lite 0.2.0 on an empty topic
                break
    return batch


async def _has_message_available(reader: pulsar.asyncio.Reader) -> bool:
    """``reader.has_message_available()``, except that pulsar-lite 0.2.0 answers an empty topic
    with UnknownError ("Topic has no messages") where Apache Pulsar answers False."""
    try:
        return bool(await reader.has_message_available())
    except pulsar.asyncio.PulsarException as exc:
        if exc.error() == pulsar.Result.UnknownError:
            return False
        raise


def _parse_descriptor(announcement: _Announcement) -> ToolDescriptor | ToolServiceDescriptor | None:
    """Validate the descriptor an ``available`` announcement carries; raises ValueError if invalid."""
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
