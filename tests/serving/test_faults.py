"""faults: faults the host survives, on the embedded broker: misbehaving plugins, overload, and a host
killed mid-call on a persistent request topic. In each, the other services keep answering."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import signal
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar.asyncio
import pytest

import tghost
from tests.conftest import READY, HostProcess, PluginDir
from tghost.agent.client import ToolCallError, ToolServiceClient
from tghost.broker import EmbeddedBroker
from tghost.protocol import wire
from tghost.pulsar.clients import PulsarSettings
from tghost.serving.settings import ServeSettings
from tghost.testing import LocalHost, RawWire


@tghost.tool
async def healthy(text: str) -> str:
    """The bystander: every fault test checks that it still answers."""
    return text[::-1]


async def assert_healthy(host: LocalHost) -> None:
    assert await host.call("healthy", {"text": "abc"}) == "cba"


@tghost.tool
def leaky(n: int) -> Iterator[str]:
    """A plain generator that raises after n chunks."""
    for i in range(n):
        yield f"part-{i}"
    raise LookupError("lost the rest")


async def test_a_generator_that_raises_mid_stream_ends_its_stream_with_an_error(pulsar_broker: EmbeddedBroker) -> None:
    async with LocalHost(pulsar_broker.url, [leaky, healthy]) as host, \
            RawWire(pulsar_broker.url, leaky.descriptor) as raw:
        replies = await raw.request({"n": 2})
        await assert_healthy(host)
        again = await raw.request({"n": 1})  # the same service goes on serving too
    assert [body["response"] for _, body in replies] == ["part-0", "part-1", ""]
    assert [body["end_of_stream"] for _, body in replies] == [False, False, True]
    assert replies[-1][1]["error"] == {"type": "tool-service-error", "message": "LookupError: lost the rest",
                                       "request-id": replies[-1][0]["id"]}
    assert [body["response"] for _, body in again] == ["part-0", ""]


async def test_an_async_plugin_that_never_returns_is_cancelled_at_its_timeout(pulsar_broker: EmbeddedBroker) -> None:
    seen: list[str] = []

    @tghost.tool(timeout=2)
    async def hangs() -> str:
        seen.append("started")
        try:
            await asyncio.Event().wait()  # nothing ever sets it
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "never"

    async with LocalHost(pulsar_broker.url, [hangs, healthy]) as host:
        hung = asyncio.create_task(host.call("hangs"))
        while not seen:
            await asyncio.sleep(0.01)
        await assert_healthy(host)  # answered while 'hangs' still hangs
        assert not hung.done()
        with pytest.raises(ToolCallError) as info:
            await hung
        assert host.server.endpoints[0].in_flight == 0  # its slot is free again
    assert info.value.error_type == "timeout"
    assert seen == ["started", "cancelled"]


@tghost.tool
async def unserialisable(kind: str) -> Any:
    """Returns what JSON cannot encode (or, with kind 'fine', a plain dict)."""
    return {"fine": {"ok": True}, "date": {"at": datetime.date(2024, 1, 1)}, "object": object(), "set": {1, 2}}[kind]


@pytest.mark.parametrize(("kind", "returned"), [("date", "a dict holding a date"), ("object", "an object"),
                                                ("set", "a set")])
async def test_a_result_json_cannot_encode_is_a_tool_service_error_naming_its_type_and_the_host_serves_on(
    pulsar_broker: EmbeddedBroker, kind: str, returned: str
) -> None:
    async with LocalHost(pulsar_broker.url, [unserialisable, healthy]) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("unserialisable", {"kind": kind})
        await assert_healthy(host)
        assert json.loads(await host.call("unserialisable", {"kind": "fine"})) == {"ok": True}
    assert info.value.error_type == "tool-service-error"
    assert info.value.message == (f"service 'unserialisable': the tool returned {returned}, which is not JSON: "
                                  "return a str, list, dict, number, bool or None")


@tghost.tool
async def blocker(seconds: float) -> str:
    """Blocks the event loop: the mistake the stall detector exists to name."""
    time.sleep(seconds)  # sync sleep inside async def
    return "unblocked"


async def test_a_plugin_blocking_the_event_loop_is_named_once_and_the_others_still_answer(
    pulsar_broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tghost.serving.stalls")
    async with LocalHost(pulsar_broker.url, [blocker, healthy], ServeSettings(stall_threshold=0.5)) as host:
        blocked = asyncio.create_task(host.call("blocker", {"seconds": 1.5}))
        bystander = asyncio.create_task(host.call("healthy", {"text": "abc"}))
        assert await bystander == "cba"
        assert await blocked == "unblocked"
        detector = host.server.stall_detector
        assert detector is not None
        assert detector.stalls_by_owner["blocker"] == 1 and detector.stalls >= 1
    warnings = [r.getMessage() for r in caplog.records if r.name == "tghost.serving.stalls"
                and "'blocker'" in r.getMessage()]
    assert len(warnings) == 1  # one warning per stall
    assert f"{__file__}:" in warnings[0] and "in blocker" in warnings[0]


@pytest.mark.parametrize("total", [300, 2000])  # 2000: more than pulsar-client's default receiver queue
async def test_far_more_requests_than_bound_and_queue_each_get_exactly_one_reply(
    pulsar_broker: EmbeddedBroker, total: int
) -> None:
    gate = asyncio.Event()

    @tghost.tool(max_concurrency=2)
    async def gated(n: int) -> int:
        await gate.wait()
        return n

    admitted = 2 + 8  # max_concurrency + max_queue
    descriptor = gated.descriptor
    client = await PulsarSettings(pulsar_broker.url).connect()
    try:
        async with LocalHost(pulsar_broker.url, [gated], ServeSettings(max_queue=8)):
            replies = await client.subscribe(descriptor.response_queue, f"count-{uuid.uuid4().hex}",
                                             receiver_queue_size=2 * total)  # the counter must not drop any
            requests = await client.create_producer(descriptor.request_queue, batching_enabled=False,
                                                    max_pending_messages=2 * total)
            ids = [f"burst-{i}" for i in range(total)]
            await asyncio.gather(*(requests.send(wire.encode_request("u", {}, {"n": i}), properties={"id": rid})
                                   for i, rid in enumerate(ids)))
            refused = await _replies_by_id(replies, total - admitted)  # the gate holds the admitted ones
            gate.set()
            answered = await _replies_by_id(replies, admitted)
            await requests.send(wire.encode_request("u", {}, {"n": -1}), properties={"id": "last"})
            last = await _replies_by_id(replies, 1)  # anything still in flight would arrive before it
    finally:
        await client.close()
    assert {body["error"]["type"] for bodies in refused.values() for body in bodies} == {"overloaded"}
    assert {json.loads(body["response"]) for bodies in answered.values() for body in bodies} == {
        ids.index(request_id) for request_id in answered}
    assert sorted([*refused, *answered]) == sorted(ids)  # every request answered ...
    assert all(len(bodies) == 1 for bodies in [*refused.values(), *answered.values()])  # ... exactly once
    assert last == {"last": [{"error": None, "response": "-1", "end_of_stream": True}]}


async def _replies_by_id(consumer: pulsar.asyncio.Consumer, count: int) -> dict[str, list[dict[str, Any]]]:
    """Every reply the consumer gets, by ``id``, until ``count`` streams have ended."""
    got: dict[str, list[dict[str, Any]]] = defaultdict(list)
    ended = 0
    while ended < count:
        message = await asyncio.wait_for(consumer.receive(), 20)
        await consumer.acknowledge(message)
        body = json.loads(message.data())
        got[message.properties()["id"]].append(body)
        ended += body["end_of_stream"]
    return dict(got)


PERSISTENT_JOB = """
import os
import pathlib
import time

import tghost

GATE = pathlib.Path(os.environ["TGHOST_TEST_GATE"])


@tghost.tool(persistent=True, timeout=120)
def slow_job(job: str) -> str:
    '''Record which host took the job, then wait for the test to release it.'''
    (GATE / f"started-{os.getpid()}").write_text(job)
    while not (GATE / "release").exists():
        time.sleep(0.05)
    return f"{job} done by {os.getpid()}"


@tghost.hookimpl
def tghost_register_services(register):
    register(slow_job)
"""


async def test_a_host_killed_mid_call_on_a_persistent_topic_hands_the_call_to_another_host(
    pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, host_process: Callable[..., HostProcess], tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    plugin_dir.add("persistent-job", PERSISTENT_JOB)
    env = plugin_dir.env(TGHOST_PULSAR_URL=pulsar_broker.url, TGHOST_TEST_GATE=str(gate),
                         XDG_CONFIG_HOME=str(tmp_path / "config"),
                         TGHOST_DESCRIPTORS_TOPIC=f"persistent://tg/config/faults-{uuid.uuid4().hex[:8]}",
                         TGHOST_LOAD_PLUGINS="persistent-job")
    hosts = [host_process("--host-id", name, env=env) for name in ("first", "second")]
    for host in hosts:
        assert "persistent://tg/request/slow-job" in host.wait_for("serving slow-job on")
        host.wait_for(READY)
    client = await PulsarSettings(pulsar_broker.url).connect()
    try:
        async with ToolServiceClient(client, "persistent://tg/request/slow-job",
                                     "non-persistent://tg/response/slow-job") as caller:
            call = asyncio.create_task(caller.call({}, {"job": "report"}, timeout=120))
            taker = await _host_that_started(gate, hosts, exclude=None)
            taker.process.send_signal(signal.SIGKILL)  # dies mid-call, the request unacknowledged
            taker.process.wait(10)
            survivor = await _host_that_started(gate, hosts, exclude=taker)  # the broker redelivered it
            (gate / "release").touch()
            answer = await call
    finally:
        await client.close()
    assert answer == f"report done by {survivor.process.pid}"
    survivor.process.send_signal(signal.SIGTERM)
    assert survivor.finish() == 0


async def _host_that_started(gate: Path, hosts: list[HostProcess], exclude: HostProcess | None) -> HostProcess:
    """The host (other than ``exclude``) whose plugin has started the job; waits up to 30 s."""
    for _ in range(600):
        for host in hosts:
            if host is not exclude and (gate / f"started-{host.process.pid}").exists():
                return host
        await asyncio.sleep(0.05)
    raise AssertionError("no host started the job; logs:\n" + "\n".join(h.log for h in hosts))
