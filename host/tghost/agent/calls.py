"""calls: the agent's calls by tool name. Checks seed 001 groups/state and the caller's
allowed groups against the live tool set, merges the tool's config values into the request,
calls its service over Pulsar and records each call. Never reads the announcement topic:
the directory hands it the live tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

import pulsar.asyncio

from tghost.agent.client import ToolCallError, ToolServiceClient, call_timeout
from tghost.agent.entries import DirectoryTool, ServiceEntry
from tghost.agent.ledger import Key, Ledger
from tghost.agent.liveness import NO_PROVIDER
from tghost.protocol import wire
from tghost.protocol.descriptors import ToolServiceDescriptor
from tghost.protocol.groups import DEFAULT_GROUPS, DEFAULT_STATE, WILDCARD, is_available, next_state
from tghost.protocol.sessions import SESSION_KEY
from tghost.protocol.trust import BAD_SIGNATURE, UNKNOWN_KEY, UNSIGNED, Signer, TrustedKeys

__all__ = [
    "CONFLICT", "GROUPS_EXCEED_ALLOWED", "NOT_AVAILABLE", "NO_PROVIDER", "UNAUTHORIZED", "UNKNOWN_TOOL",
    "CallOptions", "Installed", "NoProvider", "ToolCallListener", "ToolCallRecord", "ToolCalls", "UnknownTool",
    "described",
]

log = logging.getLogger(__name__)

# Why a call was refused before anything was sent (``ToolCalls.refusals``).
UNKNOWN_TOOL = "unknown-tool"
NOT_AVAILABLE = "not-available"
GROUPS_EXCEED_ALLOWED = "groups-exceed-allowed"
#: The tool's hosts announce that they do not admit this caller (docs/protocol.md §4.3 ``access``).
UNAUTHORIZED = "unauthorized"
#: Also the error type: another host claims the tool's name or its service id differently, and
#: nothing proves which claim is the real one (open mode; docs/protocol.md §4.8).
CONFLICT = "conflict"
#: How many close names an :class:`UnknownTool` suggests, at most.
SUGGESTIONS = 3
#: Seconds before a call was sent that a host's withdrawal of its service may come and still
#: count as a hand-off that may have lost it (docs/protocol.md §2.15): a draining host withdraws
#: first, then leaves the subscription once it sees another host on it (a few seconds at most).
WITHDRAWN_BEFORE = 10.0

#: What is installed where the caller runs: (kind, name) of each tool (``tool``) and tool
#: service (``tool-service``) of the installed plugins, e.g. from :mod:`tghost.discovery`.
Installed = Callable[[], Collection[Key]]


def described(kind: str, name: str) -> str:
    """``tool 'x'`` or ``tool service 'x'``: a ``kind`` (``tool``, ``tool-service``) and name in words."""
    return f"{'tool' if kind == 'tool' else 'tool service'} {name!r}"


class UnknownTool(ToolCallError):
    """No live tool is named :attr:`name`, and no host that the directory remembers, nor any
    installed plugin, has one (error type ``unknown-tool``).

    :attr:`suggestions` are the closest names, best first: the names it begins (shortest first),
    then the likeliest typos (:func:`difflib.get_close_matches`):
    live tools, and tools that no live host serves now (those are in :attr:`unserved` too).
    """

    def __init__(self, name: str, suggestions: Sequence[str] = (), unserved: Collection[str] = ()) -> None:
        self.name = name
        self.suggestions = tuple(suggestions)
        """The closest tool names, best first (at most three; empty: nothing is close)."""
        self.unserved = frozenset(unserved) & set(self.suggestions)
        """The suggestions that no live host serves now (known lately, or installed here)."""
        super().__init__(UNKNOWN_TOOL, self.explain("see 'tghost tools'"))

    def explain(self, hint: str) -> str:
        """The message, ending with ``hint`` (where to find the live tools)."""
        names = [f"{name!r}{' (no live host serves it)' if name in self.unserved else ''}"
                 for name in self.suggestions]
        mean = f"did you mean {' or '.join(names)}? " if names else ""
        return f"no live tool named {self.name!r}; {mean}{hint}"


class NoProvider(ToolCallError):
    """The tool (:attr:`kind` ``tool``) or tool service (``tool-service``) :attr:`name` is known,
    but no live host serves it (error type ``no-provider``): every host that announced it
    lately (:attr:`hosts`) withdrew it or let its lease expire, or (``hosts`` empty) its plugin
    is installed here and no host runs it. Nothing was sent: start a host that serves it
    (``tghost run``), or wait for one that is starting (:meth:`ToolDirectory.wait_for`,
    ``tghost call --wait``).

    Or, with :attr:`heard`, the call was sent but its hosts, live by their leases, answered none
    of its liveness probes (docs/protocol.md §2.15): they stopped without withdrawing (killed, or
    cut off from the broker). ``heard`` maps each to when the directory last heard it (unix
    seconds); ``service`` is the tool's service id.
    """

    def __init__(self, kind: str, name: str, hosts: Sequence[str] = (), untrusted: Mapping[str, str] | None = None,
                 heard: Mapping[str, float] | None = None, service: str | None = None) -> None:
        self.kind = kind
        self.name = name
        self.hosts = tuple(hosts)
        """The ids of the hosts that announced it lately (empty: it is only installed here)."""
        self.untrusted = dict(untrusted or {})
        """Host id -> why the trusted keys ignore it (``unsigned``, ``unknown-key``, ``bad-signature``), of
        the hosts that announce it unverified now (:meth:`tghost.agent.ledger.Ledger.ignored_hosts`)."""
        self.heard = dict(heard or {})
        """Host id -> when it was last heard (unix seconds), for hosts that stopped answering probes."""
        what = described(kind, name) + (f" (tool service {service!r})" if service else "")
        super().__init__(NO_PROVIDER, f"no live host serves {what}: {self._known()}. Start one ('tghost run' "
                                      "where its plugin is installed), or wait for one that is starting "
                                      "('tghost call --wait SECONDS', ToolDirectory.wait_for)")

    def _known(self) -> str:
        if self.heard:
            now = time.time()
            heard = ", ".join(f"{host} (last heard {max(0.0, now - at):.1f}s ago)" for host, at in self.heard.items())
            return (f"host(s) {heard} answered none of its liveness probes: stopped without withdrawing "
                    "(killed, or cut off from the broker)")
        if self.untrusted:
            return _ignored(self.untrusted)
        if self.hosts:
            return f"host(s) {', '.join(self.hosts)} announced it lately, and none serves it now"
        return "its plugin is installed here, but no host runs it"


#: How :func:`_ignored` says why trusted keys ignore a host, by the reason.
_IGNORED_AS = {UNSIGNED: "unsigned host(s)", UNKNOWN_KEY: "host(s) signed by a key not trusted",
               BAD_SIGNATURE: "host(s) with a bad signature"}


def _ignored(untrusted: Mapping[str, str]) -> str:
    """``2 unsigned host(s) serve it (a, b); --trusted-key ignores them``, of ``untrusted``
    (host id -> why the trusted keys ignore it)."""
    by_reason: dict[str, list[str]] = {}
    for host_id, reason in untrusted.items():
        by_reason.setdefault(reason, []).append(host_id)
    who = " and ".join(f"{len(hosts)} {_IGNORED_AS.get(reason, reason + ' host(s)')} ({', '.join(hosts)})"
                       for reason, hosts in sorted(by_reason.items()))
    return (f"{who} serve it; --trusted-key ignores them (sign their announcements with a trusted key: "
            "'tghost run --signing-key')")


@dataclass(frozen=True)
class ToolCallRecord:
    """What one :meth:`ToolCalls.invoke`/:meth:`~ToolCalls.stream` call came to, handed
    to every :data:`ToolCallListener` once it ends (audit, metrics).

    ``groups`` are the request's groups (``("default",)`` when it gave none), ``allowed_groups``
    the caller's permitted groups (``None``: not checked). ``state_before``/``state_after`` are
    seed 001 states; the state moves only on success (:func:`tghost.protocol.groups.next_state`).
    ``status`` is :data:`tghost.protocol.wire.OK`, ``cancelled`` (the caller stopped reading), the error type of a
    refusal or error reply (``unknown-tool``, ``not-allowed``, ``timeout``, ...), or the class
    name of any other exception. ``service`` is ``None`` when the tool is unknown. ``duration``
    is seconds from the call to its end.
    """

    tool: str
    service: str | None
    user: str | None
    groups: tuple[str, ...]
    allowed_groups: tuple[str, ...] | None
    state_before: str
    state_after: str
    status: str
    duration: float

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON-able dict (lists for tuples); never holds the arguments."""
        return {"tool": self.tool, "service": self.service, "user": self.user, "groups": list(self.groups),
                "allowed_groups": None if self.allowed_groups is None else list(self.allowed_groups),
                "state_before": self.state_before, "state_after": self.state_after,
                "status": self.status, "duration": self.duration}


class CallOptions(TypedDict, total=False):
    """The keyword options of a call by tool name, as :meth:`ToolCalls.stream` takes and documents
    them (docs/reference/agent-api.md "Call options"): ``invoke`` and the directory's ``invoke``/``stream``
    pass them on, and type checkers and editors know them by these names."""

    user: str | None
    groups: Sequence[str] | None
    state: str | None
    allowed_groups: Sequence[str] | None
    timeout: float | None
    progress: Callable[[wire.Progress], Any] | None


#: Called once per invoke/stream with its :class:`ToolCallRecord`. Must not block; an exception
#: is logged and the call goes on.
ToolCallListener = Callable[[ToolCallRecord], None]




class ToolCalls:
    """Calls tools by name over the live ``tools`` (a mapping the directory keeps current).

    ``listeners`` get one :class:`ToolCallRecord` per invoke/stream. A call refused before
    sending is counted in :attr:`refusals` by reason: :data:`UNKNOWN_TOOL`,
    :data:`NOT_AVAILABLE` (seed 001 group/state filtering), :data:`GROUPS_EXCEED_ALLOWED` or,
    with ``refuse_conflicts``, :data:`CONFLICT` (a contested tool, :attr:`DirectoryTool.contested`).
    ``client`` is the Pulsar client calls are made with, set by the directory once connected.
    ``services`` (id -> entry, kept current by the directory) name the hosts of each service, so
    a caller with an ``identity`` calls in sessions with them (docs/protocol.md §2.9). With
    ``trusted`` keys (signed announcements), every call also asks its hosts to sign their
    answers, and accepts only proven ones (§2.13).

    A name that is not live is :class:`NoProvider` (:data:`NO_PROVIDER`) if the ``ledger``
    remembers a host that announced it or it is ``installed`` here (asked only then), else
    :class:`UnknownTool` with the closest names.
    """

    def __init__(self, tools: Mapping[str, DirectoryTool], listeners: Sequence[ToolCallListener] = (),
                 refuse_conflicts: bool = True, identity: Signer | None = None,
                 services: Mapping[str, ServiceEntry] | None = None, ledger: Ledger | None = None,
                 installed: Installed | None = None, trusted: TrustedKeys | None = None) -> None:
        self.tools = tools
        self.trusted = trusted
        self.services = {} if services is None else services
        self.ledger = ledger
        self.installed = installed
        self.listeners = tuple(listeners)
        self.refuse_conflicts = refuse_conflicts
        self.identity = identity
        """The caller key every request is signed with (``None``: anonymous)."""
        self.client: pulsar.asyncio.Client | None = None
        self.refusals: Counter[str] = Counter()
        """Calls refused before anything was sent, by reason."""
        self._callers: dict[str, ToolServiceClient] = {}
        self._callers_lock = asyncio.Lock()

    async def close(self) -> None:
        """Close every service client (not ``client`` itself: the directory owns it)."""
        for caller in self._callers.values():
            await caller.close()
        self._callers.clear()

    def check(
        self,
        name: str,
        groups: Sequence[str] | None = None,
        state: str | None = None,
        allowed_groups: Sequence[str] | None = None,
    ) -> DirectoryTool:
        """The live tool ``name`` if a request with these groups and state may use it.

        ``allowed_groups`` are the groups the caller is permitted (seed 001 section 6.1;
        ``None``: not checked): the request's groups (``["default"]`` when ``None``) must be a
        subset of them; a requested ``"*"`` needs ``"*"`` allowed, and an allowed ``"*"``
        permits any group. A refusal is counted in :attr:`refusals`.

        Raises:
            ToolCallError: ``not-allowed`` if the request's groups exceed the allowed ones or
                seed 001 filtering excludes the tool, :class:`NoProvider` if it is known but
                not live, :class:`UnknownTool` if it is not known at all, ``conflict`` if it is
                contested and conflicts are refused (the message says why and names every side).
        """
        requested = list(DEFAULT_GROUPS if groups is None else groups)
        if allowed_groups is not None and (excess := _excess_groups(requested, allowed_groups)):
            raise self._refuse(GROUPS_EXCEED_ALLOWED, wire.NOT_ALLOWED, (
                f"requested groups {requested} exceed allowed {list(allowed_groups)} (not allowed: {excess})"))
        tool = self.tools.get(name)
        if tool is None:
            raise self._missing(name)
        if not is_available(tool.descriptor, groups, state):
            d = tool.descriptor
            raise self._refuse(NOT_AVAILABLE, wire.NOT_ALLOWED, (
                f"tool {name!r} is in groups {list(d.group)} and available in states "
                f"{list(d.available_in_states or ['*'])}; the request has groups {requested} "
                f"and state {state or DEFAULT_STATE!r}"))
        if not self.admits(tool):
            who = f"caller key {self.identity.key_id}" if self.identity else "an anonymous caller"
            raise self._refuse(UNAUTHORIZED, wire.UNAUTHORIZED, (
                f"tool {name!r} does not admit {who}: its hosts admit {tool.access()} (their [access] policy)"
                + ("; call with a caller key (--identity)" if self.identity is None else "")))
        if self.refuse_conflicts and tool.contested:
            raise self._refuse(CONFLICT, CONFLICT, _contest(tool))
        return tool

    def admits(self, tool: DirectoryTool) -> bool:
        """Whether the tool's hosts admit this caller (its :attr:`identity`; anonymous without one)."""
        return tool.admits(self.identity.key_id if self.identity else None)

    def _refuse(self, reason: str, error_type: str, message: str) -> ToolCallError:
        self.refusals[reason] += 1
        return ToolCallError(error_type, message)

    def _missing(self, name: str) -> ToolCallError:
        """Why no live tool is named ``name`` (counted): :class:`NoProvider` or :class:`UnknownTool`."""
        installed = self._installed()  # asked once per miss
        error = self._unserved("tool", name, installed) or self._unknown(name, installed)
        self.refusals[error.error_type] += 1
        return error

    def unserved(self, kind: str, name: str) -> NoProvider | None:
        """A :class:`NoProvider` for the ``tool`` or ``tool-service`` ``name`` if no live host
        serves it but one announced it lately (the ledger remembers it) or it is installed
        here; ``None`` if it is live, or not known at all."""
        return self._unserved(kind, name, self._installed())

    def live(self, kind: str) -> Mapping[str, Any]:
        """``kind`` ``tool``: the live tools by name; ``tool-service``: the live tool services by id
        (the directory keeps both current)."""
        return self.tools if kind == "tool" else self.services

    def _unserved(self, kind: str, name: str, installed: Collection[Key]) -> NoProvider | None:
        if name in self.live(kind):
            return None
        hosts = sorted(self.ledger.remembered((kind, name))) if self.ledger is not None else []
        ignored = self.ledger.ignored_hosts((kind, name), time.time()) if self.ledger is not None else {}
        if hosts or ignored or (kind, name) in installed:
            return NoProvider(kind, name, hosts, ignored)
        return None

    def _unknown(self, name: str, everywhere: Collection[Key]) -> UnknownTool:
        """An :class:`UnknownTool` suggesting the live or known tool names closest to ``name``
        (``everywhere``: what is installed here)."""
        installed = {n for k, n in everywhere if k == "tool"}
        lately = self.ledger.remembered_names("tool") if self.ledger is not None else set()
        known = self.tools.keys() | installed | lately
        completions = sorted((n for n in known if n.startswith(name)), key=lambda n: (len(n), n))
        typos = difflib.get_close_matches(name, _alike(name, known), 2 * SUGGESTIONS)
        close = completions + [n for n in typos if n not in completions]  # "calc": calculate, then crawl
        suggestions = [n for n in close if n in self.tools or n in installed
                       or (self.ledger is not None and self.ledger.remembered(("tool", n)))][:SUGGESTIONS]
        return UnknownTool(name, suggestions, [n for n in suggestions if n not in self.tools])

    def _installed(self) -> Collection[Key]:
        return () if self.installed is None else self.installed()

    async def caller(self, descriptor: ToolServiceDescriptor) -> ToolServiceClient:
        """A started client for a service's queues, cached per service id (for ``--service`` calls)."""
        async with self._callers_lock:
            caller = self._callers.get(descriptor.id)
            if caller is None or (caller.request_queue, caller.response_queue) != (
                    descriptor.request_queue, descriptor.response_queue):
                assert self.client is not None, "start the directory first"
                caller = await ToolServiceClient(self.client, descriptor.request_queue, descriptor.response_queue,
                                                 self.identity, lambda: self.session_keys(descriptor.id),
                                                 service_id=descriptor.id, trusted=self.trusted,
                                                 probes=lambda: self.probed(descriptor.id),
                                                 handed_off=lambda sent_at: self.handed_off(descriptor.id, sent_at)
                                                 ).start()
                self._callers[descriptor.id] = caller
            return caller

    def session_keys(self, service_id: str) -> list[str]:
        """The session keys that the live hosts of a service announce (docs/protocol.md §4.3)."""
        entry = self.services.get(service_id)
        if entry is None:
            return []
        return [key for p in entry.providers if isinstance(key := p.host.get(SESSION_KEY), str)]

    def probed(self, service_id: str) -> bool:
        """Whether calls of a service probe its hosts when slow to answer (docs/protocol.md §2.15):
        it has live providers, and each serves it itself and announces that it answers probes."""
        entry = self.services.get(service_id)
        return entry is not None and bool(entry.providers) and all(
            p.host.get(wire.PROBES) is True and not p.external for p in entry.providers)

    def handed_off(self, service_id: str, sent_at: float) -> int | None:
        """How many live hosts serve a service now, if one of its hosts withdrew it (a drain)
        at most :data:`WITHDRAWN_BEFORE` seconds before ``sent_at`` (unix seconds) or since;
        else ``None`` (docs/protocol.md §2.15)."""
        withdrawn = self.ledger.withdrawn.get(service_id) if self.ledger is not None else None
        entry = self.services.get(service_id)
        if withdrawn is None or entry is None or withdrawn < sent_at - WITHDRAWN_BEFORE:
            return None
        return len(entry.providers)

    def _silent(self, tool: DirectoryTool, request_id: str | None) -> NoProvider:
        """The :class:`NoProvider` of the call ``request_id`` of ``tool``, whose hosts answered no
        probe: each with when it was last heard (its lease renewed; one that expired meanwhile is
        only named)."""
        hosts = sorted({str(p.host.get("id")) for p in tool.service.providers})
        leases = self.ledger.hosts if self.ledger is not None else {}
        heard = {host: leases[host].heard for host in hosts if host in leases}
        error = NoProvider("tool", tool.descriptor.name, hosts, heard=heard, service=tool.service.descriptor.id)
        error.request_id = request_id
        return error

    async def stream(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        user: str | None = None,
        groups: Sequence[str] | None = None,
        state: str | None = None,
        allowed_groups: Sequence[str] | None = None,
        timeout: float | None = None,
        progress: Callable[[wire.Progress], Any] | None = None,
    ) -> AsyncIterator[str]:
        """Invoke tool ``name`` and yield its observation chunks. The tool's config values go
        into the request's ``config``; ``groups``/``state``/``allowed_groups`` are checked as
        in :meth:`check`. ``timeout`` is seconds for the whole call (``None``: the service's
        announced timeout, else 30; :func:`tghost.agent.client.call_timeout`). ``progress`` gets
        the tool's progress updates (a :class:`tghost.protocol.wire.Progress` each; a coroutine
        function is awaited; docs/protocol.md §2.12). Cancelling the task, or ``aclose()`` on
        the iterator, cancels the call on its host (§2.11). Every listener gets one
        :class:`ToolCallRecord` when the call ends.

        Raises:
            ToolCallError: not allowed, :class:`UnknownTool`, :class:`NoProvider`, an error reply, or
                a timeout (seconds).
        """
        started = time.perf_counter()
        known = self.tools.get(name)
        tool: DirectoryTool | None = None  # once allowed
        status = wire.OK
        try:
            tool = self.check(name, groups, state, allowed_groups)
            caller = await self.caller(tool.service.descriptor)
            wait = call_timeout(tool.service.descriptor, timeout)
            try:
                async with contextlib.aclosing(caller.stream(tool.descriptor.config, arguments, user=user,
                                                             timeout=wait, tool=name, progress=progress)) as chunks:
                    async for chunk in chunks:  # closed with this one: a caller that stops reading cancels the call
                        yield chunk
            except ToolCallError as exc:
                if exc.error_type == NO_PROVIDER:
                    raise self._silent(tool, exc.request_id) from None
                raise
        except ToolCallError as exc:
            status = exc.error_type
            raise
        except (asyncio.CancelledError, GeneratorExit):
            status = "cancelled"
            raise
        except Exception as exc:
            status = type(exc).__name__
            raise
        finally:
            before = state or DEFAULT_STATE
            self._notify(ToolCallRecord(
                tool=name, service=known.descriptor.service if known else None, user=user,
                groups=tuple(DEFAULT_GROUPS if groups is None else groups),
                allowed_groups=None if allowed_groups is None else tuple(allowed_groups),
                state_before=before,
                state_after=next_state(tool.descriptor, before, status == wire.OK) if tool else before,
                status=status, duration=time.perf_counter() - started))

    def _notify(self, record: ToolCallRecord) -> None:
        for listener in self.listeners:
            try:
                listener(record)
            except Exception:
                log.exception("call listener %r failed on a call of %r", listener, record.tool)

    async def invoke(self, name: str, arguments: dict[str, Any],
                     **options: Unpack[CallOptions]) -> str | dict[str, Any]:
        """Invoke tool ``name`` and return the observation string, all chunks joined, or, for a
        tool with an ``output-schema``, the JSON object it holds (a typed call: docs/protocol.md
        §2.14). The ``options`` (``user``, ``groups``, ``state``, ``allowed_groups``, ``timeout``,
        ``progress``) and the errors are :meth:`stream`'s (docs/reference/agent-api.md "Call
        options").

        Raises:
            ToolCallError: as :meth:`stream`; ``bad-request`` when a tool with an output schema
                answers something that is not a JSON object.
        """
        known = self.tools.get(name)
        text = "".join([chunk async for chunk in self.stream(name, arguments, **options)])
        if known is None or known.descriptor.output_schema is None:
            return text
        return structured(name, text)


def structured(name: str, text: str) -> dict[str, Any]:
    """The JSON object of tool ``name``'s observation ``text`` (a tool with an output schema).

    Raises:
        ToolCallError: ``bad-request``: the text is not a JSON object.
    """
    try:
        value = json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError):  # not JSON (NaN and Infinity are not), or nested past parsing
        value = None
    if not isinstance(value, dict):
        raise ToolCallError(wire.BAD_REQUEST, f"tool {name!r} has an output schema, but its host answered "
                                              f"something that is not a JSON object: {text[:200]!r}")
    return value


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


#: Names compared in full for a suggestion; past this many, only those of a like length and
#: first letter are (difflib's cost grows with the names, on the directory's event loop).
MAX_COMPARED = 2_000


def _alike(name: str, names: Collection[str]) -> Collection[str]:
    """``names``, or, if there are more than :data:`MAX_COMPARED`, those that could be a typo of
    ``name``: the same first letter and at most a third longer or shorter."""
    if len(names) <= MAX_COMPARED:
        return names
    slack = max(2, len(name) // 3)
    return [n for n in names if n[:1] == name[:1] and abs(len(n) - len(name)) <= slack]


def _contest(tool: DirectoryTool) -> str:
    """Why a contested tool is not called: every side of its conflicts."""
    first, *others = (side.describe() for side in tool.sides())
    return (f"tool {tool.descriptor.name!r} is claimed by conflicting announcements: {first} (seen first); "
            f"{'; '.join(others)}. Calling none of them: without trusted keys nothing proves which is real. Stop "
            "the host that should not announce it (or make their descriptors agree), or sign announcements "
            "(tghost keygen, --signing-key, --trusted-key)")


def _excess_groups(requested: Sequence[str], allowed: Sequence[str]) -> list[str]:
    """The requested groups that ``allowed`` does not permit (seed 001 section 6.1)."""
    if WILDCARD in allowed:
        return []
    return [group for group in requested if group not in allowed]
