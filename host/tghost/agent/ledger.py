"""ledger: what every host instance announced, as a directory applies the messages it reads
(docs/protocol.md §4.6-4.7): validation, signatures, order and duplicates, leases, manifests,
instances that replace one another and clashes. Gives the live claims of every tool service
and tool; the directory resolves them into the live view.

Never touches Pulsar, never resolves conflicts between claims, never raises for a bad message.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tghost.agent.untrusted import Untrusted
from tghost.protocol.access import ToolAccess
from tghost.protocol.announcement import Announcement, Entries, announcement_key, parse_descriptor
from tghost.protocol.descriptors import ToolDescriptor, ToolServiceDescriptor
from tghost.protocol.epochs import MAX_ENTRIES, MAX_HOSTS, MAX_INSTANCES, MAX_LEASE, MAX_TOTAL_ENTRIES
from tghost.protocol.trust import SIGNATURE_FIELD, TrustedKeys
from tghost.system.logs import LogSummary

__all__ = [
    "DUPLICATE",
    "HIJACK",
    "INVALID",
    "LATE",
    "MAX_ANNOUNCEMENT_BYTES",
    "MAX_DEPTH",
    "MAX_ENTRIES",
    "MAX_HOSTS",
    "MAX_INSTANCES",
    "MAX_LEASE",
    "MAX_TOTAL_ENTRIES",
    "OVER_LIMIT",
    "STALE",
    "Claim",
    "HostLease",
    "InstanceView",
    "Key",
    "Ledger",
    "Provider",
    "Ref",
    "is_late",
]

log = logging.getLogger(__name__)

# Why a message on the topic was not applied (``ToolDirectory.rejections``); with trusted keys
# also tghost.protocol.trust's ``unsigned``, ``bad-signature`` and ``unknown-key``.
INVALID = "invalid"
"""Not an announcement: undecodable, wrong shape, invalid descriptor, too large, too deep, a
message key that does not match the value, or sent (by the host's clock) more than
``max_clock_skew`` after the broker published it."""
STALE = "stale"
"""Not later in order (:func:`order`) than one already applied for the same kind, name and host instance."""
DUPLICATE = "duplicate"
"""A byte-identical copy of the last message applied for the same kind, name and host instance
(a redelivery): dropped silently, only counted."""
HIJACK = "hijack"
"""Failed the signature check while naming a tool, tool service or host claimed by a trusted host."""
OVER_LIMIT = "over-limit"
"""Would give one host instance more than ``max_entries`` tools and tool services, the directory
more than ``max_hosts`` host ids or ``max_total_entries`` entries, or a host id more than
``max_instances`` instances (docs/protocol.md §4.7)."""

#: Announcements larger than this (bytes) are rejected as ``invalid``.
MAX_ANNOUNCEMENT_BYTES = 1 << 20
#: Announcements nested deeper than this (JSON objects and arrays) are rejected as ``invalid``.
MAX_DEPTH = 32

#: (kind, name) of a tool service or tool; (host id, instance) of a host instance.
Key = tuple[str, str]
Ref = tuple[str, str]
#: The order of a host instance's messages for one entry: (``sent_at`` but never later than the
#: broker's publish time, ``sent_at``); see :func:`order`.
Order = tuple[float, float]


def order(sent_at: float, publish_time: float) -> Order:
    """Where a message (``lease.sent_at`` by the host's clock, the broker's ``publish_time``;
    unix seconds, 0 if unknown) stands among its instance's messages for one entry
    (docs/protocol.md §4.7): by ``sent_at``, except that a message sent "later" than the broker
    published it counts from its publish time. So a message from the future, forged or from a
    clock running ahead, cannot make the messages published after it stale."""
    return (min(sent_at, publish_time) if publish_time else sent_at), sent_at


class _Rejected(Exception):
    """A message that is not applied: ``reason`` is the counter key, ``detail`` the log text."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Provider:
    """A host that announced an entry: its identity (``id``, ``instance``, ...) and the plugin
    the entry came from. ``external``: the host announces a tool service that it does not
    serve (served elsewhere, e.g. by a TrustGraph ``DynamicToolService``)."""

    host: dict[str, Any]
    plugin: dict[str, Any] | None
    external: bool = False
    access: ToolAccess | None = None
    """Who may call the tool on this host (its ``[access]`` policy); ``None``: everyone."""
    policy: str | None = None
    """The fingerprint of the access rules the host applies to the tool service (``"none"``:
    no policy); ``None``: not announced (a host that predates it, or a tool's provider)."""


#: The part of its lease a host may stay silent before it is late (:meth:`HostLease.late`): half,
#: 15 s of the default 30 s lease, whose heartbeats come every 10 s.
LATE = 0.5


@dataclass(frozen=True)
class HostLease:
    """A live host: when its lease ends (unix seconds), its length (seconds) and the live
    instances (process starts) announcing under its id."""

    expires_at: float
    seconds: float
    instances: tuple[str, ...]

    @property
    def heard(self) -> float:
        """When (unix seconds) the host was last heard: its lease last renewed, by the broker's
        publish time of its latest message (``expires_at - seconds``)."""
        return self.expires_at - self.seconds

    def late(self, now: float) -> bool:
        """Whether the host is late at ``now`` (unix seconds): :func:`is_late`."""
        return is_late(self.heard, self.seconds, now)


def is_late(heard: float, seconds: float, now: float) -> bool:
    """Whether a host last heard at ``heard`` with a lease of ``seconds`` is **late** at ``now``
    (unix seconds): silent for more than :data:`LATE` of its lease, so its heartbeat (every third
    of the lease) is overdue by half a beat while its lease still runs (docs/protocol.md §4.9)."""
    return now - heard > LATE * seconds


@dataclass
class _Entry:
    """What one host instance last said about one tool or tool service, once its descriptor came.
    The descriptor is kept after a withdrawal, so the instance's next manifest can restore it."""

    descriptor: ToolDescriptor | ToolServiceDescriptor
    plugin: dict[str, Any] | None
    available: bool
    external: bool = False
    access: ToolAccess | None = None
    policy: str | None = None


@dataclass
class _Instance:
    """One host instance (a process announcing under a host id) and everything it said."""

    host: dict[str, Any]
    lease_end: float
    seconds: float
    entries: dict[Key, _Entry] = field(default_factory=dict)
    latest: dict[Key, tuple[Order, bytes]] = field(default_factory=dict)
    """(kind, name) -> the order (:func:`order`) and digest of the last message applied for it."""
    withdrawn: bool = False
    superseded: bool = False
    expired: bool = False
    fresh: bool = False
    """Whether it sent a message whose lease had not ended when applied (it was alive lately)."""
    signer: str | None = None
    """The key id the signature of its last applied message names (``None``: unsigned)."""
    health: str | None = None
    """The health URL its last host message announced (``None``: none)."""
    since: float | None = None
    """When the instance started, as its last host message says (unix seconds; ``None``: not said)."""
    queued: int = -1
    """The sequence number of its one valid entry in the ledger's lease heap (``Ledger._due``)."""
    listed: frozenset[Key] = frozenset()
    """The entries its last ``available`` host message's manifest lists."""
    successor: tuple[str, str] | None = None
    """The instance that replaced it, if one did."""

    @property
    def active(self) -> bool:
        return not (self.withdrawn or self.superseded or self.expired)


@dataclass(frozen=True)
class InstanceView:
    """One host instance as a ledger knows it, for people (``tghost inspect``).

    ``host`` is its announced ``host`` object (``id``, ``instance``, ``hostname``, ...);
    ``lease_end`` when its lease ends (unix seconds) and ``seconds`` its length; ``state`` one of
    ``active``, ``withdrawn`` (it said it stopped), ``superseded`` (a newer instance of its host id
    took over) or ``expired`` (its lease ran out); ``signed_by`` the key id its last message's
    signature names (``None``: unsigned), which ``verified`` says was checked against trusted
    keys; ``entries`` (kind, name, available) of everything it announced, withdrawn included;
    ``external`` the ids of the tool services it announces available but serves elsewhere, and
    ``health`` the URL of its health JSON, if its host message announces one; ``since`` when it
    started, as its host message says (unix seconds, informational; ``None``: not said).
    """

    host: dict[str, Any]
    lease_end: float
    seconds: float
    state: str
    signed_by: str | None
    verified: bool
    entries: tuple[tuple[str, str, bool], ...]
    external: tuple[str, ...] = ()
    health: str | None = None
    since: float | None = None

    def to_json(self) -> dict[str, Any]:
        view = {"host": self.host, "lease_end": self.lease_end, "seconds": self.seconds, "state": self.state,
                "signed_by": self.signed_by, "verified": self.verified,
                "entries": [{"kind": k, "name": n, "available": a} for k, n, a in self.entries],
                "external": list(self.external)}
        return view if self.health is None else {**view, "health": self.health}


def _state_of(state: _Instance) -> str:
    for name in ("withdrawn", "superseded", "expired"):
        if getattr(state, name):
            return name
    return "active"


@dataclass(frozen=True)
class Claim:
    """A live entry of an active instance: ``rank`` (seen, host id, instance) orders claims,
    the lowest was seen first. ``seen`` counts, in the order this ledger applied them, the
    first message of each host id's claim on each entry (docs/protocol.md §4.8): what a
    host says about itself (``since``) never moves its claim ahead of another host's."""

    descriptor: ToolDescriptor | ToolServiceDescriptor
    provider: Provider
    rank: tuple[float, str, str]

    @property
    def ref(self) -> Ref:
        return self.rank[1], self.rank[2]


class Ledger:
    """The state of every host instance heard on the topic, and the live claims it makes.

    :meth:`apply` takes one message (bytes, the broker's publish time, the message key) and
    returns the (kind, name) pairs whose claims may have changed; :attr:`claims` holds, per
    pair, the claim of every active instance. :meth:`expire` ends instances whose lease ran out.
    The rules (trust, order, leases, instances, manifests, caps) are described on
    :class:`tghost.agent.directory.ToolDirectory`; rejections are counted in :attr:`rejections` and
    summarised in the log at most every ``report_interval`` seconds (:meth:`flush_rejections`).

    What it holds is bounded (docs/protocol.md §4.7): at most ``max_hosts`` host ids,
    ``max_instances`` instances of each, ``max_entries`` available entries per instance and
    ``max_total_entries`` entries in all. A message past a cap is :data:`OVER_LIMIT`, dropped
    before its descriptor is validated (a new host id's before it is even decoded), and the
    first one past each cap is logged as a warning naming its sender and the cap.
    """

    def __init__(self, topic: str, trusted: TrustedKeys | None = None, max_clock_skew: float = 60.0,
                 report_interval: float = 60.0, max_lease: float = MAX_LEASE, max_entries: int = MAX_ENTRIES, *,
                 max_hosts: int = MAX_HOSTS, max_instances: int = MAX_INSTANCES,
                 max_total_entries: int = MAX_TOTAL_ENTRIES) -> None:
        self.topic = topic
        self.trusted = trusted
        self.max_clock_skew = max_clock_skew
        self.max_lease = max_lease
        """Seconds: the longest lease honoured; a longer ``lease.seconds`` counts as this."""
        self.max_entries = max_entries
        """Tools plus tool services one host instance may announce; more is :data:`OVER_LIMIT`."""
        self.max_hosts = max_hosts
        """Host ids remembered at once; a message of another host id is :data:`OVER_LIMIT`."""
        self.max_instances = max_instances
        """Instances of one host id remembered at once; a message of another one is :data:`OVER_LIMIT`."""
        self.max_total_entries = max_total_entries
        """Entries (with their descriptors, withdrawn ones kept included) held in all; an entry
        message that would add one more is :data:`OVER_LIMIT`."""
        self.held = 0
        """Entries held now, over every remembered instance (at most :attr:`max_total_entries`)."""
        self._warned: set[tuple[str, str]] = set()
        """(cap, host id or "") of each cap that refused a message and has not been clear since:
        said once (:meth:`_over`)."""
        self.rejections: Counter[str] = Counter()
        """Messages that were not applied, by reason."""
        self.claims: dict[Key, dict[Ref, Claim]] = {}
        """(kind, name) -> (host id, instance) -> the live claim of an active instance."""
        self.untrusted = Untrusted(max_hosts, max_lease)
        """What the hosts that ``trusted`` keys ignore announce (bounded; empty in open mode):
        :meth:`ignored_hosts`."""
        self._rejected = LogSummary(log, f"ignored %(count)d announcement(s) on {topic}: %(reason)s (e.g. %(example)s)",
                                    report_interval, self.rejections, silent=frozenset({DUPLICATE}))
        self._instances: dict[Ref, _Instance] = {}
        self._due: list[tuple[float, int, Ref]] = []
        """A heap of (due, sequence, ref): when :meth:`expire` must look at an instance again, no
        later than the time its lease ends (or, once expired, the time it is to be forgotten). An
        entry is valid while its sequence is the instance's ``queued``; a renewed lease is not
        pushed, but pushed again when its old due time pops, so each instance has one valid entry
        and :meth:`expire` never walks every instance (docs/internals/scale.md)."""
        self._sequence = itertools.count()
        self._host_instances: dict[str, list[str]] = defaultdict(list)
        self._holders: dict[Key, set[str]] = defaultdict(set)
        """Key -> the host ids whose remembered instances may hold a descriptor of it (a superset:
        :meth:`remembered` checks each), so that it never scans every host (docs/internals/scale.md)."""
        self._descriptors: dict[Key, ToolDescriptor | ToolServiceDescriptor] = {}
        """Key -> the descriptor last applied for it (:meth:`_shared`), while a host holds the key."""
        self._clashing: dict[str, frozenset[str]] = {}
        self._logged_clashes: dict[str, frozenset[str]] = {}
        self.quiet = False
        """While true (a directory catching up on history), clashes are recorded, not logged."""
        self._skewed_hosts: set[str] = set()
        self._capped_hosts: set[str] = set()
        self._seen: dict[str, dict[Key, int]] = defaultdict(dict)
        """Host id -> (kind, name) -> when its claim was first seen (a count of claims seen)."""
        self._seen_count = 0
        self.withdrawn: dict[str, float] = {}
        """Tool service id -> when (unix seconds, the broker's publish time) a host instance that
        announced it last withdrew it: a clean stop, which answers what it received (a drain)."""

    @property
    def hosts(self) -> dict[str, HostLease]:
        """Host id -> its lease, for every host with an active instance now."""
        live: dict[str, HostLease] = {}
        for (host_id, instance), state in self._instances.items():
            if state.active:
                known = live.get(host_id)
                live[host_id] = HostLease(max(state.lease_end, known.expires_at) if known else state.lease_end,
                                          state.seconds, (*(known.instances if known else ()), instance))
        return live

    def instances(self) -> list[InstanceView]:
        """Every host instance this ledger remembers, live or not, by host id then instance."""
        return [InstanceView(dict(state.host), state.lease_end, state.seconds, _state_of(state), state.signer,
                             self.trusted is not None,
                             tuple(sorted((kind, name, e.available) for (kind, name), e in state.entries.items())),
                             tuple(sorted(name for (kind, name), e in state.entries.items()
                                          if kind == "tool-service" and e.available and e.external)),
                             state.health, state.since)
                for _, state in sorted(self._instances.items())]

    @property
    def clashes(self) -> dict[str, tuple[str, ...]]:
        """Host id -> its live instances, for every host id two live processes announce under."""
        return {host_id: tuple(sorted(instances)) for host_id, instances in self._clashing.items()}

    def flush_rejections(self, now: float, force: bool = False) -> None:
        """Log the rejection summary if ``report_interval`` has passed since the last (or ``force``)."""
        self._rejected.flush(now, force)

    def resume(self, now: float, outage: float) -> None:
        """After an ``outage`` (seconds) of this directory's connection ending at ``now`` (unix
        seconds), give every live instance a full lease plus the outage's length from ``now`` to
        be heard again: a host's client backs off exponentially while the broker is away, so it
        may reconnect up to about an outage later than this directory's client."""
        for state in self._instances.values():
            if state.active:
                state.lease_end = max(state.lease_end, now + state.seconds + outage)

    def expire(self, now: float) -> set[Key]:
        """Expire every instance whose lease ended before ``now`` (unix seconds), and forget those
        ended long enough that any replay of their messages would be expired too; returns what changed.

        Looks only at the instances whose due time in the lease heap has passed: its cost grows
        with the leases that ended (or were renewed) since the last call, not with the instances."""
        dirty: set[Key] = set()
        changed = False
        while (found := self._next_due(now)) is not None:
            heapq.heappop(self._due)
            ref, state = found
            if not state.expired:
                if state.active:
                    log.info("host %s (instance %s): lease expired", *ref)
                state.expired = changed = True
                dirty |= self._sync(ref, state, set(state.entries))
            if self._forget_at(state) < now:
                dirty |= set(state.entries)  # what it said no longer contests anything
                self._forget(ref)
                changed = True
            else:
                self._queue(ref, state)
        if changed:  # otherwise no instance's state moved since the last settling (every change settles)
            self._settle_clashes()
        return dirty

    def due(self, now: float) -> bool:
        """Whether :meth:`expire` at ``now`` (unix seconds) would change anything: a lease, or an
        expired instance's time to be remembered, ended before ``now``. Cheap: leases renewed since
        they were queued are queued again on the way (which changes nothing else)."""
        return self._next_due(now) is not None

    def _next_due(self, now: float) -> tuple[Ref, _Instance] | None:
        """The instance at the top of the lease heap if its due time passed before ``now``,
        popping stale entries and queueing renewed leases again until one is found (``None``:
        nothing is due). It stays on the heap: :meth:`expire` pops it."""
        while self._due and self._due[0][0] < now:
            _, sequence, ref = self._due[0]
            state = self._instances.get(ref)
            if state is not None and state.queued == sequence and state.lease_end < now:
                return ref, state
            heapq.heappop(self._due)  # stale (forgotten, or queued again since), or renewed since it was queued
            if state is not None and state.queued == sequence:
                self._queue(ref, state)
        return None

    def _queue(self, ref: Ref, state: _Instance) -> None:
        """Push the instance's next due time on the lease heap: when its lease ends or, once
        expired, when it is to be forgotten; its entries pushed before become stale."""
        due = self._forget_at(state) if state.expired else state.lease_end
        state.queued = next(self._sequence)
        heapq.heappush(self._due, (due, state.queued, ref))

    def _forget_at(self, state: _Instance) -> float:
        """When (unix seconds) an expired instance is forgotten: long enough after its lease that
        any replay of its messages would be expired too. One expression, for the heap and the test."""
        return state.lease_end + 2 * self.max_clock_skew

    def _forget(self, ref: Ref) -> None:
        state = self._instances.pop(ref)
        host_id, instance = ref
        siblings = self._host_instances[host_id]
        siblings.remove(instance)
        self.held -= len(state.entries)
        self._release(host_id, state.entries.keys())
        if not siblings:  # the host is forgotten: nothing of it stays (a flood may rotate host ids)
            del self._host_instances[host_id]
            self._seen.pop(host_id, None)
            self._skewed_hosts.discard(host_id)
            self._capped_hosts.discard(host_id)
        self._clear(host_id)

    def _release(self, host_id: str, keys: Iterable[Key]) -> None:
        """Drop ``host_id`` from the holders' index of each of ``keys`` that no remembered instance
        of the host still announces (forgotten, or pruned from its entries)."""
        held = {key for instance in self._host_instances.get(host_id, ())
                for key in self._instances[(host_id, instance)].entries}
        for key in set(keys) - held:
            self._drop_holder(key, host_id)

    def _drop_holder(self, key: Key, host_id: str) -> None:
        holders = self._holders.get(key)
        if holders is not None:
            holders.discard(host_id)
            if not holders:
                del self._holders[key]
                self._descriptors.pop(key, None)

    def apply(self, data: bytes, publish_time: float, key: str) -> set[Key]:
        """Apply one message: its payload ``data``, the broker's ``publish_time`` (unix seconds;
        0 if unknown) and its message ``key``. Returns the (kind, name) pairs to re-resolve.

        Touches no Pulsar object, and never raises for any ``data``: a message that is not
        applied is counted in :attr:`rejections` and summarised in the log.
        """
        try:
            announcement, descriptor, digest, signer = self._accept(data, publish_time, key)
        except _Rejected as rejected:
            self._rejected.add(rejected.reason, f"key {key!r}: {rejected.detail}")
            return set()
        return self._record(announcement, descriptor, publish_time, digest, signer)

    def _accept(
        self, data: bytes, publish_time: float, key: str
    ) -> tuple[Announcement, ToolDescriptor | ToolServiceDescriptor | None, bytes, str | None]:
        """Check the host cap on the message key, decode, check the signature and the other caps,
        validate, check the key, the clock and the order; the announcement, its parsed descriptor,
        the message's digest and the key id its signature names (checked only with trusted keys;
        ``None``: unsigned).

        Raises:
            _Rejected: the message must not be applied (the reason says why).
        """
        self._check_hosts(key)
        value = _decode(data)
        if self.trusted is not None:
            reason = self.trusted.verify(value, self.topic)
            if reason is not None:
                target = _target(value)
                if target is not None and self.is_live(*target):
                    raise _Rejected(HIJACK, f"{reason}, naming the live {target[0]} {target[1]!r}")
                self.untrusted.note(value, reason, publish_time)
                raise _Rejected(reason, "not signed by a trusted key")
        self._check_caps(value)
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
        if latest is not None:
            if digest == latest[1]:
                raise _Rejected(DUPLICATE, "a byte-identical copy of the last message applied")
            if order(sent_at, publish_time) <= latest[0]:
                raise _Rejected(STALE, f"sent at {sent_at}, not after {latest[0][1]} (a replay?)")
        self._check_room({k for k, e in state.entries.items() if e.available} if state else set(), announcement)
        signature = value.get(SIGNATURE_FIELD)
        return announcement, descriptor, digest, signature.get("key") if isinstance(signature, dict) else None

    def _check_hosts(self, key: str) -> None:
        """Raises :class:`_Rejected` (:data:`OVER_LIMIT`) if the directory holds :attr:`max_hosts`
        host ids and the message ``key`` (``<kind>/<name>@<host id>``, §4.2) names none of them:
        decided before the message is decoded. A host id may hold ``@``: each ``@`` of the key is
        tried as the one before it."""
        if len(self._host_instances) < self.max_hosts:
            return
        at = key.find("@")
        while at != -1:
            if key[at + 1:] in self._host_instances:
                return
            at = key.find("@", at + 1)
        raise self._over("max_hosts", "", f"host {key.rpartition('@')[2]!r}",
                         f"{len(self._host_instances)} host ids")

    def _check_caps(self, value: dict[str, Any]) -> None:
        """Raises :class:`_Rejected` (:data:`OVER_LIMIT`) if the decoded, not yet validated
        ``value`` is from a new instance of a host id that has :attr:`max_instances`, or is an
        available entry this instance does not hold yet while the directory holds
        :attr:`max_total_entries`. A value whose fields have other types is left to validation."""
        host, kind, name = value.get("host"), value.get("kind"), value.get("name")
        if not isinstance(host, dict) or not isinstance(host.get("id"), str) or not isinstance(name, str):
            return
        host_id, instance = host["id"], host.get("instance", "")
        state = self._instances.get((host_id, instance)) if isinstance(instance, str) else None
        siblings = self._host_instances.get(host_id, ())
        sender = f"host {host_id!r} (instance {instance!r})"
        if state is None and len(siblings) >= self.max_instances:
            raise self._over("max_instances", host_id, sender, f"{len(siblings)} instances of host {host_id!r}")
        adds = kind in ("tool", "tool-service") and value.get("status") == "available" and (
            state is None or (kind, name) not in state.entries)
        if adds and self.held >= self.max_total_entries:
            raise self._over("max_total_entries", "", f"{sender} announcing {kind} {name!r}",
                             f"{self.held} tools and tool services")

    def _over(self, cap: str, host_id: str, sender: str, held: str) -> _Rejected:
        """The rejection of a message from ``sender`` past ``cap`` (for ``max_instances``,
        ``host_id``'s) while the directory holds ``held``: the first one is also a warning that
        names the sender and the cap and says what to do; the next ones are only counted, until
        the cap has room again (:meth:`_clear`)."""
        detail = f"{sender} is over {cap} ({getattr(self, cap)})"
        if (cap, host_id) not in self._warned:
            self._warned.add((cap, host_id))
            log.warning("announcements on %s: %s: the directory holds %s already. Its messages and all others over "
                        "that cap are dropped and counted as %r until there is room. If the fleet is real, raise %s "
                        "(ToolDirectory(%s=...), or --%s); otherwise someone floods the topic: sign announcements "
                        "(tghost keygen) and let only hosts publish on it (docs/protocol.md §4.10)", self.topic,
                        detail, held, OVER_LIMIT, cap, cap, cap.replace("_", "-"))
        return _Rejected(OVER_LIMIT, detail)

    def _clear(self, host_id: str) -> None:
        """Re-arm the warning of each cap that has room again, after ``host_id`` lost an
        instance or entries (:meth:`_over`)."""
        if not self._warned:
            return
        room = {("max_hosts", ""): len(self._host_instances) < self.max_hosts,
                ("max_total_entries", ""): self.held < self.max_total_entries,
                ("max_instances", host_id): len(self._host_instances.get(host_id, ())) < self.max_instances}
        self._warned -= {cap for cap, clear in room.items() if clear}

    def _check_room(self, known: AbstractSet[Key], announcement: Announcement) -> None:
        """Raises :class:`_Rejected` (:data:`OVER_LIMIT`) if applying the message would give the
        instance, whose ``known`` (kind, name) entries are available now, more than
        :attr:`max_entries` available ones (a manifest: more than that many listed)."""
        if announcement.kind == "host":
            listed = announcement.entries
            count = len(set(listed.tool_service)) + len(set(listed.tool)) if listed is not None else 0
        elif announcement.status == "available" and (announcement.kind, announcement.name) not in known:
            count = len(known) + 1
        else:
            return
        if count > self.max_entries:
            raise _Rejected(OVER_LIMIT, f"host {announcement.host.id} (instance {announcement.host.instance}) "
                                        f"would announce {count} entries, more than max_entries ({self.max_entries})")

    def is_live(self, kind: str, name: str) -> bool:
        """Whether an applied announcement claims this tool or tool service (by ``kind``), or
        this host, now; so it holds during catch-up too, before the live view is resolved."""
        if kind == "host":
            return any(self._instances[(name, i)].active for i in self._host_instances.get(name, ()))
        return bool(self.claims.get((kind, name)))

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
        return start + self._seconds(announcement)

    def _seconds(self, announcement: Announcement) -> float:
        """The lease this directory honours (seconds): the announced one, at most :attr:`max_lease`
        (a host announcing longer is told once in the log)."""
        if announcement.lease.seconds > self.max_lease and announcement.host.id not in self._capped_hosts:
            self._capped_hosts.add(announcement.host.id)
            log.warning("host %s announces a lease of %ss: it counts as %ss here (max_lease), so the host may "
                        "expire between its heartbeats; give it --lease %s or less", announcement.host.id,
                        announcement.lease.seconds, self.max_lease, self.max_lease)
        return min(announcement.lease.seconds, self.max_lease)

    def _record(
        self, announcement: Announcement, descriptor: ToolDescriptor | ToolServiceDescriptor | None,
        publish_time: float, digest: bytes, signer: str | None = None,
    ) -> set[Key]:
        """Apply an accepted announcement to its host instance; returns what changed."""
        now = time.time()
        ref = (announcement.host.id, announcement.host.instance)
        lease_end = self._lease_end(announcement, publish_time)
        state = self._instances.get(ref)
        if state is None:
            state = self._instances[ref] = _Instance(announcement.host.model_dump(), lease_end,
                                                     self._seconds(announcement))
            self._host_instances[ref[0]].append(ref[1])
            self._queue(ref, state)
        state.lease_end = max(state.lease_end, lease_end)
        state.seconds = self._seconds(announcement)
        state.signer = signer
        state.latest[(announcement.kind, announcement.name)] = (order(announcement.lease.sent_at, publish_time),
                                                                digest)
        was_active = state.active
        alive = lease_end >= now and announcement.status == "available"  # a withdrawal says it is going
        if (announcement.kind == "tool-service" and announcement.status == "withdrawn"
                and ("tool-service", announcement.name) in state.entries):
            self.withdrawn[announcement.name] = max(self.withdrawn.get(announcement.name, 0.0), publish_time or now)
        dirty = self._meet(ref, state) if alive else set()
        changed = self._state(state, announcement, descriptor)
        dirty |= self._hand_over(ref, state, changed, announcement.kind == "host")
        if len(state.entries) > 2 * self.max_entries:  # withdrawn entries pile up: forget them
            pruned = [k for k, e in state.entries.items() if not e.available]
            for key in pruned:
                del state.entries[key]
            self.held -= len(pruned)
            self._release(ref[0], pruned)
            self._clear(ref[0])
        if state.expired and state.lease_end >= now:
            state.expired = False  # heard again in time, e.g. from the backlog after an outage of ours
            self._queue(ref, state)  # due when its lease ends again, not when it would be forgotten
        if state.active != was_active:
            changed = set(state.entries)
        self._settle_clashes()
        return dirty | self._sync(ref, state, changed)

    def _state(
        self, state: _Instance, announcement: Announcement, descriptor: ToolDescriptor | ToolServiceDescriptor | None
    ) -> set[Key]:
        """Record what one message says about the instance's entries; returns those that changed."""
        if announcement.kind == "host":
            state.withdrawn = announcement.status == "withdrawn"
            state.health, state.since = announcement.health, announcement.since
            if state.withdrawn or announcement.entries is None:
                return set()
            state.listed = frozenset([*(("tool-service", name) for name in announcement.entries.tool_service),
                                      *(("tool", name) for name in announcement.entries.tool)])
            return _apply_manifest(state, announcement.entries)
        key = (announcement.kind, announcement.name)
        entry = state.entries.get(key)
        if announcement.status == "withdrawn":
            if entry is not None:
                entry.available = False
        else:
            assert descriptor is not None  # an available entry's (parse_descriptor)
            self.held += key not in state.entries
            state.entries[key] = _Entry(self._shared(key, descriptor), announcement.plugin, True,
                                        announcement.external, ToolAccess.from_json(announcement.access),
                                        announcement.access_policy if announcement.kind == "tool-service" else None)
            self._holders[key].add(announcement.host.id)
        return {key}

    def _shared(self, key: Key, descriptor: ToolDescriptor | ToolServiceDescriptor
                ) -> ToolDescriptor | ToolServiceDescriptor:
        """The descriptor of ``key`` last applied, if it equals ``descriptor`` (else ``descriptor``,
        which becomes the last): hosts that agree share one object, so a fleet of them holds one
        copy, and the directory tells agreeing claims by identity (docs/internals/scale.md)."""
        known = self._descriptors.get(key)
        if known is not None and known == descriptor:
            return known
        self._descriptors[key] = descriptor
        return descriptor

    def _meet(self, ref: Ref, state: _Instance) -> set[Key]:
        """An instance is heard alive (an ``available`` message): the first time, it replaces the
        other instances of its host id (a restart); if it was replaced itself, two live processes
        share the id (a clash), reported and never merged. A replaced instance that only withdraws
        is handing over (``tghost run --reload``), no clash. Returns what changed for the other instances."""
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
                    older.superseded, older.successor = True, ref
                    log.info("host %s: instance %s replaces instance %s", host_id, instance, other)
                    dirty |= self._sync((host_id, other), older, set(older.entries))
        return dirty

    def _report_clash(self, host_id: str) -> None:
        self._clashing[host_id] = frozenset(i for i in self._host_instances[host_id]
                                            if self._instances[(host_id, i)].fresh
                                            and not self._instances[(host_id, i)].expired)
        if not self.quiet:
            self._log_clash(host_id)

    def _log_clash(self, host_id: str) -> None:
        """Warn once per set of clashing instances."""
        live = self._clashing[host_id]
        if self._logged_clashes.get(host_id) == live:
            return
        self._logged_clashes[host_id] = live
        who = ", ".join(f"instance {i} (pid {self._instances[(host_id, i)].host.get('pid')} on "
                        f"{self._instances[(host_id, i)].host.get('hostname') or '?'})" for i in sorted(live))
        log.warning("host id %r is announced by %d live processes at once: %s; both are kept as providers: "
                    "give each process its own --host-id (env TGHOST_HOST_ID)", host_id, len(live), who)

    def caught_up(self, now: float) -> None:
        """End of a catch-up (unix time ``now``): from here on, report as things happen. Logs the
        rejection summary and the clashes that are still live, not those the history holds."""
        self.quiet = False
        self._settle_clashes()
        for host_id in self._clashing:
            self._log_clash(host_id)
        self.flush_rejections(now, force=True)

    def _hand_over(self, ref: Ref, state: _Instance, keys: set[Key], manifest: bool) -> set[Key]:
        """The instances ``ref`` replaced, brought in line with what it just said (``keys``, or
        everything they hold after a host message, whose ``manifest`` may list more)."""
        dirty: set[Key] = set()
        for other in self._host_instances[ref[0]]:
            older = self._instances[(ref[0], other)]
            if older.successor == ref and not (older.withdrawn or older.expired):
                held = set(older.entries)
                dirty |= self._sync((ref[0], other), older, held if manifest else keys & held)
        return dirty

    def _holds(self, state: _Instance, key: Key) -> _Entry | None:
        """The instance's live entry ``key``, if it has one: an active instance's available
        entry; or a replaced one's, while the instance that replaced it lists the entry in its
        manifest and its own word on it has not come (docs/protocol.md §4.7: a restart or
        ``tghost run --reload`` leaves no gap)."""
        entry = state.entries.get(key)
        if entry is None or not entry.available or state.withdrawn or state.expired:
            return None
        if not state.superseded:
            return entry
        successor = self._instances.get(state.successor) if state.successor else None
        if successor is None or not successor.active or key not in successor.listed:
            return None
        own = successor.entries.get(key)
        return entry if own is None or not own.available else None

    def _sync(self, ref: Ref, state: _Instance, keys: set[Key]) -> set[Key]:
        """Bring the live claims of ``keys`` in line with the instance's state; returns ``keys``."""
        for key in keys:
            entry = self._holds(state, key)
            claims = self.claims.get(key)
            if entry is not None:
                if claims is None:
                    claims = self.claims[key] = {}
                provider = Provider(state.host, entry.plugin, entry.external, entry.access, entry.policy)
                claims[ref] = Claim(entry.descriptor, provider, (self._first_seen(ref[0], key), *ref))
            elif claims is not None:
                claims.pop(ref, None)
                if not claims:
                    del self.claims[key]
        return keys

    def remembered(self, key: Key) -> dict[str, ToolDescriptor | ToolServiceDescriptor]:
        """Host id -> the last descriptor of ``key`` its newest remembered instance announced,
        live or not: what a host said lately, to tell a contested entry (docs/protocol.md §4.8)
        even while one side is withdrawn or expired. Kept until the ledger forgets the instance
        (``max_clock_skew`` twice after its lease ended)."""
        found: dict[str, ToolDescriptor | ToolServiceDescriptor] = {}
        for host_id in list(self._holders.get(key, ())):
            instances = self._host_instances.get(host_id)
            if not instances:  # forgotten meanwhile
                self._drop_holder(key, host_id)
                continue
            for instance in reversed(instances):
                entry = self._instances[(host_id, instance)].entries.get(key)
                if entry is not None:
                    found[host_id] = entry.descriptor
                    break
        return found

    def ignored_hosts(self, key: Key, now: float) -> dict[str, str]:
        """Host id -> why the trusted keys ignore it (``unsigned``, ``unknown-key``,
        ``bad-signature``), of each host that announces ``key`` available, unverified, with a lease
        running at ``now`` (unix seconds): who would serve it in open mode. A hint read from
        messages nothing vouches for (:mod:`tghost.agent.untrusted`); empty in open mode."""
        return self.untrusted.serving(key, now)

    def remembered_names(self, kind: str) -> set[str]:
        """The names of ``kind`` (``tool``, ``tool-service``) that a remembered instance may have
        announced: a superset of those :meth:`remembered` finds (check one with it), read from
        its index, without walking the instances."""
        return {name for (k, name) in self._holders if k == kind}

    def _first_seen(self, host_id: str, key: Key) -> int:
        """When this host id's claim on ``key`` was first seen (a count), kept while the ledger
        remembers any instance of the host, so that a restart keeps the host's place."""
        seen = self._seen[host_id]
        if key not in seen:
            self._seen_count += 1
            seen[key] = self._seen_count
        return seen[key]

    def _settle_clashes(self) -> None:
        """Forget the clashes that fewer than two active instances are left in."""
        if not self._clashing:
            return
        for host_id in [h for h, instances in self._clashing.items()
                        if sum(self._instances[(h, i)].active for i in instances if (h, i) in self._instances) < 2]:
            del self._clashing[host_id]
            if self._logged_clashes.pop(host_id, None) is not None:
                log.info("host id %r: one live process again", host_id)


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


def _apply_manifest(state: _Instance, manifest: Entries) -> set[Key]:
    """A host message's manifest: every entry the instance holds is available if listed, and
    not if not (the latest word wins, docs/protocol.md §4.4); returns the entries that changed.
    A listed name whose descriptor has not come is not held: its own ``available`` message,
    later, is the latest word then. So a manifest costs next to nothing per name it lists (a
    forged one of 1,000 names included)."""
    if not state.entries:
        return set()
    listed = {"tool-service": frozenset(manifest.tool_service), "tool": frozenset(manifest.tool)}
    changed: set[Key] = set()
    for key, entry in state.entries.items():
        available = key[1] in listed[key[0]]
        if entry.available != available:
            entry.available = available
            changed.add(key)
    return changed


