"""host: one tghost host, to run or embed. :class:`HostConfig` says what to serve and how;
:class:`Host` puts it together (plugins, server, announcer, contest watch, metrics, audit log,
plugin watch) and stops it in one order: withdraw, drain, the plugins' ``tghost_shutdown``
hooks once, close. ``tghost run`` and :class:`tghost.testing.LocalHost` are both a ``Host``.
Never parses a command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import pulsar.asyncio

from tghost.announcing.announcer import Announcer, HostIdentity
from tghost.discovery.catalog import Catalog
from tghost.discovery.config import ConfigError, load_access, load_config_tools, read_config
from tghost.discovery.discover import PluginSelection, catalog_of, discover
from tghost.operate.contest import ContestWatch
from tghost.operate.plugin_watch import PluginWatcher, WatchSettings
from tghost.protocol.epochs import DEFAULT_TOPIC, EPOCH_SECONDS
from tghost.protocol.sessions import HostSessionKey
from tghost.protocol.trust import Signer
from tghost.pulsar.clients import PulsarSettings
from tghost.serving.access import Gate
from tghost.serving.executors.base import PROCESS
from tghost.serving.request import CallListener
from tghost.serving.server import Server
from tghost.serving.settings import ServeSettings
from tghost.system.paths import app_dir

if TYPE_CHECKING:
    from tghost.operate.metrics import HostMonitor

__all__ = ["Host", "HostConfig", "HostError"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostConfig:
    """What one host serves and how; every field has ``tghost run``'s default.

    - ``pulsar``: the broker and its auth/TLS (:class:`tghost.PulsarSettings`); ``topic``: the
      announcement topic (docs/protocol.md §4.1).
    - ``serve``: host-wide serving limits: timeouts, concurrency, grace, isolation
      (:class:`tghost.ServeSettings`).
    - ``announce``: announce what is served (``False``: serve only, as a host behind a static
      config). ``lease``: seconds an announcement lives without a heartbeat (at most
      ``MAX_LEASE``, 600). ``host_id``: the id announced (default: a stable id per host slot in
      ``state_dir``, default ``~/.config/tghost``). ``signer``: signs every announcement
      (:class:`tghost.Signer`; ``None``: unsigned). ``epoch_seconds``: how long one announcement
      topic is written before the next (docs/protocol.md §4.1).
    - ``config_file``: a TOML file of tools, external services, ``[access]`` and plugin config
      (README "Configuration"); ``plugins``: which installed plugins load (default: from
      ``TGHOST_LOAD_PLUGINS``/``TGHOST_DISABLE_PLUGINS``). Both apply only to a host that
      discovers its plugins (no ``services`` given to :class:`Host`).
    - ``watch_plugins``: serve plugins pip-installed while running, withdraw uninstalled ones,
      looking every ``watch_interval`` seconds.
    - ``metrics_port``: serve Prometheus ``/metrics`` and ``/health`` there, bound to
      ``metrics_host`` (``None``: off; ``0``: a free port). ``audit_log``: append one JSON line
      per call to this path, ``-`` for stderr (``None``: off); ``audit_arguments`` adds the
      argument values.
    """

    pulsar: PulsarSettings = field(default_factory=PulsarSettings)
    topic: str = DEFAULT_TOPIC
    serve: ServeSettings = field(default_factory=ServeSettings)
    announce: bool = True
    lease: float = 30.0
    host_id: str | None = None
    signer: Signer | None = None
    epoch_seconds: float = EPOCH_SECONDS
    state_dir: Path | None = None
    config_file: Path | None = None
    plugins: PluginSelection | None = None
    watch_plugins: bool = False
    watch_interval: float = 2.0
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    audit_log: str | None = None
    audit_arguments: bool = False


class HostError(RuntimeError):
    """The host cannot start: ``problem`` says what failed, ``setting`` names the
    :class:`HostConfig` field to change (``metrics_port``, ``audit_log``)."""

    def __init__(self, problem: str, setting: str) -> None:
        super().__init__(f"{problem}: check HostConfig.{setting}")
        self.problem = problem
        self.setting = setting


class Host:
    """One host: serves a catalog of tool services on Pulsar and announces it.

    ``services``: what to serve, as :class:`tghost.ToolService` instances and ``@tghost.tool``
    functions (with ``tools``: tool descriptors or dicts over them), or a catalog; ``None``
    discovers the installed plugins (entry points ``tghost.plugins``) and ``config.config_file``
    on :meth:`start`, as ``tghost run`` does. ``listeners`` are told of every call
    (``tghost.CallRecord``), beside the audit log and metrics the config asks for.

    ``await host.serve()`` runs until SIGINT/SIGTERM (a second one ends the grace at once) or
    :meth:`request_stop`; ``async with Host(config) as host:`` starts it and stops it on exit.
    Either way :meth:`stop` runs: withdraw the announcements, stop taking requests (those that
    did not start are answered ``unavailable``, other hosts take the new ones), give in-flight
    calls ``config.serve.grace`` seconds, run the plugins' ``tghost_shutdown`` hooks once, and
    close the request consumers last.

    Raises (from :meth:`start`):
        HostError: the metrics port cannot be bound or the audit log opened.
        tghost.ConfigError: the config file's ``[access]`` table is wrong (the message names the file).
        tghost.PluginLoadError: ``TGHOST_STRICT_PLUGINS=1`` and a plugin failed.
        tghost.BrokerError: no Pulsar broker answered at ``config.pulsar.url``.
        pulsar.asyncio.PulsarException: the broker refused a subscription or producer.
        DescriptorError, ValueError: a given service or tool is invalid (on construction).
    """

    def __init__(self, config: HostConfig | None = None, services: Iterable[Any] | Catalog | None = None, *,
                 tools: Iterable[Any] = (), listeners: Sequence[CallListener] = ()) -> None:
        self.config = config or HostConfig()
        self._catalog = services if isinstance(services, Catalog) or services is None \
            else catalog_of(services, tools)
        self._listeners = list(listeners)
        self._selection = self.config.plugins or PluginSelection.from_settings()
        self.announcer: Announcer | None = None
        """What announces the served tools once started; ``None`` if ``config.announce`` is off."""
        self.monitor: HostMonitor | None = None
        """Metrics and ``/health`` once started with ``config.metrics_port``, else ``None``."""
        self._server: Server | None = None
        self._client: pulsar.asyncio.Client | None = None
        self._contest: ContestWatch | None = None
        self._watcher: PluginWatcher | None = None
        self._resources = contextlib.AsyncExitStack()
        self._stopping = asyncio.Event()
        self._cancelled: int | None = None

    @property
    def catalog(self) -> Catalog:
        """What the host serves: its services, tools, access policy and plugin reports."""
        return self.load()

    @property
    def server(self) -> Server:
        """The services' request endpoints, once started."""
        if self._server is None:
            raise RuntimeError("the host is not started: 'await host.start()' or 'async with host'")
        return self._server

    @property
    def client(self) -> pulsar.asyncio.Client:
        """The host's Pulsar client, once started."""
        if self._client is None:
            raise RuntimeError("the host is not started: 'await host.start()' or 'async with host'")
        return self._client

    async def __aenter__(self) -> Host:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    async def serve(self, *, handle_signals: bool = True) -> int:
        """Start, serve until SIGINT/SIGTERM (``handle_signals``) or :meth:`request_stop`, then
        :meth:`stop`. Returns the number of calls cancelled at the end of the grace."""
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM) if handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self._on_signal)
        try:
            await self.start()
            await self._stopping.wait()
            return await self.stop()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)

    def request_stop(self) -> None:
        """Make :meth:`serve` stop the host (from the event loop's thread); a second call ends
        the grace at once: calls still running are answered ``unavailable``."""
        if not self._stopping.is_set():
            self._stopping.set()
        elif self._server is not None:
            self._server.end_grace()

    def _on_signal(self) -> None:
        if self._stopping.is_set():
            log.warning("second signal: ending the grace period now; calls still running are answered 'unavailable'")
        self.request_stop()

    @functools.cached_property
    def _document(self) -> dict[str, Any] | None:
        """``config.config_file`` as a dict for the plugins; ``None`` when unreadable (the error
        is then reported once, by :func:`load_config_tools`) and ``{}`` without a file."""
        try:
            return {} if self.config.config_file is None else read_config(self.config.config_file)
        except ConfigError:
            return None

    def load(self) -> Catalog:
        """What the host will serve: the services given, else the installed plugins (as
        ``config.plugins`` selects them) with ``config.config_file``'s tools, external services
        and ``[access]`` policy. Blocks (plugins are imported); :meth:`start` calls it, and calling
        it before shows a plugin or config error before anything connects. Idempotent.

        Raises:
            tghost.ConfigError: the config file's ``[access]`` table is wrong.
            tghost.PluginLoadError: ``TGHOST_STRICT_PLUGINS=1`` and a plugin failed.
        """
        if self._catalog is None:
            self._catalog = _discover(self.config, self._selection, self._document)
        return self._catalog

    async def start(self) -> Host:
        """Load the plugins (if no services were given), connect, serve, announce, and start
        the metrics, contest watch and plugin watch the config asks for; returns ``self``. On
        failure whatever started is stopped (the plugins' shutdown hooks included) and the error raised."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def _start(self) -> None:
        config = self.config
        catalog = self.load()
        session = HostSessionKey() if catalog.access is not None else None
        await self._open_operations()
        if config.announce:
            identity = self._resources.enter_context(HostIdentity.claim(config.state_dir or app_dir(),
                                                                        config.host_id, session))
            self.announcer = Announcer(catalog, identity, config.topic, config.lease, config.signer,
                                       epoch_seconds=config.epoch_seconds,
                                       health_url=self.monitor.http.health_url() if self.monitor else None)
        server = Server(catalog.services, catalog.descriptors, config.serve, self._listeners,
                        authorize=catalog.authorize, gate=Gate.of(catalog.access, catalog.tools, session))
        self._client = await config.pulsar.connect()
        await server.start(self._client)
        self._server = server
        _log_catalog(catalog, config.pulsar.url)
        await self._announce()
        if self.monitor is not None and self.announcer is not None:
            self._contest = ContestWatch.of(self.announcer, config.pulsar, lambda: catalog.tools.keys()).start()
        if self.monitor is not None:
            await self.monitor.observe(catalog, server, self.announcer, self._contest)
        if config.watch_plugins:
            self._watcher = PluginWatcher(catalog, server, self.announcer, WatchSettings(
                config.watch_interval, self._selection, self._document or {},
                config.serve.isolation == PROCESS)).start()

    async def _open_operations(self) -> None:
        """Bind the metrics port and open the audit log, as the config asks."""
        config = self.config
        if config.metrics_port is not None:
            from tghost.operate.metrics import HostMonitor

            try:
                self.monitor = self._resources.enter_context(HostMonitor(config.metrics_host, config.metrics_port))
            except OSError as exc:
                raise HostError(f"cannot serve metrics on {config.metrics_host}:{config.metrics_port} ({exc})",
                                "metrics_port") from None
            self._listeners += self.monitor.listeners
        if config.audit_log is not None:
            from tghost.operate.audit import AuditLog

            try:
                audit = AuditLog.open(config.audit_log, arguments=config.audit_arguments)
            except OSError as exc:
                raise HostError(f"cannot open the audit log ({exc})", "audit_log") from None
            self._listeners.append(self._resources.enter_context(audit))

    async def _announce(self) -> None:
        """Announce everything, unless a stop comes first: a host must stop on a signal even
        while the broker never confirms its first announcement (e.g. its disk is full)."""
        if self.announcer is None:
            return
        announcing = asyncio.ensure_future(self.announcer.start(self.client))
        stopping = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({announcing, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if announcing.done():
            announcing.result()
            return
        announcing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await announcing
        log.warning("stopped before the broker confirmed the first announcement")

    async def stop(self, grace: float | None = None) -> int:
        """Withdraw, drain (in-flight calls get ``grace`` seconds, default ``config.serve.grace``),
        run the plugins' ``tghost_shutdown`` hooks once, close. Idempotent: a second call
        returns the first one's count of calls cancelled at the end of the grace."""
        if self._cancelled is not None:
            return self._cancelled
        self._cancelled = 0
        self._stopping.set()
        try:
            if self._watcher is not None:
                await self._watcher.stop()
            if self.announcer is not None:
                await self.announcer.withdraw()
            received = _received(self._server) if self._server is not None else 0
            if self._server is not None:
                self._cancelled = await self._drain(self._server, grace)
            if self._catalog is not None:  # nothing runs the plugins' code now
                await asyncio.to_thread(self._catalog.shutdown)
            if self._server is not None:
                await self._server.close()  # the last step: until here, a lone host answers 'unavailable'
                log.info("stopped after %d request(s): %d answered 'unavailable' while stopping, %d cancelled at "
                         "the end of the grace", _received(self._server), _received(self._server) - received,
                         self._cancelled)
        finally:
            if self._contest is not None:
                await self._contest.close()
            if self._client is not None:
                await self._client.close()
            await self._resources.aclose()
        return self._cancelled

    async def _drain(self, server: Server, grace: float | None) -> int:
        in_flight = sum(endpoint.in_flight for endpoint in server.endpoints)
        if in_flight:
            log.info("stopping: no new requests; waiting up to %ss for %d in-flight call(s) (a second Ctrl-C ends "
                     "the wait)", self.config.serve.grace if grace is None else grace, in_flight)
        else:
            log.info("stopping: no new requests; no call in flight")
        cancelled = await server.drain(grace)
        if cancelled:
            log.warning("%d call(s) cancelled at the end of the grace period", cancelled)
        return cancelled


def _discover(config: HostConfig, selection: PluginSelection, document: dict[str, Any] | None) -> Catalog:
    """The installed plugins ``selection`` allows, given the config file's ``document``, with
    the file's tools, external services and ``[access]`` policy; every plugin that failed is logged."""
    catalog = discover(selection=selection, config=document or {},
                       isolate_imports=config.serve.isolation == PROCESS)
    if config.config_file is not None:
        report = load_config_tools(catalog, config.config_file, document)
        if report.services:
            log.info("config %s: added external services %s", config.config_file, ", ".join(report.services))
        if report.tools:
            log.info("config %s: added tools %s", config.config_file, ", ".join(report.tools))
        load_access(catalog, config.config_file, document or {})
    for plugin in catalog.plugins:
        for error in plugin.errors:
            log.error("plugin %s: %s (run 'tghost plugins' for details)", plugin.name, error)
    if not catalog.services and not catalog.external:
        log.warning("no tool services to serve: pip install a tghost plugin (see 'tghost plugins')")
    return catalog


def _log_catalog(catalog: Catalog, url: str) -> None:
    for sid, descriptor in catalog.descriptors.items():
        tools = sorted(name for name, tool in catalog.tools.items() if tool.service == sid)
        log.info("serving %s on %s (plugin %s) tools: %s", sid, descriptor.request_queue,
                 catalog.service_origin[sid].name, ", ".join(tools) or "-")
    for sid, descriptor in catalog.external.items():
        tools = sorted(name for name, tool in catalog.tools.items() if tool.service == sid)
        log.info("announcing external service %s (served elsewhere, on %s; from %s) tools: %s", sid,
                 descriptor.request_queue, catalog.service_origin[sid].name, ", ".join(tools) or "-")
    log.info("%d service(s), %d tool(s) on %s; Ctrl-C to stop",
             len(catalog.descriptors) + len(catalog.external), len(catalog.tools), url)


def _received(server: Server) -> int:
    """Requests the host's services received so far."""
    return sum(endpoint.counters["received"] for endpoint in server.endpoints)
