"""testing: a pytest plugin for tool-service authors (loaded through the ``pytest11`` entry point).

Gives a session-wide real broker (the ``pulsar_broker`` fixture: embedded pulsar-lite on a
free port, temporary data) and :class:`LocalHost`, which serves services in-process and
calls them over the real wire. Never mocks Pulsar.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

import pulsar.asyncio
import pytest

from . import wire
from .announce import DEFAULT_TOPIC, Announcer, HostIdentity
from .broker import PulsarSettings, free_port
from .client import ToolServiceClient
from .descriptors import ToolServiceDescriptor
from .discover import Catalog, catalog_of
from .embedded import EmbeddedBroker
from .serve import Server, ServeSettings
from .service import ToolService
from .trust import Signer

__all__ = ["LocalHost", "RawWire", "pulsar_broker"]


@pytest.fixture(scope="session")
def pulsar_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A pulsar-lite broker for the test session, on a free port with a temporary data dir."""
    broker = EmbeddedBroker(tmp_path_factory.mktemp("pulsar-lite"), free_port()).start()
    yield broker
    broker.stop()


class LocalHost:
    """Serve ``services`` in this process on the broker at ``url``, and call them over Pulsar.

    ``async with LocalHost(url, [my_service]) as host: await host.call("my-service", {...})``.
    ``services`` is an iterable of :class:`tghost.ToolService` or a discovered ``Catalog``.
    With ``announce_as`` (a host id) it also announces them on ``topic`` with a ``lease``
    (seconds), signed by ``signer`` if given (:class:`tghost.trust.Signer`), and withdraws
    them on exit, as ``tghost run`` does. ``authorize`` is a function with the contract of the
    ``tghost_authorize`` hook (a ``Catalog`` brings its own).
    """

    def __init__(
        self,
        url: str,
        services: Iterable[ToolService] | Catalog,
        settings: ServeSettings | None = None,
        *,
        announce_as: str | None = None,
        lease: float = 30.0,
        topic: str = DEFAULT_TOPIC,
        signer: Signer | None = None,
        authorize: Callable[..., Any] | None = None,
    ) -> None:
        self.catalog = services if isinstance(services, Catalog) else catalog_of(services, authorize=authorize)
        self.services, self.descriptors = self.catalog.services, self.catalog.descriptors
        self.pulsar = PulsarSettings(url)
        self.server = Server(self.services, self.descriptors, settings, authorize=self.catalog.authorize)
        self.announcer = None if announce_as is None else Announcer(
            self.catalog, HostIdentity(announce_as, "localhost", os.getpid()), topic, lease, signer)
        self._clients: dict[str, ToolServiceClient] = {}
        self._lock = asyncio.Lock()
        self.client: pulsar.asyncio.Client | None = None

    async def __aenter__(self) -> LocalHost:
        self.client = await self.pulsar.connect()
        await self.server.start(self.client)
        if self.announcer is not None:
            await self.announcer.start(self.client)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.announcer is not None:
            await self.announcer.withdraw()
        for caller in self._clients.values():
            await caller.close()
        await self.server.stop(grace=5.0)
        assert self.client is not None
        await self.client.close()

    async def caller(self, service_id: str) -> ToolServiceClient:
        """A started :class:`ToolServiceClient` for one of the served services (cached)."""
        async with self._lock:
            if service_id in self._clients:
                return self._clients[service_id]
            descriptor = self.descriptors[service_id]
            assert self.client is not None, "use 'async with LocalHost(...)'"
            caller = await ToolServiceClient(
                self.client, descriptor.request_queue, descriptor.response_queue
            ).start()
            self._clients[service_id] = caller
            return caller

    async def call(
        self,
        service_id: str,
        arguments: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        *,
        user: str | None = "test",
        timeout: float = 10.0,
    ) -> str:
        """Call a served service over Pulsar and return the observation.

        Raises:
            tghost.client.ToolCallError: the service answered with an error or not in time.
        """
        caller = await self.caller(service_id)
        return await caller.call(config or {}, arguments or {}, user=user, timeout=timeout)

    async def stream(
        self,
        service_id: str,
        arguments: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        *,
        user: str | None = "test",
        timeout: float = 10.0,
    ) -> AsyncIterator[str]:
        """Call a served service and yield its observation chunks as they arrive."""
        caller = await self.caller(service_id)
        async for chunk in caller.stream(config or {}, arguments or {}, user=user, timeout=timeout):
            yield chunk


class RawWire:
    """Speaks the wire by hand, to check a service against the seed 000 contract itself.

    ``async with RawWire(url, descriptor) as raw:`` subscribes to the response queue, then
    :meth:`send` publishes any bytes with any message properties, and :meth:`replies`
    collects the decoded JSON replies that carry one ``id`` property, up to ``end_of_stream``.
    """

    def __init__(self, url: str, descriptor: ToolServiceDescriptor) -> None:
        self.pulsar = PulsarSettings(url)
        self.descriptor = descriptor

    async def __aenter__(self) -> RawWire:
        self.client = await self.pulsar.connect()
        self.consumer = await self.client.subscribe(self.descriptor.response_queue, f"raw-{uuid.uuid4().hex}")
        self.producer = await self.client.create_producer(self.descriptor.request_queue, batching_enabled=False)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()

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

    async def replies(self, request_id: str, timeout: float = 10.0) -> list[tuple[dict[str, str], dict[str, Any]]]:
        """The replies carrying ``id == request_id``, as (properties, JSON body) pairs, up to the first
        with ``end_of_stream`` true.

        Raises:
            TimeoutError: no reply came within ``timeout`` seconds of the previous one.
        """
        got: list[tuple[dict[str, str], dict[str, Any]]] = []
        while not got or not got[-1][1]["end_of_stream"]:
            message = await asyncio.wait_for(self.consumer.receive(), timeout)
            await self.consumer.acknowledge(message)
            if message.properties().get("id") == request_id:
                got.append((message.properties(), json.loads(message.data())))
        return got
