"""request: one request's way through a tool service, written once (docs/protocol.md §2).

admit -> check -> invoke -> answer -> settle. The drivers (:class:`tghost.serving.driver.Driver`)
take a request along it, and none calls into another:

- the event loop (:class:`tghost.serving.loop.LoopDriver`): ``async def`` tools, process
  isolation and persistent topics;
- the thread lane (:class:`tghost.serving.lane.ThreadLane`): a plain ``def`` tool on a
  non-persistent topic under an access policy, served from the C++ listener thread on the
  service's worker threads;
- the inline driver (:class:`tghost.serving.inline.InlineDriver`): the lane of such a tool
  without an access policy, receiving on a thread of the service's own and running short calls
  there.

What they share is here: the service's :class:`Terms` (limits, the checks before ``invoke``,
the texts of refusals and the reply an exception comes to, :meth:`Terms.failure`), one
:class:`Request` in flight (exactly one last reply; a stream's window of unconfirmed chunks),
and the :class:`Port` to Pulsar (send, acknowledge, settle).

Never runs plugin code itself: the executors do.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pulsar
import pulsar.asyncio

from tghost.author.hookspecs import Authorize
from tghost.author.service import Call, ToolError, ToolService
from tghost.protocol import wire
from tghost.protocol.answers import PROVE, AnswerProof, body_digest
from tghost.protocol.callers import CALLER, SIGNED_AT, Caller
from tghost.protocol.descriptors import ToolServiceDescriptor
from tghost.protocol.trust import Signer
from tghost.pulsar import hop
from tghost.serving.access import Fleet, Gate, Refused
from tghost.serving.executors.base import WorkerRaised
from tghost.serving.settings import FULL, TYPE
from tghost.system import tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = [
    "FAILURES",
    "NOT_STARTED",
    "RETURNED",
    "UNANSWERABLE",
    "CallListener",
    "CallRecord",
    "ChunkNotSent",
    "NotStarted",
    "Port",
    "Prover",
    "Request",
    "Terms",
]

log = logging.getLogger(__name__)

#: ``CallRecord.status`` of a request without an ``id`` property: acknowledged, never answered.
UNANSWERABLE = "unanswerable"
#: ``CallRecord.status`` of a persistent request cut off by shutdown: left unacknowledged and
#: unanswered, so the broker delivers it to another host.
RETURNED = "returned"
#: The cancel message of a request cancelled by shutdown while it waited for a slot.
NOT_STARTED = "not started"
#: What a call's checks or plugin code may raise that is answered as an error (:meth:`Terms.failure`):
#: every exception, and ``SystemExit``, which a tool (or a command-line library it calls) may raise,
#: and which is the plugin's, not a reason for the host or a thread of it to end.
FAILURES = (Exception, SystemExit)
#: Seconds between two progress updates of one call sent to its caller (more are dropped).
PROGRESS_INTERVAL = 0.1
_UNKNOWN = object()  # a request's proof before its first answer looks it up


@dataclass
class CallRecord:
    """What one request came to, handed to every :data:`CallListener` once it is settled.

    ``status`` is :data:`tghost.protocol.wire.OK`, :data:`UNANSWERABLE`, :data:`RETURNED` or the wire error type of
    the reply (``timeout``, ``overloaded``, ``not-allowed``, ...). ``duration`` is seconds from
    receipt to acknowledgement. ``user`` (asserted by the caller, never checked) and
    ``arguments`` (the decoded arguments object) are ``None`` when the envelope was not decoded;
    ``caller`` is the verified caller under the host's access policy (``None``: anonymous).
    """

    service: str
    request_id: str | None
    user: str | None = None
    status: str = wire.OK
    duration: float = 0.0
    arguments: dict[str, Any] | None = None
    caller: Caller | None = None
    trace_id: str | None = None
    """The W3C trace id of the call's host span, 32 hex digits (``None``: tracing is off)."""
    spans: CallSpans | None = field(default=None, repr=False, compare=False)
    """The host's open spans of the call while tracing is on (:mod:`tghost.system.tracing`)."""


@dataclass
class CallSpans:
    """The host's spans of one traced request: ``server``, from receipt to the last reply, and
    the ``stage`` open under it: ``queue`` until the checks start, then ``invoke``."""

    server: Span
    stage: Span | None

    @classmethod
    def start(cls, record: CallRecord, message: Any) -> None:
        """Start the spans of ``record``'s request (a raw ``_pulsar.Message``) if tracing is on."""
        if not tracing.ON:
            return
        server = tracing.server_span(record.service, message.topic_name(), message.properties())
        assert server is not None
        record.spans, record.trace_id = cls(server, tracing.child("queue", server)), tracing.trace_id(server)

    def checked(self, error_type: str | None, check: Span | None) -> None:
        """The checks ended (``error_type``: how they refused the call): the invoke begins."""
        tracing.end(check, error_type)
        self.stage = None if error_type else tracing.child("invoke", self.server)

    def settle(self, status: str) -> None:
        tracing.end(self.stage, None if status == wire.OK else status)
        tracing.end(self.server, None if status == wire.OK else status)


#: Called once per request, after it is settled (metrics, audit), on the event loop or on a
#: service's worker thread (the thread lane): must be thread-safe and must not block; an
#: exception is logged and the host goes on.
CallListener = Callable[[CallRecord], None]


class ChunkNotSent(Exception):
    """The broker did not take a chunk of a streamed reply (the connection dropped)."""


class NotStarted(ToolError):
    """A check refused the call before it could start (the service's replay record out of
    reach): its ``unavailable`` reply says so (:meth:`Terms.error`)."""


@dataclass(frozen=True)
class Terms:
    """What one service serves on: its limits, the checks before ``invoke`` and the texts of
    its error replies. ``timeout`` is seconds, ``max_payload`` bytes; ``capacity`` is how many
    requests may be admitted at once (``max_concurrency`` running plus ``max_queue`` waiting).
    ``host_id`` (the host's, if it has one) goes in every error reply; ``error_detail`` is how
    much of an unexpected exception a caller is told (:data:`tghost.serving.settings.ERROR_DETAILS`).
    """

    service: ToolService
    descriptor: ToolServiceDescriptor
    timeout: float
    max_concurrency: int
    max_queue: int
    max_payload: int
    max_redeliveries: int
    authorize: Authorize | None = None
    gate: Gate | None = None
    fleet: Fleet | None = None
    host_id: str | None = None
    error_detail: str = FULL

    @property
    def service_id(self) -> str:
        return self.descriptor.id

    @functools.cached_property
    def capacity(self) -> int:
        return self.max_concurrency + self.max_queue

    @functools.cached_property
    def required_config(self) -> tuple[str, ...]:
        """The config params a request must give (:attr:`ToolServiceDescriptor.required_config`)."""
        return self.descriptor.required_config

    @functools.cached_property
    def persistent(self) -> bool:
        """Whether requests arrive on a persistent topic (they are acknowledged only once the
        broker has their reply, and go back to the broker when a shutdown cuts them off)."""
        return self.descriptor.request_queue.startswith("persistent://")

    def check(self, request: Request, port: Port) -> Call:
        """The call to make, once the request (its raw ``_pulsar.Message``) passes every check
        before ``invoke``, in this order: the payload size, the redelivery count (persistent
        topics), the envelope, the host's access policy (``gate``: the caller's signature,
        whether it may call the tool, its rate), the other providers' (``fleet``), ``authorize``,
        the required config params and the service's argument policy. Sets the record's
        ``user``, ``caller`` and ``arguments``. The call's progress updates go to the caller
        through ``port``. Safe from any thread.

        Raises:
            ToolError: with the wire error type of the failed check (``bad-request``,
                ``redelivery-limit``, ``unauthorized``, ``rate-limited``, ``not-allowed``,
                ``missing-config``, ``invalid-arguments``).
        """
        spans = request.record.spans
        if spans is None:
            return self._check(request, port)
        tracing.end(spans.stage)  # the wait for a slot is over
        check = tracing.child("check", spans.server)
        try:
            call = self._check(request, port, check)
        except ToolError as exc:
            spans.checked(exc.error_type, check)
            raise
        spans.checked(None, check)
        return call

    def _check(self, request: Request, port: Port, span: Span | None = None) -> Call:
        record, message = request.record, request.message
        payload = message.data()
        if len(payload) > self.max_payload:
            raise ToolError(f"request is {len(payload)} bytes, over this host's limit of {self.max_payload} "
                            "bytes; send less, or raise the limit (tghost run --max-payload)", wire.BAD_REQUEST)
        if self.persistent and message.redelivery_count() > self.max_redeliveries:
            raise ToolError(f"request was delivered {message.redelivery_count() + 1} times: every host that took "
                            "it stopped before answering, so it is not invoked again (tghost run "
                            "--max-redeliveries)", wire.REDELIVERY_LIMIT)
        try:
            envelope = wire.decode_request(payload)
        except wire.BadRequest as exc:
            raise ToolError(str(exc), wire.BAD_REQUEST) from None
        record.user, record.arguments = envelope.user, envelope.arguments
        caller = self._admit(envelope.config, request, payload)
        record.caller = caller
        if self.authorize is not None:
            authorizing = tracing.child("tghost_authorize", span)
            reason = self.authorize(envelope.user, self.service_id, envelope.config, envelope.arguments, caller)
            tracing.end(authorizing, None if reason is None else wire.NOT_ALLOWED)
            if reason is not None:
                raise ToolError(reason, wire.NOT_ALLOWED)
        missing = [p for p in self.required_config if p not in envelope.config]
        if missing:
            raise ToolError(f"service {self.service_id!r} needs config param(s) {missing}", wire.MISSING_CONFIG)
        return Call(envelope.user, envelope.config, self.service.check_arguments(envelope.arguments), caller,
                    request.cancelled, functools.partial(request.progress, port))

    def _admit(self, config: dict[str, Any], request: Request, payload: bytes) -> Caller | None:
        """The verified caller, under the host's access policy (``None`` without one), once the
        other live providers of the service would admit it too (``fleet``). A replay's refusal
        goes out unproven (:class:`~tghost.serving.access.Refused`)."""
        try:
            caller = None if self.gate is None else self.gate.admit(
                self.service_id, config, request.message.properties(), payload, self.descriptor.request_queue)
            if self.fleet is not None:
                self.fleet.check(self.service_id, config, caller)
        except Refused as exc:
            if exc.replay:
                request.proof = None
            if exc.error_type == wire.UNAVAILABLE:  # the replay record: the call did not start
                raise NotStarted(str(exc), exc.error_type) from None
            raise ToolError(str(exc), exc.error_type) from None
        return caller

    def may_cancel(self, record: CallRecord, properties: Mapping[str, str], topic: str) -> bool:
        """Whether a cancel (its message ``properties``, on the control ``topic``) may stop the
        call of ``record``: any cancel may stop an anonymous caller's call; a verified caller's
        only one it signed itself (docs/protocol.md §2.11)."""
        if record.caller is None:
            return True
        return self.gate is not None and self.gate.signed_by(record.caller, properties, b"", topic)

    def over_capacity(self, admitted: int) -> str | None:
        """The text of the ``overloaded`` reply when ``admitted`` requests already fill the
        service (``capacity``), else ``None``: the admission check of both drivers."""
        return self.refusal(wire.OVERLOADED) if admitted >= self.capacity else None

    def refusal(self, error_type: str, started: bool = False) -> str:
        """The text of an ``overloaded``, ``timeout``, ``cancelled`` or ``unavailable`` reply
        (``started``: the call was cut off by shutdown while it ran, not while it waited)."""
        if error_type == wire.CANCELLED:
            return "the caller cancelled the call"
        if error_type == wire.OVERLOADED:
            return (f"service {self.service_id!r} has {self.max_concurrency} calls running and "
                    f"{self.max_queue} waiting; retry later")
        if error_type == wire.TIMEOUT:
            return f"service {self.service_id!r} did not finish within {self.timeout}s"
        if not started:
            return (f"this host stopped serving {self.service_id!r} (it is shutting down) before the call "
                    "started; retry")
        return "the host shut down before the call finished; retry"

    def stopped(self, started: bool) -> tuple[str, str, bool]:
        """The error type, text and ``started`` (:meth:`error`) of the ``unavailable`` reply to a
        call this host's stop refused before it started (``started`` False), or cut off while it
        ran (True)."""
        return wire.UNAVAILABLE, self.refusal(wire.UNAVAILABLE, started), started

    def error(self, request_id: str, error_type: str, text: str, started: bool = True) -> bytes:
        """The error reply to request ``request_id``: ``error_type`` saying ``text``, with this
        host's id and the request id (docs/protocol.md §2.6). An ``unavailable`` reply to a call
        that did not start (``started`` False: refused by a stop, or by an unreachable replay
        record, before its checks ended) says so, ``started: false``: its caller may send it again."""
        unstarted = error_type == wire.UNAVAILABLE and not started
        return wire.encode_error(error_type, text, self.host_id, request_id, False if unstarted else None)

    def failure(self, exc: BaseException, request_id: str) -> tuple[str, str, bool]:
        """The error type and text of the reply to request ``request_id``, whose checks or
        ``invoke`` raised ``exc``, and whether the call may have started (False only for the
        replay record a host could not reach, :class:`NotStarted`). A :class:`ToolError` keeps its
        type and message (the plugin meant them for the caller), and the host's own failures (a
        result JSON cannot hold, a reply too large, a chunk the broker did not take) say what they are; a
        ``tool-service-error`` of these is logged in one line with the request id, as the caller
        is told. Any other exception is unexpected: logged with its traceback and the request id,
        and answered ``tool-service-error`` with as much of it as ``error_detail`` tells
        (``full``: ``<class>: <message>``; ``type``: the class; ``none``: nothing), and, withheld,
        where the host's log has it. So every ``tool-service-error`` has its line in the log,
        under the request id its reply names."""
        if isinstance(exc, ToolError | wire.TooLarge | ChunkNotSent):
            error_type = exc.error_type if isinstance(exc, ToolError) else wire.TOOL_SERVICE_ERROR
            if error_type == wire.TOOL_SERVICE_ERROR:
                log.warning("service %s: request %s: %s: %s", self.service_id, request_id, error_type, exc)
            return error_type, str(exc), not isinstance(exc, NotStarted)
        if isinstance(exc, WorkerRaised):
            name, text = exc.name, exc.text
            log.error("service %s: request %s: invoke raised (in worker process %s)\n%s", self.service_id,
                      request_id, exc.pid, exc.remote_traceback.rstrip())
        else:
            name, text = type(exc).__name__, str(exc)
            log.error("service %s: request %s: invoke raised", self.service_id, request_id, exc_info=exc)
        return wire.TOOL_SERVICE_ERROR, self._told(name, text, request_id), True

    def _told(self, name: str, text: str, request_id: str) -> str:
        """What a caller is told of an unexpected exception ``name: text`` (see :meth:`failure`)."""
        if self.error_detail == FULL:
            return f"{name}: {text}"
        log_of = f"the log of host {self.host_id}" if self.host_id else "the host's log"
        if self.error_detail == TYPE:
            return f"{name} (its message and traceback are in {log_of}, under request {request_id})"
        return f"the tool failed; see {log_of} for request {request_id}"


class Prover:
    """How a host proves its answers to one service's callers (docs/protocol.md §2.13): under
    the session key it shares with a caller session (the ``gate``'s), else with its ``signer``
    for a request that names a caller or asks for signed answers. ``topic``: the request topic."""

    def __init__(self, topic: str, gate: Gate | None, signer: Signer | None) -> None:
        self.topic = topic
        self.gate = gate
        self.signer = signer

    def proof(self, properties: Mapping[str, str], body: bytes) -> AnswerProof | None:
        """The proof for the answers to a request with these message properties and ``body``;
        ``None``: none the caller could check."""
        caller, signed_at = properties.get(CALLER), properties.get(SIGNED_AT, "")
        if caller is not None and self.gate is not None and (mac := self.gate.session_mac(properties)) is not None:
            return AnswerProof(self.topic, caller, signed_at, body_digest(body), self.gate.session.fingerprint, mac)
        if self.signer is not None and (caller is not None or PROVE in properties):
            signed_at = signed_at if caller is not None else ""
            return AnswerProof(self.topic, caller or "", signed_at, body_digest(body), signer=self.signer)
        return None


class Port:
    """One service's side of Pulsar, as a request needs it: send a reply, learn when the broker
    has it, acknowledge the request and tell the call listeners. Safe from any thread.

    ``producer`` is the service's response producer; ``consumer`` (its request consumer) is set
    once subscribed; ``mailbox`` carries receipts into the event loop; ``prover`` proves the
    answers to the callers that can check them. ``structured``: the service has an output
    schema, so a result's reply says its observation is JSON (docs/protocol.md §2.14).
    """

    def __init__(self, producer: pulsar.asyncio.Producer, mailbox: hop.Mailbox,
                 listeners: Sequence[CallListener], service_id: str, prover: Prover | None = None,
                 structured: bool = False) -> None:
        self.producer = producer
        self.prover = prover
        self.consumer: pulsar.asyncio.Consumer | None = None
        self.structured = structured
        self._mailbox = mailbox
        self._listeners = tuple(listeners)
        self._service_id = service_id

    def send(self, request: Request, payload: bytes, result: bool = False) -> None:
        """Send a reply without waiting for the broker (:func:`tghost.pulsar.hop.send`); ``result``:
        it is the last reply of a call answered without error."""
        hop.send(self.producer, payload, self._properties(request, payload, result))

    async def receipt(self, request: Request, payload: bytes, result: bool = False) -> None:
        """Send a reply (``result``: as :meth:`send`) and wait (on the loop) until the broker has it.

        Raises:
            pulsar.asyncio.PulsarException: the broker did not take it.
        """
        await hop.receipt(self._mailbox, self.producer, payload, self._properties(request, payload, result))

    def send_chunk(self, request: Request, payload: bytes) -> futures.Future[bool]:
        """Send one chunk of a stream; the future is done once the broker has it (True) or did
        not take it (False)."""
        sent: futures.Future[bool] = futures.Future()
        hop.send(self.producer, payload, self._properties(request, payload), functools.partial(_receipt_of, sent))
        return sent

    def _properties(self, request: Request, payload: bytes, result: bool = False) -> dict[str, str]:
        """An answer's properties: its request's ``id``, for a caller that can check it this host's
        proof (docs/protocol.md §2.13), and on a structured service's ``result``
        ``tghost-content-type: application/json`` (§2.14)."""
        proof = request.proof
        if proof is _UNKNOWN:
            message = request.message
            proof = request.proof = self.prover.proof(message.properties(), message.data()) if self.prover else None
        properties = {"id": request.request_id}
        if result and self.structured:
            properties[wire.CONTENT_TYPE] = wire.JSON_CONTENT
        if isinstance(proof, AnswerProof):
            properties.update(proof.properties(payload, request.request_id, next(request.seq)))
        return properties

    def settle(self, record: CallRecord, message: Any, started: float, acknowledge: bool = True) -> None:
        """A request is answered: acknowledge it (unless it goes back to the broker), time it from
        ``started`` (:func:`time.perf_counter`) and tell the call listeners."""
        if acknowledge and self.consumer is not None:
            hop.acknowledge(self.consumer._consumer, message)
        record.duration = time.perf_counter() - started
        if record.spans is not None:
            record.spans.settle(record.status)
            record.spans = None
        for listener in self._listeners:
            try:
                listener(record)
            except Exception:
                log.exception("service %s: call listener %r failed", self._service_id, listener)


def _receipt_of(sent: futures.Future[bool], result: Any, _: Any) -> None:
    """On the client's I/O thread: the broker's answer to one chunk. Never raises: an exception
    here would end the process (pulsar-client-python #184); a receipt nobody waits for any more
    (the future was cancelled) is dropped."""
    with contextlib.suppress(futures.InvalidStateError):
        sent.set_result(result == pulsar.Result.Ok)


class Request:
    """One request in flight: its record, its raw message, and who answered it.

    Exactly one last reply per request: whoever :meth:`claim`\\ s it first (the call itself, its
    deadline, a shutdown) answers it. A streamed reply's chunks go out through :meth:`chunk`,
    which stops once the request is claimed and keeps at most :data:`tghost.pulsar.hop.STREAM_WINDOW`
    chunks unconfirmed by the broker: a non-persistent topic has no flow control back from the
    caller, so a stream is paced by the broker's receipts.
    """

    __slots__ = ("_asked", "_held", "_lock", "_progressed", "answered", "cancelled", "deadline", "job", "message",
                 "proof", "record", "seq", "started", "unconfirmed")

    def __init__(self, record: CallRecord, message: Any) -> None:
        self.record = record
        self.message = message
        self.started = time.perf_counter()
        CallSpans.start(record, message)
        self.deadline = 0.0
        """``time.monotonic()`` seconds by which ``invoke`` must end (the thread lane's clock)."""
        self.job: Any = None
        """The executor's handle on the running call (the thread lane abandons it at a timeout)."""
        self.answered = False
        self.cancelled = threading.Event()
        """Set when the caller cancels the call (``tghost.Context.cancelled`` of a plain ``def`` tool)."""
        self.unconfirmed: list[futures.Future[bool]] = []
        self.proof: AnswerProof | object | None = _UNKNOWN
        """How its answers are proven (:class:`Prover`); ``None``: not at all; looked up at the first."""
        self.seq = itertools.count()
        """The numbers of its answers (``tghost-seq``)."""
        self._asked: bool | None = None  # whether the caller wants progress updates (None: not looked yet)
        self._progressed = -math.inf  # when the last one went
        self._held: wire.Progress | None = None  # the latest one held back by the pacing
        self._lock = threading.Lock()

    @property
    def request_id(self) -> str:
        return self.record.request_id or ""

    def claim(self, status: str | None = None, port: Port | None = None) -> bool:
        """Take the right to send the last reply; False if someone already has. ``status`` (an
        error type; ``None`` for a result) becomes the record's status. A progress update the
        pacing held back goes out first, through ``port``: the caller sees where the call ended."""
        with self._lock:
            if self.answered:
                return False
            self.answered = True
            if self._held is not None and port is not None:
                port.send(self, wire.encode_progress(self._held))
        if status is not None:
            self.record.status = status
        return True

    def chunk(self, port: Port, observation: str) -> list[futures.Future[bool]] | None:
        """Send one chunk of the stream, unless the request was claimed (then ``None``: stop).

        Returns the receipts to wait for before the next chunk (the window is full), else ``[]``.

        Raises:
            wire.TooLarge: the chunk is over Pulsar's message limit.
        """
        payload = wire.encode_response(observation, False)
        with self._lock:
            if self.answered:
                return None
            self.unconfirmed.append(port.send_chunk(self, payload))
        if len(self.unconfirmed) < hop.STREAM_WINDOW:
            return []
        full, self.unconfirmed = self.unconfirmed, []
        return full

    def progress(self, port: Port, update: wire.Progress) -> None:
        """Send a progress update (docs/protocol.md §2.12), if the caller asked for them (the
        request's ``tghost-progress`` property) and the call is not answered yet: at most one
        per :data:`PROGRESS_INTERVAL`, except the one that reaches its total; the latest one held
        back goes out before the last reply (:meth:`claim`). From any thread."""
        if self._asked is None:
            self._asked = wire.PROGRESS in self.message.properties()
        now = time.monotonic()
        if not self._asked:
            return
        with self._lock:
            if self.answered:
                return
            if now - self._progressed < PROGRESS_INTERVAL and update.done != update.total:
                self._held = update  # sent with the next update, or before the last reply
                return
            self._progressed, self._held = now, None
            port.send(self, wire.encode_progress(update))

    def rest(self) -> list[futures.Future[bool]]:
        """The chunks not yet confirmed: wait for them before the last reply."""
        rest, self.unconfirmed = self.unconfirmed, []
        return rest


def confirmed(receipts: Sequence[futures.Future[bool]]) -> None:
    """Wait (on a worker thread) until the broker took every chunk of ``receipts``.

    Raises:
        ChunkNotSent: it did not take one.
    """
    futures.wait(receipts)
    _all_sent(receipts)


async def confirmed_on_loop(receipts: Sequence[futures.Future[bool]]) -> None:
    """:func:`confirmed`, on the event loop. One producer's receipts arrive in order, so waiting
    for the last one is usually one hop for the whole window."""
    if receipts:
        await asyncio.shield(asyncio.wrap_future(receipts[-1]))  # a cancelled caller leaves them be
        for receipt in receipts:
            if not receipt.done():
                await asyncio.shield(asyncio.wrap_future(receipt))
    _all_sent(receipts)


def _all_sent(receipts: Sequence[futures.Future[bool]]) -> None:
    if not all(receipt.result() for receipt in receipts):
        raise ChunkNotSent("the broker did not take a chunk of the reply (connection lost); the stream is cut short")
