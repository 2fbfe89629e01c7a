"""directory: the agent's live view of the announcements (docs/protocol.md §4.6-4.8). Resolves
the live claims of its :class:`~tghost.agent.ledger.Ledger` into tools and services (conflicts
included), emits change events, expires instances whose lease ran out and filters by seed 001
group/state. Reading the epoch topics is :mod:`tghost.agent.window`'s, applying each message the
ledger's, calls by tool name :mod:`tghost.agent.calls`'s. Never lets a bad message on the topic
raise or replace a live tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter, defaultdict
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any, Literal, Unpack

import pulsar
import pulsar.asyncio
import pulsar.exceptions

from tghost.agent.calls import (
    CONFLICT,
    GROUPS_EXCEED_ALLOWED,
    NO_PROVIDER,
    NOT_AVAILABLE,
    UNKNOWN_TOOL,
    CallOptions,
    Installed,
    NoProvider,
    ToolCallListener,
    ToolCallRecord,
    ToolCalls,
    UnknownTool,
    described,
)
from tghost.agent.client import ToolServiceClient
from tghost.agent.entries import (
    Change,
    CodeVersion,
    DirectoryTool,
    ServiceEntry,
    Side,
    describe_skew,
    policy_mismatch,
    skew_of,
)
from tghost.agent.ledger import (
    DUPLICATE,
    HIJACK,
    INVALID,
    MAX_ANNOUNCEMENT_BYTES,
    MAX_DEPTH,
    MAX_ENTRIES,
    MAX_HOSTS,
    MAX_INSTANCES,
    MAX_LEASE,
    MAX_TOTAL_ENTRIES,
    OVER_LIMIT,
    STALE,
    Claim,
    HostLease,
    Key,
    Ledger,
    Provider,
    Ref,
)
from tghost.agent.search import Found, ToolIndex
from tghost.agent.window import TopicWindow
from tghost.protocol.descriptors import ToolDescriptor, ToolServiceDescriptor
from tghost.protocol.epochs import DEFAULT_TOPIC, EPOCH_SECONDS
from tghost.protocol.groups import select
from tghost.protocol.trust import Signer, TrustedKeys
from tghost.pulsar.clients import BrokerError, PulsarSettings
from tghost.system.tasks import cancel_and_wait

__all__ = [
    "CONFLICT",
    "DUPLICATE",
    "GROUPS_EXCEED_ALLOWED",
    "HIJACK",
    "INVALID",
    "MAX_ANNOUNCEMENT_BYTES",
    "MAX_DEPTH",
    "MAX_ENTRIES",
    "MAX_HOSTS",
    "MAX_INSTANCES",
    "MAX_LEASE",
    "MAX_TOTAL_ENTRIES",
    "NOT_AVAILABLE",
    "NO_PROVIDER",
    "OVER_LIMIT",
    "STALE",
    "UNKNOWN_TOOL",
    "Change",
    "DirectoryTool",
    "HostLease",
    "Installed",
    "NoProvider",
    "Provider",
    "ServiceEntry",
    "ToolCallListener",
    "ToolCallRecord",
    "ToolDirectory",
    "UnknownTool",
]

log = logging.getLogger(__name__)

class ToolDirectory:
    """The live tool set announced on the epoch topics of ``topic`` (docs/protocol.md §4).

    ``async with ToolDirectory(PulsarSettings(url)) as directory:`` catches up, then follows.
    ``expiry_interval`` is how often (seconds) leases are checked; ``epoch_seconds`` must be
    the hosts' (:data:`tghost.protocol.announcement.EPOCH_SECONDS`).

    Trust: with ``trusted`` keys only announcements signed by one of them are applied
    (format in :mod:`tghost.protocol.trust`); without, every well-formed one is (open mode). Every
    message that is not applied is counted in :attr:`rejections` by reason: :data:`INVALID`,
    :data:`STALE`, :data:`DUPLICATE`, :data:`OVER_LIMIT`, ``unsigned``, ``bad-signature``, ``unknown-key``, or
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
    params than the claim this directory saw first, or a tool announced over another service or
    with other config values, loses; it is listed in :attr:`conflicts` and logged. What a host
    says about itself (``since``) never orders claims: a claim already held is never displaced
    by another host's. Without ``trusted`` keys (open mode) a contested tool (its name or its
    service claimed differently by another host) is not called at all: calls are refused with
    ``conflict``, naming both sides, until the other claims end.

    Drift (docs/protocol.md §4.8): of the claims that agree on the wire (a service's queues and
    config params; a tool's service and config values), the live one seen first is the one
    applied: its descriptor (timeout, description, max concurrency, arguments, groups...) and a
    tool's access. Another live provider announcing it otherwise has drifted: it stays a
    provider (it serves the same queues) and calls go ahead, but its descriptor is not applied;
    it is listed in the entry's ``drift`` and logged. Once the claims seen before it end, the
    next one seen is applied: an upgrade takes effect as its last old provider leaves.

    Ordering and clocks: ``lease.sent_at`` (the host's clock, but never later than the broker's
    publish time: :func:`tghost.agent.ledger.order`) orders the messages of one (kind, name,
    host instance); one not newer than the newest applied is :data:`STALE`, so a replayed
    ``available`` never undoes a later ``withdrawn``, and a message from the future never
    makes the later ones stale. A lease longer than ``max_lease`` seconds counts as
    ``max_lease``. A lease runs from the broker's
    publish time (one clock for every host, capped at this directory's now), but never from
    later than ``sent_at + max_clock_skew``. The trade-off: hosts whose clocks are behind the
    broker's by up to ``max_clock_skew`` seconds keep their full lease; a host further behind
    gets a shorter one (logged once per host), and in exchange a verbatim replay of an old
    message can keep a dead host's entries alive for at most ``max_clock_skew`` plus its lease
    after the host sent it. A message sent more than ``max_clock_skew`` after its publish time
    is :data:`INVALID` (a clock far ahead would otherwise make every later message of that key
    stale). ``max_clock_skew`` also widens the window of epochs read.

    Bounds (docs/protocol.md §4.7): the directory holds at most ``max_hosts`` host ids,
    ``max_instances`` instances of each, ``max_entries`` available entries per instance and
    ``max_total_entries`` entries in all (a manifest's names cost nothing until their descriptors
    come). A message past a cap is :data:`OVER_LIMIT`, dropped before its descriptor is validated
    (a new host id's before it is decoded), and the first past each cap is a warning naming its
    sender and the cap; hosts already held keep their place. The defaults hold thousands of real
    hosts; a flood larger than a cap, published before real hosts, takes their place: in open
    mode caps bound what a flood costs, only signatures and publish permissions stop it.

    While this directory's readers are disconnected from the broker it expires nothing (it
    cannot tell a dead host from its own outage); once back, each host gets at least a full
    lease plus the outage's length to be heard again (see :meth:`_resume_leases`). Nor does it
    expire anything while it is behind its topics (messages wait unread, e.g. in a starved
    process): an unread message may renew the lease (:meth:`_settle`).

    Calls (:meth:`check`, :meth:`invoke`, :meth:`stream`, :meth:`caller`) are made by an
    :class:`~tghost.agent.calls.ToolCalls` over the live tools: ``listeners`` get one
    :class:`~tghost.agent.calls.ToolCallRecord` per call, and refusals are counted in :attr:`refusals`.
    A call of a tool that no live host serves fails at once: :class:`~tghost.agent.calls.NoProvider`
    if a host announced it lately (the ledger remembers it) or it is ``installed`` here
    (:data:`~tghost.agent.calls.Installed`, asked only when a call names a tool that is not live),
    else :class:`~tghost.agent.calls.UnknownTool`, with the closest names.
    """

    def __init__(
        self,
        pulsar_settings: PulsarSettings,
        topic: str = DEFAULT_TOPIC,
        *,
        expiry_interval: float = 0.25,
        trusted: TrustedKeys | None = None,
        listeners: Sequence[ToolCallListener] = (),
        max_clock_skew: float = 60.0,
        epoch_seconds: float = EPOCH_SECONDS,
        report_interval: float = 60.0,
        max_lease: float = MAX_LEASE,
        max_entries: int = MAX_ENTRIES,
        max_hosts: int = MAX_HOSTS,
        max_instances: int = MAX_INSTANCES,
        max_total_entries: int = MAX_TOTAL_ENTRIES,
        identity: Signer | None = None,
        installed: Installed | None = None,
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
        self.ledger = Ledger(topic, trusted, max_clock_skew, report_interval, max_lease, max_entries,
                             max_hosts=max_hosts, max_instances=max_instances, max_total_entries=max_total_entries)
        """What every host instance announced, and the live claims (:mod:`tghost.agent.ledger`)."""
        self.rejections: Counter[str] = self.ledger.rejections
        """Messages on the topic that were not applied, by reason (see the class docstring)."""
        self._losers: dict[str, set[Ref]] = {}
        self._tools_of_service: dict[str, set[str]] = defaultdict(set)
        self._filtered: dict[tuple[tuple[str, ...] | None, str | None], list[ToolDescriptor]] = {}
        self._watchers: list[asyncio.Queue[Change]] = []
        self.identity = identity
        """The caller key this directory calls with (``None``: anonymous): it signs every request,
        and :meth:`available` lists only the tools their hosts admit it to."""
        self.index = ToolIndex()
        """The live tools for :meth:`search` (:mod:`tghost.agent.search`), kept in step with :attr:`tools`."""
        self.calls = ToolCalls(self.tools, listeners, refuse_conflicts=trusted is None, identity=identity,
                               services=self.services, ledger=self.ledger, installed=installed, trusted=trusted)
        """Calls by tool name over :attr:`tools` (:mod:`tghost.agent.calls`)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._client: pulsar.asyncio.Client | None = None
        self._window: TopicWindow | None = None
        self._outage_since: float | None = None
        """Since when (unix seconds) a reader is disconnected: nothing expires meanwhile."""
        self._behind_since: float | None = None
        """Since when (unix seconds) leases were due while messages waited unread."""
        self._expiring_behind = False
        """Whether :meth:`_behind` gave up holding expiry back (said once, until caught up)."""
        self._held: set[Key] = set()
        """What messages applied while a lease was due changed: shown by :meth:`_settle`."""
        self._handed = 0
        """Messages :meth:`_follow` applied since :meth:`_behind` last asked."""
        self._wake = asyncio.Event()
        self.caught_up = 0
        """How many messages :meth:`start` read to catch up: bounded by the live hosts and one epoch
        of their heartbeats, never by the topic's history (docs/protocol.md §4.6)."""

    @property
    def rejected(self) -> int:
        """How many messages on the topic were not applied (the sum of :attr:`rejections`)."""
        return self.rejections.total()

    @property
    def hosts(self) -> dict[str, HostLease]:
        """Host id -> its lease, for every host with a live instance now."""
        return self.ledger.hosts

    @property
    def clashes(self) -> dict[str, tuple[str, ...]]:
        """Host id -> its live instances, for every host id that two live processes announce
        under at once (a misconfiguration: each process needs its own ``--host-id``)."""
        return self.ledger.clashes

    def is_connected(self) -> bool:
        """Whether every reader of the announcement topics is connected now (False before start)."""
        return self._window is not None and self._window.is_connected()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> ToolDirectory:
        """Read the epoch topics of the read window from their first message up to now, then
        follow them in the background (docs/protocol.md §4.6).

        An agent may start before its broker: this waits up to the settings'
        ``connect_timeout`` seconds (:attr:`tghost.pulsar.clients.PulsarSettings.connect_timeout`,
        default 30) for one to answer, logging one line per ``retry_interval``. Tools that
        arrive once it follows are ``added`` changes; :meth:`changes` with ``replay=True`` also
        gives those known before.

        Raises:
            tghost.pulsar.clients.BrokerError: no broker answered in time (``BrokerUnavailable``), the
                URL is not a Pulsar broker (``NotPulsarBroker``), or reading the topic failed;
                the message names the URL.
        """
        self._client = self.calls.client = await self.pulsar.connect()
        try:
            self._window = window = TopicWindow(self._client, self.topic, self.max_clock_skew, self.epoch_seconds)
            self.ledger.quiet = True
            dirty = await self._catch_up(window)
        except (pulsar.asyncio.PulsarException, pulsar.exceptions.PulsarException) as exc:
            await self.close()
            raise BrokerError(f"reading {self.topic} from the Pulsar broker at {self.pulsar.url} failed: "
                              f"{exc}") from exc
        dirty |= self._expire(time.time())  # hosts that died before we came
        self._resolve(dirty, "removed")  # nothing is live yet: all changes are "added"
        self.ledger.caught_up(time.time())
        window.follow(self._follow)
        self._tasks = [asyncio.create_task(self._expire_loop(), name="directory expiry")]
        return self

    async def _catch_up(self, window: TopicWindow) -> set[Key]:
        """Apply every message now on the window's topics; returns what changed."""
        dirty: set[Key] = set()
        self.caught_up = await window.catch_up(lambda message: dirty.update(self._apply_message(message)))
        return dirty

    async def close(self) -> None:
        """Stop following and close every client. Idempotent (also after a failed :meth:`start`)."""
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(*tasks)
        await self.calls.close()
        window, self._window = self._window, None
        if window is not None:
            await window.close()
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def __aenter__(self) -> ToolDirectory:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _follow(self, message: pulsar.Message) -> None:
        """Apply a message read while following, and show what it changed, unless a lease has
        ended meanwhile: then the expiry loop decides first (:meth:`_settle`), so a renewal still
        unread is never missed, and, once the directory has read up, a replay whose lease had ended
        is never shown (while it is behind, at most for the bound :meth:`_behind` keeps)."""
        dirty = self._apply_message(message)
        self._handed += 1
        if self._outage_since is None and self.ledger.due(time.time()):
            self._held |= dirty
            self._wake.set()
            return
        self._resolve(dirty, "removed")

    async def _expire_loop(self) -> None:
        """Every ``expiry_interval`` seconds, or as soon as :meth:`_follow` holds a change back:
        :meth:`_tick`. A failing tick is logged and the next one runs: held changes are never lost."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.expiry_interval):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self._tick(time.time())
            except Exception:
                log.exception("the directory's expiry check failed; it runs again in %ss", self.expiry_interval)

    async def _tick(self, now: float) -> None:
        """Track this directory's own outage, move the read window, then :meth:`_settle` at ``now``."""
        assert self._window is not None
        if not self._window.is_connected():
            if self._outage_since is None:
                log.warning("lost the broker connection: expiring nothing until it is back")
                self._outage_since = now
            self._resolve(self._take_held(), "removed")
            return
        if self._outage_since is not None:
            outage, self._outage_since = now - self._outage_since, None
            log.info("broker connection is back after %.1fs: every host gets a lease from now", outage)
            self._resume_leases(now, outage)
        try:
            await self._window.move(now)
        except pulsar.asyncio.PulsarException as exc:
            log.warning("could not open the next epoch's topic (%s); trying again", exc)
        await self._settle(now)
        self.ledger.flush_rejections(now)

    async def _settle(self, now: float) -> None:
        """Expire the leases that ended before ``now`` (unix seconds), unless this directory is
        behind its topics (:meth:`tghost.agent.window.TopicWindow.behind`): a message it has not
        read yet may renew them. Then show what the messages held back by :meth:`_follow` changed."""
        if self.ledger.due(now) and not await self._behind(now):
            self._resolve(self._expire(now), "expired")
        self._resolve(self._take_held(), "removed")

    async def _behind(self, now: float) -> bool:
        """Whether to hold expiry back at ``now``: a topic has messages this directory has not
        read, it has read some since it last asked (it is reading, not stuck: a broker that says
        it has messages it never delivers does not count), and it has not been behind for
        ``max_clock_skew`` seconds already (a flood must not keep dead hosts live for ever)."""
        assert self._window is not None
        handed, self._handed = self._handed, 0
        if not await self._window.behind():
            if self._behind_since is not None:
                log.info("caught up with the announcement topics after %.1fs behind", now - self._behind_since)
                self._behind_since, self._expiring_behind = None, False
            return False
        if self._behind_since is None:
            self._behind_since = now
            log.warning("behind the announcement topics (messages wait unread): expiring nothing while it catches up")
            return True
        if handed and now - self._behind_since <= self.max_clock_skew:
            return True
        if not self._expiring_behind:
            self._expiring_behind = True
            log.warning("still behind the announcement topics after %.1fs%s: expiring by the clock until caught up",
                        now - self._behind_since, "" if handed else ", and reading nothing")
        return False

    def _take_held(self) -> set[Key]:
        held, self._held = self._held, set()
        return held

    def _apply_message(self, message: pulsar.Message) -> set[Key]:
        """Apply a message read from the topic (:meth:`tghost.agent.ledger.Ledger.apply`)."""
        return self._apply(message.data(), message.publish_timestamp() / 1000, message.partition_key())

    def _apply(self, data: bytes, publish_time: float, key: str) -> set[Key]:
        """:meth:`tghost.agent.ledger.Ledger.apply`: one message's bytes, the broker's publish time (unix
        seconds) and the message key; returns the (kind, name) pairs to re-resolve."""
        return self.ledger.apply(data, publish_time, key)

    def _expire(self, now: float) -> set[Key]:
        """:meth:`tghost.agent.ledger.Ledger.expire` at unix time ``now``; returns what to re-resolve."""
        return self.ledger.expire(now)

    def _resume_leases(self, now: float, outage: float) -> None:
        """:meth:`tghost.agent.ledger.Ledger.resume` after an ``outage`` (seconds) ending at ``now``."""
        self.ledger.resume(now, outage)

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

    def _resolve_service(self, service_id: str) -> None:
        claims = self.ledger.claims.get(("tool-service", service_id), {})
        conflict = f"tool-service/{service_id}"
        if not claims:
            self.services.pop(service_id, None)
            self._losers.pop(service_id, None)
            self.conflicts.pop(conflict, None)
            return
        groups: dict[Any, list[Claim]] = defaultdict(list)
        for claim in claims.values():
            assert isinstance(claim.descriptor, ToolServiceDescriptor)
            groups[_wire_identity(claim.descriptor)].append(claim)
        winners, losers = _rank(groups.values())
        self._losers[service_id] = {c.ref for c in losers}
        first = winners[0].descriptor
        assert isinstance(first, ToolServiceDescriptor)
        drift = _drift(winners, service_id, first.request_queue)
        self._log_drift(f"tool service {service_id!r}", self.services.get(service_id), drift, winners[0])
        providers = tuple(c.provider for c in winners)
        skew = skew_of(providers)
        _log_skew(service_id, self.services.get(service_id), skew)
        entry = ServiceEntry(first, providers, self._service_rivals(first), drift, skew)
        _log_policy_mismatch(service_id, self.services.get(service_id), entry)
        self.services[service_id] = entry
        losing_hosts = sorted({c.provider.host["id"] for c in losers})
        if losing_hosts and self.conflicts.get(conflict) != losing_hosts:
            log.warning("tool service %r is announced with other queues or config params by host(s) %s; host %r "
                        "was seen first and keeps it%s", service_id, losing_hosts, winners[0].provider.host["id"],
                        self._refusing)
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
        self.index.put(name, after.descriptor if after else None)
        change: Literal["added", "updated", "removed", "expired"] = (
            "added" if before is None else gone if after is None else "updated")
        self._filtered.clear()
        for queue in self._watchers:
            queue.put_nowait(Change(change, name, after or before))

    def _winning_tool(self, name: str) -> DirectoryTool | None:
        """Live claims grouped by service and config values; the group announced first wins, and
        its claim seen first is applied (the others that differ are its drift). Claims of hosts
        whose descriptor of the service lost a conflict do not count."""
        groups: dict[tuple[str, str], list[Claim]] = defaultdict(list)
        for claim in self.ledger.claims.get(("tool", name), {}).values():
            descriptor = claim.descriptor
            assert isinstance(descriptor, ToolDescriptor)
            self._tools_of_service[descriptor.service].add(name)
            if descriptor.service in self.services and claim.ref not in self._losers.get(descriptor.service, ()):
                groups[(descriptor.service, _config_identity(descriptor))].append(claim)
        if not groups:
            self.conflicts.pop(name, None)
            return None
        winners, losers = _rank(groups.values())
        first = winners[0]
        assert isinstance(first.descriptor, ToolDescriptor)
        service = first.descriptor.service
        losing = list(dict.fromkeys(c.descriptor.service for c in sorted(losers, key=lambda c: c.rank)
                                    if isinstance(c.descriptor, ToolDescriptor)))
        if losing and self.conflicts.get(name) != losing:
            log.warning("tool %r is claimed by services %s; %r was seen first and keeps it%s", name,
                        [service, *losing], service, self._refusing)
        _set_or_drop(self.conflicts, name, losing)
        drift = _drift(winners, service, access=not self.services[service].policy_mismatch)
        self._log_drift(f"tool {name!r}", self.tools.get(name), drift, first)
        return DirectoryTool(first.descriptor, self.services[service], tuple(c.provider for c in winners),
                             self._tool_rivals(first.descriptor), drift)

    def _tool_rivals(self, winner: ToolDescriptor) -> tuple[Side, ...]:
        """The hosts whose latest word on this tool name, live or lately (the ledger's
        remembered claims), names another service or other config values than ``winner``."""
        mine = (winner.service, _config_identity(winner))
        return tuple(Side(host, d.service) for host, d in sorted(self.ledger.remembered(("tool", winner.name)).items())
                     if isinstance(d, ToolDescriptor) and (d.service, _config_identity(d)) != mine)

    def _service_rivals(self, winner: ToolServiceDescriptor) -> tuple[Side, ...]:
        """The hosts whose latest word on this service id, live or lately, names other queues
        or config params than ``winner``."""
        mine = _wire_identity(winner)
        return tuple(Side(host, d.id, d.request_queue)
                     for host, d in sorted(self.ledger.remembered(("tool-service", winner.id)).items())
                     if isinstance(d, ToolServiceDescriptor) and _wire_identity(d) != mine)

    def _log_drift(self, what: str, before: ServiceEntry | DirectoryTool | None, drift: tuple[Side, ...],
                   first: Claim) -> None:
        """Warn once per change of ``what``'s drift (its providers announcing another descriptor
        than the ``first`` claim's), if it has any."""
        if drift and drift != (before.drift if before is not None else ()):
            others = "; ".join(f"host(s) {side.host} (another {', '.join(side.differs)})" for side in drift)
            log.warning("%s is announced with another descriptor by %s; host %r was seen first, and its descriptor "
                        "is the one applied while its claim is live: expected during a rolling upgrade, otherwise "
                        "stop those hosts (or sign announcements)", what, others, first.provider.host["id"])

    @property
    def _refusing(self) -> str:
        """How a conflict affects calls, for the log."""
        if self.calls.refuse_conflicts:
            return ("; calls to it are refused ('conflict') until the other claims end: without trusted keys "
                    "anyone on the broker may announce, so sign announcements (tghost keygen)")
        return ""

    # -- queries ---------------------------------------------------------------------------

    def available(self, groups: Sequence[str] | None = None, state: str | None = None,
                  read_only: bool = False) -> list[ToolDescriptor]:
        """Tools a request with these groups and state may use (seed 001), and that their hosts
        admit this directory's :attr:`identity` to (anonymous without one), sorted by name; with
        ``read_only``, only those hinted read-only (``annotations.read-only``, docs/protocol.md §3.3).

        Cached per (groups, state) until the tool set changes.
        """
        key = (None if groups is None else tuple(groups), state)
        if key not in self._filtered:
            descriptors = (self.tools[name].descriptor for name in sorted(self.tools)
                           if self.calls.admits(self.tools[name]))
            self._filtered[key] = select(descriptors, groups, state)
        return [d for d in self._filtered[key] if d.read_only] if read_only else self._filtered[key]

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

    def search(self, query: str, limit: int = 10, groups: Sequence[str] | None = None,
               state: str | None = None, read_only: bool = False) -> list[Found]:
        """The live tools that best match ``query`` (plain language), best first, at most
        ``limit`` (1..1000): only those :meth:`available` gives for ``groups``, ``state`` and
        ``read_only`` (seed 001; ``groups=None`` is the ``default`` group, ``["*"]`` every group), each with its
        score (:mod:`tghost.agent.search`: BM25 over name, description and arguments). A tool
        whose name is contested is the one the directory would call (:attr:`DirectoryTool.contested`).
        Never talks to Pulsar; a change the directory has seen is searched.

        Raises:
            tghost.agent.search.SearchError: the query has no words, or ``limit`` is out of range.
        """
        allowed = {d.name for d in self.available(groups, state, read_only)}
        return [Found(self.tools[name], score) for name, score in self.index.ranked(query, allowed.__contains__, limit)]

    async def wait_for(self, name: str, timeout: float = 10.0, present: bool = True,
                       kind: Literal["tool", "tool-service"] = "tool") -> None:
        """Wait (seconds) until tool ``name`` (with ``kind="tool-service"``: the tool service of
        that id) is live (or, with ``present=False``, gone): e.g. for a host that is starting.

        Raises:
            TimeoutError: it did not happen in time.
        """
        live = self.calls.live(kind)
        try:
            async with asyncio.timeout(timeout):
                while (name in live) != present:
                    await asyncio.sleep(0.02)
        except TimeoutError:
            raise TimeoutError(f"{described(kind, name)} is {'not live' if present else 'still live'} after "
                               f"{timeout:g}s") from None

    # -- calls (tghost.agent.calls) -------------------------------------------------------------

    @property
    def listeners(self) -> tuple[ToolCallListener, ...]:
        """What gets an :class:`~tghost.agent.calls.ToolCallRecord` per call."""
        return self.calls.listeners

    @property
    def refusals(self) -> Counter[str]:
        """Calls refused before anything was sent, by reason (:mod:`tghost.agent.calls`)."""
        return self.calls.refusals

    def check(self, name: str, groups: Sequence[str] | None = None, state: str | None = None,
              allowed_groups: Sequence[str] | None = None) -> DirectoryTool:
        """:meth:`tghost.agent.calls.ToolCalls.check`: the live tool ``name`` if this request may use it."""
        return self.calls.check(name, groups, state, allowed_groups)

    async def caller(self, descriptor: ToolServiceDescriptor) -> ToolServiceClient:
        """:meth:`tghost.agent.calls.ToolCalls.caller`: a started client for a service's queues."""
        return await self.calls.caller(descriptor)

    def stream(self, name: str, arguments: dict[str, Any], **options: Unpack[CallOptions]) -> AsyncIterator[str]:
        """:meth:`tghost.agent.calls.ToolCalls.stream`: invoke tool ``name``, yield observation chunks."""
        return self.calls.stream(name, arguments, **options)

    async def invoke(self, name: str, arguments: dict[str, Any],
                     **options: Unpack[CallOptions]) -> str | dict[str, Any]:
        """:meth:`tghost.agent.calls.ToolCalls.invoke`: invoke tool ``name``, return the observation
        (the JSON object it holds, for a tool with an output schema)."""
        return await self.calls.invoke(name, arguments, **options)


def _log_policy_mismatch(service_id: str, before: ServiceEntry | None, after: ServiceEntry) -> None:
    """Warn once per change of a service's policy mismatch (its providers announcing different
    access policies, docs/protocol.md §4.8), naming each policy's hosts."""
    if after.policy_mismatch and (before is None or before.mismatch() != after.mismatch()):
        log.warning("%s", after.mismatch())


def _wire_identity(descriptor: ToolServiceDescriptor) -> tuple[Any, ...]:
    """What makes two descriptors of one service the same service on the wire: its queues and
    config params. Hosts that agree on these are providers of it; others conflict."""
    return descriptor.request_queue, descriptor.response_queue, descriptor.config_params


def _config_identity(descriptor: ToolDescriptor) -> str:
    """A tool's config values, canonically: two claims over one service with other values conflict."""
    return json.dumps(descriptor.config, sort_keys=True, default=str)


#: Descriptor fields that providers may announce differently without drift: informational only.
INFORMATIONAL = frozenset({"version"})


def _drift(winners: list[Claim], service: str, request_queue: str = "", access: bool = True) -> tuple[Side, ...]:
    """The claims of ``winners`` (in rank order: the first is applied) whose descriptor differs
    from the first's in a field but :data:`INFORMATIONAL` ones, or (with ``access``: unless the
    service's policy mismatch reports it) whose announced access admits other callers: one
    :class:`Side` of ``service`` per set of such fields (wire names, and ``access``), naming its hosts."""
    first = winners[0]
    mine: dict[str, Any] | None = None
    hosts: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for claim in winners[1:]:
        fields: tuple[str, ...] = ()
        # identity first: the ledger shares equal descriptors, so a fleet that agrees compares cheaply
        if not (claim.descriptor is first.descriptor or claim.descriptor == first.descriptor):
            mine = mine or first.descriptor.model_dump(mode="json", by_alias=True)
            theirs = claim.descriptor.model_dump(mode="json", by_alias=True)
            fields = tuple(key for key in dict.fromkeys([*mine, *theirs])
                           if key not in INFORMATIONAL and mine.get(key) != theirs.get(key))
        if access and _admitted(claim.provider) != _admitted(first.provider):
            fields += ("access",)
        if fields:
            hosts[fields].add(str(claim.provider.host["id"]))
    return tuple(Side(",".join(sorted(ids)), service, request_queue, fields) for fields, ids in sorted(hosts.items()))


def _admitted(provider: Provider) -> tuple[bool, frozenset[str]] | None:
    """Who the provider's announced access admits: ``None`` everyone (no access announced),
    else whether anonymous callers are and the caller key ids it names (listed by them alone)."""
    access = provider.access
    return None if access is None else (access.anonymous, frozenset(access.keys))


def _log_skew(service_id: str, before: ServiceEntry | None, skew: tuple[CodeVersion, ...]) -> None:
    """Warn once per skew appearing (a set of code versions the service's providers serve),
    naming every version and its hosts; say when the providers agree again."""
    if _versions(skew) == _versions(before.skew if before is not None else ()):
        return
    if skew:
        log.warning("%s ('tghost status' lists them)", describe_skew(service_id, skew))
    else:
        log.info("tool service %r: its hosts serve one version of its code again", service_id)


def _versions(skew: tuple[CodeVersion, ...]) -> set[tuple[str | None, ...]]:
    """The versions of a skew, without their hosts."""
    return {(v.distribution, v.version, v.fingerprint) for v in skew}


def _rank(groups: Any) -> tuple[list[Claim], list[Claim]]:
    """The claims of the group announced first (lowest rank), in rank order, and all the others."""
    ranked = sorted((sorted(group, key=lambda c: c.rank) for group in groups), key=lambda group: group[0].rank)
    return ranked[0], [claim for group in ranked[1:] for claim in group]


def _set_or_drop(conflicts: dict[str, list[str]], key: str, losers: list[str]) -> None:
    if losers:
        conflicts[key] = losers
    else:
        conflicts.pop(key, None)


def _shape(tool: DirectoryTool | None) -> tuple[Any, ...] | None:
    """What a change event is about: the tool, its providers, its service's descriptor, whether
    it is contested, its drift, and its service's policy mismatch and skew."""
    return None if tool is None else (tool.descriptor, tool.providers, tool.service.descriptor, tool.contested,
                                      tool.drift, tool.service.drift, policy_mismatch(tool.service), tool.service.skew)
