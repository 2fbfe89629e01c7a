"""metrics: a :class:`Host` serving with metrics on, called over the embedded broker and
scraped over real HTTP; directory metrics read from a live ToolDirectory."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import tghost
from tests.conftest import OwnBrokers, PluginDir
from tghost.agent.client import ToolCallError, ToolServiceClient
from tghost.agent.directory import ToolDirectory
from tghost.announcing.announcer import Announcer
from tghost.broker import EmbeddedBroker
from tghost.discovery.catalog import Catalog
from tghost.discovery.discover import PluginSelection, catalog_of, discover
from tghost.operate.health import Health
from tghost.operate.host import Host, HostConfig
from tghost.operate.metrics import HostMetrics, HostMonitor
from tghost.protocol.announcement import current_topic
from tghost.protocol.trust import TrustedKeys
from tghost.pulsar.clients import PulsarSettings
from tghost.serving.settings import ServeSettings
from tghost.testing import LocalHost

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

held = asyncio.Event()
holding = asyncio.Event()


@tghost.tool
async def echo(text: str) -> str:
    """Echo the text back."""
    return text


@tghost.tool
async def failing() -> str:
    """Always raises."""
    raise RuntimeError("out of coffee")


@tghost.tool(timeout=0.2)
async def sleepy() -> str:
    """Sleeps past its timeout."""
    await asyncio.sleep(5)
    return "woke"


@tghost.tool(max_concurrency=1)
async def busy() -> str:
    """Holds its only slot until the test lets go."""
    holding.set()
    await held.wait()
    return "done"


def parse(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, by (name, labels)."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def scrape(port: int) -> Samples:
    status, text = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    return parse(text)


def invocations(samples: Samples) -> float:
    return sum(v for (name, _), v in samples.items() if name == "tghost_invocations_total")


async def scrape_until(port: int, ready: Callable[[Samples], bool]) -> Samples:
    """Scrape until ``ready`` (at most 10 s): a call's listener runs just after its reply is sent,
    and the call leaves ``in_flight`` just after that.

    Raises:
        TimeoutError: the samples never became ready.
    """
    async with asyncio.timeout(10):
        while not ready(samples := await scrape(port)):
            await asyncio.sleep(0.02)
        return samples


@contextlib.asynccontextmanager
async def monitored_host(url: str, catalog: Catalog, topic: str) -> AsyncIterator[tuple[HostMonitor, Announcer]]:
    """A :class:`Host` in this loop with metrics on a free port, announcing, as ``tghost run`` is."""
    config = HostConfig(pulsar=PulsarSettings(url), topic=topic, serve=ServeSettings(max_queue=0),
                        host_id=f"metrics-{uuid.uuid4().hex[:6]}", metrics_port=0)
    async with Host(config, catalog) as host:
        assert host.monitor is not None and host.announcer is not None
        async with asyncio.timeout(10):
            while host.monitor.health.connected() is None:
                await asyncio.sleep(0.02)
        yield host.monitor, host.announcer


@contextlib.asynccontextmanager
async def callers(url: str, catalog: Catalog) -> AsyncIterator[dict[str, ToolServiceClient]]:
    client = await PulsarSettings(url).connect()
    found = {sid: await ToolServiceClient(client, d.request_queue, d.response_queue).start()
             for sid, d in catalog.descriptors.items()}
    try:
        yield found
    finally:
        await client.close()


async def error_type(call: Any) -> str:
    with pytest.raises(ToolCallError) as info:
        await call
    return info.value.error_type


async def test_calls_are_counted_by_service_and_status_and_scraped_over_http(pulsar_broker: EmbeddedBroker) -> None:
    catalog = catalog_of([echo, failing, sleepy, busy])
    topic = f"persistent://tg/config/metrics-{uuid.uuid4().hex[:8]}"
    held.clear()
    holding.clear()
    async with monitored_host(pulsar_broker.url, catalog, topic) as (monitor, announcer), \
            callers(pulsar_broker.url, catalog) as call:
        port = monitor.http.port
        assert await call["echo"].call({}, {"text": "a"}) == "a"
        assert await call["echo"].call({}, {"text": "b"}) == "b"
        assert await error_type(call["echo"].call({}, {})) == "invalid-arguments"
        assert await error_type(call["failing"].call({}, {})) == "tool-service-error"
        assert await error_type(call["sleepy"].call({}, {})) == "timeout"
        first = asyncio.create_task(call["busy"].call({}, {}))
        await asyncio.wait_for(holding.wait(), 10)
        assert await error_type(call["busy"].call({}, {})) == "overloaded"
        during = await scrape_until(port, lambda samples: invocations(samples) == 6)
        held.set()
        assert await first == "done"
        after = await scrape_until(port, lambda samples: invocations(samples) == 7 and sample(
            samples, "tghost_in_flight", service="busy") == 0)
        sent = announcer.sent  # before the withdraw at the end sends more

    assert sample(during, "tghost_in_flight", service="busy") == 1
    counts = {(dict(labels)["service"], dict(labels)["status"]): value
              for (name, labels), value in after.items() if name == "tghost_invocations_total"}
    assert counts == {("echo", "ok"): 2, ("echo", "invalid-arguments"): 1, ("failing", "tool-service-error"): 1,
                      ("sleepy", "timeout"): 1, ("busy", "overloaded"): 1, ("busy", "ok"): 1}
    assert sample(after, "tghost_invocation_duration_seconds_count", service="echo") == 3
    assert sample(after, "tghost_timeouts_total", service="sleepy") == 1
    assert sample(after, "tghost_timeouts_total", service="echo") == 0
    assert sample(after, "tghost_rejections_total", service="busy", reason="overloaded") == 1
    assert sample(after, "tghost_rejections_total", service="echo", reason="invalid-arguments") == 1
    assert sample(after, "tghost_rejections_total", service="failing", reason="tool-service-error") is None
    assert sample(after, "tghost_plugins", status="loaded") == 1
    assert sample(after, "tghost_announcements_sent_total") == sent > 0


async def test_health_reports_connected_services_and_the_last_error(pulsar_broker: EmbeddedBroker) -> None:
    catalog = catalog_of([echo, failing])
    topic = f"persistent://tg/config/health-{uuid.uuid4().hex[:8]}"
    async with monitored_host(pulsar_broker.url, catalog, topic) as (monitor, _), \
            callers(pulsar_broker.url, catalog) as call:
        status, body = await asyncio.to_thread(get, f"http://127.0.0.1:{monitor.http.port}/health")
        before = json.loads(body)
        await error_type(call["failing"].call({}, {}))  # serve logs the exception at ERROR
        after = json.loads((await asyncio.to_thread(get, f"http://127.0.0.1:{monitor.http.port}/health"))[1])
    assert status == 200
    assert (before["status"], before["connected"], before["last_error"]) == ("ok", True, None)
    assert sorted(before["services"]) == ["echo", "failing"]
    assert before["uptime_seconds"] >= 0
    assert after["last_error"]["logger"] == "tghost.serving.request"
    assert "invoke raised" in after["last_error"]["message"]


def test_plugins_are_counted_by_status(plugin_dir: PluginDir) -> None:
    plugin_dir.add("good", "import tghost\n\n@tghost.tool\ndef one() -> int:\n    '''One.'''\n    return 1\n\n"
                           "@tghost.hookimpl\ndef tghost_register_services(register):\n    register(one)\n")
    plugin_dir.add("broken", "import not_a_module_anywhere\n")
    plugin_dir.add("unwanted", "raise SystemExit('never imported')\n")
    catalog = discover(plugin_dir.entry_points(), strict=False,
                       selection=PluginSelection(disable=frozenset({"unwanted", "not-installed"})))
    metrics = HostMetrics()
    metrics.collect_catalog(catalog)
    samples = parse(generate_latest(metrics.registry).decode())
    assert {status: sample(samples, "tghost_plugins", status=status)
            for status in ("loaded", "failed", "blocked", "missing")} == {
        "loaded": 1, "failed": 1, "blocked": 1, "missing": 1}


async def test_directory_metrics_count_tools_by_group_and_rejections(pulsar_broker: EmbeddedBroker) -> None:
    topic = f"persistent://tg/config/metrics-dir-{uuid.uuid4().hex[:8]}"
    grouped = [echo.tool("echo-a", group=["alpha"]), echo.tool("echo-ab", group=["alpha", "beta"])]
    async with LocalHost(pulsar_broker.url, catalog_of([echo], grouped), announce_as="dir-host", topic=topic) as host:
        trusting = ToolDirectory(PulsarSettings(pulsar_broker.url), topic,
                                 trusted=TrustedKeys([Ed25519PrivateKey.generate().public_key()]))
        async with ToolDirectory(PulsarSettings(pulsar_broker.url), topic) as open_directory, trusting:
            client = await PulsarSettings(pulsar_broker.url).connect()
            producer = await client.create_producer(current_topic(topic), batching_enabled=False)
            await producer.send(b"not json", partition_key="garbage")
            await client.close()
            async with asyncio.timeout(10):
                while open_directory.rejections["invalid"] < 1:
                    await asyncio.sleep(0.02)
            metrics, trusting_metrics = HostMetrics(), HostMetrics()
            metrics.collect_directory(open_directory)
            trusting_metrics.collect_directory(trusting)
            samples = parse(generate_latest(metrics.registry).decode())
            trusting_samples = parse(generate_latest(trusting_metrics.registry).decode())
        assert host.announcer is not None
        sent = host.announcer.sent

    tools = {dict(labels)["group"]: v for (name, labels), v in samples.items() if name == "tghost_directory_tools"}
    assert tools == {"default": 1, "alpha": 2, "beta": 1}  # echo, echo-a, echo-ab
    assert sample(samples, "tghost_directory_rejections_total", reason="invalid") == 1
    assert not [k for k in samples if k[0] == "tghost_signature_rejections_total"]
    assert sample(trusting_samples, "tghost_signature_rejections_total", reason="unsigned") == sent
    assert not [k for k in trusting_samples if k[0] == "tghost_directory_tools"]


def test_health_is_starting_until_the_connection_is_known_and_degraded_without_it() -> None:
    assert Health(connected=lambda: None).snapshot()["status"] == "starting"
    assert Health(connected=lambda: True).snapshot()["status"] == "ok"
    assert Health(connected=lambda: False).snapshot()["status"] == "degraded"
    assert Health(connected=lambda: 1 / 0).snapshot()["status"] == "degraded"  # type: ignore[arg-type, return-value]


async def test_health_turns_degraded_while_the_broker_is_down_and_ok_once_back(own_brokers: OwnBrokers) -> None:
    broker = own_brokers.start()
    catalog = catalog_of([echo])
    async with monitored_host(broker.url, catalog, "persistent://tg/config/health-restart") as (monitor, _):
        url = f"http://127.0.0.1:{monitor.http.port}/health"
        assert json.loads((await asyncio.to_thread(get, url))[1])["connected"] is True
        broker.stop()
        down = await health_when(url, "degraded")
        broker.start()
        back = await health_when(url, "ok")
    assert down[0] == 503 and down[1]["connected"] is False and down[1]["services"] == ["echo"]
    assert back[0] == 200 and back[1]["connected"] is True


async def health_when(url: str, status: str) -> tuple[int, dict[str, Any]]:
    """The /health answer once its status is ``status`` (waits at most 20 s)."""
    async with asyncio.timeout(20):
        while True:
            code, body = await asyncio.to_thread(get, url)
            if json.loads(body)["status"] == status:
                return code, json.loads(body)
            await asyncio.sleep(0.05)
