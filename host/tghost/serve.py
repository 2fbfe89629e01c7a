"""serve: answer tool-service requests on Pulsar, per the wire contract (docs/protocol.md §2).

One :class:`ServiceWorker` per service: a Shared subscription ``<id>-request`` on its request
topic, a non-batching producer on its response topic and its own worker threads. Never
imports the directory, and never lets one service's faults stop another from answering.

The hot path (docs/benchmarks.md §1): a request on a non-persistent topic arrives through a C++
message listener. A plain ``def`` service under thread isolation answers it on its worker
threads (:mod:`tghost.lane`); any other crosses into the event loop once
(:class:`tghost.hop.Mailbox`). The reply goes out with the producer's ``send_async``, and the
request is acknowledged as it is sent. A persistent topic is read with ``receive`` instead, one
request per free slot, and a request there is acknowledged only once the broker has its reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pulsar
import pulsar.asyncio

from . import executors, handoff, hop, wire
from .deadlines import Deadlines
from .descriptors import ToolServiceDescriptor
from .executors.thread import ThreadExecutor
from .hookspecs import Authorize
from .lane import ThreadLane
from .service import ToolError, ToolService
from .watchdog import LoopWatchdog

__all__ = [
    "OK",
    "RETURNED",
    "UNANSWERABLE",
    "CallListener",
    "CallRecord",
    "ServeSettings",
    "Server",
    "ServiceWorker",
]

log = logging.getLogger(__name__)

#: Messages the client may buffer per consumer of a non-persistent request topic: the burst
#: one host absorbs per service. The receive loop drains the buffer eagerly and the worker
#: answers ``overloaded`` beyond its bound, so the host itself drops nothing. But the broker
#: drops a non-persistent message when no consumer has a free permit (Pulsar's semantics): a
#: larger burst, arriving faster than the host takes it, partly never reaches the host and its
#: callers time out; use a persistent topic for such bursts. (tests/test_faults.py sends 2000 at
#: once; pulsar-client's default of 1000 lost a third of them.) A persistent topic keeps what no
#: host has taken, so its consumer buffers nothing (size 0) and receives only when a slot is free.
RECEIVER_QUEUE = 10_000
#: The cancel message of a request cancelled by shutdown while it waited for a slot.
NOT_STARTED = "not started"


@dataclass(frozen=True)
class ServeSettings:
    """Host-wide serving limits; a service descriptor's ``timeout``/``max-concurrency`` override.

    ``timeout``, ``grace`` and ``stall_threshold`` are seconds; ``max_payload`` is bytes.

    - ``max_queue``: requests per service that may wait for a free slot before new ones are
      answered ``overloaded`` (non-persistent topics; a persistent topic queues in the broker).
    - ``max_payload``: a larger request is answered ``bad-request`` and never decoded.
    - ``max_redeliveries``: how often a request on a persistent topic may be delivered again
      (its host died or shut down mid-call) and still be invoked; one more delivery is answered
      ``redelivery-limit``, and the client moves any later one to the dead-letter topic
      ``<request topic>-<subscription>-DLQ``.
    - ``stall_threshold``: the loop-lag watchdog warns when the event loop is blocked longer;
      ``0`` turns it off.
    - ``isolation``: where ``invoke`` runs unless the service says (:data:`tghost.executors.ISOLATIONS`):
      ``thread`` (the host's worker threads) or ``process`` (worker processes).
    - ``worker_limits``: when worker processes are recycled (:class:`tghost.executors.WorkerLimits`).
    """

    timeout: float = 30.0
    max_concurrency: int = 16
    max_queue: int = 64
    grace: float = 10.0
    max_payload: int = 1024 * 1024
    max_redeliveries: int = 3
    stall_threshold: float = 0.5
    isolation: str = executors.THREAD
    worker_limits: executors.WorkerLimits = field(default_factory=executors.WorkerLimits)


#: ``CallRecord.status`` of a call answered without error; any other status is the wire error type.
OK = "ok"
#: ``CallRecord.status`` of a request without an ``id`` property: acknowledged, never answered.
UNANSWERABLE = "unanswerable"
#: ``CallRecord.status`` of a persistent request cut off by shutdown: left unacknowledged and
#: unanswered, so the broker delivers it to another host.
RETURNED = "returned"


@dataclass
class CallRecord:
    """What one request came to, handed to every :data:`CallListener` once it is acknowledged.

    ``status`` is :data:`OK`, :data:`UNANSWERABLE`, :data:`RETURNED` or the wire error type of
    the reply (``timeout``, ``overloaded``, ``not-allowed``, ...). ``duration`` is seconds from
    receipt to acknowledgement. ``user`` and ``arguments`` (the decoded arguments object) are
    ``None`` when the envelope was not decoded.
    """

    service: str
    request_id: str | None
    user: str | None = None
    status: str = OK
    duration: float = 0.0
    arguments: dict[str, Any] | None = None


#: Called once per request, after it is acknowledged (metrics, audit), on the event loop or on
#: a service's worker thread (the thread lane, :mod:`tghost.lane`): must be thread-safe and must
#: not block; an exception is logged and the host goes on.
CallListener = Callable[[CallRecord], None]


class ServiceWorker:
    """Serves one tool service: receive, bound, check, invoke, reply, then acknowledge.

    ``invoke`` runs in this service's own :class:`tghost.executors.Executor` (worker threads or
    worker processes, ``max_concurrency`` at most), so a plugin that never returns starves only
    its own service. At the timeout the caller is answered ``timeout`` at once and the slot is
    freed; the executor stops the call if it can (a worker process is killed).

    Before ``invoke``, in this order: the payload size (``max_payload``), the redelivery count
    (persistent topics), the envelope, ``authorize`` (``not-allowed``), the required config
    params and ``service.check_arguments`` (``invalid-arguments``).
    """

    def __init__(
        self,
        service: ToolService,
        descriptor: ToolServiceDescriptor,
        settings: ServeSettings,
        listeners: Sequence[CallListener] = (),
        authorize: Authorize | None = None,
    ) -> None:
        self.service = service
        self.descriptor = descriptor
        self.timeout = descriptor.timeout or settings.timeout
        self.max_concurrency = descriptor.max_concurrency or settings.max_concurrency
        self.max_queue = settings.max_queue
        self.max_payload = settings.max_payload
        self.max_redeliveries = settings.max_redeliveries
        self.capacity = self.max_concurrency + self.max_queue
        self.required_config = descriptor.required_config
        self.persistent = descriptor.request_queue.startswith("persistent://")
        self.counters = {"received": 0, "unanswerable": 0}
        self._listeners = tuple(listeners)
        self._authorize = authorize
        self.executor = executors.create(service, descriptor, self.max_concurrency, settings.isolation,
                                         settings.worker_limits)
        self._slots = asyncio.Semaphore(self.max_concurrency)
        self._room = asyncio.Semaphore(self.max_concurrency) if self.persistent else None
        self._admitted = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._consumer: pulsar.asyncio.Consumer | None = None
        self._producer: pulsar.asyncio.Producer | None = None
        self._mailbox: hop.Mailbox | None = None
        self._lane: ThreadLane | None = None
        self._clock = Deadlines(self.timeout)
        self._stopping = False
        self._client: pulsar.asyncio.Client | None = None
        self._waiting: set[asyncio.Task[None]] = set()  # requests waiting for a slot
        self._peers: handoff.PeerWatch | None = None
        self._unsubscribing: asyncio.Task[None] | None = None

    @property
    def subscription(self) -> str:
        """The Shared subscription name, ``<service-id>-request`` (docs/protocol.md §2.4)."""
        return f"{self.descriptor.id}-request"

    def is_connected(self) -> bool:
        """Whether the response producer is connected to the broker now (False before start)."""
        return self._producer is not None and bool(self._producer.is_connected())

    @property
    def in_flight(self) -> int:
        """Requests received and not yet answered (running, waiting for a slot, or being refused)."""
        return len(self._tasks) + (self._lane.in_flight if self._lane is not None else 0)

    @property
    def stopping(self) -> bool:
        """Whether the service stopped taking new calls (:meth:`stop_receiving`)."""
        return self._stopping

    async def start(self, client: pulsar.asyncio.Client) -> None:
        """Create the response producer, start the executor, then subscribe and start receiving.

        Raises:
            pulsar.asyncio.PulsarException: the broker refused the producer or subscription.
        """
        self._mailbox = hop.Mailbox(asyncio.get_running_loop())
        self._client = client
        self._producer = await client.create_producer(
            self.descriptor.response_queue, batching_enabled=False, block_if_queue_full=True
        )
        await self.executor.start()
        if isinstance(self.executor, ThreadExecutor) and self.service.runs_in_thread and not self.persistent:
            self._lane = ThreadLane(self, self.executor, asyncio.get_running_loop())
        try:
            self._consumer = await client.subscribe(
                self.descriptor.request_queue,
                self.subscription,
                consumer_type=pulsar.ConsumerType.Shared,
                **self._consumer_options(),
            )
        except BaseException:
            await self._close_executor()
            raise
        if self.persistent:
            self._loop_task = asyncio.create_task(self._receive_loop(), name=f"receive {self.descriptor.id}")

    def _consumer_options(self) -> dict[str, Any]:
        if not self.persistent:
            return {"receiver_queue_size": RECEIVER_QUEUE, "message_listener": self._on_message}
        return {"receiver_queue_size": 0,
                "dead_letter_policy": pulsar.ConsumerDeadLetterPolicy(self.max_redeliveries + 1)}

    def _on_message(self, consumer: Any, message: Any) -> None:
        """The C++ listener thread: hand an answerable request to the thread lane
        (:mod:`tghost.lane`), if the service has one and is not stopping; anything else to the
        loop (:class:`tghost.hop.Mailbox`)."""
        request_id = message.properties().get("id")
        if self._lane is None or self._stopping or request_id is None:
            self._mailbox.put(self._received, message)  # type: ignore[union-attr]
            return
        self.counters["received"] += 1
        self._lane.take(CallRecord(self.descriptor.id, request_id), message)

    def _received(self, message: Any) -> None:
        """A request (a raw ``_pulsar.Message``) is in: handle it in its own task."""
        self.counters["received"] += 1
        task = asyncio.create_task(self._handle(message))
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    async def _receive_loop(self) -> None:
        assert self._consumer is not None
        while True:
            if self._room is not None:
                await self._room.acquire()  # persistent: take a request only when it can run
            try:
                message = await self._consumer.receive()
            except pulsar.asyncio.PulsarException as exc:
                self._release_room()
                if exc.error() == pulsar.Result.AlreadyClosed:
                    return
                log.warning("service %s: receive failed (%s); retrying", self.descriptor.id, exc)
                await asyncio.sleep(0.5)
                continue
            self._received(message._message)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._release_room()

    def _release_room(self) -> None:
        if self._room is not None:
            self._room.release()

    async def _handle(self, message: Any) -> None:
        started = time.perf_counter()
        task: asyncio.Task[None] = asyncio.current_task()  # type: ignore[assignment]
        record = CallRecord(self.descriptor.id, message.properties().get("id"))
        log.debug("service %s: request %s received", self.descriptor.id, record.request_id)
        acknowledge = True
        try:
            if record.request_id is None:
                self.counters["unanswerable"] += 1
                record.status = UNANSWERABLE
                log.warning("service %s: request without 'id' property cannot be answered; "
                            "acknowledged and dropped", self.descriptor.id)
            elif self._stopping:
                if self._peers is not None:
                    self._peers.mine(record.request_id)
                await self._fail(record, wire.UNAVAILABLE, f"this host stopped serving {self.descriptor.id!r} "
                                 "(it is shutting down) before the call started; retry")
            elif self._admitted >= self.capacity:
                await self._fail(record, wire.OVERLOADED, self.refusal(wire.OVERLOADED))
            else:
                await self._admit(record, message, task)
        except asyncio.CancelledError as exc:
            acknowledge = not self.persistent
            await self._cut_off(record, started=NOT_STARTED not in exc.args)
            raise
        except Exception:
            log.exception("service %s: could not reply to request %s", self.descriptor.id, record.request_id)
        finally:
            self._tasks.discard(task)  # answered: no longer in flight
            self._settle(record, message, started, acknowledge)

    async def _admit(self, record: CallRecord, message: Any, task: asyncio.Task[None]) -> None:
        self._admitted += 1
        try:
            self._waiting.add(task)
            try:
                await self._slots.acquire()
            finally:
                self._waiting.discard(task)
            try:
                await self._answer(record, message, task)
            finally:
                self._slots.release()
        finally:
            self._admitted -= 1

    async def _cut_off(self, record: CallRecord, started: bool) -> None:
        """A call cancelled by shutdown (``started``: in ``invoke``, else waiting for a slot): a
        persistent request goes back to the broker unanswered (another host takes it when this
        consumer closes); any other is answered ``unavailable``."""
        if self.persistent:
            record.status = RETURNED
        elif record.request_id is not None:
            with contextlib.suppress(Exception):
                await self._fail(record, wire.UNAVAILABLE, self.refusal(wire.UNAVAILABLE, started))

    def refusal(self, error_type: str, started: bool = False) -> str:
        """The text of an ``overloaded``, ``timeout`` or ``unavailable`` reply (``started``: the
        call was cut off by shutdown while it ran, not while it waited)."""
        if error_type == wire.OVERLOADED:
            return (f"service {self.descriptor.id!r} has {self.max_concurrency} calls running and "
                    f"{self.max_queue} waiting; retry later")
        if error_type == wire.TIMEOUT:
            return f"service {self.descriptor.id!r} did not finish within {self.timeout}s"
        return f"the host shut down before the call {'finished' if started else 'started'}; retry"

    def _notify(self, record: CallRecord) -> None:
        for listener in self._listeners:
            try:
                listener(record)
            except Exception:
                log.exception("service %s: call listener %r failed", self.descriptor.id, listener)

    def _receipt(self, request_id: str, payload: bytes) -> asyncio.Future[None]:
        """Send one reply; the future is done once the broker has it (:func:`tghost.hop.receipt`)."""
        return hop.receipt(self._mailbox, self._producer, payload, {"id": request_id})  # type: ignore[arg-type]

    def send_chunk(self, record: CallRecord, payload: bytes) -> Future[bool]:
        """Send one chunk of a stream (the thread lane's streams); the future is done once the
        broker has it (True) or refused it (False). Safe from any thread."""
        sent: Future[bool] = Future()
        hop.send(self._producer, payload, {"id": record.request_id or ""},  # type: ignore[arg-type]
                 lambda result, _: sent.set_result(result == pulsar.Result.Ok))
        return sent

    def finish(self, record: CallRecord, message: Any, payload: bytes, started: float) -> None:
        """The thread lane's last reply (a non-persistent request): send it without waiting,
        acknowledge ``message`` and tell the call listeners (``started``: the
        :func:`time.perf_counter` of its receipt). Safe from any thread."""
        hop.send(self._producer, payload, {"id": record.request_id or ""})  # type: ignore[arg-type]
        self._settle(record, message, started)

    def _settle(self, record: CallRecord, message: Any, started: float, acknowledge: bool = True) -> None:
        """A request is answered: acknowledge it (unless it goes back to the broker), time it from
        ``started`` (:func:`time.perf_counter`) and tell the call listeners."""
        if acknowledge:
            hop.acknowledge(self._consumer._consumer, message)  # type: ignore[union-attr]
        record.duration = time.perf_counter() - started
        self._notify(record)

    async def _send(self, request_id: str, payload: bytes) -> None:
        """Send a last reply. A persistent request's waits until the broker has it: the request is
        acknowledged only then. A non-persistent one's is handed to the client and not waited
        for: the broker never delivers a non-persistent request again, so the acknowledgement
        changes nothing, and waiting would cost a hop and the client's I/O thread the GIL
        (docs/benchmarks.md §1). The producer is flushed before it closes."""
        if self.persistent:
            await self._receipt(request_id, payload)
        else:
            hop.send(self._producer, payload, {"id": request_id})  # type: ignore[arg-type]

    async def _fail(self, record: CallRecord, error_type: str, message: str) -> None:
        """Answer the request with an error reply and record its type as the call's status."""
        record.status = error_type
        await self._send(record.request_id or "", wire.encode_error(error_type, message))

    async def _answer(self, record: CallRecord, message: Any, task: asyncio.Task[None]) -> None:
        """Check the request, invoke under the timeout, and send the reply (or error)."""
        try:
            call = self.check(record, message)
            self._clock.start(task)
            try:
                await self._stream(record.request_id or "", call)
            finally:
                self._clock.stop(task)
        except ToolError as exc:
            await self._fail(record, exc.error_type, str(exc))
        except wire.TooLarge as exc:
            await self._fail(record, wire.TOOL_SERVICE_ERROR, str(exc))
        except asyncio.CancelledError:
            if not self._clock.expired(task):
                raise
            await self._fail(record, wire.TIMEOUT, self.refusal(wire.TIMEOUT))
        except Exception as exc:
            await self._invoke_failed(record, exc)

    async def _invoke_failed(self, record: CallRecord, exc: Exception) -> None:
        log.exception("service %s: invoke raised", self.descriptor.id, exc_info=exc)
        await self._fail(record, wire.TOOL_SERVICE_ERROR, f"{type(exc).__name__}: {exc}")

    def check(self, record: CallRecord, message: Any) -> executors.Call:
        """The call to make, once the request passes every check before ``invoke``; sets the
        record's ``user`` and ``arguments``. Safe from any thread.

        Raises:
            ToolError: with the wire error type of the failed check.
        """
        payload = message.data()
        if len(payload) > self.max_payload:
            raise ToolError(f"request is {len(payload)} bytes, over this host's limit of {self.max_payload} "
                            "bytes; send less, or raise the limit (tghost run --max-payload)", wire.BAD_REQUEST)
        if self.persistent and message.redelivery_count() > self.max_redeliveries:
            raise ToolError(f"request was delivered {message.redelivery_count() + 1} times: every host that took "
                            "it stopped before answering, so it is not invoked again (tghost run "
                            "--max-redeliveries)", wire.REDELIVERY_LIMIT)
        try:
            request = wire.decode_request(payload)
        except wire.BadRequest as exc:
            raise ToolError(str(exc), wire.BAD_REQUEST) from None
        record.user, record.arguments = request.user, request.arguments
        if self._authorize is not None:
            reason = self._authorize(request.user, self.descriptor.id, request.config, request.arguments)
            if reason is not None:
                raise ToolError(reason, wire.NOT_ALLOWED)
        missing = [p for p in self.required_config if p not in request.config]
        if missing:
            raise ToolError(f"service {self.descriptor.id!r} needs config param(s) {missing}", wire.MISSING_CONFIG)
        return request.user, request.config, self.service.check_arguments(request.arguments)

    async def _stream(self, request_id: str, call: executors.Call) -> None:
        """Send one response, or for a generator one per chunk then an empty final one.

        Chunks go out without waiting for each receipt (one producer keeps their order); at most
        :data:`tghost.hop.STREAM_WINDOW` are unconfirmed at a time, and the call ends once the broker has all.
        """
        result = await self.executor.invoke(call)
        if isinstance(result, str):
            await self._send(request_id, wire.encode_response(result))
            return
        unconfirmed: list[asyncio.Future[None]] = []
        try:
            async with contextlib.aclosing(result):
                async for chunk in result:
                    unconfirmed.append(self._receipt(request_id, wire.encode_response(chunk, False)))
                    if len(unconfirmed) >= hop.STREAM_WINDOW:
                        await asyncio.gather(*unconfirmed)
                        unconfirmed.clear()
        finally:
            if unconfirmed:
                await asyncio.gather(*unconfirmed, return_exceptions=True)
        await self._send(request_id, wire.encode_response("", True))

    async def stop_receiving(self) -> None:
        """Stop taking new requests; in-flight ones go on (see :meth:`drain`).

        Every request that reached this host and did not start (waiting for a slot, or arriving
        now) is answered ``unavailable`` at once. A non-persistent topic's request consumer is
        closed as soon as another host is seen sharing the subscription
        (:class:`tghost.handoff.PeerWatch`), so the broker routes new requests there; a host that
        is the only one stays subscribed until :meth:`close` and answers them ``unavailable`` (the
        broker would drop them otherwise). A persistent topic's requests stay with the broker, for
        another host or this service's next start: its consumer prefetches nothing and stops
        asking.
        """
        self._stopping = True
        if self._lane is not None:
            self._lane.stop()
        for task in list(self._waiting):
            task.cancel(NOT_STARTED)
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        elif self._consumer is not None and self._client is not None:
            await self._watch_peers(self._client)

    async def _watch_peers(self, client: pulsar.asyncio.Client) -> None:
        """Without a watch (no broker now, or it does not answer in time) the consumer stays
        subscribed and answers ``unavailable`` until :meth:`close`."""
        if not self.is_connected():
            return
        self._peers = peers = handoff.PeerWatch(self._hand_off)  # told of every request from now on
        try:
            async with asyncio.timeout(handoff.WATCH_TIMEOUT):
                await peers.start(client, self.descriptor.request_queue, self.subscription)
        except Exception as exc:
            self._peers = None
            await peers.close()
            log.debug("service %s: cannot watch for other hosts while draining: %r", self.descriptor.id, exc)

    def _hand_off(self) -> None:
        """Another host shares the subscription: close the request consumer now (once)."""
        if self._unsubscribing is None:
            log.info("service %s: another host serves it; stopped receiving its requests here", self.descriptor.id)
            self._unsubscribing = asyncio.create_task(self._unsubscribe())

    async def _unsubscribe(self) -> None:
        """Close the request consumer, then the watch. On a hand-off this runs as the draining
        consumer has just received a request: a Shared subscription deals requests out in turn,
        so the next ones go to the other hosts while the close reaches the broker (a request the
        broker sends to a consumer that is closing is dropped by the client, unanswered)."""
        if self._consumer is not None:
            await self._quietly("close the consumer", self._consumer.close())
        if self._peers is not None:
            await self._peers.close()

    async def drain(self, grace: float, over: asyncio.Event | None = None) -> int:
        """Wait up to ``grace`` seconds (or until ``over`` is set: a second Ctrl-C) for in-flight
        calls; cancel the rest, which are answered ``unavailable`` (persistent: returned to the
        broker). Returns how many were cancelled."""
        if not self.in_flight:
            return 0
        finished = asyncio.ensure_future(self._all_answered())
        ended = asyncio.ensure_future((over or asyncio.Event()).wait())
        await asyncio.wait({finished, ended}, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
        finished.cancel()
        ended.cancel()
        pending = [task for task in self._tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)  # let them answer 'unavailable'
        return len(pending) + (self._lane.cut_off() if self._lane is not None else 0)

    async def _all_answered(self) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks))
        if self._lane is not None:
            await self._lane.idle()

    async def close(self) -> None:
        """Close the consumer and producer, and let go of the executor's workers (a thread still in a
        plugin runs on; worker processes stop); errors are logged, not raised."""
        if self._unsubscribing is None:
            self._unsubscribing = asyncio.create_task(self._unsubscribe())
        await self._unsubscribing
        if self._tasks:  # 'unavailable' answers to requests that arrived while stopping
            await asyncio.wait(set(self._tasks), timeout=1.0)
        if self._producer is not None:
            await self._quietly("flush the producer", self._producer.flush())
            await self._quietly("close the producer", self._producer.close())
        await self._close_executor()

    async def _close_executor(self) -> None:
        if self._lane is not None:
            self._lane.close()
        await self.executor.close()

    async def _quietly(self, what: str, closing: Any) -> None:
        try:
            await closing
        except Exception as exc:
            log.debug("service %s: could not %s: %s", self.descriptor.id, what, exc)


class Server:
    """All the services of one host, started together and shut down gracefully, plus the
    loop-lag watchdog (:class:`tghost.watchdog.LoopWatchdog`) while they serve."""

    def __init__(
        self,
        services: dict[str, ToolService],
        descriptors: dict[str, ToolServiceDescriptor],
        settings: ServeSettings | None = None,
        listeners: Sequence[CallListener] = (),
        authorize: Authorize | None = None,
    ) -> None:
        """Serve ``services`` (by service id) under their ``descriptors``.

        ``listeners`` are told of every request once it is acknowledged (see :class:`CallRecord`).
        ``authorize`` is asked about every decoded request before ``invoke`` (see
        :data:`tghost.hookspecs.Authorize`); ``None`` allows every call.
        """
        self.settings = settings or ServeSettings()
        self._listeners = tuple(listeners)
        self._authorize = authorize
        self.workers = self._workers(services, descriptors)
        self.watchdog: LoopWatchdog | None = None
        self._client: pulsar.asyncio.Client | None = None
        self._grace_over = asyncio.Event()

    def _workers(self, services: dict[str, ToolService],
                 descriptors: dict[str, ToolServiceDescriptor]) -> list[ServiceWorker]:
        return [ServiceWorker(services[sid], descriptors[sid], self.settings, self._listeners, self._authorize)
                for sid in descriptors]

    async def start(self, client: pulsar.asyncio.Client) -> None:
        """Start the watchdog (unless ``stall_threshold`` is 0) and every service worker.

        Raises:
            pulsar.asyncio.PulsarException: a subscription or producer could not be created.
        """
        if self.settings.stall_threshold > 0:
            self.watchdog = LoopWatchdog(self.settings.stall_threshold, owner_type=ThreadExecutor,
                                         label=lambda executor: executor.service_id).start()
        self._client = client
        await asyncio.gather(*(worker.start(client) for worker in self.workers))

    async def add(self, services: dict[str, ToolService], descriptors: dict[str, ToolServiceDescriptor]) -> None:
        """Start serving more services (by service id) on the client given to :meth:`start`, with
        the same settings, listeners and ``authorize``; a live plugin install (:mod:`tghost.watch`).

        Raises:
            RuntimeError: the server was not started.
            ValueError: a service id is already served (nothing is started then).
            pulsar.asyncio.PulsarException: a subscription or producer could not be created; the
                workers that did start are closed again.
        """
        if self._client is None:
            raise RuntimeError("Server.add() before Server.start()")
        taken = sorted(set(descriptors) & {worker.descriptor.id for worker in self.workers})
        if taken:
            raise ValueError(f"service id(s) {taken} already served")
        workers = self._workers(services, descriptors)
        results = await asyncio.gather(*(worker.start(self._client) for worker in workers), return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            await self._shut(workers, 0)
            raise failed
        self.workers += workers

    async def remove(self, service_ids: Iterable[str], grace: float | None = None) -> int:
        """Stop serving ``service_ids`` as :meth:`stop` does for all: hand off and stop receiving,
        give in-flight calls ``grace`` seconds (default ``settings.grace``), close. Unknown ids are
        ignored.

        Returns the number of calls cancelled because the grace period ran out.
        """
        ids = set(service_ids)
        leaving = [worker for worker in self.workers if worker.descriptor.id in ids]
        self.workers = [worker for worker in self.workers if worker.descriptor.id not in ids]
        return await self._shut(leaving, self.settings.grace if grace is None else grace)

    def end_grace(self) -> None:
        """End every grace period now, and any later one at once (a second Ctrl-C or SIGTERM):
        calls still running are answered ``unavailable`` (persistent: returned to the broker)."""
        self._grace_over.set()

    async def _shut(self, workers: list[ServiceWorker], grace: float) -> int:
        await asyncio.gather(*(w.stop_receiving() for w in workers))
        cancelled = sum(await asyncio.gather(*(w.drain(grace, self._grace_over) for w in workers)))
        await asyncio.gather(*(w.close() for w in workers))
        return cancelled

    async def stop(self, grace: float | None = None) -> int:
        """Stop receiving (requests that did not start are answered ``unavailable``, and another
        host takes the new ones: see :meth:`ServiceWorker.stop_receiving`), let in-flight calls
        finish within ``grace`` seconds or until :meth:`end_grace`, then close.

        Returns the number of calls cancelled because the grace period ran out.
        """
        cancelled = await self._shut(self.workers, self.settings.grace if grace is None else grace)
        if self.watchdog is not None:
            self.watchdog.stop()
        return cancelled
