"""inline: the inline driver (tghost/serving/inline.py) runs a short plain ``def`` call on its
service's receive thread, on the embedded broker. A service runs inline only once its latest
calls were measured short; what is the inline driver's own (which thread a call runs on, the
receive thread handed over, a call left with its plugin counted stuck, a stream on a worker) is
checked here with every call eligible (``eager``); every request rule runs over it in
tests/serving/test_parity.py too (its ``inline`` and ``inline-measured`` modes)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import tghost
from tests.conftest import until
from tghost.agent.client import ToolCallError
from tghost.broker import EmbeddedBroker
from tghost.discovery.discover import catalog_of
from tghost.protocol import wire
from tghost.serving import inline
from tghost.serving.inline import InlineDriver
from tghost.serving.request import CallRecord
from tghost.testing import LocalHost, RawWire


def here() -> str:
    return threading.current_thread().name


async def test_a_service_runs_inline_once_its_latest_calls_were_short_and_a_slow_one_never(
    pulsar_broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    @tghost.tool
    def quick() -> str:
        return here()

    @tghost.tool
    def slow() -> str:
        time.sleep(inline.BUDGET * 3)
        return here()

    monkeypatch.setattr(inline, "BUDGET", 0.05)  # not 1 ms: 8 calls in a row that short are rare under load
    async with LocalHost(pulsar_broker.url, [quick, slow]) as host:
        assert {type(endpoint._driver) for endpoint in host.server.endpoints} == {InlineDriver}
        quick_threads = [await host.call("quick") for _ in range(inline.RECENT + 20)]
        slow_threads = [await host.call("slow") for _ in range(inline.RECENT + 3)]
    assert all(name.startswith("tghost-quick_") for name in quick_threads[:inline.RECENT])  # measured on the lane
    assert "tghost-quick-receive-0" in quick_threads[inline.RECENT:], quick_threads  # then inline (under load: some)
    assert all(name.startswith("tghost-slow_") for name in slow_threads)


async def test_an_inline_call_past_its_timeout_gets_one_reply_and_a_new_receive_thread_takes_over(
    pulsar_broker: EmbeddedBroker, eager: None,
) -> None:
    release = threading.Event()

    @tghost.tool(timeout=0.3)
    def dawdle(hold: bool = False) -> str:
        if hold:
            release.wait(30)
        return here()

    async with LocalHost(pulsar_broker.url, [dawdle]) as host, RawWire(pulsar_broker.url, dawdle.descriptor) as raw:
        assert await host.call("dawdle") == "tghost-dawdle-receive-0"
        await raw.send(wire.encode_request("u", {}, {"hold": True}), {"id": "slow"})
        replies = await raw.raw_replies("slow", timeout=10)  # at the deadline: the plugin still holds the call
        during = await host.call("dawdle")  # while the plugin still holds the old thread (set aside before the reply)
        release.set()
        settled = await raw.raw_replies("slow", settle=0.5)
        # the old thread's call ends a moment after the plugin returned
        await until(lambda: not host.server.endpoints[0]._driver._left, "the set-aside call ends", 10)
        after = await host.call("dawdle")
    assert len(replies) == 1 and replies[0].json()["error"]["type"] == "timeout"
    assert len(settled) == 1  # the late result is dropped
    assert during.startswith("tghost-dawdle_")  # no inline call while one is left with its plugin
    assert after == "tghost-dawdle-receive-1"  # the new receive thread, inline again


async def test_an_inline_call_is_cancelled_at_once_and_told(pulsar_broker: EmbeddedBroker, eager: None) -> None:
    records: list[CallRecord] = []
    started, told = threading.Event(), threading.Event()

    @tghost.tool(timeout=60)
    def grind(ctx: tghost.Context) -> str:
        started.set()
        if ctx.cancelled.wait(30):
            told.set()
        return here()

    async with LocalHost(pulsar_broker.url, [grind], listeners=[records.append]) as host:
        call = asyncio.create_task(host.call("grind", timeout=90))
        await asyncio.to_thread(started.wait, 30)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await asyncio.to_thread(told.wait, 10)
        # the plugin returns; the call set aside with it ends, so the next one runs inline again
        await until(lambda: not host.server.endpoints[0]._driver._left, "the cancelled call ends", 10)
        started.clear()
        second = asyncio.create_task(host.call("grind", timeout=30))
        await asyncio.to_thread(started.wait, 30)
        [endpoint] = host.server.endpoints
        [request_id] = endpoint._driver._by_id
        endpoint._control._cancel(request_id, {})  # a cancel with no caller to check
        with pytest.raises(ToolCallError) as info:
            await second
    assert info.value.error_type == wire.CANCELLED
    assert [r.status for r in records] == [wire.CANCELLED, wire.CANCELLED]


async def test_an_inline_call_running_when_the_grace_ends_is_answered_unavailable(
    pulsar_broker: EmbeddedBroker, eager: None,
) -> None:
    release, running = threading.Event(), threading.Event()

    @tghost.tool(timeout=60)
    def endless() -> str:
        running.set()
        release.wait(30)
        return "never seen"

    async with LocalHost(pulsar_broker.url, [endless]) as host:
        call = asyncio.create_task(host.call("endless", timeout=30))
        await asyncio.to_thread(running.wait, 30)
        [endpoint] = host.server.endpoints
        assert endpoint.in_flight == 1 and next(iter(endpoint._driver._by_id.values())).job is inline._INLINE
        assert await host.server.stop(grace=0.2) == 1
        with pytest.raises(ToolCallError) as info:
            await call
        async with asyncio.timeout(10):  # a worker thread waited for the call handed over; freed at the cut-off
            while endpoint.executor.stats().busy:
                await asyncio.sleep(0.01)
        stuck = endpoint.executor.stats()
        release.set()
        async with asyncio.timeout(10):  # its thread is freed when the plugin returns
            while endpoint.executor.stats().stuck:
                await asyncio.sleep(0.01)
    assert info.value.error_type == "unavailable" and "before the call finished" in info.value.message
    assert (stuck.stuck, stuck.busy) == (1, 0)  # counted stuck, as a worker thread would be


async def test_an_inline_call_that_blocks_never_delays_another_services_replies(
    pulsar_broker: EmbeddedBroker, eager: None,
) -> None:
    release, running = threading.Event(), threading.Event()

    @tghost.tool(timeout=60)
    def block() -> str:
        running.set()
        release.wait(30)
        return "released"

    @tghost.tool
    def echo(text: str) -> str:
        return f"{text} on {here()}"

    async with LocalHost(pulsar_broker.url, [block, echo]) as host:
        blocked = asyncio.create_task(host.call("block", timeout=60))
        await asyncio.to_thread(running.wait, 30)
        answers = [await host.call("echo", {"text": str(i)}, timeout=10) for i in range(3)]
        assert not blocked.done()
        release.set()
        assert await blocked == "released"
    assert answers == [f"{i} on tghost-echo-receive-0" for i in range(3)]


async def test_inline_calls_reach_the_listeners_and_authorize_runs_on_the_receive_thread(
    pulsar_broker: EmbeddedBroker, eager: None,
) -> None:
    records: list[CallRecord] = []

    @tghost.tool
    def picky(n: int) -> int:
        if n < 0:
            raise tghost.ToolError("negative", "out-of-range")
        return n * 2

    def only_alice(user: str, service: str) -> str | None:
        return None if user == "alice" else f"{user} may not call {service} ({here()})"

    catalog = catalog_of([picky], authorize=only_alice)
    async with LocalHost(pulsar_broker.url, catalog, listeners=[records.append]), \
            RawWire(pulsar_broker.url, picky.descriptor) as raw:
        answers = [await raw.request({"n": n}, user="alice") for n in (2, -1)]
        [(_, denied)] = await raw.request({"n": 1}, user="bob")
        await until(lambda: len(records) == 3, "every record is told", 10)  # right after its reply is sent
    assert [replies[-1][1]["response"] for replies in answers] == ["4", ""]
    assert (denied["error"]["type"], denied["error"]["message"]) == (
        "not-allowed", "bob may not call picky (tghost-picky-receive-0)")
    assert sorted((r.status, r.user) for r in records) == [  # each told by its thread: in any order
        ("not-allowed", "bob"), ("ok", "alice"), ("out-of-range", "alice")]


async def test_an_inline_calls_stream_goes_on_a_worker_thread(pulsar_broker: EmbeddedBroker, eager: None) -> None:
    @tghost.tool
    def ticker(count: int) -> Iterator[str]:
        for i in range(count):
            yield f"{i} on {here()}"

    async with LocalHost(pulsar_broker.url, [ticker]) as host:
        chunks = [chunk async for chunk in host.stream("ticker", {"count": 3})]
    assert [chunk.split(" on ")[0] for chunk in chunks] == ["0", "1", "2"]
    assert all(chunk.split(" on ")[1].startswith("tghost-ticker_") for chunk in chunks)


async def test_an_inline_call_that_turns_slow_hands_the_receiving_over_and_max_concurrency_holds(
    pulsar_broker: EmbeddedBroker, eager: None,
) -> None:
    release = threading.Event()
    running: list[str] = []

    @tghost.tool(timeout=60, max_concurrency=1)
    def solo(name: str) -> str:
        running.append(name)
        release.wait(30)
        running.remove(name)
        return f"{name} on {here()}"

    async with LocalHost(pulsar_broker.url, [solo]) as host:
        [endpoint] = host.server.endpoints
        first = asyncio.create_task(host.call("solo", {"name": "first"}, timeout=60))
        async with asyncio.timeout(10):
            while not running:
                await asyncio.sleep(0.01)
        second = asyncio.create_task(host.call("solo", {"name": "second"}, timeout=60))
        async with asyncio.timeout(10):  # received on a new thread while the first still blocks
            while endpoint.in_flight < 2:
                await asyncio.sleep(0.01)
        # a worker thread takes the call handed over, and waits for the one slot
        await until(lambda: endpoint.executor.stats().busy == 1, "a worker thread holds the second call", 10)
        await asyncio.sleep(0.3)
        together = list(running)
        release.set()
        answers = await asyncio.gather(first, second)
    assert together == ["first"]  # the second waits for the one slot
    assert answers[0] == "first on tghost-solo-receive-0" and answers[1].startswith("second on tghost-solo_")


async def test_an_inline_calls_stream_that_times_out_leaves_its_worker_thread_counted_stuck(
    pulsar_broker: EmbeddedBroker, eager: None,
) -> None:
    release = threading.Event()

    @tghost.tool(timeout=0.3)
    def trickle() -> Iterator[str]:
        yield "first"
        release.wait(30)
        yield "never sent"

    async with LocalHost(pulsar_broker.url, [trickle]) as host, RawWire(pulsar_broker.url, trickle.descriptor) as raw:
        [endpoint] = host.server.endpoints
        await raw.send(wire.encode_request("u", {}, {}), {"id": "s"})
        replies = await raw.raw_replies("s", timeout=10)
        for _ in range(100):  # the timer answers first, then lets the thread go
            if (stats := endpoint.executor.stats()).stuck:
                break
            await asyncio.sleep(0.02)
        release.set()
    assert [(reply.json().get("error") or {}).get("type") for reply in replies] == [None, "timeout"]
    assert (stats.stuck, stats.busy) == (1, 0)  # as the lane's: slot free, thread stuck until the plugin returns


async def test_a_request_the_receive_thread_fails_to_take_is_logged_and_the_service_receives_on(
    pulsar_broker: EmbeddedBroker, eager: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    @tghost.tool
    def quick() -> str:
        return here()

    take, failed = InlineDriver.take, threading.Event()

    def fails_once(driver: InlineDriver, request: Any) -> None:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("a defect in taking this request")
        take(driver, request)

    monkeypatch.setattr(InlineDriver, "take", fails_once)
    async with LocalHost(pulsar_broker.url, [quick]) as host:
        with pytest.raises(ToolCallError) as lost:
            await host.call("quick", timeout=2)
        assert lost.value.error_type == "timeout"  # that one request is lost, and said so in the log
        assert await host.call("quick") == "tghost-quick-receive-0"  # the same receive thread goes on
    assert "service quick: could not take a request; receiving goes on" in caplog.text
