"""host: one tghost host, to run or embed. :class:`HostConfig` says what to serve and how;
:class:`Host` puts it together (plugins, server, announcer, toolsets, contest watch, metrics,
audit log, plugin watch) and stops it in one order: withdraw, drain, the plugins' ``tghost_shutdown``
hooks once, close. ``tghost run`` and :class:`tghost.testing.LocalHost` are both a ``Host``.
Never parses a command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import pulsar.asyncio

from tghost.announcing.announcer import Announcer, HostIdentity
from tghost.discovery.catalog import Catalog
from tghost.discovery.config import ConfigError, load_access, load_config_tools, read_config
from tghost.discovery.discover import PluginSelection, catalog_of, catalog_of_plugin, discover
from tghost.operate.toolsets import ToolSets, toolset_services
from tghost.protocol.access import policy_fingerprint, tools_for
from tghost.protocol.epochs import DEFAULT_TOPIC, EPOCH_SECONDS, check_lease
from tghost.protocol.sessions import HostSessionKey
from tghost.protocol.trust import Signer, TrustedKeys
from tghost.pulsar import hop
from tghost.pulsar.clients import PulsarSettings
from tghost.serving.access import Fleet, Gate
from tghost.serving.executors.base import PROCESS
from tghost.serving.request import CallListener
from tghost.serving.server import Server
from tghost.serving.settings import ServeSettings
from tghost.system.paths import app_dir
from tghost.system.tasks import cancel_and_wait

if TYPE_CHECKING:
    from tghost.operate.contest import ContestWatch
    from tghost.operate.metrics import HostMonitor
    from tghost.operate.plugin_watch import PluginWatcher

__all__ = ["Host", "HostConfig", "HostError"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostConfig:
    """What one host serves and how; every field has ``tghost run``'s default but
    ``config_file`` (``tghost run`` reads ``TGHOST_CONFIG`` or its default file; this, none).

    - ``pulsar``: the broker and its auth/TLS (:class:`tghost.PulsarSettings`); ``topic``: the
      announcement topic (docs/protocol.md §4.1).
    - ``serve``: host-wide serving limits: timeouts, concurrency, grace, isolation, and how much
      of a tool's exception a caller is told (:class:`tghost.ServeSettings`).
    - ``announce``: announce what is served (``False``: serve only, as a host behind a static
      config). ``lease``: seconds an announcement lives without a heartbeat (at most
      ``MAX_LEASE``, 600). ``host_id``: the id announced (default: a stable id per host slot in
      ``state_dir``, default ``~/.config/tghost``). ``signer``: signs every announcement
      (:class:`tghost.Signer`; ``None``: unsigned). ``trusted``: the keys whose signed announcements
      the host believes of its peers (:class:`tghost.TrustedKeys`; its fleet check of access
      policies and its contest, skew and neighbour reports: docs/guides/security.md "One policy per
      service"; ``None``: every host's word, open mode). ``epoch_seconds``: how long one
      announcement topic is written before the next (docs/protocol.md §4.1).
    - ``config_file``: a TOML file of tools, external services, ``[access]`` and plugin config
      (docs/guides/writing-plugins.md "Tools from configuration", docs/guides/security.md "Who may
      call what"); ``plugins``: which installed plugins load (default: from
      ``TGHOST_LOAD_PLUGINS``/``TGHOST_DISABLE_PLUGINS``), only for a host that discovers its plugins
      (no services or plugin given to :class:`Host`).
    - ``watch_plugins``: serve plugins pip-installed while running, withdraw uninstalled ones,
      looking every ``watch_interval`` seconds (a host that discovers its plugins only).
    - ``metrics_port``: serve Prometheus ``/metrics`` and ``/health`` there, bound to
      ``metrics_host`` (``None``: off; ``0``: a free port). ``audit_log``: append one JSON line
      per call to this path, ``-`` for stderr (``None``: off); ``audit_arguments`` adds the
      argument values.

    Raises:
        ValueError: ``lease`` is not above 0 and at most ``MAX_LEASE`` seconds.
    """

    pulsar: PulsarSettings = field(default_factory=PulsarSettings)
    topic: str = DEFAULT_TOPIC
    serve: ServeSettings = field(default_factory=ServeSettings)
    announce: bool = True
    lease: float = 30.0
    host_id: str | None = None
    signer: Signer | None = None
    trusted: TrustedKeys | None = None
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

    def __post_init__(self) -> None:
        check_lease(self.lease)


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
    functions (with ``tools``: tool descriptors or dicts over them), or a :class:`tghost.Catalog`;
    or ``plugin``: a plugin module (or object) whose hooks register them, loaded as an entry
    point's module is, without installing it. With neither, the host discovers the installed
    plugins (entry points ``tghost.plugins``, as ``config.plugins`` selects them) on
    :meth:`load`, as ``tghost run`` does.
    ``config.config_file``'s tools, external services and ``[access]`` policy apply either way.
    ``listeners`` are told of every call (``tghost.CallRecord``), beside the audit log and
    metrics the config asks for. The host runs the ``tghost_shutdown`` hooks of the plugins it
    discovered or was given as services; a ``Catalog`` passed in is its owner's to shut down.

    ``await host.serve()`` runs until SIGINT/SIGTERM (a second one ends the grace at once),
    :meth:`request_stop` or its task's cancellation; ``async with Host(config) as host:``
    starts it and stops it on exit. Either way :meth:`stop` runs: withdraw the announcements,
    stop taking requests (those that did not start are answered ``unavailable``, other hosts
    take the new ones), give in-flight calls ``config.serve.grace`` seconds, run the plugins'
    ``tghost_shutdown`` hooks once, and close the request consumers last. A host starts once.

    Raises:
        ValueError: (on construction) ``services`` and ``plugin`` both given; ``config.plugins``
            or ``config.watch_plugins`` with either (both choose installed plugins); a given
            service, tool or plugin is invalid (``DescriptorError``; a plugin that fails to
            register); ``config.lease`` is out of range.
        HostError: (from :meth:`start`) the metrics port cannot be bound or the audit log opened.
        tghost.ConfigError, tghost.PluginLoadError: (from :meth:`load`) see there.
        tghost.BrokerError: (from :meth:`start`) no Pulsar broker answered at ``config.pulsar.url``.
        pulsar.asyncio.PulsarException: (from :meth:`start`) the broker refused a subscription or producer.
    """

    def __init__(self, config: HostConfig | None = None, services: Iterable[Any] | Catalog | None = None, *,
                 tools: Iterable[Any] = (), plugin: object | None = None,
                 listeners: Sequence[CallListener] = ()) -> None:
        self.config = config or HostConfig()
        given = services is not None or plugin is not None
        if services is not None and plugin is not None:
            raise ValueError("give a Host its services or a plugin, not both")
        if given and (self.config.plugins is not None or self.config.watch_plugins):
            raise ValueError("HostConfig.plugins and watch_plugins choose installed plugins: give them to a Host "
                             "that discovers its plugins (no services or plugin), or leave them unset")
        self._catalog = _catalog(services, tools, plugin)
        self._owns_plugins = not isinstance(services, Catalog)
        self._configured = False
        self._listeners = list(listeners)
        self._selection = self.config.plugins or PluginSelection.from_settings()
        self.announcer: Announcer | None = None
        """What announces the served tools once started; ``None`` if ``config.announce`` is off."""
        self.monitor: HostMonitor | None = None
        """Metrics and ``/health`` once started with ``config.metrics_port``, else ``None``."""
        self._server: Server | None = None
        self._serving = False
        self._client: pulsar.asyncio.Client | None = None
        self._contest: ContestWatch | None = None
        self._watcher: PluginWatcher | None = None
        self._toolsets: ToolSets | None = None
        self._resources = contextlib.AsyncExitStack()
        self._stopping = asyncio.Event()
        self._started = False
        self._stopped: asyncio.Task[int] | None = None
        self._signals = False

    @property
    def catalog(self) -> Catalog:
        """What the host serves: its services, tools, access policy and plugin reports (:meth:`load`)."""
        return self.load()

    @property
    def server(self) -> Server:
        """The services' request endpoints, once started."""
        if not self._serving:
            raise RuntimeError("the host is not serving: 'await host.start()' or 'async with host'")
        assert self._server is not None
        return self._server

    @property
    def client(self) -> pulsar.asyncio.Client:
        """The host's Pulsar client, once started."""
        if self._client is None:
            raise RuntimeError("the host is not started: 'await host.start()' or 'async with host'")
        return self._client

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    async def serve(self, *, handle_signals: bool = True) -> int:
        """Start, serve until SIGINT/SIGTERM (``handle_signals``), :meth:`request_stop` or this
        task's cancellation, then :meth:`stop`. Returns the number of calls cancelled at the end
        of the grace. Like ``tghost run``, it lets the Pulsar client's threads take the GIL sooner
        (``sys.setswitchinterval``, a process-wide setting) while it serves."""
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM) if handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self._on_signal)
        self._signals = bool(signals)
        switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(hop.SWITCH_INTERVAL)
        try:
            await self.start()
            await self._stopping.wait()
        finally:
            cancelled = await self.stop()
            sys.setswitchinterval(switch_interval)
            for sig in signals:
                loop.remove_signal_handler(sig)
        return cancelled

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

    def load(self) -> Catalog:
        """What the host will serve: the services given, else the installed plugins, with
        ``config.config_file``'s tools, external services and ``[access]`` policy. Blocks
        (plugins are imported); :meth:`start` calls it, and calling it first reports a plugin or
        config error before anything connects. Idempotent.

        Raises:
            tghost.ConfigError: the config file's ``[access]`` table is wrong (the message names the file).
            tghost.PluginLoadError: ``TGHOST_STRICT_PLUGINS=1`` and a plugin failed.
        """
        if self._configured and self._catalog is not None:
            return self._catalog
        discovered = self._catalog is None
        catalog = self._catalog = self._catalog if self._catalog is not None else discover(
            selection=self._selection, config=self._document or {},
            isolate_imports=self.config.serve.isolation == PROCESS)
        if self.config.config_file is not None:
            _add_config(catalog, self.config.config_file, self._document)
        if discovered:
            _report_plugins(catalog)
        self._configured = True
        return catalog

    @functools.cached_property
    def _document(self) -> dict[str, Any] | None:
        """``config.config_file`` as a dict for the plugins; ``None`` when unreadable (the error
        is then reported once, by :func:`load_config_tools`) and ``{}`` without a file."""
        try:
            return {} if self.config.config_file is None else read_config(self.config.config_file)
        except ConfigError:
            return None

    async def start(self) -> Self:
        """Load the plugins (if no services were given), connect, serve, announce, and start
        the metrics, contest watch and plugin watch the config asks for; returns ``self``. On
        failure (or cancellation) it stops what it started, the plugins' shutdown hooks
        included, and raises.

        Raises:
            RuntimeError: the host was started before (a host starts once).
        """
        if self._started:
            raise RuntimeError("this host was started before: a Host starts once; make a new one")
        self._started = True
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
        fleet = Fleet(catalog.access, catalog.tools)
        server = self._server = Server(catalog.services, catalog.descriptors, config.serve, self._listeners,
                                       authorize=catalog.authorize,
                                       gate=Gate.of(catalog.access, catalog.tools, session), signer=config.signer,
                                       in_process=toolset_services(catalog.plugins), fleet=fleet,
                                       host_id=self.announcer.identity.id if self.announcer else config.host_id)
        self._client = await config.pulsar.connect()
        await self._follow(fleet)
        await server.start(self._client)
        self._serving = True
        _log_catalog(catalog, config.pulsar.url, "; Ctrl-C to stop" if self._signals else "")
        await self._announce()
        toolsets = self._toolsets = ToolSets(catalog, server, self.announcer)
        if not self._stopping.is_set():  # a stop cut the first announcement short
            toolsets.start()
        if self.monitor is not None:
            await self.monitor.observe(catalog, server, self.announcer, self._contest)
        if config.watch_plugins:
            from tghost.operate.plugin_watch import PluginWatcher, WatchSettings

            self._watcher = PluginWatcher(catalog, server, self.announcer, WatchSettings(
                config.watch_interval, self._selection, self._document or {},
                config.serve.isolation == PROCESS), toolsets).start()

    async def _follow(self, fleet: Fleet) -> None:
        """Catch up on the announcement topics before serving, then follow them: the tools other
        hosts contest, and the access policies of the other providers of this host's services,
        which ``fleet`` applies from then on (docs/protocol.md §2.8). A host that does not announce
        follows nothing."""
        if self.announcer is None:
            return
        from tghost.operate.contest import ContestWatch
        from tghost.operate.policies import DirectoryPeers

        catalog = self.load()
        self._contest = ContestWatch.of(self.announcer, self.config.pulsar, lambda: catalog.tools.keys(),
                                        self.config.trusted)
        if await self._contest.catch_up():
            fleet.peers = DirectoryPeers(self._contest.directory, self.announcer.identity.id)

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
        await cancel_and_wait(announcing)
        log.warning("stopped before the broker confirmed the first announcement")

    async def stop(self, grace: float | None = None) -> int:
        """Withdraw, drain (in-flight calls get ``grace`` seconds, default ``config.serve.grace``),
        run the plugins' ``tghost_shutdown`` hooks once, close. Every step runs even when one
        before it failed. Returns the number of calls cancelled at the end of the grace. Every
        call, overlapping or later, waits for the one stop and returns its count; cancelling a
        caller does not cancel the stop."""
        self._stopping.set()
        if self._stopped is None:
            self._stopped = asyncio.ensure_future(self._stop(grace))
        return await asyncio.shield(self._stopped)

    async def _stop(self, grace: float | None) -> int:
        cancelled = received = 0
        try:
            try:
                if self._watcher is not None:
                    await self._watcher.stop()
                if self._toolsets is not None:
                    await self._toolsets.stop()
                if self.announcer is not None:
                    await self.announcer.withdraw()
                if self._serving and self._server is not None:
                    received = _received(self._server)  # what came until now was served as ever
                    cancelled = await self._drain(self._server, grace)
                if self._toolsets is not None:
                    await self._toolsets.retired()
            finally:
                if self._catalog is not None and self._owns_plugins:  # nothing runs the plugins' code now
                    await asyncio.to_thread(self._catalog.shutdown)
                if self._serving and self._server is not None:
                    await self._server.close()  # the last step: until here, a lone host answers 'unavailable'
                    log.info("stopped after %d request(s): %d answered 'unavailable' while stopping, %d cancelled "
                             "at the end of the grace", _received(self._server),
                             _received(self._server) - received, cancelled)
        finally:
            if self._contest is not None:
                await self._contest.close()
            if self._client is not None:
                await self._client.close()
            await self._resources.aclose()
        return cancelled

    async def _drain(self, server: Server, grace: float | None) -> int:
        in_flight = sum(endpoint.in_flight for endpoint in server.endpoints)
        if in_flight:
            log.info("stopping: no new requests; waiting up to %ss for %d in-flight call(s)%s",
                     self.config.serve.grace if grace is None else grace, in_flight,
                     " (a second Ctrl-C ends the wait)" if self._signals else "")
        else:
            log.info("stopping: no new requests; no call in flight")
        cancelled = await server.drain(grace)
        if cancelled:
            log.warning("%d call(s) cancelled at the end of the grace period", cancelled)
        return cancelled


def _catalog(services: Iterable[Any] | Catalog | None, tools: Iterable[Any], plugin: object | None) -> Catalog | None:
    """What a host was given to serve, as a catalog; ``None`` to discover the installed plugins."""
    if plugin is not None:
        return catalog_of_plugin(plugin)
    if services is None or isinstance(services, Catalog):
        return services
    return catalog_of(services, tools)


def _report_plugins(catalog: Catalog) -> None:
    """Log every plugin that failed, and a host with nothing to serve."""
    for plugin in catalog.plugins:
        for error in plugin.errors:
            log.error("plugin %s: %s (run 'tghost plugins' for details)", plugin.name, error)
    if not catalog.services and not catalog.external:
        log.warning("no tool services to serve: pip install a tghost plugin (see 'tghost plugins')")


def _add_config(catalog: Catalog, path: Path, document: dict[str, Any] | None) -> None:
    """The config file's tools, external services and ``[access]`` policy, added to ``catalog``."""
    report = load_config_tools(catalog, path, document)
    if report.services:
        log.info("config %s: added external services %s", path, ", ".join(report.services))
    if report.tools:
        log.info("config %s: added tools %s", path, ", ".join(report.tools))
    load_access(catalog, path, document or {})


def _log_catalog(catalog: Catalog, url: str, hint: str) -> None:
    for sid, descriptor in catalog.descriptors.items():
        tools = sorted(name for name, tool in catalog.tools.items() if tool.service == sid)
        log.info("serving %s on %s (plugin %s) tools: %s", sid, descriptor.request_queue,
                 catalog.service_origin[sid].name, ", ".join(tools) or "-")
    for sid, descriptor in catalog.external.items():
        tools = sorted(name for name, tool in catalog.tools.items() if tool.service == sid)
        log.info("announcing external service %s (served elsewhere, on %s; from %s) tools: %s", sid,
                 descriptor.request_queue, catalog.service_origin[sid].name, ", ".join(tools) or "-")
    _log_policy(catalog)
    log.info("%d service(s), %d tool(s) on %s%s",
             len(catalog.descriptors) + len(catalog.external), len(catalog.tools), url, hint)


def _log_policy(catalog: Catalog) -> None:
    """One line per served service under an ``[access]`` policy: its fingerprint and who may call each tool."""
    if catalog.access is None:
        return
    for sid in catalog.descriptors:
        tools = sorted(name for name, tool in catalog.tools.items() if tool.service == sid)
        access = [catalog.access.access_of(tools_for(catalog.tools, sid, catalog.tools[name].config)) for name in tools]
        who = "; ".join(f"{name}: {granted.describe()}" for name, granted in zip(tools, access, strict=True))
        log.info("access policy %s for %s: %s", policy_fingerprint(catalog.access, catalog.tools, sid), sid,
                 who or "-")


def _received(server: Server) -> int:
    """Requests the host's services received so far."""
    return sum(endpoint.counters["received"] for endpoint in server.endpoints)
