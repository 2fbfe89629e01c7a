"""tracing: OpenTelemetry spans for every call, on both sides of the wire, and the W3C trace
context that joins them (docs/protocol.md §2.10).

Off by default, and then free: every helper here returns at once while :data:`ON` is false, and
not even the OpenTelemetry API is imported (:func:`use` imports it). :func:`setup` (``--otel``
or ``TGHOST_OTEL=1``) turns it on with the SDK of the ``tghost[otel]`` extra, configured by the
standard ``OTEL_*`` environment variables; :func:`use` turns it on with a tracer provider of
one's own (tests, embedders).

Spans follow OpenTelemetry's RPC and messaging conventions where they fit: ``rpc.system`` is
``tghost``, ``rpc.service`` the tool service id, ``rpc.method`` the tool (when the caller knows
it), ``messaging.system`` ``pulsar`` and ``messaging.destination.name`` the request topic;
``error.type`` is the wire error type of a failed call.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Mapping, MutableMapping
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = ["ON", "TracingError", "child", "client_span", "end", "flush", "inject", "server_span", "setup",
           "summary", "trace_id", "use"]

#: Whether calls are traced now (:func:`setup` or :func:`use`).
ON = False
_provider: Any = None
_tracer: Tracer = cast("Tracer", None)  # set by use() before ON is ever true
_api: Any = None  # the OpenTelemetry API's modules and names, once use() has imported them
_exports = "to the tracer provider given to tracing.use()"  # where spans go, in words (summary())
log = logging.getLogger(__name__)


class TracingError(RuntimeError):
    """Tracing was asked for but cannot start: the SDK is not installed, or an exporter named
    in ``OTEL_TRACES_EXPORTER`` is unknown. The message says what to install or set."""


def setup(service_name: str) -> None:
    """Turn tracing on with the OpenTelemetry SDK, configured as the SDK documents: the
    exporters in ``OTEL_TRACES_EXPORTER`` (comma-separated; default ``otlp``; ``console`` prints
    spans on stderr, ``none`` exports nothing), each set up by its own ``OTEL_EXPORTER_*`` variables; the
    sampler in ``OTEL_TRACES_SAMPLER``; the resource from ``OTEL_RESOURCE_ATTRIBUTES`` and
    ``OTEL_SERVICE_NAME`` (default ``service_name``).

    Raises:
        TracingError: the SDK (``pip install 'tghost[otel]'``) or a named exporter is missing.
    """
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise TracingError("tracing needs the OpenTelemetry SDK: pip install 'tghost[otel]'") from None
    global _exports
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(attributes))
    names = [name.strip() for name in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")
             if name.strip() and name.strip() != "none"]
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    _quiet_exporters()
    service = os.environ.get("OTEL_SERVICE_NAME") or service_name
    _exports = (f"as service {service!r} to {', '.join(_destination(name) for name in names)}" if names
                else f"as service {service!r}, exported nowhere (OTEL_TRACES_EXPORTER=none)")
    use(provider)


def summary() -> str | None:
    """The line a host logs at start while tracing is on: where the spans go (``None``: off)."""
    return f"tracing is on: OpenTelemetry spans of every call {_exports}" if ON else None


def _destination(exporter: str) -> str:
    """Where the exporter named ``exporter`` (in ``OTEL_TRACES_EXPORTER``) sends spans, in words."""
    if exporter == "console":
        return "stderr (console)"
    if exporter == "otlp":
        return f"an OTLP collector at {_otlp_endpoint()}"
    return exporter


#: Seconds an OTLP export may take, retries included, unless ``OTEL_EXPORTER_OTLP_TIMEOUT`` (or
#: its ``_TRACES_`` form) says otherwise: a collector that does not answer must not hold a host's
#: export thread, or a command's exit, for the SDK's default 10 s.
EXPORT_TIMEOUT = 2.0
#: The SDK's entry point of each OTLP protocol (``OTEL_EXPORTER_OTLP_PROTOCOL``).
OTLP_PROTOCOLS = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}


def _exporter(name: str) -> Any:
    """A span exporter: the one registered under ``name`` (the SDK's ``opentelemetry_traces_exporter``
    entry points); ``otlp`` is the one of ``OTEL_EXPORTER_OTLP_PROTOCOL`` (default ``http/protobuf``),
    ``console`` prints on stderr (a command's stdout is its output).

    Raises:
        TracingError: the exporter, or its protocol, is not installed, or does not load.
    """
    from importlib.metadata import entry_points

    found = {ep.name: ep for ep in entry_points(group="opentelemetry_traces_exporter")}
    wanted, options = name, {}
    if name == "otlp":
        protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                    or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
        if protocol not in OTLP_PROTOCOLS:
            raise TracingError(f"OTEL_EXPORTER_OTLP_PROTOCOL is {protocol!r}; use http/protobuf or grpc")
        wanted = OTLP_PROTOCOLS[protocol]
        if not (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT")):
            options["timeout"] = EXPORT_TIMEOUT
        if wanted not in found:
            raise TracingError(f"OTLP over {protocol} needs its exporter: pip install "
                               f"opentelemetry-exporter-{wanted.replace('_', '-')}")
    elif name not in found:
        raise TracingError(f"OTEL_TRACES_EXPORTER names {name!r}, which is not installed (installed: "
                           f"{', '.join(sorted(found)) or 'none'}); use console, otlp or none")
    try:
        exporter = found[wanted].load()
    except Exception as exc:
        raise TracingError(f"the {name} span exporter does not load ({type(exc).__name__}: {exc}); reinstall it, "
                           "or choose another with OTEL_TRACES_EXPORTER") from None
    return exporter(out=sys.stderr) if name == "console" else exporter(**options)


class _ExportProblems(logging.Handler):
    """Takes the SDK's own log lines (an export that failed, retried, timed out) and says so in
    one tghost line a minute at most, with what to check."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._said = -math.inf

    def emit(self, record: logging.LogRecord) -> None:
        now = time.monotonic()
        if now - self._said >= 60:
            self._said = now
            log.warning("spans could not be exported to %s: is a collector running there? Set "
                        "OTEL_EXPORTER_OTLP_ENDPOINT, or OTEL_TRACES_EXPORTER=console or none", _otlp_endpoint())


def _otlp_endpoint() -> str:
    """The OTLP collector's URL, as the ``OTEL_EXPORTER_OTLP_*ENDPOINT`` variables give it (default http/protobuf's)."""
    return (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            or "http://localhost:4318")


def _quiet_exporters() -> None:
    """Route the OpenTelemetry SDK's log lines to :class:`_ExportProblems`, never to a terminal."""
    sdk = logging.getLogger("opentelemetry")
    if not any(isinstance(handler, _ExportProblems) for handler in sdk.handlers):
        sdk.addHandler(_ExportProblems())
        sdk.propagate = False


def use(provider: Any) -> None:
    """Trace with ``provider`` (an SDK ``TracerProvider``); ``None`` turns tracing off again.
    The global provider is set once per process (OpenTelemetry's rule); later calls only turn
    tracing on or off."""
    global ON, _provider, _tracer, _api
    if provider is not None and _provider is None:
        from opentelemetry import propagate, trace

        trace.set_tracer_provider(provider)
        _provider, _tracer = provider, trace.get_tracer("tghost")
        _api = SimpleNamespace(trace=trace, propagate=propagate, SpanKind=trace.SpanKind, Status=trace.Status,
                               StatusCode=trace.StatusCode)
    ON = provider is not None


#: Milliseconds a command waits at exit for its spans to be exported.
FLUSH_TIMEOUT_MS = 2000


def flush() -> None:
    """Export what is buffered (before a command exits without running ``atexit``), waiting at
    most :data:`FLUSH_TIMEOUT_MS` (an unreachable collector must not hold a command up)."""
    if _provider is not None:
        _provider.force_flush(FLUSH_TIMEOUT_MS)


def client_span(topic: str, request_id: str, tool: str | None = None, service: str | None = None) -> Span | None:
    """A caller's span for request ``request_id`` to the service whose request ``topic`` is
    given (``None`` while tracing is off): kind CLIENT, named ``call <tool or service>``; the
    ``service`` id defaults to the topic's last part."""
    if not ON:
        return None
    service = service or topic.rsplit("/", 1)[-1]
    return _tracer.start_span(f"call {tool or service}", kind=_api.SpanKind.CLIENT, attributes={
        "rpc.system": "tghost", "rpc.service": service, "messaging.system": "pulsar",
        "messaging.destination.name": topic, "messaging.message.conversation_id": request_id,
        **({"rpc.method": tool} if tool else {})})


def inject(properties: MutableMapping[str, str], span: Span | None) -> None:
    """Add ``span``'s W3C ``traceparent`` (and ``tracestate``) to a request's properties."""
    if span is not None:
        _api.propagate.inject(properties, context=_api.trace.set_span_in_context(span))


def server_span(service: str, topic: str, properties: Mapping[str, str]) -> Span | None:
    """A host's span for one request (``None`` while tracing is off): kind SERVER, the child
    of the caller's span when the request carries a valid ``traceparent``, else a new trace (a
    malformed one is ignored)."""
    if not ON:
        return None
    return _tracer.start_span(f"serve {service}", context=_api.propagate.extract(properties),
                              kind=_api.SpanKind.SERVER,
                              attributes={"rpc.system": "tghost", "rpc.service": service,
                                          "messaging.system": "pulsar", "messaging.destination.name": topic,
                                          "messaging.message.conversation_id": properties.get("id", "")})


def child(name: str, parent: Span | None, **attributes: Any) -> Span | None:
    """A span under ``parent``, started now, with ``attributes`` (``None`` without a parent:
    tracing is off)."""
    if parent is None:
        return None
    return _tracer.start_span(name, context=_api.trace.set_span_in_context(parent), attributes=attributes or None)


def end(span: Span | None, error_type: str | None = None, **attributes: Any) -> None:
    """End ``span``; with an ``error_type`` (a wire error type, or an exception's class name)
    its status is ERROR and ``error.type`` says which."""
    if span is None:
        return
    if attributes:
        span.set_attributes(attributes)
    if error_type is not None:
        span.set_attribute("error.type", error_type)
        span.set_status(_api.Status(_api.StatusCode.ERROR, error_type))
    span.end()


def trace_id(span: Span | None) -> str | None:
    """``span``'s trace id as 32 hex digits (as W3C ``traceparent`` writes it), or ``None``."""
    return None if span is None else format(span.get_span_context().trace_id, "032x")
