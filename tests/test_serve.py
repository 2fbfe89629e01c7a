"""serve: every reply goes through the embedded broker and is checked against the wire contract."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

import tghost
from tghost import wire
from tghost.broker import EmbeddedBroker, PulsarSettings
from tghost.client import ToolCallError
from tghost.discover import catalog_of
from tghost.serve import CallRecord, Server, ServeSettings
from tghost.testing import LocalHost, RawWire


class Recorder(tghost.ToolService):
    """Echoes its inputs; counts calls so tests can prove the plugin was (not) called."""

    id = "recorder"
    config_params = (tghost.ConfigParam(name="needed", required=True), "optional")

    def __init__(self) -> None:
        self.calls = 0

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        self.calls += 1
        if arguments.get("fail"):
            raise ValueError(f"asked to fail: {arguments['fail']}")
        if arguments.get("tool_error"):
            raise tghost.ToolError("no such row", "not-found")
        return {"user": user, "config": config, "arguments": arguments}


@tghost.tool(timeout=0.3)
async def sleepy(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "awake"


@tghost.tool
async def counting(n: int, fail_at: int = -1) -> AsyncIterator[str]:
    """Stream n chunks; raise at chunk fail_at."""
    for i in range(n):
        if i == fail_at:
            raise RuntimeError(f"broke at {i}")
        yield f"chunk-{i};"


@tghost.tool
def sync_counting(n: int) -> Any:
    """A plain generator streams too."""
    yield from (f"s{i}" for i in range(n))


def catalog_parts(services: list[tghost.ToolService]) -> tuple[Any, Any]:
    catalog = catalog_of(services)
    return catalog.services, catalog.descriptors


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


async def test_reply_echoes_the_id_and_has_exactly_the_contract_fields(
    pulsar_broker: EmbeddedBroker, recorder: Recorder
) -> None:
    async with LocalHost(pulsar_broker.url, [recorder]), RawWire(pulsar_broker.url, recorder.descriptor) as raw:
        request = wire.encode_request("alice", {"needed": 1}, {"q": "x"})
        await raw.send(request, {"id": "req-42"})
        [(properties, body)] = await raw.replies("req-42")
    assert properties["id"] == "req-42"
    assert set(body) == {"error", "response", "end_of_stream"}
    assert body["error"] is None and body["end_of_stream"] is True
    # A non-string result is sent as json.dumps(result).
    assert json.loads(body["response"]) == {"user": "alice", "config": {"needed": 1}, "arguments": {"q": "x"}}


async def test_exception_in_invoke_is_a_tool_service_error(pulsar_broker: EmbeddedBroker, recorder: Recorder) -> None:
    async with LocalHost(pulsar_broker.url, [recorder]) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("recorder", {"fail": "please"}, {"needed": 1})
    assert info.value.error_type == "tool-service-error"
    assert "asked to fail: please" in info.value.message


async def test_tool_error_keeps_the_plugins_error_type(pulsar_broker: EmbeddedBroker, recorder: Recorder) -> None:
    async with LocalHost(pulsar_broker.url, [recorder]) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("recorder", {"tool_error": True}, {"needed": 1})
    assert (info.value.error_type, info.value.message) == ("not-found", "no such row")


async def test_missing_required_config_is_answered_without_calling_the_plugin(
    pulsar_broker: EmbeddedBroker, recorder: Recorder
) -> None:
    async with LocalHost(pulsar_broker.url, [recorder]) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("recorder", {"q": 1}, {"optional": "x"})
    assert info.value.error_type == "missing-config" and "needed" in info.value.message
    assert recorder.calls == 0


@pytest.mark.parametrize(
    "payload",
    [b"not json", b"[]", b'{"arguments": "[1, 2]"}', b'{"config": {"needed": 1}}', b'{"user": ["x"]}'],
)
async def test_malformed_request_with_an_id_gets_bad_request(
    pulsar_broker: EmbeddedBroker, recorder: Recorder, payload: bytes
) -> None:
    async with LocalHost(pulsar_broker.url, [recorder]), RawWire(pulsar_broker.url, recorder.descriptor) as raw:
        await raw.send(payload, {"id": "bad-1"})
        [(properties, body)] = await raw.replies("bad-1")
    assert properties["id"] == "bad-1"
    assert body["error"]["type"] == "bad-request" and body["end_of_stream"] is True
    assert recorder.calls == 0


async def test_request_without_id_is_counted_acknowledged_and_not_answered(
    pulsar_broker: EmbeddedBroker, recorder: Recorder
) -> None:
    async with LocalHost(pulsar_broker.url, [recorder]) as host, RawWire(pulsar_broker.url, recorder.descriptor) as raw:
        await raw.send(b"garbage without id", {})
        await raw.send(wire.encode_request("u", {"needed": 1}, {}), {})
        await raw.send(wire.encode_request("u", {"needed": 1}, {"after": True}), {"id": "next"})
        [(_, body)] = await raw.replies("next")  # the only reply is the one with an id
        [worker] = host.server.workers
    assert json.loads(body["response"])["arguments"] == {"after": True}
    assert worker.counters["unanswerable"] == 2
    assert recorder.calls == 1


async def test_a_slow_call_is_cancelled_and_answered_timeout_per_service_override(
    pulsar_broker: EmbeddedBroker,
) -> None:
    # The host default is 30 s; the service descriptor's 0.3 s wins.
    async with LocalHost(pulsar_broker.url, [sleepy], ServeSettings(timeout=30)) as host:
        assert await host.call("sleepy", {"seconds": 0}) == "awake"
        with pytest.raises(ToolCallError) as info:
            await host.call("sleepy", {"seconds": 5})
    assert info.value.error_type == "timeout" and "0.3s" in info.value.message


async def test_host_default_timeout_applies_when_the_service_sets_none(pulsar_broker: EmbeddedBroker) -> None:
    @tghost.tool
    async def slow_default() -> str:
        await asyncio.sleep(5)
        return "late"

    async with LocalHost(pulsar_broker.url, [slow_default], ServeSettings(timeout=0.2)) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("slow-default")
    assert info.value.error_type == "timeout" and "0.2s" in info.value.message


async def test_async_generator_streams_chunks_then_an_end_of_stream(pulsar_broker: EmbeddedBroker) -> None:
    async with LocalHost(pulsar_broker.url, [counting]), RawWire(pulsar_broker.url, counting.descriptor) as raw:
        await raw.send(wire.encode_request("u", {}, {"n": 3}), {"id": "s1"})
        replies = await raw.replies("s1")
    assert [body["response"] for _, body in replies] == ["chunk-0;", "chunk-1;", "chunk-2;", ""]
    assert [body["end_of_stream"] for _, body in replies] == [False, False, False, True]
    assert {props["id"] for props, _ in replies} == {"s1"}


async def test_an_error_mid_stream_ends_the_stream_with_an_error(pulsar_broker: EmbeddedBroker) -> None:
    async with LocalHost(pulsar_broker.url, [counting]), RawWire(pulsar_broker.url, counting.descriptor) as raw:
        await raw.send(wire.encode_request("u", {}, {"n": 5, "fail_at": 2}), {"id": "s2"})
        replies = await raw.replies("s2")
    assert [body["response"] for _, body in replies[:2]] == ["chunk-0;", "chunk-1;"]
    assert replies[-1][1]["error"] == {"type": "tool-service-error", "message": "RuntimeError: broke at 2"}
    assert len(replies) == 3


async def test_a_plain_generator_streams_from_a_worker_thread(pulsar_broker: EmbeddedBroker) -> None:
    async with LocalHost(pulsar_broker.url, [sync_counting]) as host:
        chunks = [chunk async for chunk in host.stream("sync-counting", {"n": 4})]
    assert chunks == ["s0", "s1", "s2", "s3"]


async def test_invalid_arguments_are_answered_naming_the_field(pulsar_broker: EmbeddedBroker) -> None:
    async with LocalHost(pulsar_broker.url, [counting]) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("counting", {"n": "many"})
    assert info.value.error_type == "invalid-arguments" and "argument 'n'" in info.value.message


async def test_sync_plugins_run_in_a_thread_and_never_block_other_services(pulsar_broker: EmbeddedBroker) -> None:
    release = threading.Event()

    @tghost.tool
    def blocking() -> str:
        """Blocks its thread until released."""
        return "released" if release.wait(20) else "never released"

    @tghost.tool
    async def quick() -> str:
        return "quick"

    async with LocalHost(pulsar_broker.url, [blocking, quick]) as host:
        blocked = asyncio.create_task(host.call("blocking", timeout=30))
        assert await host.call("quick") == "quick"  # answered while 'blocking' still holds its thread
        assert not blocked.done()
        release.set()
        assert await blocked == "released"


async def test_concurrency_bound_limits_calls_in_flight(pulsar_broker: EmbeddedBroker) -> None:
    gate = asyncio.Event()
    running = {"now": 0, "max": 0}

    @tghost.tool(max_concurrency=2)
    async def gated() -> str:
        running["now"] += 1
        running["max"] = max(running["max"], running["now"])
        await gate.wait()
        running["now"] -= 1
        return "done"

    async with LocalHost(pulsar_broker.url, [gated]) as host:
        calls = [asyncio.create_task(host.call("gated")) for _ in range(6)]
        while sum(w.in_flight for w in host.server.workers) < 6:
            await asyncio.sleep(0.01)
        assert running["now"] == 2
        gate.set()
        assert await asyncio.gather(*calls) == ["done"] * 6
    assert running["max"] == 2


async def test_requests_beyond_bound_and_queue_are_answered_overloaded(pulsar_broker: EmbeddedBroker) -> None:
    gate = asyncio.Event()

    @tghost.tool(max_concurrency=1)
    async def narrow() -> str:
        await gate.wait()
        return "ok"

    async with LocalHost(pulsar_broker.url, [narrow], ServeSettings(max_queue=2)) as host:
        calls = [asyncio.create_task(host.call("narrow")) for _ in range(8)]
        done, _ = await asyncio.wait(calls, timeout=2)  # the 5 overloaded ones come back at once
        gate.set()
        results = await asyncio.gather(*calls, return_exceptions=True)
    overloaded = [r for r in results if isinstance(r, ToolCallError) and r.error_type == "overloaded"]
    assert len(done) == 5 and len(overloaded) == 5
    assert results.count("ok") == 3  # one running + two queued; every request got a reply


async def test_two_hosts_share_one_service_through_the_shared_subscription(pulsar_broker: EmbeddedBroker) -> None:
    @tghost.tool(service="shared-echo")
    async def echo(text: str) -> str:
        return text

    async with LocalHost(pulsar_broker.url, [echo]) as first, LocalHost(pulsar_broker.url, [echo]) as second:
        [w1], [w2] = first.server.workers, second.server.workers
        assert w1.subscription == w2.subscription == "shared-echo-request"
        answers = await asyncio.gather(*(first.call("shared-echo", {"text": str(i)}) for i in range(40)))
        assert answers == [str(i) for i in range(40)]
        assert w1.counters["received"] > 0 and w2.counters["received"] > 0
        assert w1.counters["received"] + w2.counters["received"] == 40


async def test_graceful_stop_finishes_in_flight_calls(pulsar_broker: EmbeddedBroker) -> None:
    @tghost.tool
    async def unhurried() -> str:
        await asyncio.sleep(0.5)
        return "finished"

    async with LocalHost(pulsar_broker.url, [unhurried]) as host:
        call = asyncio.create_task(host.call("unhurried"))
        while host.server.workers[0].in_flight == 0:
            await asyncio.sleep(0.01)
        cancelled = await host.server.stop(grace=5)
        assert await call == "finished"
    assert cancelled == 0


async def test_calls_still_running_after_the_grace_period_are_answered_unavailable(
    pulsar_broker: EmbeddedBroker,
) -> None:
    @tghost.tool
    async def endless() -> str:
        await asyncio.sleep(60)
        return "never"

    async with LocalHost(pulsar_broker.url, [endless]) as host:
        call = asyncio.create_task(host.call("endless"))
        while host.server.workers[0].in_flight == 0:
            await asyncio.sleep(0.01)
        assert await host.server.stop(grace=0.1) == 1
        with pytest.raises(ToolCallError) as info:
            await call
    assert info.value.error_type == "unavailable"



async def test_listeners_get_one_record_per_request_with_its_status_and_user(
    pulsar_broker: EmbeddedBroker, recorder: Recorder
) -> None:
    records: list[CallRecord] = []
    server = Server(*catalog_parts([recorder]), listeners=[records.append, lambda r: 1 / 0])  # a bad one too
    client = await PulsarSettings(pulsar_broker.url).connect()
    await server.start(client)
    try:
        async with RawWire(pulsar_broker.url, recorder.descriptor) as raw:
            await raw.request({"q": 1}, config={"needed": 1}, user="alice")
            await raw.request({}, config={})  # lacks the required config param
            await raw.send(b"no id", {})
            await raw.request({"fail": "x"}, config={"needed": 1})
    finally:
        await server.stop()
        await client.close()
    assert [(r.status, r.user) for r in records] == [
        ("ok", "alice"), ("missing-config", "test"), ("unanswerable", None), ("tool-service-error", "test")]
    assert all(r.service == "recorder" and r.duration > 0 for r in records)
    assert records[0].request_id is not None and records[2].request_id is None
