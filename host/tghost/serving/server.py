"""server: all the tool services of one host (:class:`Server`), started together, extended and
shrunk by a live plugin install, and shut down gracefully: stop receiving, hand off, drain, close.

Each service is a :class:`tghost.serving.endpoint.ServiceEndpoint`; the stall detector
(:class:`tghost.serving.stalls.StallDetector`) samples their event loop while they serve.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Collection, Iterable, Sequence

import pulsar.asyncio

from tghost.author.hookspecs import Authorize
from tghost.author.service import ToolService
from tghost.protocol.descriptors import ToolServiceDescriptor
from tghost.protocol.trust import Signer
from tghost.serving.access import Fleet, Gate
from tghost.serving.endpoint import ServiceEndpoint
from tghost.serving.executors.base import THREAD
from tghost.serving.executors.thread import ThreadExecutor
from tghost.serving.request import CallListener
from tghost.serving.settings import ServeSettings
from tghost.serving.stalls import StallDetector

__all__ = ["Server"]


class Server:
    """All the services of one host, started together and shut down gracefully (:meth:`drain`,
    then :meth:`close` as the last step before the process exits), plus the stall detector
    (:class:`tghost.serving.stalls.StallDetector`) while they serve."""

    def __init__(
        self,
        services: dict[str, ToolService],
        descriptors: dict[str, ToolServiceDescriptor],
        settings: ServeSettings | None = None,
        listeners: Sequence[CallListener] = (),
        authorize: Authorize | None = None,
        gate: Gate | None = None,
        signer: Signer | None = None,
        in_process: Collection[str] = (),
        fleet: Fleet | None = None,
        host_id: str | None = None,
    ) -> None:
        """Serve ``services`` (by service id) under their ``descriptors``; those of ``in_process``
        (the services of a toolset, live objects a worker process cannot load) in the host's
        worker threads whatever ``settings.isolation`` says, unless they set their own.

        ``listeners`` are told of every request once it is acknowledged (see :class:`CallRecord`).
        ``authorize`` is asked about every decoded request before ``invoke`` (see
        :data:`tghost.author.hookspecs.Authorize`); ``None`` allows every call. ``gate`` applies
        the host's ``[access]`` policy first (:class:`tghost.serving.access.Gate`). ``signer``
        (the host's signing key) signs the answers of callers that can check them (docs/protocol.md §2.13).
        ``fleet`` admits a request only where the service's other live providers would too
        (:class:`tghost.serving.access.Fleet`). ``host_id``, the host's id (``None``: it has none),
        goes in every error reply, so a caller knows whose log to read (docs/protocol.md §2.6).
        """
        self.host_id = host_id
        self.gate = gate
        self.fleet = fleet
        self.signer = signer
        self.settings = settings or ServeSettings()
        self._listeners = tuple(listeners)
        self._authorize = authorize
        self._served = (services, descriptors, in_process)  # opened by start()
        self.endpoints: list[ServiceEndpoint] = []
        self.stall_detector: StallDetector | None = None
        self._client: pulsar.asyncio.Client | None = None
        self._grace_over = asyncio.Event()

    async def start(self, client: pulsar.asyncio.Client) -> None:
        """Start the stall detector (unless ``stall_threshold`` is 0) and every service endpoint.

        Raises:
            pulsar.asyncio.PulsarException: a subscription or producer could not be created; the
                endpoints that did start are closed again, and the stall detector stopped.
        """
        if self.settings.stall_threshold > 0:
            self.stall_detector = StallDetector(self.settings.stall_threshold, owner_type=ThreadExecutor,
                                         label=lambda executor: executor.service_id).start()
        self._client = client
        try:
            self.endpoints = await self._open(*self._served)
        except BaseException:
            if self.stall_detector is not None:
                self.stall_detector.stop()
            raise

    async def add(self, services: dict[str, ToolService], descriptors: dict[str, ToolServiceDescriptor],
                  in_process: Collection[str] = (), replace: Collection[str] = ()) -> list[ServiceEndpoint]:
        """Start serving more services (by service id) on the client given to :meth:`start`, with
        the same settings, listeners and ``authorize`` (``in_process`` as on construction); a live
        plugin install (:mod:`tghost.operate.plugin_watch`) or a toolset's change (:mod:`tghost.operate.toolsets`).

        The ids of ``replace`` may be served already (a toolset's new object of the same id):
        their endpoints are taken out (as :meth:`detach` does) only once the new ones receive,
        so a call is never without an endpoint, and returned for :meth:`retire` (``[]`` if none).

        Raises:
            RuntimeError: the server was not started.
            ValueError: a service id not in ``replace`` is already served (nothing is started then).
            pulsar.asyncio.PulsarException: a subscription or producer could not be created; the
                endpoints that did start are closed again, and those it would replace serve on.
        """
        if self._client is None:
            raise RuntimeError("Server.add() before Server.start()")
        taken = sorted((set(descriptors) - set(replace)) & {endpoint.descriptor.id for endpoint in self.endpoints})
        if taken:
            raise ValueError(f"service id(s) {taken} already served")
        endpoints = await self._open(services, descriptors, in_process)
        replaced = self.detach(set(replace) & set(descriptors))
        for endpoint in replaced:
            endpoint.hand_off()
        self.endpoints += endpoints
        return replaced

    async def _open(self, services: dict[str, ToolService], descriptors: dict[str, ToolServiceDescriptor],
                    in_process: Collection[str]) -> list[ServiceEndpoint]:
        """Open an endpoint per service on the client; if one fails, close those that opened and
        raise its error."""
        assert self._client is not None
        threads = dataclasses.replace(self.settings, isolation=THREAD)
        results = await asyncio.gather(*(
            ServiceEndpoint.open(self._client, services[sid], descriptors[sid],
                                 threads if sid in in_process else self.settings, self._listeners, self._authorize,
                                 self.gate, self.signer, self.fleet, self.host_id)
            for sid in descriptors), return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            await self._shut([r for r in results if isinstance(r, ServiceEndpoint)], 0)
            raise failed
        return [r for r in results if isinstance(r, ServiceEndpoint)]

    async def remove(self, service_ids: Iterable[str], grace: float | None = None) -> int:
        """Stop serving ``service_ids`` as :meth:`stop` does for all: hand off and stop receiving,
        give in-flight calls ``grace`` seconds (default ``settings.grace``), close. Unknown ids are
        ignored.

        Returns the number of calls cancelled because the grace period ran out.
        """
        return await self.retire(self.detach(service_ids), grace)

    def detach(self, service_ids: Iterable[str]) -> list[ServiceEndpoint]:
        """Take the endpoints of ``service_ids`` out of the server at once, still receiving, and
        return them for :meth:`retire`: the ids are free to be added again meanwhile (a toolset
        that replaces a service by a new one of the same id). Unknown ids are ignored."""
        ids = set(service_ids)
        leaving = [endpoint for endpoint in self.endpoints if endpoint.descriptor.id in ids]
        self.endpoints = [endpoint for endpoint in self.endpoints if endpoint.descriptor.id not in ids]
        return leaving

    async def retire(self, endpoints: list[ServiceEndpoint], grace: float | None = None) -> int:
        """Stop serving ``endpoints`` (from :meth:`detach`) as :meth:`remove` says; returns the
        number of calls cancelled because the grace period (or :meth:`end_grace`) ran out."""
        return await self._shut(endpoints, self.settings.grace if grace is None else grace)

    def end_grace(self) -> None:
        """End every grace period now, and any later one at once (a second Ctrl-C or SIGTERM):
        calls still running are answered ``unavailable`` (persistent: returned to the broker)."""
        self._grace_over.set()

    async def _shut(self, endpoints: list[ServiceEndpoint], grace: float) -> int:
        cancelled = await self._drain(endpoints, grace)
        await asyncio.gather(*(w.close() for w in endpoints))
        return cancelled

    async def _drain(self, endpoints: list[ServiceEndpoint], grace: float) -> int:
        await asyncio.gather(*(w.stop_receiving() for w in endpoints))
        cancelled = sum(await asyncio.gather(*(w.drain(grace, self._grace_over) for w in endpoints)))
        await asyncio.gather(*(w.release() for w in endpoints))
        return cancelled

    async def drain(self, grace: float | None = None) -> int:
        """Stop receiving (requests that did not start are answered ``unavailable``, and another
        host takes the new ones: see :meth:`ServiceEndpoint.stop_receiving`), let in-flight calls
        finish within ``grace`` seconds or until :meth:`end_grace`, then let go of the workers.
        A service no other host shares stays subscribed, answering ``unavailable``, until
        :meth:`close`: call that as the last step before the process exits.

        Returns the number of calls cancelled because the grace period ran out.
        """
        cancelled = await self._drain(self.endpoints, self.settings.grace if grace is None else grace)
        if self.stall_detector is not None:
            self.stall_detector.stop()
        return cancelled

    async def close(self) -> None:
        """Close every request consumer and response producer (after :meth:`drain`); returns
        once the ``unavailable`` answers to requests that arrived until then are sent."""
        await asyncio.gather(*(w.close() for w in self.endpoints))

    async def stop(self, grace: float | None = None) -> int:
        """:meth:`drain`, then :meth:`close`. Returns the number of calls cancelled because the
        grace period ran out."""
        cancelled = await self.drain(grace)
        await self.close()
        return cancelled
