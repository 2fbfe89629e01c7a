"""directory: the agent's live view of the announcements (docs/protocol.md §4.6-4.8). Applies
each message to the state of its host instance, resolves the live tools and services (leases,
manifests, conflicts, two processes on one host id), expires instances whose lease ran out and
filters by seed 001 group/state. Reading the epoch topics is :mod:`tghost.window`'s, calls by
tool name are :mod:`tghost.invoke`'s. Never imports serve or discover, and never lets a bad
message on the topic raise or replace a live tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections import Counter, defaultdict
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pulsar
import pulsar.asyncio
from pydantic import ValidationError

from . import groups as seed001
from .announcement import (
    DEFAULT_TOPIC,
    EPOCH_SECONDS,
    Announcement,
    announcement_key,
    parse_descriptor,
)
from .broker import PulsarSettings
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
from .window import TopicWindow

__all__ = [
    "DUPLICATE",
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
    "HostLease",
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
"""Not newer (``lease.sent_at``) than one already applied for the same kind, name and host instance."""
DUPLICATE = "duplicate"
"""A byte-identical copy of the last message applied for the same kind, name and host instance
(a redelivery): dropped silently, only counted."""
HIJACK = "hijack"
"""Failed the signature check while naming a tool, tool service or host claimed by a trusted host."""

#: Announcements larger than this (bytes) are rejected as ``invalid``.
MAX_ANNOUNCEMENT_BYTES = 1 << 20
#: Announcements nested deeper than this (JSON objects and arrays) are rejected as ``invalid``.
MAX_DEPTH = 32

#: (kind, name) of a tool service or tool; (host id, instance) of a host instance.
Key = tuple[str, str]
Ref = tuple[str, str]


class _Rejected(Exception):
    """A message that is not applied: ``reason`` is the counter key, ``detail`` the log text."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Provider:
    """A host that announced an entry: its identity (``id``, ``instance``, ...) and the plugin
    the entry came from."""

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


@dataclass(frozen=True)
class HostLease:
    """A live host: when its lease ends (unix seconds), its length (seconds) and the live
    instances (process starts) announcing under its id."""

    expires_at: float
    seconds: float
    instances: tuple[str, ...]


@dataclass
class _Entry:
    """What one host instance last said about one tool or tool service. The descriptor is kept
    after a withdrawal, so the instance's next manifest can restore it."""

    descriptor: ToolDescriptor | ToolServiceDescriptor | None
    plugin: dict[str, Any] | None
    since: float
    available: bool


@dataclass
class _Instance:
    """One host instance (a process announcing under a host id) and everything it said."""

    host: dict[str, Any]
    lease_end: float
    seconds: float
    entries: dict[Key, _Entry] = field(default_factory=dict)
    latest: dict[Key, tuple[float, bytes]] = field(default_factory=dict)
    """(kind, name) -> ``sent_at`` and digest of the last message applied for it."""
    withdrawn: bool = False
    superseded: bool = False
    expired: bool = False
    fresh: bool = False
    """Whether it sent a message whose lease had not ended when applied (it was alive lately)."""

    @property
    def active(self) -> bool:
        return not (self.withdrawn or self.superseded or self.expired)


@dataclass(frozen=True)
class _Claim:
    """A live entry of an active instance: ``rank`` (since, host id, instance) orders claims,
    the lowest was announced first."""

    descriptor: ToolDescriptor | ToolServiceDescriptor
    provider: Provider
    rank: tuple[float, str, str]

    @property
    def ref(self) -> Ref:
        return self.rank[1], self.rank[2]


class _RejectionLog:
    """Counts rejected messages in ``counts`` and logs a summary: one warning per reason with its
    count and an example, at most once per ``interval`` seconds (each message at debug level).
    Duplicates are counted, never summarised."""

    def __init__(self, counts: Counter[str], topic: str, interval: float) -> None:
        self.counts = counts
        self.topic = topic
        self.interval = interval
        self._pending: Counter[str] = Counter()
        self._examples: dict[str, str] = {}
        self._last = 0.0

    def add(self, reason: str, key: str, detail: str) -> None:
        self.counts[reason] += 1
        log.debug("ignored an announcement (key %r): %s: %s", key, reason, detail)
        if reason != DUPLICATE:
            self._pending[reason] += 1
            self._examples.setdefault(reason, f"key {key!r}: {detail}")

    def flush(self, now: float, force: bool = False) -> None:
        """Log what was counted since the last summary, if ``interval`` has passed (or ``force``)."""
        if not self._pending or (not force and now - self._last < self.interval):
            return
        for reason, count in sorted(self._pending.items()):
            log.warning("ignored %d announcement(s) on %s: %s (e.g. %s)", count, self.topic, reason,
                        self._examples[reason])
        self._pending.clear()
        self._examples.clear()
        self._last = now


class ToolDirectory:
    """The live tool set announced on the epoch topics of ``topic`` (docs/protocol.md §4).

    ``async with ToolDirectory(PulsarSettings(url)) as directory:`` catches up, then follows.
    ``expiry_interval`` is how often (seconds) leases are checked; ``epoch_seconds`` must be
    the hosts' (:data:`tghost.announcement.EPOCH_SECONDS`).

    Trust: with ``trusted`` keys only announcements signed by one of them are applied
    (format in :mod:`tghost.trust`); without, every well-formed one is (open mode). Every
    message that is not applied is counted in :attr:`rejections` by reason: :data:`INVALID`,
    :data:`STALE`, :data:`DUPLICATE`, ``unsigned``, ``bad-signature``, ``unknown-key``, or
    :data:`HIJACK` when a message failing the signature check names a tool, tool service or
    host that a trusted announcement claims now (one reason per message). The log gets a
    summary, one line per reason, at most every ``report_interval`` seconds (duplicates are
    never logged). Signatures protect the values, not the topic's key space: restrict who may
    publish on the topics (Pulsar authorization) so that compaction cannot drop a host's entries.

    Host instances (docs/protocol.md §4.7): each process announcing under a host id is an
    instance; a new one replaces the older ones of its id. If a replaced one speaks again, two
    live processes share the id: both stay providers, :attr:`clashes` lists them and the log
    says so once. A host message's manifest (``entries``) is the instance's word on what it
    announces: it restores an entry a withdrawal hid and hides one it no longer lists.

    Conflicts (docs/protocol.md §4.8): a tool service announced with other queues or config
    params than the claim announced first (lowest ``since``), or a tool announced over another
    service or with other config values, loses; it is listed in :attr:`conflicts` and logged.

    Ordering and clocks: ``lease.sent_at`` (the host's clock) orders the messages of one
    (kind, name, host instance); one not newer than the newest applied is :data:`STALE`, so a
    replayed ``available`` never undoes a later ``withdrawn``. A lease runs from the broker's
    publish time (one clock for every host, capped at this directory's now), but never from
    later than ``sent_at + max_clock_skew``. The trade-off: hosts whose clocks are behind the
    broker's by up to ``max_clock_skew`` seconds keep their full lease; a host further behind
    gets a shorter one (logged once per host), and in exchange a verbatim replay of an old
    message can keep a dead host's entries alive for at most ``max_clock_skew`` plus its lease
    after the host sent it. A message sent more than ``max_clock_skew`` after its publish time
    is :data:`INVALID` (a clock far ahead would otherwise make every later message of that key
    stale). ``max_clock_skew`` also widens the window of epochs read.

    While this directory's readers are disconnected from the broker it expires nothing (it
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
        epoch_seconds: float = EPOCH_SECONDS,
        report_interval: float = 60.0,
    ) -> None:
        self.pulsar = pulsar_settings
        self.topic = topic
        self.expiry_interval = expiry_interval
        self.trusted = trusted
        self.max_clock_skew = max_clock_skew
        self.epoch_seconds = epoch_seconds
        self.tools: dict[str, DirectoryTool] = {}
        self.services: dict[str, ServiceEntry] = {}
        self.conflicts: dict[str, list[str]] = {}
        """Tool name -> the service ids whose claims lost a conflict over it; ``tool-service/<id>``
        -> the host ids whose descriptor of that service lost (the winners are in :attr:`tools`
        and :attr:`services`)."""
        self.rejections: Counter[str] = Counter()
        """Messages on the topic that were not applied, by reason (see the class docstring)."""
        self._rejected = _RejectionLog(self.rejections, topic, report_interval)
        self._instances: dict[Ref, _Instance] = {}
        self._host_instances: dict[str, list[str]] = defaultdict(list)
        self._clashing: dict[str, frozenset[str]] = {}
        self._claims: dict[Key, dict[Ref, _Claim]] = {}
        self._losers: dict[str, set[Ref]] = {}
        self._skewed_hosts: set[str] = set()
        self._tools_of_service: dict[str, set[str]] = defaultdict(set)
        self._filtered: dict[tuple[tuple[str, ...] | None, str | None], list[ToolDescriptor]] = {}
        self._watchers: list[asyncio.Queue[Change]] = []
        self.calls = Invoker(self.tools, listeners)
        """Calls by tool name over :attr:`tools` (:mod:`tghost.invoke`)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._client: pulsar.asyncio.Client | None = None
        self._window: TopicWindow | None = None
        self._outage_since: float | None = None
        """Since when (unix seconds) a reader is disconnected: nothing expires meanwhile."""

    @property
    def rejected(self) -> int:
        """How many messages on the topic were not applied (the sum of :attr:`rejections`)."""
        return self.rejections.total()

    @property
    def hosts(self) -> dict[str, HostLease]:
        """Host id -> its lease, for every host with a live instance now."""
        live: dict[str, HostLease] = {}
        for (host_id, instance), state in self._instances.items():
            if state.active:
                known = live.get(host_id)
                live[host_id] = HostLease(max(state.lease_end, known.expires_at) if known else state.lease_end,
                                          state.seconds, (*(known.instances if known else ()), instance))
        return live

    @property
    def clashes(self) -> dict[str, tuple[str, ...]]:
        """Host id -> its live instances, for every host id that two live processes announce
        under at once (a misconfiguration: each process needs its own ``--host-id``)."""
        return {host_id: tuple(sorted(instances)) for host_id, instances in self._clashing.items()}

    def is_connected(self) -> bool:
        """Whether every reader of the announcement topics is connected now (False before start)."""
        return self._window is not None and self._window.is_connected()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> ToolDirectory:
        """Read the epoch topics of the read window from their first message up to now, then
        follow them in the background (docs/protocol.md §4.6).

        Raises:
            pulsar.asyncio.PulsarException: the broker did not answer.
        """
        self._client = self.calls.client = await self.pulsar.connect()
        self._window = window = TopicWindow(self._client, self.topic, self.max_clock_skew, self.epoch_seconds)
        dirty = await self._catch_up(window)
        dirty |= self._expire(time.time())  # hosts that died before we came
        self._resolve(dirty, "removed")  # nothing is live yet: all changes are "added"
        self._rejected.flush(time.time(), force=True)
        window.follow(self._follow)
        self._tasks = [asyncio.create_task(self._expire_loop(), name="directory expiry")]
        return self

    async def _catch_up(self, window: TopicWindow) -> set[Key]:
        """Apply every message now on the window's topics; returns what changed."""
        dirty: set[Key] = set()
        await window.catch_up(lambda message: dirty.update(self._apply_message(message)))
        return dirty

    async def close(self) -> None:
        """Stop following and close every client."""
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.calls.close()
        if self._window is not None:
            await self._window.close()
        if self._client is not None:
            await self._client.close()

    async def __aenter__(self) -> ToolDirectory:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _follow(self, message: pulsar.Message) -> None:
        dirty = self._apply_message(message)
        if self._outage_since is None:  # e.g. a replay whose lease had ended: never shown
            self._resolve(self._expire(time.time()), "expired")
        self._resolve(dirty, "removed")

    async def _expire_loop(self) -> None:
        assert self._window is not None
        while True:
            await asyncio.sleep(self.expiry_interval)
            now = time.time()
            if not self._window.is_connected():
                if self._outage_since is None:
                    log.warning("lost the broker connection: expiring nothing until it is back")
                    self._outage_since = now
                continue
            if self._outage_since is not None:
                outage, self._outage_since = now - self._outage_since, None
                log.info("broker connection is back after %.1fs: every host gets a lease from now", outage)
                self._resume_leases(now, outage)
            try:
                await self._window.move(now)
            except pulsar.asyncio.PulsarException as exc:
                log.warning("could not open the next epoch's topic (%s); trying again", exc)
            self._resolve(self._expire(now), "expired")
            self._rejected.flush(now)

    def _resume_leases(self, now: float, outage: float) -> None:
        """After an ``outage`` (seconds) of this directory's connection ending at ``now`` (unix
        seconds), give every live instance a full lease plus the outage's length from ``now`` to
        be heard again: a host's client backs off exponentially while the broker is away, so it
        may reconnect up to about an outage later than this directory's client."""
        for state in self._instances.values():
            if state.active:
                state.lease_end = max(state.lease_end, now + state.seconds + outage)

    def _expire(self, now: float) -> set[Key]:
        """Expire every instance whose lease ended before ``now`` (unix seconds), and forget those
        ended long enough that any replay of their messages would be expired too; returns what changed."""
        dirty: set[Key] = set()
        for ref, state in list(self._instances.items()):
            if state.lease_end >= now:
                continue
            if not state.expired:
                if state.active:
                    log.info("host %s (instance %s): lease expired", *ref)
                state.expired = True
                dirty |= self._sync(ref, state, set(state.entries))
            if state.lease_end < now - 2 * self.max_clock_skew:
                self._forget(ref)
        return dirty

    def _forget(self, ref: Ref) -> None:
        del self._instances[ref]
        host_id, instance = ref
        siblings = self._host_instances[host_id]
        siblings.remove(instance)
        if not siblings:
            del self._host_instances[host_id]

    # -- applying messages -----------------------------------------------------------------

    def _apply_message(self, message: pulsar.Message) -> set[Key]:
        """:meth:`_apply` a message read from the topic."""
        return self._apply(message.data(), message.publish_timestamp() / 1000, message.partition_key())

    def _apply(self, data: bytes, publish_time: float, key: str) -> set[Key]:
        """Apply one message: its payload ``data``, the broker's ``publish_time`` (unix seconds;
        0 if unknown) and its message ``key``. Returns the (kind, name) pairs to re-resolve.

        Touches no Pulsar object, and never raises for any ``data``: a message that is not
        applied is counted in :attr:`rejections` and summarised in the log.
        """
        try:
            announcement, descriptor, digest = self._accept(data, publish_time, key)
        except _Rejected as rejected:
            self._rejected.add(rejected.reason, key, rejected.detail)
            return set()
        return self._record(announcement, descriptor, publish_time, digest)

    def _accept(
        self, data: bytes, publish_time: float, key: str
    ) -> tuple[Announcement, ToolDescriptor | ToolServiceDescriptor | None, bytes]:
        """Decode, check the signature, validate, check the key, the clock and the order; the
        announcement, its parsed descriptor and the message's digest.

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
            announcement = Announcement.model_validate(value)
            descriptor = parse_descriptor(announcement)
        except ValidationError as exc:
            raise _Rejected(INVALID, _first_error(exc)) from None
        except ValueError as exc:
            raise _Rejected(INVALID, str(exc).splitlines()[0]) from None
        expected = announcement_key(announcement.kind, announcement.name, announcement.host.id)
        if key != expected:
            raise _Rejected(INVALID, f"the message key should be {expected!r}")
        sent_at = announcement.lease.sent_at
        if publish_time and sent_at > publish_time + self.max_clock_skew:
            raise _Rejected(INVALID, f"sent {sent_at - publish_time:.1f}s after the broker published it: the "
                                     f"host's clock is ahead by more than max_clock_skew ({self.max_clock_skew}s)")
        digest = hashlib.blake2b(data, digest_size=16).digest()
        state = self._instances.get((announcement.host.id, announcement.host.instance))
        latest = state.latest.get((announcement.kind, announcement.name)) if state else None
        if latest is not None and sent_at <= latest[0]:
            if (sent_at, digest) == latest:
                raise _Rejected(DUPLICATE, "a byte-identical copy of the last message applied")
            raise _Rejected(STALE, f"sent at {sent_at}, not after {latest[0]} (a replay?)")
        return announcement, descriptor, digest

    def _is_live(self, kind: str, name: str) -> bool:
        """Whether an applied announcement claims this tool or tool service (by ``kind``), or
        this host, now; so it holds during catch-up too, before the live view is resolved."""
        if kind == "host":
            return any(self._instances[(name, i)].active for i in self._host_instances.get(name, ()))
        return bool(self._claims.get((kind, name)))

    def _lease_end(self, announcement: Announcement, publish_time: float) -> float:
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
        self, announcement: Announcement, descriptor: ToolDescriptor | ToolServiceDescriptor | None,
        publish_time: float, digest: bytes,
    ) -> set[Key]:
        """Apply an accepted announcement to its host instance; returns what changed."""
        now = time.time()
        ref = (announcement.host.id, announcement.host.instance)
        lease_end = self._lease_end(announcement, publish_time)
        state = self._instances.get(ref)
        if state is None:
            state = self._instances[ref] = _Instance(announcement.host.model_dump(), lease_end,
                                                     announcement.lease.seconds)
            self._host_instances[ref[0]].append(ref[1])
        state.lease_end = max(state.lease_end, lease_end)
        state.seconds = announcement.lease.seconds
        state.latest[(announcement.kind, announcement.name)] = (announcement.lease.sent_at, digest)
        was_active = state.active
        dirty = self._meet(ref, state) if lease_end >= now else set()
        changed = self._state(state, announcement, descriptor)
        if state.expired and state.lease_end >= now:
            state.expired = False  # heard again in time, e.g. from the backlog after an outage of ours
        if state.active != was_active:
            changed = set(state.entries)
        return dirty | self._sync(ref, state, changed)

    def _state(
        self, state: _Instance, announcement: Announcement, descriptor: ToolDescriptor | ToolServiceDescriptor | None
    ) -> set[Key]:
        """Record what one message says about the instance's entries; returns those that changed."""
        sent_at = announcement.lease.sent_at
        if announcement.kind == "host":
            state.withdrawn = announcement.status == "withdrawn"
            if state.withdrawn or announcement.entries is None:
                return set()
            return _apply_manifest(state, announcement.entries.keys(), sent_at)
        key = (announcement.kind, announcement.name)
        entry = state.entries.get(key)
        if announcement.status == "withdrawn":
            if entry is not None:
                entry.available = False
        else:
            since = announcement.since if announcement.since is not None else entry.since if entry else sent_at
            state.entries[key] = _Entry(descriptor, announcement.plugin, since, True)
        return {key}

    def _meet(self, ref: Ref, state: _Instance) -> set[Key]:
        """An instance is heard alive: the first time, it replaces the other instances of its
        host id (a restart); if it was replaced itself, two live processes share the id (a
        clash), reported and never merged. Returns what changed for the other instances."""
        host_id, instance = ref
        first, state.fresh = not state.fresh, True
        if state.superseded:
            state.superseded = False
            self._report_clash(host_id)
            return set()
        dirty: set[Key] = set()
        if first:
            for other in self._host_instances[host_id]:
                older = self._instances[(host_id, other)]
                if other != instance and older.active:
                    older.superseded = True
                    log.info("host %s: instance %s replaces instance %s", host_id, instance, other)
                    dirty |= self._sync((host_id, other), older, set(older.entries))
        return dirty

    def _report_clash(self, host_id: str) -> None:
        live = frozenset(i for i in self._host_instances[host_id] if self._instances[(host_id, i)].fresh
                         and not self._instances[(host_id, i)].expired)
        if self._clashing.get(host_id) != live:
            who = ", ".join(f"instance {i} (pid {self._instances[(host_id, i)].host.get('pid')} on "
                            f"{self._instances[(host_id, i)].host.get('hostname') or '?'})" for i in sorted(live))
            log.warning("host id %r is announced by %d live processes at once: %s; both are kept as providers: "
                        "give each process its own --host-id (env TGHOST_HOST_ID)", host_id, len(live), who)
        self._clashing[host_id] = live

    def _sync(self, ref: Ref, state: _Instance, keys: set[Key]) -> set[Key]:
        """Bring the live claims of ``keys`` in line with the instance's state; returns ``keys``."""
        for key in keys:
            entry = state.entries.get(key)
            claims = self._claims.get(key)
            if state.active and entry is not None and entry.available and entry.descriptor is not None:
                if claims is None:
                    claims = self._claims[key] = {}
                claims[ref] = _Claim(entry.descriptor, Provider(state.host, entry.plugin), (entry.since, *ref))
            elif claims is not None:
                claims.pop(ref, None)
                if not claims:
                    del self._claims[key]
        return keys

    # -- resolving the live view -----------------------------------------------------------

    def _resolve(self, dirty: set[Key], gone: Literal["removed", "expired"]) -> None:
        """Recompute the entries named in ``dirty`` (and tools of changed services); emit changes."""
        tool_names = {name for kind, name in dirty if kind == "tool"}
        for kind, service_id in dirty:
            if kind == "tool-service":
                self._resolve_service(service_id)
                tool_names |= self._tools_of_service[service_id]
        for name in tool_names:
            self._resolve_tool(name, gone)
        self._settle_clashes()

    def _settle_clashes(self) -> None:
        for host_id in [h for h, instances in self._clashing.items()
                        if sum(self._instances[(h, i)].active for i in instances if (h, i) in self._instances) < 2]:
            del self._clashing[host_id]
            log.info("host id %r: one live process again", host_id)

    def _resolve_service(self, service_id: str) -> None:
        claims = self._claims.get(("tool-service", service_id), {})
        conflict = f"tool-service/{service_id}"
        if not claims:
            self.services.pop(service_id, None)
            self._losers.pop(service_id, None)
            self.conflicts.pop(conflict, None)
            return
        groups: dict[Any, list[_Claim]] = defaultdict(list)
        for claim in claims.values():
            assert isinstance(claim.descriptor, ToolServiceDescriptor)
            groups[_wire_identity(claim.descriptor)].append(claim)
        winners, losers = _rank(groups.values())
        self._losers[service_id] = {c.ref for c in losers}
        newest = max(winners, key=lambda c: c.rank)
        assert isinstance(newest.descriptor, ToolServiceDescriptor)
        self.services[service_id] = ServiceEntry(newest.descriptor, tuple(c.provider for c in winners))
        losing_hosts = sorted({c.provider.host["id"] for c in losers})
        if losing_hosts and self.conflicts.get(conflict) != losing_hosts:
            log.warning("tool service %r is announced with other queues or config params by host(s) %s; host %r "
                        "announced it first and keeps it", service_id, losing_hosts, winners[0].provider.host["id"])
        _set_or_drop(self.conflicts, conflict, losing_hosts)

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
        """Live claims grouped by service and config values; the group announced first wins.
        Claims of hosts whose descriptor of the service lost a conflict do not count."""
        groups: dict[tuple[str, str], list[_Claim]] = defaultdict(list)
        for claim in self._claims.get(("tool", name), {}).values():
            descriptor = claim.descriptor
            assert isinstance(descriptor, ToolDescriptor)
            self._tools_of_service[descriptor.service].add(name)
            if descriptor.service in self.services and claim.ref not in self._losers.get(descriptor.service, ()):
                groups[(descriptor.service, _config_identity(descriptor))].append(claim)
        if not groups:
            self.conflicts.pop(name, None)
            return None
        winners, losers = _rank(groups.values())
        newest = max(winners, key=lambda c: c.rank)
        assert isinstance(newest.descriptor, ToolDescriptor)
        service = newest.descriptor.service
        losing = list(dict.fromkeys(c.descriptor.service for c in sorted(losers, key=lambda c: c.rank)
                                    if isinstance(c.descriptor, ToolDescriptor)))
        if losing and self.conflicts.get(name) != losing:
            log.warning("tool %r is claimed by services %s; %r wins (announced first), claims with other services "
                        "or config values are ignored", name, [service, *losing], service)
        _set_or_drop(self.conflicts, name, losing)
        return DirectoryTool(newest.descriptor, self.services[service], tuple(c.provider for c in winners))

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

    async def changes(self) -> AsyncGenerator[Change, None]:
        """Yield every change to the live tool set from now on, until the caller stops (``aclose()``
        it, or leave the ``async for``, to stop)."""
        queue: asyncio.Queue[Change] = asyncio.Queue()
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


def _first_error(error: ValidationError) -> str:
    """The first problem pydantic found, as ``field.path: message``."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(value)"
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def _target(value: dict[str, Any]) -> tuple[str, str] | None:
    """The (kind, name) an unverified value claims, if it names one."""
    kind, name = value.get("kind"), value.get("name")
    return (kind, name) if isinstance(kind, str) and isinstance(name, str) else None


def _apply_manifest(state: _Instance, listed: set[Key], sent_at: float) -> set[Key]:
    """A host message's manifest: every listed entry is available, every other one is not
    (the latest word wins, docs/protocol.md §4.4); returns the entries that changed. A listed
    entry whose descriptor has not arrived yet is remembered until it does."""
    changed: set[Key] = set()
    for key in listed | state.entries.keys():
        entry = state.entries.get(key)
        available = key in listed
        if entry is None:
            state.entries[key] = _Entry(None, None, sent_at, available)
        elif entry.available != available:
            entry.available = available
            changed.add(key)
    return changed


def _wire_identity(descriptor: ToolServiceDescriptor) -> tuple[Any, ...]:
    """What makes two descriptors of one service the same service on the wire: its queues and
    config params. Hosts that agree on these are providers of it; others conflict."""
    return descriptor.request_queue, descriptor.response_queue, descriptor.config_params


def _config_identity(descriptor: ToolDescriptor) -> str:
    """A tool's config values, canonically: two claims over one service with other values conflict."""
    return json.dumps(descriptor.config, sort_keys=True, default=str)


def _rank(groups: Any) -> tuple[list[_Claim], list[_Claim]]:
    """The claims of the group announced first (lowest rank), in rank order, and all the others."""
    ranked = sorted((sorted(group, key=lambda c: c.rank) for group in groups), key=lambda group: group[0].rank)
    return ranked[0], [claim for group in ranked[1:] for claim in group]


def _set_or_drop(conflicts: dict[str, list[str]], key: str, losers: list[str]) -> None:
    if losers:
        conflicts[key] = losers
    else:
        conflicts.pop(key, None)


def _shape(tool: DirectoryTool | None) -> tuple[Any, ...] | None:
    """What a change event is about: the tool, its providers and its service's descriptor."""
    return None if tool is None else (tool.descriptor, tool.providers, tool.service.descriptor)
