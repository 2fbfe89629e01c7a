"""client: the caller's side of the wire contract, as TrustGraph's ``ToolServiceClient``.

Sends request envelopes with an ``id`` property and routes the responses, which every
caller of a service sees on its shared response topic, back by that ``id``. Requests go out
with the producer's ``send_async``; responses arrive through a C++ message listener and cross
into the event loop once (:class:`tghost.pulsar.hop.Mailbox`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pulsar
import pulsar.asyncio

from tghost.agent.answers import Answers, Check
from tghost.agent.liveness import NO_PROVIDER, Silent, Watch
from tghost.protocol import wire
from tghost.protocol.answers import PROVE, body_digest, proven_by
from tghost.protocol.callers import SIGNATURE, sign_request
from tghost.protocol.descriptors import DEFAULT_TIMEOUT, ToolServiceDescriptor
from tghost.protocol.sessions import CallerSession
from tghost.protocol.trust import Signer, TrustedKeys
from tghost.pulsar import hop
from tghost.system import tracing
from tghost.system.logs import LogSummary

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["ToolCallError", "ToolServiceClient", "call_timeout"]

log = logging.getLogger(__name__)


class ToolCallError(Exception):
    """A call answered with an error, or not answered in time.

    ``error_type`` is the wire error type (``tool-service-error``, ``timeout``, ...). ``host`` is
    the id of the host that answered with the error, when its reply names it, and ``request_id``
    the call's request id (32 hex digits) once it was sent: the host's log names the request by
    it (docs/protocol.md §2.6). Both are ``None`` for a call refused before it was sent.
    """

    def __init__(self, error_type: str, message: str, host: str | None = None,
                 request_id: str | None = None) -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.message = message
        self.host = host
        self.request_id = request_id


def call_timeout(descriptor: ToolServiceDescriptor | None, given: float | None = None) -> float:
    """Seconds a caller waits for a call of ``descriptor``'s service: ``given`` if any, else the
    service's announced ``timeout``, else :data:`~tghost.protocol.descriptors.DEFAULT_TIMEOUT`
    (30), as a host does."""
    if given is not None:
        return given
    return (descriptor.timeout if descriptor else None) or DEFAULT_TIMEOUT


#: Responses the client may buffer for its calls: a response topic is non-persistent, and the
#: broker drops what a consumer has no room for (no flow control reaches the host), so a long
#: stream must fit here while the caller reads it (docs/protocol.md §2.5).
RESPONSE_QUEUE = 10_000
#: Seconds before its session expires that a caller starts a new one (docs/protocol.md §2.9).
SESSION_RENEWAL = 300.0


@dataclass
class _Sent:
    """One sending of a call's request: its ``id``, the answers waiting under it, when it went
    (unix seconds), its liveness probes, whether it went in a caller session, and whether the
    call heard anything of it (a chunk, a progress update, an answer)."""

    request_id: str
    answers: Answers
    sent_at: float
    watch: Watch | None = None
    in_session: bool = False
    heard: bool = False


def _may_resend(response: wire.Response, sent: _Sent, resends: int) -> bool:
    """Whether an error answer lets the call be sent again: ``unavailable`` from a host that
    says the call did not start (docs/protocol.md §2.6), before any chunk, at most :data:`~tghost.protocol.wire.RESENDS`
    times."""
    assert response.error is not None
    return (response.error["type"] == wire.UNAVAILABLE and response.started is False and not sent.heard
            and resends < wire.RESENDS)


async def _next(answers: Answers, watch: Watch | None) -> wire.Response | Exception:
    """The call's next answer (:meth:`Answers.next`); with a ``watch``, its hosts are probed
    while none comes (docs/protocol.md §2.15).

    Raises:
        Silent: no host answered the probes.
    """
    if watch is None:
        return await answers.next()
    wait = watch.heard()
    while True:
        try:
            async with asyncio.timeout(wait):  # a timer, not a task: the outer timeout still ends the call
                return await answers.next()
        except TimeoutError:
            wait = watch.silent()


class ToolServiceClient:
    """Calls one tool service: a producer on its request queue, a consumer on its response queue.

    Use ``async with ToolServiceClient(client, request_queue, response_queue) as svc:`` then
    ``await svc.call(...)`` or ``async for chunk in svc.stream(...)``. With an ``identity`` (a
    caller key, ``tghost keygen``) every request is signed (docs/protocol.md §2.8); without, the
    caller is anonymous. ``host_keys`` gives the session keys the service's hosts announce now
    (a directory knows them): with an identity and any such key, requests go in a caller session
    instead, MACed for those hosts (§2.9), and one a host cannot check is resent signed.
    ``trusted``: the hosts' signing keys this caller trusts (a directory's, with signed
    announcements). A call in a session, or with trusted keys, accepts only the answers a host
    of the service proved for it (§2.13): the others are dropped, counted in
    :attr:`dropped_answers` and summarised in the log.
    ``service_id`` names the service in the call's span and in errors (default: the request
    topic's last part). ``probes`` says, as a call starts, whether the service's hosts answer
    liveness probes (docs/protocol.md §2.15; a directory knows from their announcements): if so,
    a call that hears nothing for a second probes them, and ends ``no-provider`` when none
    answers (within about 3 s) instead of waiting for its timeout. ``None``: never probe.

    A call answered ``unavailable`` by a stopping host that says the call did not start is sent
    again (:data:`~tghost.protocol.wire.RESENDS` times at most, within its timeout; docs/protocol.md §2.6).
    ``handed_off(sent_at)`` (a directory gives it; ``sent_at`` in unix seconds) is the number of
    live hosts of the service now if one of its hosts withdrew it (a drain) since about
    ``sent_at``, else ``None``: a probed call that heard nothing, whose probes every live host
    answered and none holds, is then sent again once (§2.15).
    """

    def __init__(self, client: pulsar.asyncio.Client, request_queue: str, response_queue: str,
                 identity: Signer | None = None, host_keys: Callable[[], Sequence[str]] | None = None,
                 service_id: str | None = None, trusted: TrustedKeys | None = None,
                 probes: Callable[[], bool] | None = None,
                 handed_off: Callable[[float], int | None] | None = None) -> None:
        self._client = client
        self._probes = probes
        self._handed_off = handed_off
        self._watches: dict[str, Watch] = {}  # a probe's id -> the call that sent it
        self.trusted = trusted
        self.dropped_answers = 0
        """Messages with a call's ``id`` that no host of the service proved (docs/protocol.md §2.13)."""
        self.service_id = service_id
        self.identity = identity
        self._host_keys = host_keys
        self._session: CallerSession | None = None
        self.request_queue = request_queue
        self.response_queue = response_queue
        self._pending: dict[str, Answers] = {}
        self._producer: pulsar.asyncio.Producer | None = None
        self._control: pulsar.asyncio.Producer | None = None
        self._consumer: pulsar.asyncio.Consumer | None = None
        self._mailbox: hop.Mailbox | None = None
        self._unproven = LogSummary(log, f"{request_queue}: dropped %(count)d answer(s) that no host of the service "
                                         "proved (docs/protocol.md §2.13): %(reason)s (e.g. %(example)s)")

    async def start(self) -> ToolServiceClient:
        """Subscribe to the response queue first (non-persistent topics keep nothing), then
        create the request producer.

        Raises:
            pulsar.asyncio.PulsarException: the broker refused the subscription or producer.
        """
        self._mailbox = hop.Mailbox(asyncio.get_running_loop())
        self._consumer = await hop.subscribe_listening(
            self._client, self.response_queue, f"tghost-caller-{uuid.uuid4().hex}",
            pulsar.ConsumerType.Exclusive, self._on_response, receiver_queue_size=RESPONSE_QUEUE,
        )
        self._producer = await self._client.create_producer(self.request_queue, batching_enabled=False)
        self._control = await self._client.create_producer(wire.control_topic(self.request_queue),
                                                           batching_enabled=False)
        return self

    def _on_response(self, consumer: Any, message: Any) -> None:
        """The C++ listener thread: acknowledge, and hand a waited-for response to the loop."""
        hop.acknowledge(consumer, message)
        properties = message.properties()
        answers = self._pending.get(properties.get("id", ""))
        if answers is not None:
            self._mailbox.put(answers.queue.put_nowait, (properties, message.data()))  # type: ignore[union-attr]
        elif wire.ALIVE in properties and (watch := self._watches.get(properties.get("id", ""))) is not None:
            self._mailbox.put(watch.answer, properties)  # type: ignore[union-attr]

    def _on_sent(self, answers: Answers, result: Any) -> None:
        """The C++ thread, once the broker has the request: a failure goes to the waiting call."""
        if result != pulsar.Result.Ok:
            self._mailbox.put(answers.queue.put_nowait, pulsar.asyncio.PulsarException(result))  # type: ignore[union-attr]

    async def stream(
        self,
        config: dict[str, Any],
        arguments: dict[str, Any],
        *,
        user: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        tool: str | None = None,
        progress: Callable[[wire.Progress], Any] | None = None,
    ) -> AsyncGenerator[str, None]:
        """Send one request and yield each non-empty observation chunk until end of stream.

        ``timeout`` is seconds for the whole call (a client knows no descriptor: see
        :func:`call_timeout` for the service's own). ``tool`` names the call's span when tracing
        is on (:mod:`tghost.system.tracing`; its ``traceparent`` goes with the request).
        ``progress`` asks the service for progress updates and gets each one (docs/protocol.md
        §2.12); it may be a coroutine function. Cancelling the task, or closing the iterator
        (``aclose()``), cancels the call on its host (§2.11).

        An ``unavailable`` that did not start is sent again under a new ``id`` (the stopping
        host's answer ended the first), after a pause that doubles from :data:`~tghost.protocol.wire.RESEND_PAUSE`
        seconds, at most :data:`~tghost.protocol.wire.RESENDS` times; then it is raised as any error. The call's span
        counts the sendings again (``tghost.resends``).

        Raises:
            ToolCallError: the service answered with an error, or (type ``timeout``) not in time,
                or (type ``no-provider``, with ``probes``) no host answered its liveness probes.
            pulsar.asyncio.PulsarException: the request could not be sent.
        """
        assert self._producer is not None, "call start() first"
        request_id = uuid.uuid4().hex
        span = tracing.client_span(self.request_queue, request_id, tool, self.service_id)
        body = wire.encode_request(user, config, arguments)
        asks = {wire.PROGRESS: "1"} if progress is not None else {}
        if self.trusted is not None and self.identity is None:
            asks[PROVE] = "1"
        sent = self._waiting(request_id, body, span, asks)
        failed: str | None = "cancelled"
        resends = 0  # of an 'unavailable' that did not start
        try:
            async with asyncio.timeout(timeout):
                self._sending(sent, body, span, asks)
                while True:
                    response = await _next(sent.answers, sent.watch)
                    if isinstance(response, Exception):
                        raise response
                    if response.progress is not None:
                        sent.heard = True
                        if progress is not None and inspect.isawaitable(told := progress(response.progress)):
                            await told
                        continue
                    if response.error and sent.in_session and response.error["type"] == wire.UNKNOWN_SESSION:
                        self._send(sent.answers, sent.request_id, body, self._session_keys(), span, asks, signed=True)
                        continue  # a host we did not know: the same request, signed too
                    if response.error and _may_resend(response, sent, resends):
                        await asyncio.sleep(wire.RESEND_PAUSE * 2 ** resends)
                        resends += 1
                        log.debug("%s: request %s did not start on host %s (it is stopping): sent again (%d of %d)",
                                  self._named(tool), sent.request_id, response.error.get("host"), resends, wire.RESENDS)
                        self._close(sent)
                        sent = self._waiting(uuid.uuid4().hex, body, span, asks)
                        self._sending(sent, body, span, asks)
                        continue
                    if response.error:
                        failed = response.error["type"]
                        raise ToolCallError(response.error["type"], response.error["message"],
                                            response.error.get("host"), sent.request_id)
                    sent.heard = True
                    if response.response:
                        yield response.response
                    if response.end_of_stream:
                        failed = None
                        return
        except TimeoutError:
            failed = wire.TIMEOUT
            raise ToolCallError(wire.TIMEOUT, f"{self._named(tool)} gave no complete answer within {timeout}s "
                                              f"(request topic {self.request_queue})"
                                              f"{sent.watch.told() if sent.watch else ''}",
                                request_id=sent.request_id) from None
        except Silent as exc:
            failed = NO_PROVIDER
            raise ToolCallError(NO_PROVIDER, f"{self._named(tool)}: {exc}: its hosts stopped without withdrawing "
                                             "(killed, or cut off from the broker)",
                                request_id=sent.request_id) from None
        except Exception as exc:
            failed = failed if failed != "cancelled" else type(exc).__name__
            raise
        finally:
            self._close(sent)
            resent = resends + (sent.watch is not None and sent.watch.resent)
            tracing.end(span, failed, **{"tghost.resends": resent} if resent else {})
            if failed in ("cancelled", wire.TIMEOUT, NO_PROVIDER):
                self._cancel(sent.request_id)

    def _waiting(self, request_id: str, body: bytes, span: Span | None, asks: Mapping[str, str]) -> _Sent:
        """A sending of the request (its encoded ``body``) under ``request_id``, not sent yet: its
        answers wait under that id from now on, and, where the service's hosts answer probes,
        its :class:`Watch`."""
        sent = _Sent(request_id, Answers(None), time.time())
        self._pending[request_id] = sent.answers
        if self._probes is not None and self._probes():
            sent.watch = self._watch(request_id, functools.partial(self._orphaned, sent, body, span, asks))
        return sent

    def _sending(self, sent: _Sent, body: bytes, span: Span | None, asks: Mapping[str, str]) -> None:
        """Send the request under ``sent``'s id, and say how its answers are checked."""
        sent.in_session = self._send(sent.answers, sent.request_id, body, self._session_keys(), span, asks)
        sent.answers.check = self._check(sent.request_id, sent.in_session, sent.answers.sent, body_digest(body))
        sent.answers.known = self._known_hosts if sent.in_session else frozenset

    def _close(self, sent: _Sent) -> None:
        """The call is done with ``sent``'s id: forget its answers and probes."""
        del self._pending[sent.request_id]
        for probe in sent.watch.probes if sent.watch else ():
            del self._watches[probe]
        self._count_unproven(sent.answers)

    def _orphaned(self, sent: _Sent, body: bytes, span: Span | None, asks: Mapping[str, str], serving: int) -> bool:
        """A probe of the call ``sent`` was answered by ``serving`` hosts (not stopping) and none
        holds the request (docs/protocol.md §2.15). If the call heard nothing of it, every host
        the directory knows of the service answered, and one of them withdrew the service since
        about when the request was sent (a drain, which answers every request it received before
        it leaves), the request was lost at that host's unsubscribe: send it again, once, under the
        same id (so a host's replay record still runs it at most once). Whether it did."""
        live = self._handed_off(sent.sent_at) if self._handed_off is not None and not sent.heard else None
        if live is None or serving < live:
            return False
        log.debug("request %s: no host holds it, and a host of the service withdrew it since it was sent: "
                  "lost at that host's unsubscribe; sent again", sent.request_id)
        self._send(sent.answers, sent.request_id, body, self._session_keys(), span, asks, signed=sent.in_session)
        return True

    def _named(self, tool: str | None) -> str:
        """``tool 'x' (tool service 'y')``, or the service alone without ``tool``."""
        service = f"tool service {self.service_id or self.request_queue.rsplit('/', 1)[-1]!r}"
        return f"tool {tool!r} ({service})" if tool else service

    def _watch(self, request_id: str, orphaned: Callable[[int], bool]) -> Watch:
        """The liveness probes of the call of ``request_id``, each sent on the control topic
        with the call's ``id`` as its :data:`~tghost.protocol.wire.PROBE` (docs/protocol.md §2.15);
        ``orphaned``: :meth:`Watch.silent`'s."""
        def send(probe: str) -> None:
            self._watches[probe] = watch
            hop.send(self._control, b"", {"id": probe, wire.PROBE: request_id})
        watch = Watch(send, orphaned)
        return watch

    def _cancel(self, request_id: str) -> None:
        """Tell the service's hosts that this caller gave up on ``request_id`` (docs/protocol.md
        §2.11): the one running it stops it and frees its slot. Sent and forgotten; signed with
        the identity, as hosts with an access policy ask of a verified caller's cancel."""
        if self._control is None:
            return
        properties = {"id": request_id, wire.CANCEL: "1"}
        if self.identity is not None:
            properties.update(sign_request(self.identity, b"", request_id, wire.control_topic(self.request_queue),
                                             time.time()))
        hop.send(self._control, b"", properties, lambda result, _: None)

    def _session_keys(self) -> Sequence[str]:
        """The hosts' session keys, when this client has an identity to open sessions with."""
        return self._host_keys() if self.identity is not None and self._host_keys is not None else ()

    def _send(self, answers: Answers, request_id: str, body: bytes, host_keys: Sequence[str],
              span: Span | None = None, extra: Mapping[str, str] = {}, signed: bool = False) -> bool:
        """Send the request with its ``id`` (and the ``extra`` properties) and, with an identity,
        its proof: a session's MACs for ``host_keys`` if there are any (and, ``signed``, a
        signature too, for a host it has no MAC for), else a signature. Whether it went in a session."""
        properties = {"id": request_id, **extra}
        now = time.time()
        answers.sent.add(f"{now:.3f}" if self.identity is not None else "")
        if self.identity is not None and host_keys:
            if self._session is None or (not signed and self._session.expires - now < SESSION_RENEWAL):
                self._session = CallerSession(self.identity, now)
            properties.update(self._session.properties(body, request_id, self.request_queue, now, host_keys))
            if signed:
                proof = sign_request(self.identity, body, request_id, self.request_queue, now)
                properties[SIGNATURE] = proof[SIGNATURE]
        elif self.identity is not None:
            properties.update(sign_request(self.identity, body, request_id, self.request_queue, now))
        tracing.inject(properties, span)
        hop.send(self._producer, body, properties, lambda result, _: self._on_sent(answers, result))
        return self.identity is not None and bool(host_keys)

    def _check(self, request_id: str, in_session: bool, sent: set[str], request: str) -> Check | None:
        """How a call checks its answers (docs/protocol.md §2.13): proven under its session's key
        with a host it knows now, or signed by a trusted key; ``None`` when it can check neither."""
        if not in_session and self.trusted is None:
            return None
        caller = self.identity.key_id if self.identity is not None else ""
        session = self._session if in_session else None

        def check(properties: Mapping[str, str], payload: bytes) -> tuple[str, str, int] | None:
            hosts = session.answer_keys(self._session_keys()) if session is not None else {}
            return proven_by(properties, payload, request_id, self.request_queue, caller, request, sent, hosts,
                             self.trusted)
        return check

    def _known_hosts(self) -> Collection[str]:
        """The fingerprints of the hosts this caller's session knows now."""
        return self._session.answer_keys(self._session_keys()).keys() if self._session is not None else ()

    def _count_unproven(self, answers: Answers) -> None:
        dropped = answers.close()
        if dropped:
            self.dropped_answers += dropped
            self._unproven.add("a response, chunk, progress update or error with a call's id and no valid proof; "
                               "someone else on the broker answers this service's requests", f"{dropped} for one call")
            self._unproven.flush()

    async def call(
        self,
        config: dict[str, Any],
        arguments: dict[str, Any],
        *,
        user: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        tool: str | None = None,
        progress: Callable[[wire.Progress], Any] | None = None,
    ) -> str:
        """Send one request and return the observation (streamed chunks joined).

        Raises:
            ToolCallError: as for :meth:`stream`.
        """
        return "".join([chunk async for chunk in self.stream(config, arguments, user=user,
                                                             timeout=timeout, tool=tool, progress=progress)])

    async def close(self) -> None:
        """Close the producers and leave the response subscription (:func:`tghost.pulsar.hop.leave`;
        responses still arriving are dropped)."""
        for closable in (self._producer, self._control):
            if closable is not None:
                with contextlib.suppress(Exception):
                    await closable.close()
        if self._consumer is not None:
            await hop.leave(self._consumer)

    async def __aenter__(self) -> ToolServiceClient:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

