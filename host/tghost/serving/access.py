"""access: a host's gate between a decoded request and ``invoke`` when it has an ``[access]``
policy (docs/protocol.md §2.8, §2.9): who sent the request (a caller's signature, or its
session's MAC for this host, checked against the policy's keys, within a time window, never
twice), whether that caller may call the tool the request's config values name, and whether it
is within its rate. Then, with or without a policy, the :class:`Fleet` check: while the other
live providers of a service announce another access policy, a caller only where they all admit it.

Never runs plugin code and never answers a request: it says why one is refused.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from limits import parse
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from tghost.protocol import callers as signed
from tghost.protocol import sessions, wire
from tghost.protocol.access import ANONYMOUS, NO_POLICY, AccessPolicy, CallerGrant, policy_fingerprint, tools_for
from tghost.protocol.callers import Caller
from tghost.protocol.descriptors import ToolDescriptor
from tghost.protocol.sessions import HostSessionKey, OpenSession
from tghost.serving.replays import SharedReplays
from tghost.system.logs import LogSummary

__all__ = ["WINDOW", "Fleet", "Gate", "Peers", "Refused"]

log = logging.getLogger(__name__)

#: Seconds a signed request may be from the host's clock; a signature is accepted once within it.
WINDOW = 60.0
#: Seconds a host waits for its mark of a request to come back from the service's replay record.
MARK_TIMEOUT = 10.0
#: Caller sessions a gate keeps open at most; the oldest is dropped (and opened again if used).
MAX_SESSIONS = 10_000


class Refused(Exception):
    """A request the gate does not let through: ``error_type`` (``unauthorized`` or
    ``rate-limited``, :mod:`tghost.protocol.wire`) and the text of the reply. ``replay``: the
    request is a copy of one a host took, so its refusal goes out unproven (docs/protocol.md
    §2.13): proven, it would end the call of the caller it was copied from."""

    def __init__(self, error_type: str, text: str, replay: bool = False) -> None:
        super().__init__(text)
        self.error_type = error_type
        self.replay = replay


class _Seen:
    """Signatures accepted within the window, by (key id, request id): a replay is refused.
    Thread-safe; holds at most what one window brings. One host's memory only: a service
    served through an endpoint shares its record with its other hosts (:meth:`Gate.share`)."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._lock = threading.Lock()

    def first_time(self, key: tuple[str, str], now: float) -> bool:
        with self._lock:
            while self._seen and next(iter(self._seen.values())) < now - 2 * self.window:
                self._seen.popitem(last=False)
            if key in self._seen:
                return False
            self._seen[key] = now
            return True


class _Sessions:
    """Caller sessions this host has opened, by their (binding, signature) properties: a
    binding's Ed25519 signature is verified once. Thread-safe; at most :data:`MAX_SESSIONS`."""

    def __init__(self) -> None:
        self._open: OrderedDict[tuple[str, str], OpenSession] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> OpenSession | None:
        return self._open.get(key)

    def __len__(self) -> int:
        return len(self._open)

    def add(self, key: tuple[str, str], session: OpenSession) -> None:
        with self._lock:
            self._open[key] = session
            while len(self._open) > MAX_SESSIONS:
                self._open.popitem(last=False)


class Gate:
    """The access checks of one host's services under ``policy``. ``tools`` are the host's
    tools (name -> descriptor): a request could be for any tool over its service whose config
    values it carries, and is allowed only to a caller the policy allows every one. ``session``
    is the host's key for caller sessions (announced as its ``session-key``; a new one if not
    given). ``window``: seconds (see :data:`WINDOW`)."""

    def __init__(self, policy: AccessPolicy, tools: Mapping[str, ToolDescriptor],
                 session: HostSessionKey | None = None, window: float = WINDOW) -> None:
        self.policy = policy
        self.tools = tools
        self.session = session or HostSessionKey()
        self.window = window
        self._seen = _Seen(window)
        self._shared: dict[str, SharedReplays] = {}
        self._sessions = _Sessions()
        self._rates = {key: parse(grant.rate) for key, grant in policy.callers.items() if grant.rate}
        # the in-memory storage runs a timer thread: only a policy with rates needs one
        self._limiter = MovingWindowRateLimiter(MemoryStorage()) if self._rates else None
        self._limiting = threading.Lock()  # limits' MemoryStorage starts its expiry timer unlocked
        self._refused = LogSummary(log, "refused %(count)d request(s) under this host's [access] policy: "
                                        "%(reason)s (e.g. %(example)s)")

    def share(self, topic: str, record: SharedReplays) -> None:
        """Check replays of requests on ``topic`` in ``record``, the replay record the service's
        hosts share (docs/protocol.md §2.8), instead of this host's memory (in place of the
        record shared before: a new endpoint of the same service takes over)."""
        self._shared[topic] = record

    def unshare(self, topic: str, record: SharedReplays) -> None:
        """Stop checking ``topic``'s replays in ``record``; nothing changes when the gate holds
        another record for it now (the endpoint that took the service over shares its own)."""
        if self._shared.get(topic) is record:
            del self._shared[topic]

    @property
    def open_sessions(self) -> int:
        """Caller sessions this gate has verified and keeps (docs/protocol.md §2.9)."""
        return len(self._sessions)

    @classmethod
    def of(cls, policy: AccessPolicy | None, tools: Mapping[str, ToolDescriptor],
           session: HostSessionKey | None = None) -> Gate | None:
        """The gate of a host's ``[access]`` ``policy`` over its ``tools`` (read live: a plugin
        installed later is gated too), with the host's ``session`` key; ``None`` without a policy."""
        return None if policy is None else cls(policy, tools, session)

    def admit(self, service: str, config: Mapping[str, Any], properties: Mapping[str, str], body: bytes,
              topic: str) -> Caller | None:
        """The verified caller of a request to ``service`` (``None``: anonymous), if the policy
        lets it call every tool the request could be for now: each tool over ``service`` whose
        config values ``config`` carries (at least one).

        Raises:
            Refused: a bad or replayed signature or MAC, a caller the policy does not know or
                does not allow every such tool (the text names those it may not call), or a
                caller over its rate (the text says which, and what to do); ``unknown-session``
                for a session request without a MAC for this host (the caller resends it
                signed). Each other refusal is summarised in the log, one line per reason at
                most once a minute.
        """
        try:
            return self._admit(service, config, properties, body, topic)
        except Refused as refused:
            if refused.error_type != wire.UNKNOWN_SESSION:  # not a fault: the caller resends it signed
                self._refused.add(refused.error_type, str(refused))
                self._refused.flush()
            raise

    def _admit(self, service: str, config: Mapping[str, Any], properties: Mapping[str, str], body: bytes,
               topic: str) -> Caller | None:
        grant = self._verify(properties, body, topic)
        tools = tools_for(self.tools, service, config)
        refused = self.policy.refused(grant, tools)
        if refused or not tools:
            raise Refused(wire.UNAUTHORIZED, _refusal(grant, service, tools, refused))
        if grant is not None:
            self._within_rate(grant)
            return Caller(grant.name, grant.key_id)
        return None

    def _verify(self, properties: Mapping[str, str], body: bytes, topic: str) -> CallerGrant | None:
        key_id = signed.caller_key_id(properties)
        if key_id is None:
            return None
        grant = self.policy.callers.get(key_id)
        if grant is None:
            raise Refused(wire.UNAUTHORIZED, f"caller key {key_id!r} is not in this host's [access] policy")
        now = time.time()
        if sessions.SESSION in properties:
            checked = self._verify_session(grant, properties, body, topic, now)
        else:
            checked = signed.verify_request(grant.key, properties, body, topic, now, self.window)
        if isinstance(checked, str):
            raise Refused(wire.UNAUTHORIZED, f"caller {grant.name!r}: {checked}")
        if not self._first_time(topic, key_id, properties["id"], properties.get(signed.SIGNED_AT, ""), now):
            raise Refused(wire.UNAUTHORIZED, f"caller {grant.name!r}: request {properties['id']!r} was already "
                                        "received (a replay); send each request with a new id", replay=True)
        return grant

    def _first_time(self, topic: str, key_id: str, request_id: str, signed_at: str, now: float) -> bool:
        """Whether no host of the service took this request before (this host's memory alone
        when the service's hosts share no record). Blocks on the shared record's broker."""
        record = self._shared.get(topic)
        if record is None:
            return self._seen.first_time((key_id, request_id), now)
        try:
            return record.mark(key_id, request_id, signed_at, MARK_TIMEOUT)
        except TimeoutError as exc:
            raise Refused(wire.UNAVAILABLE, f"{exc}: the request did not run, since no host can tell whether "
                                            "it ran before; retry with a new id") from None

    def _opened(self, grant: CallerGrant, properties: Mapping[str, str], now: float) -> OpenSession | str:
        """The caller session of a request's binding, verified once and kept; or why it is refused."""
        key = (properties[sessions.SESSION], properties.get(sessions.SESSION_SIGNATURE, ""))
        session = self._sessions.get(key)
        if session is None:
            opened = sessions.open_session(self.session, grant.key, grant.key_id, properties, now)
            if isinstance(opened, str):
                return opened
            self._sessions.add(key, session := opened)
        return session

    def session_mac(self, properties: Mapping[str, str]) -> hmac.HMAC | None:
        """An HMAC keyed with the key this host shares with the request's caller session (its
        binding verified with the policy's key for the caller), to prove this host's answers
        with (docs/protocol.md §2.13); ``None`` without a session that verifies."""
        key_id = signed.caller_key_id(properties)
        grant = self.policy.callers.get(key_id) if key_id is not None else None
        if grant is None or sessions.SESSION not in properties:
            return None
        session = self._opened(grant, properties, time.time())
        return None if isinstance(session, str) else session.mac

    def _verify_session(self, grant: CallerGrant, properties: Mapping[str, str], body: bytes, topic: str,
                        now: float) -> float | str:
        """A session request's MAC for this host (docs/protocol.md §2.9): the unix time it was
        sent, or why it is refused."""
        session = self._opened(grant, properties, now)
        if isinstance(session, str):
            return session
        if session.expires < now:
            return "the request's session has expired: start a new one"
        verified = sessions.verify_mac(session, self.session.fingerprint, properties, body, topic)
        if verified is None and signed.SIGNATURE in properties:  # resent signed, for a host it did not know
            return signed.verify_request(grant.key, properties, body, topic, now, self.window)
        if verified is None:
            raise Refused(wire.UNKNOWN_SESSION, f"caller {grant.name!r}: the request's session has no MAC for this "
                                               f"host (key {self.session.fingerprint}); resend it with a signature")
        if not verified:
            return "the request's MAC does not verify (tampered, or sent for another topic)"
        return signed.signed_within(properties.get(signed.SIGNED_AT, ""), now, self.window)

    def signed_by(self, caller: Caller, properties: Mapping[str, str], body: bytes, topic: str) -> bool:
        """Whether ``properties`` carry ``caller``'s valid signature (docs/protocol.md §2.8) of
        ``body`` on ``topic``, made within the window (a cancel of its own call, §2.11)."""
        grant = self.policy.callers.get(caller.key_id)
        if grant is None or signed.caller_key_id(properties) != caller.key_id:
            return False
        return not isinstance(signed.verify_request(grant.key, properties, body, topic, time.time(), self.window), str)

    def _within_rate(self, grant: CallerGrant) -> None:
        rate = self._rates.get(grant.key_id)
        if rate is None or self._limiter is None:
            return
        with self._limiting:  # checks run on several threads at once (the thread lane, marks)
            if self._limiter.hit(rate, grant.key_id):
                return
            reset = self._limiter.get_window_stats(rate, grant.key_id).reset_time
        raise Refused(wire.RATE_LIMITED, f"caller {grant.name!r} is over its rate of {grant.rate} on this host; "
                                    f"retry in {max(reset - time.time(), 0):.1f}s")


def _refusal(grant: CallerGrant | None, service: str, tools: Sequence[str], refused: Sequence[str]) -> str:
    """Why a request to ``service`` that could be for any of ``tools`` is refused to ``grant``
    (``None``: anonymous), who may not call ``refused`` of them, and what to do."""
    who = ANONYMOUS if grant is None else f"caller {grant.name!r}"
    if not tools:
        return (f"{who} may not call service {service!r} with these config values on this host: no tool of its "
                "has them; send one tool's own config values and no other tool's (tghost tools --json shows them)")
    what = f"tool {refused[0]!r}" if len(refused) == 1 else f"tools {', '.join(refused)}"
    text = f"{who} may not call {what} on this host (its [access] policy)"
    if len(tools) > 1:
        text += (f", and a request to service {service!r} with these config values could be for any of "
                 f"{', '.join(tools)}: it is allowed only to a caller granted every one")
    return text + ("; sign requests with a caller key (--identity)" if grant is None
                   else "; ask this host's operator to grant it in [access]")


class Peers(Protocol):
    """What the other live providers of a service announce, as this host's own directory of its
    announcement topics sees them (docs/protocol.md §4.3): read from worker threads."""

    def policies(self, service: str) -> set[str | None]:
        """The ``access-policy`` each other live provider of ``service`` announces (``None``: one
        that announces none); empty when no other host provides it."""
        ...

    def forbidding(self, tool: str, key_id: str | None) -> str | None:
        """The id of another live provider of ``tool`` whose announced ``access`` does not admit a
        caller with ``key_id`` (``None``: anonymous), else ``None``."""
        ...


class Fleet:
    """One policy per service (docs/protocol.md §2.8): this host admits a request only where
    every other live provider of its service would, while they announce another access policy
    than this host's (``policy``, ``None``: none, over its ``tools``, name -> descriptor, read
    live). A host without a policy cannot verify a caller key, so it takes every caller as
    anonymous. ``peers`` is set once the host follows its announcement topics; until then the
    check lets every request through."""

    def __init__(self, policy: AccessPolicy | None, tools: Mapping[str, ToolDescriptor]) -> None:
        self.policy = policy
        self.tools = tools
        self.peers: Peers | None = None
        self._own: dict[str, tuple[tuple[tuple[str, ToolDescriptor], ...], str]] = {}

    def own(self, service: str) -> str:
        """The ``access-policy`` this host announces for ``service``: computed again only when
        its tools changed (a name, or a descriptor object), not per request."""
        if self.policy is None:
            return NO_POLICY
        tools = tuple(self.tools.items())  # one C-level copy; compared by identity first
        cached = self._own.get(service)
        if cached is not None and cached[0] == tools:
            return cached[1]
        fingerprint = policy_fingerprint(self.policy, dict(tools), service)
        self._own[service] = (tools, fingerprint)
        return fingerprint

    def check(self, service: str, config: Mapping[str, Any], caller: Caller | None) -> None:
        """Nothing when the other live providers of ``service`` announce this host's access
        policy (or there are none), or when they all admit ``caller`` (``None``: anonymous) to every
        tool a request with ``config`` could be for (:func:`tools_for`).

        Raises:
            Refused: ``unauthorized``, naming the tool, the host whose policy forbids it and what
                to do; also a request that is for no tool of this host.
        """
        peers = self.peers
        if peers is None:
            return
        others = peers.policies(service)
        if not others or others == {self.own(service)}:
            return
        key_id = caller.key_id if caller is not None and self.policy is not None else None
        tools = tools_for(self.tools, service, config)
        if not tools:
            raise Refused(wire.UNAUTHORIZED, _refusal(None, service, tools, []))
        for tool in tools:
            host = peers.forbidding(tool, key_id)
            if host is not None:
                raise Refused(wire.UNAUTHORIZED, self._refusal(caller, tool, service, host))

    def _refusal(self, caller: Caller | None, tool: str, service: str, host: str) -> str:
        who = ANONYMOUS if caller is None or self.policy is None else f"caller {caller.name!r}"
        mine = ("this host has no [access] policy, so it takes every caller as anonymous" if self.policy is None
                else "this host's [access] policy is another")
        return (f"{who} may not call tool {tool!r}: host {host}'s [access] policy for service {service!r} forbids "
                f"it, and {mine}; every host of a service admits only what all of them admit until their "
                "policies agree: give every host of the service the same [access] policy")
