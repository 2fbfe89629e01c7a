"""lane: the thread lane (tghost/serving/lane.py): a plain ``def`` tool on a non-persistent topic is served on
its worker threads with no event-loop hop, and keeps every behaviour of the loop path. Each test
causes the case on the embedded broker and counts the replies on the wire.

(The drain cases run for both paths in tests/serving/test_drain.py; streaming and stuck threads in
tests/serving/test_endpoint.py and tests/serving/test_executors.py.)"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import tghost
from tghost.agent.client import ToolCallError
from tghost.broker import EmbeddedBroker
from tghost.discovery.discover import catalog_of
from tghost.protocol import wire
from tghost.serving.lane import ThreadLane
from tghost.serving.request import CallRecord
from tghost.serving.settings import ServeSettings
from tghost.testing import LocalHost, RawWire


def lane_of(host: LocalHost) -> Any:
    """The only service's thread lane (None: another driver serves it)."""
    [endpoint] = host.server.endpoints
    return endpoint._driver if isinstance(endpoint._driver, ThreadLane) else None


async def test_a_plain_def_is_served_by_the_lane_and_an_async_def_is_not(pulsar_broker: EmbeddedBroker) -> None:
    @tghost.tool
    def plain(text: str) -> str:
        return f"{threading.current_thread().name}:{text}"

    @tghost.tool
    async def awaited(text: str) -> str:
        return text

    async with LocalHost(pulsar_broker.url, [plain]) as host:
        assert lane_of(host) is not None
        answer = await host.call("plain", {"text": "hi"})
    assert answer.startswith("tghost-plain_") and answer.endswith(":hi")  # the service's own worker thread
    async with LocalHost(pulsar_broker.url, [awaited]) as host:
        assert lane_of(host) is None


async def test_a_timed_out_call_gets_exactly_one_reply_and_its_late_result_is_dropped(
    pulsar_broker: EmbeddedBroker,
) -> None:
    returned = threading.Event()

    @tghost.tool(timeout=0.3)
    def dawdle(seconds: float) -> str:
        time.sleep(seconds)
        returned.set()
        return "late"

    async with LocalHost(pulsar_broker.url, [dawdle]) as host, \
            RawWire(pulsar_broker.url, dawdle.descriptor) as raw:
        started = time.monotonic()
        await raw.send(wire.encode_request("u", {}, {"seconds": 1.5}), {"id": "slow"})
        replies = await raw.raw_replies("slow", timeout=10)
        answered_after = time.monotonic() - started
        await asyncio.to_thread(returned.wait, 10)
        settled = await raw.raw_replies("slow", settle=0.5)  # anything the late result would have sent
        assert await host.call("dawdle", {"seconds": 0}) == "late"  # the service still answers
    assert [reply.json()["error"]["type"] for reply in settled] == ["timeout"]
    assert len(replies) == 1 and answered_after < 1.5  # answered at the deadline, not when the plugin returned
    assert "0.3s" in settled[0].json()["error"]["message"]


async def test_requests_beyond_the_bound_and_queue_are_answered_overloaded_at_once(
    pulsar_broker: EmbeddedBroker,
) -> None:
    gate = threading.Event()
    running = {"now": 0, "max": 0}
    lock = threading.Lock()

    @tghost.tool(max_concurrency=2)
    def narrow() -> str:
        with lock:
            running["now"] += 1
            running["max"] = max(running["max"], running["now"])
        gate.wait(20)
        with lock:
            running["now"] -= 1
        return "ok"

    async with LocalHost(pulsar_broker.url, [narrow], settings=ServeSettings(max_queue=3)) as host:
        calls = [asyncio.create_task(host.call("narrow", timeout=30)) for _ in range(9)]
        done, _ = await asyncio.wait(calls, timeout=5)  # the 4 overloaded ones come back at once
        in_flight = lane_of(host).in_flight
        gate.set()
        results = await asyncio.gather(*calls, return_exceptions=True)
    overloaded = [r for r in results if isinstance(r, ToolCallError) and r.error_type == "overloaded"]
    assert len(done) == 4 and len(overloaded) == 4 and in_flight == 5
    assert "2 calls running and 3 waiting" in overloaded[0].message
    assert results.count("ok") == 5 and running["max"] == 2  # two ran at once, three waited; all answered


async def test_every_lane_call_reaches_the_listeners_once_with_its_status_user_and_arguments(
    pulsar_broker: EmbeddedBroker,
) -> None:
    records: list[CallRecord] = []

    @tghost.tool
    def picky(n: int) -> int:
        if n < 0:
            raise tghost.ToolError("negative", "out-of-range")
        if n == 13:
            raise RuntimeError("unlucky")
        return n * 2

    async with LocalHost(pulsar_broker.url, [picky], listeners=[records.append]), \
            RawWire(pulsar_broker.url, picky.descriptor) as raw:
        answers = [await raw.request({"n": n}, user="alice") for n in (2, -1, 13)]
        await raw.request({"n": "two"})
        async with asyncio.timeout(10):  # the last record is told right after its reply is sent
            while len(records) < 4:
                await asyncio.sleep(0.01)
    assert [replies[-1][1]["response"] for replies in answers] == ["4", "", ""]
    assert [(r.status, r.user) for r in records] == [
        ("ok", "alice"), ("out-of-range", "alice"), ("tool-service-error", "alice"), ("invalid-arguments", "test")]
    assert records[0].arguments == {"n": 2} and all(r.duration > 0 for r in records)


async def test_a_stream_that_times_out_stops_its_chunks_at_the_timeout_reply(pulsar_broker: EmbeddedBroker) -> None:
    @tghost.tool(timeout=0.5)
    def ticker(count: int) -> Iterator[str]:
        for i in range(count):
            time.sleep(0.1)
            yield f"tick-{i}"

    async with LocalHost(pulsar_broker.url, [ticker]), RawWire(pulsar_broker.url, ticker.descriptor) as raw:
        await raw.send(wire.encode_request("u", {}, {"count": 30}), {"id": "t"})
        replies = await raw.raw_replies("t", timeout=10, settle=1.0)
    bodies = [reply.json() for reply in replies]
    assert 1 <= len(bodies) - 1 <= 6, bodies  # some chunks, then the timeout
    assert [b["response"] for b in bodies[:-1]] == [f"tick-{i}" for i in range(len(bodies) - 1)]
    assert bodies[-1]["error"]["type"] == "timeout"  # and nothing after it


class Deferred(tghost.ToolService):
    """A plain ``invoke`` that returns an awaitable, then one that returns an async generator."""

    id = "deferred"
    arguments = (tghost.Argument(name="stream", type="boolean", description="stream it"),)

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        if arguments["stream"]:
            return self._chunks()
        return self._later()

    async def _later(self) -> str:
        await asyncio.sleep(0)
        return f"awaited on the loop: {asyncio.get_running_loop() is not None}"

    async def _chunks(self) -> Any:
        for word in ("a", "b"):
            await asyncio.sleep(0)
            yield word


async def test_a_plain_invoke_may_return_an_awaitable_or_an_async_generator(pulsar_broker: EmbeddedBroker) -> None:
    service = Deferred()
    async with LocalHost(pulsar_broker.url, [service]) as host:
        assert lane_of(host) is not None
        assert await host.call("deferred", {"stream": False}) == "awaited on the loop: True"
        assert [chunk async for chunk in host.stream("deferred", {"stream": True})] == ["a", "b"]


async def test_a_call_still_running_when_the_grace_ends_is_answered_unavailable_and_its_thread_counted_stuck(
    pulsar_broker: EmbeddedBroker,
) -> None:
    release, running = threading.Event(), threading.Event()

    @tghost.tool(timeout=60)
    def endless() -> str:
        running.set()
        release.wait(30)
        return "never seen"

    async with LocalHost(pulsar_broker.url, [endless]) as host:
        call = asyncio.create_task(host.call("endless", timeout=30))
        [endpoint] = host.server.endpoints
        await asyncio.to_thread(running.wait, 30)  # running, not only received (a loaded machine is slow to start it)
        assert await host.server.stop(grace=0.2) == 1
        stuck = endpoint.executor.stats().stuck
        with pytest.raises(ToolCallError) as info:
            await call
        release.set()
    assert info.value.error_type == "unavailable" and "before the call finished" in info.value.message
    assert stuck == 1


async def test_authorize_runs_before_a_lane_call_and_a_deny_never_invokes(pulsar_broker: EmbeddedBroker) -> None:
    invoked: list[str] = []

    @tghost.tool
    def guarded(q: str) -> str:
        invoked.append(q)
        return q

    def only_alice(user: str, service: str) -> str | None:
        return None if user == "alice" else f"{user} may not call {service} ({threading.current_thread().name})"

    catalog = catalog_of([guarded], authorize=only_alice)
    async with LocalHost(pulsar_broker.url, catalog) as host, RawWire(pulsar_broker.url, guarded.descriptor) as raw:
        assert lane_of(host) is not None
        [(_, denied)] = await raw.request({"q": "secret"}, user="bob")
        [(_, allowed)] = await raw.request({"q": "hi"}, user="alice")
    assert denied["error"]["type"] == "not-allowed"
    assert denied["error"]["message"].startswith("bob may not call guarded (tghost-guarded_")  # on its worker thread
    assert allowed["response"] == "hi" and invoked == ["hi"]
