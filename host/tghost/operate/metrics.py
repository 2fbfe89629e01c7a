"""metrics: Prometheus metrics and ``/health`` for ``tghost run --metrics-port`` (off by default).

Per-call counters come from a :data:`tghost.serving.request.CallListener`; live values (in flight, plugins,
announcements, directory tools and rejections) are read from the live objects at scrape time,
so no other module imports this one. Never changes what it observes; never uses the global registry.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from types import TracebackType
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tghost.operate.health import HEALTHY, Health
from tghost.protocol import wire
from tghost.protocol.access import ANONYMOUS
from tghost.serving.request import UNANSWERABLE, CallRecord

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIEnvironment

    from tghost.agent.directory import ToolDirectory
    from tghost.announcing.announcer import Announcer
    from tghost.discovery.catalog import Catalog
    from tghost.operate.contest import ContestWatch
    from tghost.serving.server import Server

__all__ = ["REJECTIONS", "SIGNATURE_REASONS", "CallMetrics", "HostMetrics", "HostMonitor", "MetricsServer"]

log = logging.getLogger(__name__)

#: Call statuses that mean the request was refused before ``invoke`` (``tghost_rejections_total``).
REJECTIONS = frozenset({wire.OVERLOADED, wire.BAD_REQUEST, wire.MISSING_CONFIG, wire.INVALID_ARGUMENTS,
                        wire.NOT_ALLOWED, wire.REDELIVERY_LIMIT, wire.UNAUTHORIZED, wire.RATE_LIMITED, UNANSWERABLE})
#: Directory rejection reasons that come from the signature check (``tghost_signature_rejections_total``).
SIGNATURE_REASONS = frozenset({"unsigned", "bad-signature", "unknown-key", "hijack"})
#: Plugin statuses always reported by ``tghost_plugins`` (0 when none).
PLUGIN_STATUSES = ("loaded", "failed", "blocked", "missing")
#: Seconds; the default timeout is 30 s, so the buckets reach past it.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, float("inf"))


class CallMetrics:
    """A :data:`tghost.serving.request.CallListener` counting every acknowledged request:

    - ``tghost_invocations_total{service,status}``: every request, by its status (``ok`` or the
      wire error type);
    - ``tghost_invocation_duration_seconds{service}``: receipt to acknowledgement, seconds;
    - ``tghost_timeouts_total{service}``: calls answered ``timeout``;
    - ``tghost_rejections_total{service,reason}``: requests refused before ``invoke``
      (:data:`REJECTIONS`);
    - ``tghost_caller_invocations_total{service,caller,status}``: by verified caller (the names
      of the host's ``[access]`` policy, or ``anonymous``: bounded by the policy).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.invocations = Counter("tghost_invocations", "Requests by service and status (ok or error type).",
                                   ["service", "status"], registry=registry)
        self.duration = Histogram("tghost_invocation_duration_seconds", "Seconds from receipt to acknowledgement.",
                                  ["service"], registry=registry, buckets=DURATION_BUCKETS)
        self.timeouts = Counter("tghost_timeouts", "Calls answered 'timeout'.", ["service"], registry=registry)
        self.rejections = Counter("tghost_rejections", "Requests refused before invoke, by reason.",
                                  ["service", "reason"], registry=registry)
        self.by_caller = Counter("tghost_caller_invocations", "Requests by service, verified caller (the "
                                 "[access] policy's name, or 'anonymous') and status.",
                                 ["service", "caller", "status"], registry=registry)

    def __call__(self, record: CallRecord) -> None:
        self.invocations.labels(record.service, record.status).inc()
        self.by_caller.labels(record.service, record.caller.name if record.caller else ANONYMOUS, record.status).inc()
        self.duration.labels(record.service).observe(record.duration)
        if record.status == wire.TIMEOUT:
            self.timeouts.labels(record.service).inc()
        elif record.status in REJECTIONS:
            self.rejections.labels(record.service, record.status).inc()

    def declare(self, services: Iterable[str]) -> None:
        """Export zero timeouts for ``services`` before their first call (so rates exist from the start)."""
        for service in services:
            self.timeouts.labels(service)


class _Live(Collector):
    """Reads live objects at scrape time (in the HTTP thread: reads only, copies before iterating)."""

    def __init__(self, read: Callable[[], Iterator[Metric]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        yield from self._read()


def _server_metrics(server: Server) -> Iterator[Metric]:
    in_flight = GaugeMetricFamily("tghost_in_flight", "Requests received and not yet answered.", labels=["service"])
    workers = GaugeMetricFamily("tghost_workers", "Worker threads started or worker processes alive.",
                                labels=["service", "isolation"])
    stuck = GaugeMetricFamily("tghost_stuck_workers", "Worker threads stuck in calls that timed out.",
                              labels=["service"])
    restarts = CounterMetricFamily("tghost_worker_restarts", "Worker processes replaced, by reason.",
                                   labels=["service", "reason"])
    for endpoint in list(server.endpoints):
        sid, stats = endpoint.descriptor.id, endpoint.executor.stats()
        in_flight.add_metric([sid], endpoint.in_flight)
        workers.add_metric([sid, stats.isolation], stats.workers)
        stuck.add_metric([sid], stats.stuck)
        for reason, count in stats.restarts.items():
            restarts.add_metric([sid, reason], count)
    yield from (in_flight, workers, stuck, restarts)
    if server.stall_detector is not None:
        yield CounterMetricFamily("tghost_loop_stalls", "Times the event loop was blocked past the threshold.",
                                  value=server.stall_detector.stalls)


def _catalog_metrics(catalog: Catalog) -> Iterator[Metric]:
    plugins = GaugeMetricFamily("tghost_plugins", "Plugins (entry points) by status.", labels=["status"])
    statuses = [report.status for report in list(catalog.plugins)]
    for status in PLUGIN_STATUSES:
        plugins.add_metric([status], statuses.count(status))
    yield plugins


def _announcer_metrics(announcer: Announcer) -> Iterator[Metric]:
    yield CounterMetricFamily("tghost_announcements_sent", "Announcement messages published (incl. heartbeats).",
                              value=announcer.sent)


def _directory_metrics(directory: ToolDirectory) -> Iterator[Metric]:
    tools = GaugeMetricFamily("tghost_directory_tools", "Live tools in the directory, by group.", labels=["group"])
    by_group: dict[str, int] = {}
    for tool in list(directory.tools.values()):
        for group in tool.descriptor.group:
            by_group[group] = by_group.get(group, 0) + 1
    for group, count in sorted(by_group.items()):
        tools.add_metric([group], count)
    yield tools
    rejections = dict(directory.rejections)
    yield _counter_by("tghost_directory_rejections", "Announcements not applied, by reason.", "reason", rejections)
    yield _counter_by("tghost_signature_rejections", "Announcements that failed the signature check, by reason.",
                      "reason", {r: n for r, n in rejections.items() if r in SIGNATURE_REASONS})
    yield _counter_by("tghost_directory_refusals", "Calls refused before sending, by reason.", "reason",
                      dict(directory.refusals))
    yield GaugeMetricFamily("tghost_directory_conflicts", "Tools and tool services announced in conflicting ways "
                            "(docs/protocol.md §4.8).", value=len(directory.conflicts))
    yield GaugeMetricFamily("tghost_directory_host_id_clashes", "Host ids that more than one live process "
                            "announces under (each needs its own --host-id).", value=len(directory.clashes))


def _counter_by(name: str, documentation: str, label: str, counts: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value, count in sorted(counts.items()):
        family.add_metric([value], count)
    return family


class HostMetrics:
    """The metrics of one host (or agent) in a private registry: :attr:`calls` is the call
    listener to give the :class:`tghost.serving.server.Server`; ``collect_*`` add live values.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.calls = CallMetrics(self.registry)

    def _collect(self, read: Callable[[], Iterator[Metric]]) -> None:
        self.registry.register(_Live(read))

    def collect_server(self, server: Server) -> None:
        """Export ``tghost_in_flight{service}``, ``tghost_workers{service,isolation}``,
        ``tghost_stuck_workers{service}``, ``tghost_worker_restarts_total{service,reason}`` and
        ``tghost_loop_stalls_total``."""
        self.calls.declare(endpoint.descriptor.id for endpoint in server.endpoints)
        self._collect(lambda: _server_metrics(server))

    def collect_catalog(self, catalog: Catalog) -> None:
        """Export ``tghost_plugins{status}`` (loaded, failed, blocked, missing)."""
        self._collect(lambda: _catalog_metrics(catalog))

    def collect_announcer(self, announcer: Announcer) -> None:
        """Export ``tghost_announcements_sent_total``."""
        self._collect(lambda: _announcer_metrics(announcer))

    def collect_directory(self, directory: ToolDirectory) -> None:
        """Export ``tghost_directory_tools{group}``, ``tghost_directory_rejections_total{reason}``,
        ``tghost_signature_rejections_total{reason}``, ``tghost_directory_refusals_total{reason}``,
        ``tghost_directory_conflicts`` and ``tghost_directory_host_id_clashes``."""
        self._collect(lambda: _directory_metrics(directory))


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics port: " + format, *args)


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class MetricsServer:
    """HTTP in a background thread: ``GET /metrics`` (and ``/``) the registry in Prometheus text
    format, ``GET /health`` the :meth:`Health.snapshot` JSON (200 when ok, else 503).

    Raises (on :meth:`start`):
        OSError: the address cannot be bound (port in use, no such interface).
    """

    def __init__(self, registry: CollectorRegistry, health: Health, host: str = "127.0.0.1", port: int = 0) -> None:
        self.health = health
        self.host = host
        self.port = port
        self._metrics_app = make_wsgi_app(registry)
        self._httpd: WSGIServer | None = None

    def start(self) -> MetricsServer:
        """Bind and serve; ``port`` 0 picks a free port, then :attr:`port` holds it."""
        self._httpd = make_server(self.host, self.port, self._app, _ThreadingServer, _QuietHandler)
        self.port = self._httpd.server_port
        threading.Thread(target=self._httpd.serve_forever, name="tghost-metrics", daemon=True).start()
        return self

    def health_url(self) -> str:
        """The URL of ``/health`` to announce (docs/protocol.md §4.3 ``health``): on the bound address,
        or on this machine's fully qualified name when bound to every interface (a StatefulSet's pod
        behind a headless Service: ``POD.SERVICE.NAMESPACE.svc...``). A loopback one is only of use
        on this machine."""
        host = _machine_name() if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/health"

    def stop(self) -> None:
        """Stop serving and close the socket. Idempotent."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def _app(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/health":
            snapshot = self.health.snapshot()
            body = json.dumps(snapshot).encode()
            status = "200 OK" if snapshot["status"] == HEALTHY else "503 Service Unavailable"
            start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        if path in ("/", "/metrics"):
            result: Iterable[bytes] = self._metrics_app(environ, start_response)
            return result
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics or /health\n"]


class HostMonitor:
    """Metrics and health for a host: ``with HostMonitor(host, port) as monitor:`` binds the port
    and captures errors logged under ``tghost``; the :class:`~tghost.operate.host.Host` then
    calls :meth:`observe` once it serves. Give :attr:`listeners` to the server.

    Raises (on enter):
        OSError: the metrics address cannot be bound.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.metrics = HostMetrics()
        self.listeners = (self.metrics.calls,)
        self.health = Health()
        self.http = MetricsServer(self.metrics.registry, self.health, host, port)

    def __enter__(self) -> HostMonitor:
        self.health.attach()
        try:
            self.http.start()
        except OSError:
            self.health.detach()
            raise
        log.info("metrics on http://%s:%d/metrics, health on /health", self.http.host, self.http.port)
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.http.stop()
        self.health.detach()

    async def observe(self, catalog: Catalog, server: Server, announcer: Announcer | None,
                      contest: ContestWatch | None = None) -> None:
        """Read the live host from now on. Pulsar connectivity is the announcer's producer's (else
        the first service's response producer's): producers the host already has. The
        announcer's :attr:`~tghost.announcing.announcer.Announcer.problem`, the tools another
        host contests (``contest``) and what the toolsets say or had refused
        (:meth:`~tghost.discovery.catalog.Catalog.toolset_problems`) are among ``/health``'s problems."""
        self.metrics.collect_catalog(catalog)
        self.metrics.collect_server(server)
        if announcer is not None:
            self.metrics.collect_announcer(announcer)
        self.health.reports = lambda: ([announcer.problem] if announcer is not None and announcer.problem else []) + (
            contest.problems() if contest is not None else []) + catalog.toolset_problems()
        self.health.services = lambda: [endpoint.descriptor.id for endpoint in server.endpoints]
        self.health.workers = lambda: {e.descriptor.id: e.executor.stats() for e in list(server.endpoints)}
        source = announcer if announcer is not None else next(iter(server.endpoints), None)
        if source is not None:
            self.health.connected = source.is_connected


def _machine_name() -> str:
    """This machine's fully qualified name, if it has one (``getfqdn`` answers ``localhost`` where
    /etc/hosts maps the host name to loopback first), else its host name."""
    fqdn = socket.getfqdn()
    return fqdn if "." in fqdn and not fqdn.startswith("localhost") else socket.gethostname()
