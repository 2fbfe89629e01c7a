"""conformance: check that any tool service, tghost's or another implementation's, answers per
the wire contract (docs/protocol.md §2), by speaking the wire by hand (:class:`RawWire`).

Never uses tghost's own client or server code to judge a service: only raw Pulsar messages.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from tghost.protocol import wire
from tghost.protocol.descriptors import ToolServiceDescriptor
from tghost.pulsar import hop
from tghost.pulsar.clients import PulsarSettings

__all__ = ["Conformance", "Finding", "RawWire", "Reply", "check_conformance"]


@dataclass(frozen=True)
class Reply:
    """One message read from a response queue: its properties and payload bytes."""

    properties: dict[str, str]
    data: bytes

    def json(self) -> Any:
        """The payload decoded as JSON.

        Raises:
            ValueError: the payload is not UTF-8 JSON.
        """
        return json.loads(self.data)


class RawWire:
    """Speaks the wire by hand, to check a service against the contract itself.

    ``async with RawWire(url, descriptor) as raw:`` subscribes to the response queue (before
    any request: a non-persistent topic keeps nothing), then :meth:`send` publishes any bytes
    with any message properties, and :meth:`replies` collects the decoded JSON replies that
    carry one ``id`` property, up to ``end_of_stream``. From the first :meth:`replies` (or
    :meth:`raw_replies`) on, every reply is kept by its ``id``, so several requests may be in
    flight at once; until then :attr:`consumer` is free to read directly.
    """

    def __init__(self, url: str, descriptor: ToolServiceDescriptor) -> None:
        self.pulsar = PulsarSettings(url)
        self.descriptor = descriptor
        self._by_id: dict[str, list[Reply]] = defaultdict(list)
        self._arrived = asyncio.Condition()

    async def __aenter__(self) -> RawWire:
        self.client = await self.pulsar.connect()
        self.consumer = await self.client.subscribe(self.descriptor.response_queue, f"raw-{uuid.uuid4().hex}")
        self.producer = await self.client.create_producer(self.descriptor.request_queue, batching_enabled=False)
        self._collect: asyncio.Task[None] | None = None
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._collect is not None:
            self._collect.cancel()
        await hop.leave(self.consumer)
        await self.client.close()

    async def _receive(self) -> None:
        while True:
            message = await self.consumer.receive()
            await self.consumer.acknowledge(message)
            async with self._arrived:
                self._by_id[message.properties().get("id", "")].append(Reply(message.properties(), message.data()))
                self._arrived.notify_all()

    async def send(self, payload: bytes, properties: dict[str, str]) -> None:
        """Publish ``payload`` (bytes, sent as they are) on the request queue."""
        await self.producer.send(payload, properties=properties)

    async def request(
        self, arguments: dict[str, Any], config: dict[str, Any] | None = None, user: str | None = "test"
    ) -> list[tuple[dict[str, str], dict[str, Any]]]:
        """Send one well-formed request envelope with a fresh ``id``; return :meth:`replies` for it."""
        request_id = uuid.uuid4().hex
        await self.send(wire.encode_request(user, config or {}, arguments), {"id": request_id})
        return await self.replies(request_id)

    async def raw_replies(self, request_id: str, timeout: float = 10.0, settle: float = 0.0,
                          ends: int = 1) -> list[Reply]:
        """Every reply carrying ``id == request_id``, up to the ``ends``-th whose payload says
        ``end_of_stream`` (or is not a JSON object saying it is not), plus any that came within
        ``settle`` seconds after it. ``ends`` above 1: the id was sent more than once (a replay,
        a copy), and each copy's last reply is awaited.

        Raises:
            TimeoutError: no reply came within ``timeout`` seconds of the previous one.
        """
        if self._collect is None:
            self._collect = asyncio.create_task(self._receive(), name="raw wire replies")
        async with self._arrived:
            got = self._by_id[request_id]
            while sum(_ends(reply) for reply in got) < ends:
                await asyncio.wait_for(self._arrived.wait_for(_longer_than(got, len(got))), timeout)
        if settle:
            await asyncio.sleep(settle)
        return list(self._by_id[request_id])

    async def replies(self, request_id: str, timeout: float = 10.0) -> list[tuple[dict[str, str], dict[str, Any]]]:
        """The replies carrying ``id == request_id``, as (properties, JSON body) pairs, up to the first
        with ``end_of_stream`` true.

        Raises:
            TimeoutError: no reply came within ``timeout`` seconds of the previous one.
            ValueError: a reply is not JSON.
        """
        got = await self.raw_replies(request_id, timeout)
        end = next(i for i, reply in enumerate(got) if _ends(reply))
        return [(reply.properties, reply.json()) for reply in got[:end + 1]]


def _longer_than(replies: list[Reply], count: int) -> Callable[[], bool]:
    return lambda: len(replies) > count


def _ends(reply: Reply) -> bool:
    """Whether a reply closes its stream: ``end_of_stream`` true, or a payload that cannot say otherwise."""
    try:
        body = reply.json()
    except ValueError:
        return True
    return not isinstance(body, dict) or body.get("end_of_stream") is not False


@dataclass(frozen=True)
class Finding:
    """One rule checked: ``level`` is the RFC 2119 keyword of the rule in docs/protocol.md."""

    rule: str
    level: Literal["MUST", "SHOULD"]
    passed: bool
    detail: str = ""


@dataclass
class Conformance:
    """What :func:`check_conformance` found for the service on ``request_queue``."""

    request_queue: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every MUST rule passed (SHOULD rules are advice)."""
        return all(f.passed for f in self.findings if f.level == "MUST")

    @property
    def failures(self) -> list[Finding]:
        """The rules that did not pass, MUST and SHOULD."""
        return [f for f in self.findings if not f.passed]

    def add(self, rule: str, level: Literal["MUST", "SHOULD"], passed: bool, detail: str = "") -> bool:
        self.findings.append(Finding(rule, level, passed, detail))
        return passed

    def __str__(self) -> str:
        lines = [f"wire conformance of {self.request_queue}: {'ok' if self.ok else 'FAILS'}"]
        lines += [f"  {'pass' if f.passed else 'FAIL'} {f.level:<6} {f.rule}" + (f": {f.detail}" if f.detail else "")
                  for f in self.findings]
        return "\n".join(lines)


#: Seconds to keep listening after a stream ended, for replies that should not come.
SETTLE = 0.5


async def check_conformance(
    url: str,
    descriptor: ToolServiceDescriptor,
    arguments: dict[str, Any],
    config: dict[str, Any] | None = None,
    *,
    timeout: float = 10.0,
) -> Conformance:
    """Call the tool service that ``descriptor`` names (its queues) over the broker at ``url``
    with raw messages, and check each rule of the wire contract (docs/protocol.md §2).

    ``arguments`` and ``config`` must make a valid call of the service (the check sends them
    several ways). ``timeout`` is seconds to wait for each reply. Returns every
    :class:`Finding`; :attr:`Conformance.ok` is true when every MUST rule passed, and
    ``str()`` of the result is a readable report, so ``assert result.ok, result`` reads well
    in a test.

    Raises:
        pulsar.asyncio.PulsarException: the broker refused the subscription or producer.
    """
    result = Conformance(descriptor.request_queue)
    config = config or {}
    async with RawWire(url, descriptor) as raw:
        replies = await _call(raw, wire.encode_request("conformance", config, arguments), timeout, result)
        if replies is not None:
            _check_stream(replies, result, "a well-formed request")
            result.add("§2.5 a valid call is answered without an error", "SHOULD", _error(replies) is None,
                       f"it was answered {_error(replies)} (are the sample arguments and config valid?)"
                       if _error(replies) else "")
        await _check_correlation(raw, config, arguments, timeout, result)
        no_user = json.dumps({"config": json.dumps(config), "arguments": json.dumps(arguments)}).encode()
        await _check_accepted(raw, no_user, timeout, result, "§2.3 a request without 'user' is served")
        extra = json.dumps({"user": "conformance", "config": json.dumps(config), "arguments": json.dumps(arguments),
                            "x-conformance": {"ignore": True}}).encode()
        await _check_accepted(raw, extra, timeout, result, "§2.3 unknown request keys are ignored")
        await _check_bad_request(raw, timeout, result)
    return result


async def _call(raw: RawWire, payload: bytes, timeout: float, result: Conformance) -> list[Reply] | None:
    """Send ``payload`` with a fresh id; its replies, or ``None`` (recorded as a failure) if none came."""
    request_id = uuid.uuid4().hex
    await raw.send(payload, {"id": request_id})
    try:
        replies = await raw.raw_replies(request_id, timeout, SETTLE)
    except TimeoutError:
        result.add("§2.4 a request with an 'id' is answered with that 'id'", "MUST", False,
                   f"no reply with id {request_id} within {timeout}s")
        return None
    return replies


def _check_stream(replies: list[Reply], result: Conformance, what: str) -> bool:
    """The envelope and stream rules for the replies to one request."""
    result.add("§2.4 a request with an 'id' is answered with that 'id'", "MUST", True, what)
    bodies: list[dict[str, Any]] = []
    for reply in replies:
        try:
            body = reply.json()
        except ValueError as exc:
            return result.add("§2.5 every response is a UTF-8 JSON object", "MUST", False, f"not JSON: {exc}")
        if not isinstance(body, dict):
            return result.add("§2.5 every response is a UTF-8 JSON object", "MUST", False,
                              f"a JSON {type(body).__name__}")
        bodies.append(body)
    shape = [problem for body in bodies for problem in _shape_problems(body)]
    result.add("§2.5 every response has 'error', 'response' (string) and 'end_of_stream' (boolean)", "MUST",
               not shape, "; ".join(shape[:3]))
    ends = [i for i, body in enumerate(bodies) if body.get("end_of_stream") is True]
    result.add("§2.5 a stream ends with exactly one response whose end_of_stream is true, and nothing after it",
               "MUST", ends == [len(bodies) - 1],
               f"{len(bodies)} response(s), end_of_stream true at {ends}" if ends != [len(bodies) - 1] else
               f"{len(bodies)} response(s)")
    errors = [body for body in bodies if body.get("error") not in (None, {})]
    bad = [e for e in errors if not _is_error(e)]
    result.add("§2.6 an error is {type, message} strings, with response '' and end_of_stream true, last",
               "MUST", not bad and all(e is bodies[-1] for e in errors), json.dumps(bad[:1])[:200] if bad else "")
    return not shape


def _shape_problems(body: dict[str, Any]) -> list[str]:
    problems = []
    if "error" not in body or not (body["error"] is None or isinstance(body["error"], dict)):
        problems.append(f"'error' is {body.get('error', 'missing')!r}, not null or an object")
    if not isinstance(body.get("response"), str):
        problems.append(f"'response' is {type(body.get('response')).__name__}, not a string")
    if not isinstance(body.get("end_of_stream"), bool):
        problems.append(f"'end_of_stream' is {body.get('end_of_stream', 'missing')!r}, not a boolean")
    return problems


def _is_error(body: dict[str, Any]) -> bool:
    error = body["error"]
    return (isinstance(error, dict) and isinstance(error.get("type"), str) and isinstance(error.get("message"), str)
            and body.get("response") == "" and body.get("end_of_stream") is True)


def _error(replies: list[Reply]) -> str | None:
    """The error type of the last reply, or ``None``."""
    try:
        error = replies[-1].json().get("error")
    except (ValueError, AttributeError):
        return "an undecodable reply"
    return None if not error else f"with error {error.get('type') if isinstance(error, dict) else error!r}"


async def _check_correlation(raw: RawWire, config: dict[str, Any], arguments: dict[str, Any], timeout: float,
                             result: Conformance) -> None:
    """Two requests at once: each id gets its own complete stream (callers share the response topic)."""
    ids = [uuid.uuid4().hex, uuid.uuid4().hex]
    payload = wire.encode_request("conformance", config, arguments)
    await asyncio.gather(*(raw.send(payload, {"id": request_id}) for request_id in ids))
    started = time.monotonic()
    try:
        streams = await asyncio.gather(*(raw.raw_replies(request_id, timeout) for request_id in ids))
    except TimeoutError:
        result.add("§2.4 concurrent requests are each answered under their own 'id'", "MUST", False,
                   f"not both answered within {time.monotonic() - started:.1f}s")
        return
    result.add("§2.4 concurrent requests are each answered under their own 'id'", "MUST",
               all(streams), f"{[len(s) for s in streams]} response(s)")


async def _check_accepted(raw: RawWire, payload: bytes, timeout: float, result: Conformance, rule: str) -> None:
    replies = await _call(raw, payload, timeout, result)
    if replies is None:
        return
    error = _error(replies)
    result.add(rule, "MUST", error is None or wire.BAD_REQUEST not in error, error or "")


async def _check_bad_request(raw: RawWire, timeout: float, result: Conformance) -> None:
    """Undecodable bytes with an id: answered with an error (``bad-request``), never left hanging."""
    request_id = uuid.uuid4().hex
    await raw.send(b"\xff this is not JSON", {"id": request_id})
    try:
        replies = await raw.raw_replies(request_id, timeout)
    except TimeoutError:
        result.add("§2.6 an undecodable request with an 'id' is answered with an error", "SHOULD", False,
                   f"no reply within {timeout}s")
        return
    error = _error(replies)
    result.add("§2.6 an undecodable request with an 'id' is answered with an error", "SHOULD",
               error is not None, error or "answered without an error")
    result.add("§2.6 an undecodable request is answered with type 'bad-request'", "SHOULD",
               error is not None and wire.BAD_REQUEST in error, error or "")
