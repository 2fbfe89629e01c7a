"""serve: answer tool-service requests on Pulsar, per the wire contract in DESIGN.md.

One :class:`ServiceWorker` per service: a Shared subscription ``<id>-request`` on its request
topic and a non-batching producer on its response topic. Never imports the directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pulsar
import pulsar.asyncio

from . import wire
from .descriptors import ToolServiceDescriptor
from .service import ToolError, ToolService

__all__ = ["OK", "UNANSWERABLE", "CallListener", "CallRecord", "ServeSettings", "Server", "ServiceWorker"]

log = logging.getLogger(__name__)
_DONE = object()

#: Messages the client may buffer per consumer. The broker drops a non-persistent message
#: when no consumer has a free permit, so the receive loop drains this queue eagerly and
#: the worker itself answers ``overloaded`` beyond its bound: nothing is dropped silently.
RECEIVER_QUEUE = 1000


@dataclass(frozen=True)
class ServeSettings:
    """Host-wide serving limits; a service descriptor's ``timeout``/``max-concurrency`` override.

    ``timeout`` and ``grace`` are seconds. ``max_queue`` is how many requests per service
    may wait for a free slot before new ones are answered ``overloaded``.
    """

    timeout: float = 30.0
    max_concurrency: int = 16
    max_queue: int = 64
    grace: float = 10.0


#: ``CallRecord.status`` of a call answered without error; any other status is the wire error type.
OK = "ok"
#: ``CallRecord.status`` of a request without an ``id`` property: acknowledged, never answered.
UNANSWERABLE = "unanswerable"


@dataclass
class CallRecord:
    """What one request came to, handed to every :data:`CallListener` once it is acknowledged.

    ``status`` is :data:`OK`, :data:`UNANSWERABLE` or the wire error type of the reply
    (``timeout``, ``overloaded``, ...). ``duration`` is seconds from receipt to acknowledgement.
    ``user`` is ``None`` when the envelope could not be decoded.
    """

    service: str
    request_id: str | None
    user: str | None = None
    status: str = OK
    duration: float = 0.0


#: Called once per request, after it is acknowledged (metrics, audit). Must not block; an
#: exception is logged and the host goes on.
CallListener = Callable[[CallRecord], None]


def _next_chunk(chunks: Iterator[Any]) -> Any:
    return next(chunks, _DONE)


class ServiceWorker:
    """Serves one tool service: receive, bound, invoke, reply, then acknowledge."""

    def __init__(
        self,
        service: ToolService,
        descriptor: ToolServiceDescriptor,
        settings: ServeSettings,
        executor: ThreadPoolExecutor,
        listeners: Sequence[CallListener] = (),
    ) -> None:
        self.service = service
        self.descriptor = descriptor
        self.timeout = descriptor.timeout or settings.timeout
        self.max_concurrency = descriptor.max_concurrency or settings.max_concurrency
        self.max_queue = settings.max_queue
        self.counters = {"received": 0, "unanswerable": 0}
        self._executor = executor
        self._listeners = tuple(listeners)
        self._slots = asyncio.Semaphore(self.max_concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._consumer: pulsar.asyncio.Consumer | None = None
        self._producer: pulsar.asyncio.Producer | None = None

    @property
    def subscription(self) -> str:
        """The Shared subscription name, ``<service-id>-request`` (DESIGN.md)."""
        return f"{self.descriptor.id}-request"

    @property
    def in_flight(self) -> int:
        """Requests received and not yet answered (running or waiting for a slot)."""
        return len(self._tasks)

    async def start(self, client: pulsar.asyncio.Client) -> None:
        """Create the response producer, then subscribe and start receiving.

        Raises:
            pulsar.asyncio.PulsarException: the broker refused the producer or subscription.
        """
        self._producer = await client.create_producer(
            self.descriptor.response_queue, batching_enabled=False, block_if_queue_full=True
        )
        self._consumer = await client.subscribe(
            self.descriptor.request_queue,
            self.subscription,
            consumer_type=pulsar.ConsumerType.Shared,
            receiver_queue_size=RECEIVER_QUEUE,
        )
        self._loop_task = asyncio.create_task(self._receive_loop(), name=f"receive {self.descriptor.id}")

    async def _receive_loop(self) -> None:
        assert self._consumer is not None
        while True:
            try:
                message = await self._consumer.receive()
            except pulsar.asyncio.PulsarException as exc:
                if exc.error() == pulsar.Result.AlreadyClosed:
                    return
                log.warning("service %s: receive failed (%s); retrying", self.descriptor.id, exc)
                await asyncio.sleep(0.5)
                continue
            self.counters["received"] += 1
            task = asyncio.create_task(self._handle(message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _handle(self, message: pulsar.Message) -> None:
        started = time.perf_counter()
        record = CallRecord(self.descriptor.id, message.properties().get("id"))
        log.debug("service %s: request %s received", self.descriptor.id, record.request_id)
        try:
            if record.request_id is None:
                self.counters["unanswerable"] += 1
                record.status = UNANSWERABLE
                log.warning("service %s: request without 'id' property cannot be answered; "
                            "acknowledged and dropped", self.descriptor.id)
            elif len(self._tasks) > self.max_concurrency + self.max_queue:
                await self._fail(record, wire.OVERLOADED, f"service {self.descriptor.id!r} has "
                                 f"{self.max_concurrency} calls running and {self.max_queue} waiting; retry later")
            else:
                async with self._slots:
                    await self._answer(record, message.data())
        except asyncio.CancelledError:
            if record.request_id is not None:
                with contextlib.suppress(Exception):
                    await self._fail(record, wire.UNAVAILABLE, "the host shut down before the call finished; retry")
            raise
        except Exception:
            log.exception("service %s: could not reply to request %s", self.descriptor.id, record.request_id)
        finally:
            with contextlib.suppress(Exception):
                await self._consumer.acknowledge(message)  # type: ignore[union-attr]
            record.duration = time.perf_counter() - started
            self._notify(record)

    def _notify(self, record: CallRecord) -> None:
        for listener in self._listeners:
            try:
                listener(record)
            except Exception:
                log.exception("service %s: call listener %r failed", self.descriptor.id, listener)

    async def _send(self, request_id: str, payload: bytes) -> None:
        await self._producer.send(payload, properties={"id": request_id})  # type: ignore[union-attr]

    async def _fail(self, record: CallRecord, error_type: str, message: str) -> None:
        """Answer the request with an error reply and record its type as the call's status."""
        record.status = error_type
        await self._send(record.request_id or "", wire.encode_error(error_type, message))

    async def _answer(self, record: CallRecord, payload: bytes) -> None:
        """Decode, check config, invoke under the timeout, and send the reply (or error)."""
        try:
            request = wire.decode_request(payload)
        except wire.BadRequest as exc:
            await self._fail(record, wire.BAD_REQUEST, str(exc))
            return
        record.user = request.user
        missing = [p for p in self.descriptor.required_config if p not in request.config]
        if missing:
            await self._fail(record, wire.MISSING_CONFIG,
                             f"service {self.descriptor.id!r} needs config param(s) {missing}")
            return
        try:
            async with asyncio.timeout(self.timeout):
                await self._stream(record.request_id or "", request)
        except TimeoutError:
            await self._fail(record, wire.TIMEOUT, f"service {self.descriptor.id!r} did not finish within "
                                                   f"{self.timeout}s")
        except ToolError as exc:
            await self._fail(record, exc.error_type, str(exc))
        except Exception as exc:
            log.exception("service %s: invoke raised", self.descriptor.id)
            await self._fail(record, wire.TOOL_SERVICE_ERROR, f"{type(exc).__name__}: {exc}")

    async def _stream(self, request_id: str, request: wire.Request) -> None:
        """Send one response, or for a generator one per chunk then an empty final one."""
        result = await self._invoke(request)
        if inspect.isasyncgen(result) or inspect.isgenerator(result):
            async for chunk in self._chunks(result):
                await self._send(request_id, wire.encode_response(wire.observation(chunk), False))
            await self._send(request_id, wire.encode_response("", True))
        else:
            await self._send(request_id, wire.encode_response(wire.observation(result)))

    async def _invoke(self, request: wire.Request) -> Any:
        args = (request.user, request.config, request.arguments)
        if self.service.runs_in_thread:
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(self._executor, self.service.invoke, *args)
        else:
            result = self.service.invoke(*args)
        return await result if inspect.isawaitable(result) else result

    async def _chunks(self, result: Any) -> AsyncIterator[Any]:
        if inspect.isasyncgen(result):
            async with contextlib.aclosing(result):
                async for chunk in result:
                    yield chunk
            return
        loop = asyncio.get_running_loop()
        try:
            while (chunk := await loop.run_in_executor(self._executor, _next_chunk, result)) is not _DONE:
                yield chunk
        finally:
            result.close()

    async def stop_receiving(self) -> None:
        """Stop taking new requests; in-flight ones go on."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task

    async def drain(self, grace: float) -> int:
        """Wait up to ``grace`` seconds for in-flight calls; cancel the rest. Returns how many."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
            for task in pending:
                task.cancel()
            return len(pending)
        return 0

    async def close(self) -> None:
        """Close the consumer and producer; errors are logged, not raised."""
        for closable in (self._consumer, self._producer):
            if closable is not None:
                try:
                    await closable.close()
                except Exception as exc:
                    log.debug("service %s: close failed: %s", self.descriptor.id, exc)


class Server:
    """All the services of one host, started together and shut down gracefully."""

    def __init__(
        self,
        services: dict[str, ToolService],
        descriptors: dict[str, ToolServiceDescriptor],
        settings: ServeSettings | None = None,
        listeners: Sequence[CallListener] = (),
    ) -> None:
        """``listeners`` are told of every request once it is acknowledged (see :class:`CallRecord`)."""
        self.settings = settings or ServeSettings()
        self._executor = ThreadPoolExecutor(
            max_workers=max(4, sum(
                (d.max_concurrency or self.settings.max_concurrency) for d in descriptors.values()
            )),
            thread_name_prefix="tghost-invoke",
        )
        self.workers = [
            ServiceWorker(services[sid], descriptors[sid], self.settings, self._executor, listeners)
            for sid in descriptors
        ]

    async def start(self, client: pulsar.asyncio.Client) -> None:
        """Start every service worker.

        Raises:
            pulsar.asyncio.PulsarException: a subscription or producer could not be created.
        """
        await asyncio.gather(*(worker.start(client) for worker in self.workers))

    async def stop(self, grace: float | None = None) -> int:
        """Stop receiving, let in-flight calls finish within ``grace`` seconds, then close.

        Returns the number of calls cancelled because the grace period ran out.
        """
        grace = self.settings.grace if grace is None else grace
        await asyncio.gather(*(w.stop_receiving() for w in self.workers))
        cancelled = sum(await asyncio.gather(*(w.drain(grace) for w in self.workers)))
        await asyncio.gather(*(w.close() for w in self.workers))
        self._executor.shutdown(wait=False, cancel_futures=True)
        return cancelled
