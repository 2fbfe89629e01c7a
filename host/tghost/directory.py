"""directory: the agent's live view of the ``tool-descriptors`` topic. Catches up from the
earliest message, follows live, expires providers whose lease ran out, filters by seed 001
group/state, and invokes tools by name. Never imports serve or discover.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pulsar
import pulsar.asyncio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import groups as seed001
from .announce import DEFAULT_TOPIC
from .broker import PulsarSettings
from .client import ToolCallError, ToolServiceClient
from .descriptors import ToolDescriptor, ToolServiceDescriptor

__all__ = ["Change", "DirectoryTool", "Provider", "ServiceEntry", "ToolDirectory"]

log = logging.getLogger(__name__)
UNKNOWN_TOOL = "unknown-tool"


class _Lease(BaseModel):
    seconds: float = Field(gt=0)
    sent_at: float


class _Host(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str = Field(min_length=1)
    hostname: str = ""
    pid: int = 0
    version: str = ""


class _Announcement(BaseModel):
    """One message on the topic (the announcement protocol in DESIGN.md)."""

    kind: Literal["host", "tool-service", "tool"]
    name: str = Field(min_length=1)
    status: Literal["available", "withdrawn"]
    descriptor: dict[str, Any] | None = None
    host: _Host
    plugin: dict[str, Any] | None = None
    lease: _Lease


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
    names: set[tuple[str, str]] = field(default_factory=set)


class ToolDirectory:
    """The live tool set announced on ``topic``.

    ``async with ToolDirectory(PulsarSettings(url)) as directory:`` catches up, then follows.
    ``expiry_interval`` is how often (seconds) leases are checked.
    """

    def __init__(
        self,
        pulsar_settings: PulsarSettings,
        topic: str = DEFAULT_TOPIC,
        *,
        expiry_interval: float = 0.25,
    ) -> None:
        self.pulsar = pulsar_settings
        self.topic = topic
        self.expiry_interval = expiry_interval
        self.tools: dict[str, DirectoryTool] = {}
        self.services: dict[str, ServiceEntry] = {}
        self.conflicts: dict[str, list[str]] = {}
        """Tool name -> the service ids that lost a name conflict (the winner is in ``tools``)."""
        self.rejected = 0
        """Messages that were not valid announcements (counted, logged, ignored)."""
        self._claims: dict[tuple[str, str], dict[str, _Claim]] = defaultdict(dict)
        self._hosts: dict[str, _HostLease] = {}
        self._tools_of_service: dict[str, set[str]] = defaultdict(set)
        self._order = 0
        self._filtered: dict[tuple[tuple[str, ...] | None, str | None], list[ToolDescriptor]] = {}
        self._watchers: list[asyncio.Queue[Change]] = []
        self._callers: dict[str, ToolServiceClient] = {}
        self._callers_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._client: pulsar.asyncio.Client | None = None
        self._reader: pulsar.asyncio.Reader | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> ToolDirectory:
        """Read the topic from the earliest message up to now, then follow it in the background.

        Raises:
            pulsar.asyncio.PulsarException: the broker did not answer.
        """
        self._client = await self.pulsar.connect()
        self._reader = reader = await self._client.create_reader(self.topic, pulsar.MessageId.earliest)
        dirty: set[tuple[str, str]] = set()
        while await _has_message_available(reader):
            dirty |= self._apply(await reader.read_next())
        dirty |= self._expire(time.time())  # hosts that died before we came
        self._resolve(dirty, "removed")  # nothing is live yet: all changes are "added"
        self._tasks = [asyncio.create_task(self._follow(reader), name="directory follow"),
                       asyncio.create_task(self._expire_loop(), name="directory expiry")]
        return self

    async def close(self) -> None:
        """Stop following and close every client."""
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for caller in self._callers.values():
            await caller.close()
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
            self._resolve(self._apply(message), "removed")

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(self.expiry_interval)
            self._resolve(self._expire(time.time()), "expired")

    def _expire(self, now: float) -> set[tuple[str, str]]:
        """Drop every host whose lease ended before ``now`` (unix seconds); returns what changed."""
        dirty: set[tuple[str, str]] = set()
        for host_id in [h for h, lease in self._hosts.items() if lease.expires_at < now]:
            log.info("host %s: lease expired", host_id)
            dirty |= self._drop_host(host_id)
        return dirty

    # -- applying messages -----------------------------------------------------------------

    def _apply(self, message: pulsar.Message) -> set[tuple[str, str]]:
        """Apply one message to the claims; returns the (kind, name) pairs to re-resolve."""
        self._order += 1
        try:
            announcement = _Announcement.model_validate_json(message.data())
            descriptor = _parse_descriptor(announcement)
        except (ValidationError, ValueError) as exc:
            self.rejected += 1
            log.warning("ignored an invalid announcement (key %r): %s", message.partition_key(),
                        str(exc).splitlines()[0])
            return set()
        host_id = announcement.host.id
        published = message.publish_timestamp() / 1000 or announcement.lease.sent_at
        expires_at = min(published, time.time()) + announcement.lease.seconds
        if announcement.kind == "host":
            if announcement.status == "withdrawn":
                return self._drop_host(host_id)
            self._renew(host_id, expires_at)
            return set()
        key = (announcement.kind, announcement.name)
        if announcement.status == "withdrawn":
            self._claims[key].pop(host_id, None)
            self._hosts.get(host_id, _HostLease(0)).names.discard(key)
            return {key}
        assert descriptor is not None
        provider = Provider(announcement.host.model_dump(), announcement.plugin)
        previous = self._claims[key].get(host_id)
        self._claims[key][host_id] = _Claim(descriptor, provider, previous.order if previous else self._order)
        self._renew(host_id, expires_at).names.add(key)
        return {key}

    def _renew(self, host_id: str, expires_at: float) -> _HostLease:
        lease = self._hosts.setdefault(host_id, _HostLease(expires_at))
        lease.expires_at = max(lease.expires_at, expires_at)
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

    async def changes(self) -> AsyncIterator[Change]:
        """Yield every change to the live tool set from now on, until the caller stops."""
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

    # -- invoking --------------------------------------------------------------------------

    def check(self, name: str, groups: Sequence[str] | None = None, state: str | None = None) -> DirectoryTool:
        """The live tool ``name`` if a request with these groups and state may use it.

        Raises:
            ToolCallError: ``unknown-tool`` if it is not live, ``not-allowed`` if seed 001
                filtering excludes it (the message says why).
        """
        tool = self.tools.get(name)
        if tool is None:
            raise ToolCallError(UNKNOWN_TOOL, f"no live tool named {name!r}; see 'tghost tools'")
        if not seed001.is_available(tool.descriptor, groups, state):
            d = tool.descriptor
            raise ToolCallError("not-allowed", (
                f"tool {name!r} is in groups {list(d.group)} and available in states "
                f"{list(d.available_in_states or ['*'])}; the request has groups "
                f"{list(groups) if groups is not None else list(seed001.DEFAULT_GROUPS)} "
                f"and state {state or seed001.DEFAULT_STATE!r}"))
        return tool

    async def caller(self, descriptor: ToolServiceDescriptor) -> ToolServiceClient:
        """A started client for a service's queues, cached per service id (for ``--service`` calls)."""
        async with self._callers_lock:
            caller = self._callers.get(descriptor.id)
            if caller is None or (caller.request_queue, caller.response_queue) != (
                    descriptor.request_queue, descriptor.response_queue):
                assert self._client is not None, "start the directory first"
                caller = await ToolServiceClient(self._client, descriptor.request_queue,
                                                 descriptor.response_queue).start()
                self._callers[descriptor.id] = caller
            return caller

    async def stream(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        user: str | None = None,
        groups: Sequence[str] | None = None,
        state: str | None = None,
        timeout: float = 60.0,
    ) -> AsyncIterator[str]:
        """Invoke tool ``name`` and yield its observation chunks. The tool's config values go
        into the request's ``config``; ``groups``/``state`` are checked as in :meth:`check`.

        Raises:
            ToolCallError: not allowed, unknown, an error reply, or a timeout (seconds).
        """
        tool = self.check(name, groups, state)
        caller = await self.caller(tool.service.descriptor)
        async for chunk in caller.stream(tool.descriptor.config, arguments, user=user, timeout=timeout):
            yield chunk

    async def invoke(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        user: str | None = None,
        groups: Sequence[str] | None = None,
        state: str | None = None,
        timeout: float = 60.0,
    ) -> str:
        """Invoke tool ``name`` and return the observation string; as :meth:`stream`."""
        chunks = self.stream(name, arguments, user=user, groups=groups, state=state, timeout=timeout)
        return "".join([chunk async for chunk in chunks])


def _shape(tool: DirectoryTool | None) -> tuple[Any, ...] | None:
    """What a change event is about: the tool, its providers and its service's descriptor."""
    return None if tool is None else (tool.descriptor, tool.providers, tool.service.descriptor)


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
