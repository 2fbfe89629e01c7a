"""lane: the thread lane (tghost/serving/lane.py): a plain ``def`` tool on a non-persistent topic is served on
its worker threads with no event-loop hop. What is the lane's own is here: which services it serves,
a plain ``invoke`` that returns an awaitable, and ``authorize`` on its worker thread.

(Every request rule, for the lane and every other driver: tests/serving/test_parity.py; the
SIGTERM drains run for both in tests/serving/test_drain.py; stuck threads in
tests/serving/test_executors.py.)"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import tghost
from tghost.broker import EmbeddedBroker
from tghost.discovery.discover import catalog_of
from tghost.serving.lane import ThreadLane
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
