"""hop: the hot path's one crossing from the Pulsar client's threads into the event loop, and
what serve and call keep on it (order, acknowledgement after the reply, stopping); against the
embedded broker."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

import tghost
from tghost.agent.client import ToolCallError
from tghost.broker import EmbeddedBroker
from tghost.protocol import wire
from tghost.pulsar import hop
from tghost.testing import LocalHost, RawWire


async def test_a_mailbox_runs_every_call_from_every_thread_in_order_on_the_loop() -> None:
    loop = asyncio.get_running_loop()
    mailbox = hop.Mailbox(loop)
    seen: dict[str, list[int]] = {}
    on_loop: set[bool] = set()
    done = asyncio.Event()

    def record(name: str, i: int) -> None:
        on_loop.add(threading.current_thread() is threading.main_thread())
        seen.setdefault(name, []).append(i)
        if sum(map(len, seen.values())) == 4 * 500:
            done.set()

    def put_all(name: str) -> None:
        for i in range(500):
            mailbox.put(record, name, i)

    threads = [threading.Thread(target=put_all, args=(f"t{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    await asyncio.wait_for(done.wait(), 10)
    assert seen == {f"t{n}": list(range(500)) for n in range(4)}
    assert on_loop == {True}


async def test_a_failing_mailbox_call_is_reported_and_the_next_ones_still_run() -> None:
    loop = asyncio.get_running_loop()
    errors: list[BaseException] = []
    loop.set_exception_handler(lambda _, context: errors.append(context["exception"]))
    mailbox, ran = hop.Mailbox(loop), asyncio.Event()
    mailbox.put(lambda: 1 / 0)
    mailbox.put(ran.set)
    await asyncio.wait_for(ran.wait(), 5)
    assert [type(e) for e in errors] == [ZeroDivisionError]


@tghost.tool
async def long_stream(n: int) -> AsyncIterator[str]:
    """Stream n numbered chunks."""
    for i in range(n):
        yield f"{i},"


@tghost.tool(service="long-stream")
def plain_long_stream(n: int) -> Iterator[str]:
    """The same from a plain generator (the thread lane)."""
    yield from (f"{i}," for i in range(n))


@pytest.mark.parametrize("streamer", [long_stream, plain_long_stream], ids=["async def", "def"])
async def test_a_stream_far_longer_than_the_send_window_arrives_whole_and_in_order(
        pulsar_broker: EmbeddedBroker, streamer: tghost.ToolService) -> None:
    """Many windows, paced by the broker's receipts; within the reader's queue (1000 messages:
    on a non-persistent topic the broker drops what does not fit, docs/protocol.md §2.5)."""
    count = 12 * hop.STREAM_WINDOW + 5
    async with LocalHost(pulsar_broker.url, [streamer]), RawWire(pulsar_broker.url, streamer.descriptor) as raw:
        await raw.send(wire.encode_request("u", {}, {"n": count}), {"id": "long"})
        replies = await raw.replies("long")
    assert [body["response"] for _, body in replies] == [f"{i}," for i in range(count)] + [""]
    assert [body["end_of_stream"] for _, body in replies] == [False] * count + [True]


@tghost.tool
async def ping() -> str:
    """Answer pong."""
    return "pong"


async def test_a_request_arriving_after_the_host_stopped_receiving_is_answered_unavailable(
        pulsar_broker: EmbeddedBroker) -> None:
    """A non-persistent request delivered while the host drains is not left unanswered: it is
    answered 'unavailable', saying it did not start, each of the times its caller sends it."""
    async with LocalHost(pulsar_broker.url, [ping]) as host:
        assert await host.call("ping") == "pong"
        [endpoint] = host.server.endpoints
        await endpoint.stop_receiving()
        with pytest.raises(ToolCallError) as info:
            await host.call("ping")
        assert endpoint.counters["received"] == 2 + wire.RESENDS  # the first call, then the refused one's sendings
    assert info.value.error_type == "unavailable" and "shutting down" in info.value.message


async def test_responses_reach_each_of_many_concurrent_callers_by_id(pulsar_broker: EmbeddedBroker) -> None:
    @tghost.tool
    async def echo(text: str) -> str:
        """Echo."""
        await asyncio.sleep(0.001 * (hash(text) % 5))
        return text

    async with LocalHost(pulsar_broker.url, [echo]) as host:
        answers = await asyncio.gather(*(host.call("echo", {"text": str(i)}) for i in range(60)))
    assert answers == [str(i) for i in range(60)]  # within max-concurrency + max-queue
