"""testing: a pytest plugin for tool-service authors (loaded through the ``pytest11`` entry point).

Gives a session-wide real broker (the ``pulsar_broker`` fixture: embedded pulsar-lite on a
free port, temporary data), :class:`LocalHost`, which serves services in-process and calls
them over the real wire, :func:`check_conformance` for any service's wire behaviour, and
:func:`simulated_history` for the announcements of a long-running deployment. Never mocks Pulsar.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import inspect
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any

import pulsar.asyncio
import pytest

from tghost.agent.client import ToolServiceClient
from tghost.announcing.announcer import Announcer, HostIdentity
from tghost.author.service import ToolService
from tghost.author.toolset import ToolSet
from tghost.broker import EmbeddedBroker
from tghost.conformance import Conformance, Finding, RawWire, check_conformance
from tghost.discovery.catalog import Catalog
from tghost.discovery.discover import catalog_of
from tghost.operate.host import Host, HostConfig
from tghost.protocol.epochs import DEFAULT_TOPIC, EPOCH_SECONDS, epoch_of, epoch_topic
from tghost.protocol.trust import Signer
from tghost.protocol.wire import Progress
from tghost.pulsar.clients import PulsarSettings
from tghost.serving.request import CallListener
from tghost.serving.settings import ServeSettings
from tghost.system.net import free_port

__all__ = [
    "Conformance",
    "EmbeddedBroker",
    "Finding",
    "LocalHost",
    "RawWire",
    "check_conformance",
    "publish_history",
    "pulsar_broker",
    "simulated_history",
]


@pytest.fixture(scope="session")
def pulsar_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A pulsar-lite broker for the test session, on a free port with a temporary data dir."""
    broker = EmbeddedBroker(tmp_path_factory.mktemp("pulsar-lite"), free_port()).start()
    yield broker
    broker.stop()


class LocalHost(Host):
    """Serve tool services in this process on the broker at ``url``, and call them over Pulsar:
    a :class:`tghost.Host` with a test's defaults, whose exit runs the host's whole stop
    (withdraw, drain, the plugins' ``tghost_shutdown`` hooks once, close).

    ``async with LocalHost(url, [my_service]) as host: await host.call("my-tool", {...})``.
    What it serves, as a plugin would register it:

    - ``services``: :class:`tghost.ToolService` instances, ``@tghost.tool`` functions (a
      function's own tool comes with it) and :class:`tghost.ToolSet` objects, with ``tools``: tool
      descriptors or dicts over them (e.g. ``service.tool("query-customers", collection="customers")``);
      or a discovered ``Catalog``;
    - or ``plugin``: a plugin module (or object) whose hooks register them, loaded as the host
      loads an entry point's module, so the test covers ``tghost_register_tools`` and
      ``tghost_shutdown`` too (a ``Catalog`` passed in is the test's to shut down).

    :meth:`call` and :meth:`stream` take a tool name, whose config values go into the request,
    as ``ToolDirectory`` and ``tghost call TOOL`` send them; or a service id.
    With ``announce_as`` (a host id) it also announces them on ``topic`` with a ``lease``
    (seconds), signed by ``signer`` if given (:class:`tghost.Signer`), on epochs of
    ``epoch_seconds``, and withdraws them on exit, as ``tghost run`` does. ``authorize`` is a
    function with the contract of the ``tghost_authorize`` hook (a ``Catalog`` or ``plugin``
    brings its own). ``listeners`` are told of every call (``tghost.CallRecord``), as
    metrics and the audit log are. ``settings`` are the host's serving limits; by default a
    test's: ``ServeSettings(grace=5.0)``, the seconds in-flight calls get on exit.

    Raises:
        DescriptorError, ValueError: a descriptor is invalid, a name is registered twice, or the
            plugin failed to register (the message names it).
    """

    def __init__(
        self,
        url: str,
        services: Iterable[ToolService | ToolSet] | Catalog = (),
        settings: ServeSettings | None = None,
        *,
        tools: Iterable[Any] = (),
        plugin: object | None = None,
        announce_as: str | None = None,
        lease: float = 30.0,
        topic: str = DEFAULT_TOPIC,
        signer: Signer | None = None,
        authorize: Callable[..., Any] | None = None,
        epoch_seconds: float = EPOCH_SECONDS,
        listeners: Sequence[CallListener] = (),
    ) -> None:
        given = None if plugin is not None else services if isinstance(services, Catalog) \
            else catalog_of(services, tools, authorize=authorize)
        config = HostConfig(pulsar=PulsarSettings(url), topic=topic, serve=settings or ServeSettings(grace=5.0),
                            announce=announce_as is not None, host_id=announce_as, lease=lease, signer=signer,
                            epoch_seconds=epoch_seconds)
        super().__init__(config, given, plugin=plugin, listeners=listeners)
        self.services, self.descriptors = self.catalog.services, self.catalog.descriptors
        self.pulsar = config.pulsar
        self._clients: dict[str, ToolServiceClient] = {}
        self._callers_client: pulsar.asyncio.Client | None = None
        self._lock = asyncio.Lock()

    async def stop(self, grace: float | None = None) -> int:
        """Stop the host (:meth:`tghost.Host.stop`), then close the test's callers: a call in
        flight is answered first."""
        try:
            return await super().stop(grace)
        finally:
            for caller in self._clients.values():
                await caller.close()
            self._clients.clear()
            if self._callers_client is not None:
                await self._callers_client.close()
                self._callers_client = None

    async def caller(self, service_id: str) -> ToolServiceClient:
        """A started :class:`ToolServiceClient` for one of the served services (cached)."""
        async with self._lock:
            if service_id in self._clients:
                return self._clients[service_id]
            descriptor = self.descriptors[service_id]
            if self._callers_client is None:  # the test's callers are the host's peers: a connection of their own
                self._callers_client = await self.pulsar.connect()
            caller = await ToolServiceClient(
                self._callers_client, descriptor.request_queue, descriptor.response_queue, service_id=service_id
            ).start()
            self._clients[service_id] = caller
            return caller

    def request(self, name: str, config: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """The service id and config a call of ``name`` sends: for a tool, its service and its
        config values updated with ``config``; for a service id, that service and ``config``.

        Raises:
            KeyError: no tool or service is served here by that name (the message lists them).
        """
        tool = self.catalog.tools.get(name)
        if tool is not None:
            return tool.service, {**tool.config, **(config or {})}
        if name in self.descriptors:
            return name, dict(config or {})
        raise KeyError(f"no tool or service named {name!r} is served here; tools: {sorted(self.catalog.tools)}, "
                       f"services: {sorted(self.descriptors)}")

    async def call(self, name: str, arguments: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
                   **options: Any) -> str:
        """Call tool (or service) ``name`` over Pulsar and return the observation, all chunks
        joined; the ``options`` (``user``, ``timeout``, ``progress``) and the errors are :meth:`stream`'s."""
        return "".join([chunk async for chunk in self.stream(name, arguments, config, **options)])

    async def stream(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        *,
        user: str | None = "test",
        timeout: float = 10.0,
        progress: Callable[[Progress], Any] | None = None,
    ) -> AsyncIterator[str]:
        """Call tool (or service) ``name`` over Pulsar and yield its observation chunks as they arrive.

        ``config`` is added to the tool's config values (see :meth:`request`); ``timeout`` is in
        seconds; ``user`` goes into the request envelope; ``progress`` gets the tool's progress
        updates (``ctx.progress``, docs/protocol.md §2.12).

        Raises:
            tghost.ToolCallError: the service answered with an error (``.error_type``, ``.message``)
                or not in time (``timeout``).
            KeyError: nothing is served here by that name.
        """
        service_id, merged = self.request(name, config)
        caller = await self.caller(service_id)
        async with contextlib.aclosing(caller.stream(merged, arguments or {}, user=user, timeout=timeout,
                                                     progress=progress)) as chunks:
            async for chunk in chunks:
                yield chunk


@pytest.hookimpl
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run an ``async def`` test that uses ``pulsar_broker`` on a fresh event loop, when no other
    plugin ran it first (pytest-asyncio and anyio turn the tests they run into plain functions,
    or answer this hook before it): a plugin's own tests need no pytest configuration and no
    pytest-asyncio. Returns ``True`` when it ran the test, ``None`` to leave it to pytest."""
    test = pyfuncitem.obj
    if not inspect.iscoroutinefunction(test) or "pulsar_broker" not in pyfuncitem.fixturenames:
        return None
    parameters = inspect.signature(test).parameters
    asyncio.run(test(**{name: value for name, value in pyfuncitem.funcargs.items() if name in parameters}))
    return True


#: One message of a simulated history: (unix time sent, epoch topic, message key, value bytes).
Sent = tuple[float, str, str, bytes]


def simulated_history(
    catalog: Catalog,
    hosts: int,
    seconds: float,
    *,
    lease: float = 30.0,
    restarts_per_day: float = 10.0,
    topic: str = DEFAULT_TOPIC,
    epoch_seconds: float = EPOCH_SECONDS,
    now: float | None = None,
) -> Iterator[Sent]:
    """Every announcement ``hosts`` hosts serving ``catalog`` sent in the ``seconds`` before
    unix time ``now`` (default: now), in send order, built by a real :class:`Announcer` with a
    simulated clock: a start, a heartbeat every ``lease / 3`` seconds, a restatement on every
    new epoch, and ``restarts_per_day`` restarts each (withdraw everything, then a new instance
    announces). Every host is alive at ``now``. Publish them with :func:`publish_history` to
    test or measure a catch-up after a long history without waiting for it.
    """
    end = time.time() if now is None else now
    runs = (_host_history(catalog, f"simulated-{h}", end - seconds + h * 0.01, end, lease,
                          86_400 / restarts_per_day if restarts_per_day else seconds + 1, topic, epoch_seconds)
            for h in range(hosts))
    return heapq.merge(*runs, key=lambda sent: sent[0])


def _host_history(catalog: Catalog, host_id: str, t: float, end: float, lease: float, restart_every: float,
                  topic: str, epoch_seconds: float) -> Iterator[Sent]:
    """One simulated host's messages from ``t`` to ``end`` (unix seconds), instance after instance."""
    while True:
        announcer = Announcer(catalog, HostIdentity(host_id, "simulated", 0), topic, lease, epoch_seconds=epoch_seconds)
        announcer._started_at, announcer._since = t, dict.fromkeys(announcer._since, t)
        yield from _sent(announcer, "available", t, everything=True)
        epoch, stop = epoch_of(t, epoch_seconds), min(t + restart_every, end)
        while (t := t + lease / 3) < stop:
            restate = epoch_of(t, epoch_seconds) != epoch
            epoch = epoch_of(t, epoch_seconds)
            yield from _sent(announcer, "available", t, everything=restate)
        if stop >= end:
            yield from _sent(announcer, "available", end, everything=epoch_of(end, epoch_seconds) != epoch)
            return
        yield from _sent(announcer, "withdrawn", stop, everything=True)
        t = stop + 1.0  # the restart


def _sent(announcer: Announcer, status: str, at: float, everything: bool) -> Iterator[Sent]:
    """What ``announcer`` sends at ``at``: everything (a start, restatement or withdrawal) or a heartbeat."""
    messages = (announcer._messages(status, None, at) if everything
                else [announcer._message("host", announcer.identity.id, None, None, status, at)])
    where = epoch_topic(announcer.topic, epoch_of(at, announcer.epoch_seconds))
    return ((at, where, key, json.dumps(value).encode()) for key, value in messages)


async def publish_history(url: str, history: Iterable[Sent], window: int = 500) -> int:
    """Publish simulated messages (see :func:`simulated_history`) on their topics, up to
    ``window`` sends in flight; returns how many were sent.

    Raises:
        pulsar.asyncio.PulsarException: the broker refused a producer or a send.
    """
    client = await PulsarSettings(url).connect()
    producer: pulsar.asyncio.Producer | None = None
    current = ""
    pending: list[asyncio.Future[Any]] = []
    sent = 0
    try:
        for _, topic, key, value in history:
            if topic != current:  # the history is in time order: an old epoch's topic is done with
                await asyncio.gather(*pending)
                pending.clear()
                if producer is not None:
                    await producer.close()
                producer = await client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
                current = topic
            assert producer is not None
            pending.append(asyncio.ensure_future(producer.send(value, partition_key=key)))
            sent += 1
            if len(pending) >= window:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await client.close()
    return sent
