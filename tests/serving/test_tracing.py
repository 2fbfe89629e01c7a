"""tracing: one trace across caller and host, on the embedded broker, with OpenTelemetry's
in-memory exporter (docs/protocol.md §2.10): the caller's span is the parent of the host's,
which has the check, queue and invoke under it (and a worker process's span under invoke); a
raw ``traceparent`` from another client is continued; a malformed one starts a new trace; an
error reply marks both sides."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import tghost
from tests.conftest import HostProcess, tghost_cli
from tghost.agent.client import ToolCallError
from tghost.agent.directory import ToolDirectory
from tghost.broker import EmbeddedBroker
from tghost.conformance import RawWire
from tghost.operate.audit import audit_entry
from tghost.protocol import wire
from tghost.pulsar.clients import PulsarSettings
from tghost.serving.executors.base import PROCESS
from tghost.serving.request import CallRecord
from tghost.serving.settings import ServeSettings
from tghost.system import tracing
from tghost.system.net import free_port
from tghost.testing import LocalHost

EXPORTER = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, into the in-memory exporter, for this test only."""
    EXPORTER.clear()
    tracing.use(PROVIDER)
    yield EXPORTER
    tracing.use(None)
    EXPORTER.clear()


@tghost.tool
def shout(text: str) -> str:
    """Shout the text back."""
    return text.upper()


def by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in finished}


async def test_one_trace_joins_the_callers_span_and_the_hosts_with_its_stages(
    pulsar_broker: EmbeddedBroker, spans: InMemorySpanExporter
) -> None:
    topic = f"persistent://tg/config/trace-{uuid.uuid4().hex[:8]}"
    records: list[CallRecord] = []
    async with LocalHost(pulsar_broker.url, [shout], announce_as="traced", topic=topic, listeners=[records.append]), \
            ToolDirectory(PulsarSettings(pulsar_broker.url), topic) as directory:
        await directory.wait_for("shout")
        assert await directory.invoke("shout", {"text": "hi"}) == "HI"
    found = by_name(spans.get_finished_spans())
    caller, host = found["call shout"], found["serve shout"]
    assert caller.kind == SpanKind.CLIENT and host.kind == SpanKind.SERVER
    assert host.context.trace_id == caller.context.trace_id and host.parent.span_id == caller.context.span_id
    for stage in ("queue", "check", "invoke"):
        assert found[stage].parent.span_id == host.context.span_id
        assert found[stage].context.trace_id == host.context.trace_id
    assert found["queue"].end_time <= found["check"].start_time <= found["check"].end_time <= found["invoke"].start_time
    assert host.attributes["rpc.system"] == "tghost" and host.attributes["rpc.service"] == "shout"
    assert caller.attributes["rpc.method"] == "shout" and caller.attributes["messaging.system"] == "pulsar"
    assert caller.attributes["rpc.service"] == host.attributes["rpc.service"] == "shout"
    conversation = "messaging.message.conversation_id"
    assert caller.attributes[conversation] == host.attributes[conversation] == records[0].request_id
    assert records[0].trace_id == format(caller.context.trace_id, "032x")
    assert audit_entry(records[0])["trace_id"] == records[0].trace_id  # an audit line leads to its trace


async def test_under_process_isolation_the_worker_has_a_span_under_invoke(
    pulsar_broker: EmbeddedBroker, spans: InMemorySpanExporter
) -> None:
    async with LocalHost(pulsar_broker.url, [shout], ServeSettings(isolation=PROCESS)) as host:
        assert await host.call("shout", {"text": "hi"}) == "HI"
    found = by_name(spans.get_finished_spans())
    worker, invoke = found["worker"], found["invoke"]
    assert worker.parent.span_id == invoke.context.span_id and worker.context.trace_id == invoke.context.trace_id
    assert invoke.start_time <= worker.start_time <= worker.end_time <= invoke.end_time
    assert worker.attributes["process.pid"] not in (None, os.getpid())  # the call ran in a worker process


async def test_a_raw_traceparent_is_continued_and_a_malformed_one_starts_a_new_trace(
    pulsar_broker: EmbeddedBroker, spans: InMemorySpanExporter
) -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    async with LocalHost(pulsar_broker.url, [shout]) as host, \
            RawWire(host.pulsar.url, host.descriptors["shout"]) as raw:
        body = wire.encode_request(None, {}, {"text": "x"})
        await raw.send(body, {"id": "continued", "traceparent": parent})
        await raw.send(body, {"id": "malformed", "traceparent": "00-not-a-trace-id-01"})
        assert (await raw.replies("continued"))[0][1]["response"] == "X"
        assert (await raw.replies("malformed"))[0][1]["response"] == "X"
    served = {span.attributes["messaging.message.conversation_id"]: span for span in spans.get_finished_spans()
              if span.name == "serve shout"}
    assert format(served["continued"].context.trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert format(served["continued"].parent.span_id, "016x") == "00f067aa0ba902b7"
    assert served["malformed"].parent is None
    assert served["malformed"].context.trace_id != served["continued"].context.trace_id


async def test_an_error_reply_marks_both_sides_with_its_error_type(
    pulsar_broker: EmbeddedBroker, spans: InMemorySpanExporter
) -> None:
    async with LocalHost(pulsar_broker.url, [shout]) as host:
        with pytest.raises(ToolCallError):
            await host.call("shout", {})
    found = by_name(spans.get_finished_spans())
    for name in ("call shout", "serve shout", "check"):
        assert found[name].status.status_code == StatusCode.ERROR, name
        assert found[name].attributes["error.type"] == wire.INVALID_ARGUMENTS, name
    assert "invoke" not in found


def test_tracing_off_makes_no_spans_and_asking_for_an_unknown_exporter_says_what_to_use(
    pulsar_broker: EmbeddedBroker
) -> None:
    assert not tracing.ON and tracing.client_span("non-persistent://tg/request/s", "r1", "t") is None
    result = tghost_cli("call", "shout", "text=x", "--otel", env={**os.environ, "TGHOST_PULSAR_URL": pulsar_broker.url,
                                                "OTEL_TRACES_EXPORTER": "jaeger-thrift"})
    assert result.returncode == 2 and "use console, otlp or none" in result.stderr and "Traceback" not in result.stderr


def test_a_host_with_tracing_on_says_so_once_at_start_and_where_the_spans_go(
    pulsar_broker: EmbeddedBroker, host_process: Callable[..., HostProcess]
) -> None:
    assert tracing.summary() is None  # off: the host log says nothing of it
    env = {**os.environ, "TGHOST_PULSAR_URL": pulsar_broker.url, "TGHOST_LOAD_PLUGINS": "joke",
           "TGHOST_DESCRIPTORS_TOPIC": f"persistent://tg/config/trace-{uuid.uuid4().hex[:8]}",
           "OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "traced-host"}
    host = host_process("--otel", env=env)
    line = host.wait_for("tracing is on")
    assert "OpenTelemetry spans of every call as service 'traced-host' to stderr (console)" in line
    host.wait_for("announced")
    host.process.terminate()
    assert host.finish() == 0 and host.log.count("tracing is on") == 1


async def test_a_collector_that_is_not_there_is_one_line_and_a_missing_protocol_says_what_to_install(
    pulsar_broker: EmbeddedBroker,
) -> None:
    topic = f"persistent://tg/config/trace-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "TGHOST_PULSAR_URL": pulsar_broker.url, "TGHOST_DESCRIPTORS_TOPIC": topic,
           "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}"}  # nothing listens there
    async with LocalHost(pulsar_broker.url, [shout], announce_as="traced", topic=topic):
        called = await asyncio.to_thread(tghost_cli, "call", "shout", "text=x", "--otel", env=env)
        grpc = await asyncio.to_thread(tghost_cli, "call", "shout", "text=x", "--otel",
                                       env={**env, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert called.returncode == 0 and called.stdout == "X\n", called.stderr
    lines = called.stderr.splitlines()
    assert len(lines) == 1 and "spans could not be exported to http://127.0.0.1:" in lines[0], called.stderr
    assert "is a collector running there?" in lines[0]  # the SDK's own retries and errors stay off the terminal
    assert grpc.returncode == 2 and "pip install opentelemetry-exporter-otlp-proto-grpc" in grpc.stderr
