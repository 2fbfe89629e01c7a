"""parity: every request rule holds alike under every driver and isolation mode
(tghost/serving/driver.py), on the embedded broker.

One fixture, :func:`mode`, serves the same plugin, :data:`PARITY`, each way a host can serve a
service: a plain ``def`` on the inline driver, its calls on the receive thread whenever nothing
of the service is in flight (``inline``: every call eligible at once, as if its latest calls were
short) or measured slow and run on the lane's worker threads (``inline-measured``), the same under
an access policy (the thread lane), an ``async def`` on the event loop, a plain ``def`` in worker processes,
and a plain ``def`` on a persistent topic (the loop driver, receiving one request per free
slot). Each test causes one case (timeout, overloaded, cancel, drain, stream
pacing, progress, authorize, access refusals, persistent acknowledgement) and counts the replies
on the wire, so a rule changed for one driver is checked for all. Where a persistent topic's
rule differs (the broker keeps what the host has not taken), the test says so.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PluginDir, until
from tests.serving.conftest import every_call_inline
from tghost import Progress
from tghost.agent.client import ToolCallError
from tghost.broker import EmbeddedBroker
from tghost.discovery.catalog import Catalog
from tghost.discovery.discover import discover
from tghost.protocol import wire
from tghost.protocol.access import AccessPolicy
from tghost.serving.driver import Driver
from tghost.serving.executors.base import PROCESS, THREAD
from tghost.serving.inline import InlineDriver
from tghost.serving.lane import ThreadLane
from tghost.serving.loop import LoopDriver
from tghost.serving.request import RETURNED, CallRecord
from tghost.serving.settings import ServeSettings
from tghost.testing import LocalHost, RawWire

#: The plugin every mode serves: ``{def}`` is ``def`` or ``async def``, ``{nap}`` how it sleeps,
#: ``{options}`` the decorator's extra options, ``{tag}`` makes its service ids this test's own
#: (a persistent topic keeps what one test left for the next).
PARITY = '''
import asyncio
import threading
import pathlib
import time
import uuid

import tghost


def released(mark):
    return pathlib.Path(mark, "release").exists()


@tghost.tool(service="dawdle-{tag}", timeout=0.5{options})
{def} dawdle(mark: str = "") -> str:
    """Answer at once; given a ``mark``, once released."""
    while mark and not released(mark):
        {nap}(0.01)
    return "late"


@tghost.tool(service="narrow-{tag}", max_concurrency=2{options})
{def} narrow(mark: str) -> str:
    """Hold one of two slots until released."""
    pathlib.Path(mark, uuid.uuid4().hex).touch()
    while not released(mark):
        {nap}(0.01)
    return "ok"


@tghost.tool(service="held-{tag}", max_concurrency=1, timeout=60{options})
{def} held(mark: str, ctx: tghost.Context) -> str:
    """Run until released, or until told of a cancel."""
    pathlib.Path(mark, "started").touch()
    try:
        while not released(mark):
            if ctx.cancelled.is_set():
                pathlib.Path(mark, "cancelled").touch()
                return "stopped"
            {nap}(0.01)
    except asyncio.CancelledError:
        pathlib.Path(mark, "cancelled").touch()
        raise
    return "done"


@tghost.tool(service="picky-{tag}"{options})
{def} picky(n: int) -> int:
    """Double ``n``; refuse a negative one; fail on 13."""
    if n < 0:
        raise tghost.ToolError("negative", "out-of-range")
    if n == 13:
        raise RuntimeError("unlucky")
    return n * 2


@tghost.tool(service="ticker-{tag}", timeout=0.5{options})
{def} ticker(count: int):
    """Stream ``count`` ticks, one each 0.1 s."""
    for i in range(count):
        {nap}(0.1)
        yield f"tick-{{i}}"


@tghost.tool(service="report-{tag}"{options})
{def} report(steps: int, ctx: tghost.Context) -> str:
    """Say how far it has got, each 0.3 s (three times the progress interval: a loaded machine's
    stall between two updates never brings them within it)."""
    for step in range(1, steps + 1):
        {nap}(0.3)
        ctx.progress(step, steps, f"page {{step}}")
    return f"fetched {{steps}} pages"


@tghost.tool(service="hurry-{tag}"{options})
{def} hurry(ctx: tghost.Context) -> str:
    """Report twice at once, then answer."""
    ctx.progress(1, message="started")
    ctx.progress(2, message="almost")
    return "done"


@tghost.tool(service="chatter-{tag}"{options})
{def} chatter(times: int, ctx: tghost.Context) -> str:
    """Report progress in a tight loop."""
    for n in range(1, times + 1):
        ctx.progress(n, times)
    return "said it all"


@tghost.tool(service="count-{tag}"{options})
{def} count(mark: str) -> str:
    """Leave one file per invocation."""
    pathlib.Path(mark, uuid.uuid4().hex).touch()
    return "counted"


@tghost.tool(service="bail-{tag}"{options})
{def} bail(code: int) -> str:
    """Exit, as a command-line library called by a tool does."""
    raise SystemExit(code)


@tghost.hookimpl
def tghost_register_services(register):
    for service in (dawdle, narrow, held, picky, ticker, report, hurry, chatter, count, bail):
        register(service)
'''


@dataclass
class Mode:
    """One way to serve :data:`PARITY`: how its tools are written, the isolation, the topic, and
    the driver that must serve them."""

    name: str
    plain: bool
    isolation: str
    persistent: bool
    gated: bool
    driver: type[Any]
    plugin_dir: PluginDir = field(repr=False)
    url: str = ""
    tmp: Path = Path()

    def catalog(self) -> Catalog:
        source = PARITY.format(**{"def": "def" if self.plain else "async def",
                                  "nap": "time.sleep" if self.plain else "await asyncio.sleep",
                                  "options": ", persistent=True" if self.persistent else "",
                                  "tag": uuid.uuid4().hex[:8]})
        self.plugin_dir.add(f"parity-{uuid.uuid4().hex[:6]}", source)
        catalog = discover(self.plugin_dir.entry_points()[-1:], strict=True)
        if self.gated:  # every caller may call every tool: the checks go through the gate all the same
            catalog.access = AccessPolicy.from_table({"anonymous": sorted(catalog.tools)}, self.tmp)
        return catalog

    @asynccontextmanager
    async def host(self, catalog: Catalog | None = None, records: list[CallRecord] | None = None,
                   **settings: Any) -> AsyncIterator[LocalHost]:
        """A host serving :data:`PARITY` this way; asserts every service has this mode's driver (a
        plain ``def`` under an access policy: the thread lane)."""
        serve = ServeSettings(isolation=self.isolation, **settings)
        catalog = catalog or self.catalog()
        driver = ThreadLane if catalog.access is not None and self.driver is InlineDriver else self.driver
        async with LocalHost(self.url, catalog, serve,
                             listeners=[records.append] if records is not None else ()) as host:
            assert {type(endpoint._driver) for endpoint in host.server.endpoints} == {driver}
            yield host

    def mark(self, name: str) -> Path:
        folder = self.tmp / f"{name}-{uuid.uuid4().hex[:6]}"
        folder.mkdir()
        return folder


MODES = {  # plain def, isolation, persistent topic, access policy, driver
    "inline": (True, THREAD, False, False, InlineDriver),
    "inline-measured": (True, THREAD, False, False, InlineDriver),
    "lane": (True, THREAD, False, True, ThreadLane),
    "loop": (False, THREAD, False, False, LoopDriver),
    "process": (True, PROCESS, False, False, LoopDriver),
    "persistent": (True, THREAD, True, False, LoopDriver),
}


@pytest.fixture(params=list(MODES))
def mode(request: pytest.FixtureRequest, plugin_dir: PluginDir, pulsar_broker: EmbeddedBroker,
         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Mode:
    plain, isolation, persistent, gated, driver = MODES[request.param]
    if request.param == "inline":  # every call may run on the receive thread from the first
        every_call_inline(monkeypatch)
    return Mode(request.param, plain, isolation, persistent, gated, driver, plugin_dir, pulsar_broker.url, tmp_path)


async def answered_at_once(calls: list[asyncio.Task[Any]], expected: int) -> set[asyncio.Task[Any]]:
    """The calls answered at once: wait until ``expected`` of them are (within 5 s), or for
    ``expected`` 0 a second in which none may be; the rest wait for a slot."""
    if expected:
        await until(lambda: sum(call.done() for call in calls) >= expected, f"{expected} calls answered", 5)
        return {call for call in calls if call.done()}
    done, _ = await asyncio.wait(calls, timeout=1)
    return done


def endpoint_of(host: LocalHost, tool: str) -> Any:
    service_id = host.catalog.tools[tool].service
    return next(endpoint for endpoint in host.server.endpoints if endpoint.descriptor.id == service_id)


def test_every_driver_is_a_driver() -> None:
    drivers: list[type[Driver]] = [ThreadLane, LoopDriver, InlineDriver]  # mypy holds each to the protocol
    assert all(callable(getattr(driver, "take", None)) for driver in drivers)


async def test_a_timed_out_call_gets_exactly_one_reply_at_its_deadline(mode: Mode) -> None:
    async with mode.host() as host, RawWire(mode.url, endpoint_of(host, "dawdle").descriptor) as raw:
        assert await host.call("dawdle") == "late"  # a worker process is up
        mark = mode.mark("slow")
        await raw.send(wire.encode_request("u", {}, {"mark": str(mark)}), {"id": "slow"})
        replies = await raw.raw_replies("slow", timeout=10)  # at the deadline: the plugin still holds the call
        (mark / "release").touch()
        settled = await raw.raw_replies("slow", settle=2.0)  # past when the plugin returns: nothing more
        assert await host.call("dawdle") == "late"  # the service still answers
    assert [reply.json()["error"]["type"] for reply in settled] == ["timeout"] and len(replies) == 1
    assert "did not finish within 0.5s" in settled[0].json()["error"]["message"]


async def test_a_stream_that_times_out_stops_its_chunks_at_the_timeout_reply(mode: Mode) -> None:
    async with mode.host() as host, RawWire(mode.url, endpoint_of(host, "ticker").descriptor) as raw:
        assert [chunk async for chunk in host.stream("ticker", {"count": 0})] == []  # a worker process is up
        await raw.send(wire.encode_request("u", {}, {"count": 30}), {"id": "t"})
        replies = await raw.raw_replies("t", timeout=10, settle=1.0)
    bodies = [reply.json() for reply in replies]
    assert 1 <= len(bodies) - 1 <= 6, bodies  # some chunks, then the timeout
    assert [b["response"] for b in bodies[:-1]] == [f"tick-{i}" for i in range(len(bodies) - 1)]
    assert bodies[-1]["error"]["type"] == "timeout"  # and nothing after it


async def test_requests_beyond_the_bound_and_queue_are_answered_overloaded_at_once(mode: Mode) -> None:
    mark = mode.mark("narrow")
    async with mode.host(max_queue=3) as host:
        calls = [asyncio.create_task(host.call("narrow", {"mark": str(mark)}, timeout=60)) for _ in range(9)]
        await until(lambda: len(list(mark.iterdir())) == 2, "two calls run")
        done = await answered_at_once(calls, 0 if mode.persistent else 4)
        in_flight = endpoint_of(host, "narrow").in_flight
        ran = len(list(mark.iterdir()))
        (mark / "release").touch()
        results = await asyncio.gather(*calls, return_exceptions=True)
    overloaded = [r for r in results if isinstance(r, ToolCallError) and r.error_type == "overloaded"]
    assert ran == 2  # two ran at once, the rest waited
    if mode.persistent:  # the broker keeps what no slot is free for: nothing is refused
        assert (len(done), len(overloaded), in_flight, results.count("ok")) == (0, 0, 2, 9)
        return
    assert len(done) == 4 and len(overloaded) == 4 and in_flight == 5
    assert "2 calls running and 3 waiting" in overloaded[0].message
    assert results.count("ok") == 5  # all answered


async def test_every_call_reaches_the_listeners_once_with_its_status_user_and_arguments(mode: Mode) -> None:
    records: list[CallRecord] = []
    async with mode.host(records=records) as host, RawWire(mode.url, endpoint_of(host, "picky").descriptor) as raw:
        answers = [await raw.request({"n": n}, user="alice") for n in (2, -1, 13)]
        await raw.request({"n": "two"})
        await until(lambda: len(records) >= 4, "every record is told")  # right after its reply is sent
    assert [replies[-1][1]["response"] for replies in answers] == ["4", "", ""]
    # each told right after its reply, on the thread that sent it: the next call's may come first
    told = {r.status: r for r in records}
    assert sorted((r.status, r.user) for r in records) == [
        ("invalid-arguments", "test"), ("ok", "alice"), ("out-of-range", "alice"), ("tool-service-error", "alice")]
    assert told["ok"].arguments == {"n": 2} and all(r.duration > 0 for r in records)


async def test_a_cancelled_call_is_answered_cancelled_and_frees_its_slot_at_once(mode: Mode) -> None:
    records: list[CallRecord] = []
    first, second = mode.mark("first"), mode.mark("second")
    async with mode.host(records=records) as host:
        call = asyncio.create_task(host.call("held", {"mark": str(first)}, timeout=90))
        await until(lambda: (first / "started").exists(), "the call started")
        call.cancel()  # the caller gives up: its client sends a cancel
        with pytest.raises(asyncio.CancelledError):
            await call
        if mode.isolation == THREAD:  # the tool is told (a worker process is killed instead)
            await until(lambda: (first / "cancelled").exists(), "the tool was told")
        (second / "release").touch()
        answer = await host.call("held", {"mark": str(second)}, timeout=30)  # the one slot is free
    assert answer == "done"
    assert sorted(r.status for r in records) == [wire.CANCELLED, wire.OK]  # the freed slot may answer first


async def test_requests_waiting_for_a_slot_are_answered_unavailable_when_the_host_stops(mode: Mode) -> None:
    running_mark, waiting_mark = mode.mark("running"), mode.mark("waiting")
    async with mode.host(max_concurrency=1) as host:
        endpoint = endpoint_of(host, "held")
        running = asyncio.create_task(host.call("held", {"mark": str(running_mark)}, timeout=60))
        await until(lambda: (running_mark / "started").exists(), "the call is running")
        caller = await host.caller(endpoint.descriptor.id)
        waiting = [asyncio.create_task(caller.call({}, {"mark": str(waiting_mark)}, timeout=60)) for _ in range(3)]
        if not mode.persistent:
            await until(lambda: endpoint.in_flight == 4, "three calls wait for the slot")
        stopping = asyncio.create_task(host.server.stop(grace=60))
        if not mode.persistent:  # the broker keeps a persistent topic's for another host
            outcomes = await asyncio.gather(*waiting, return_exceptions=True)
            assert [getattr(o, "error_type", o) for o in outcomes] == ["unavailable"] * 3  # the held call runs on
        assert not running.done()
        (running_mark / "release").touch()
        assert await running == "done"
        assert await stopping == 0
        for call in waiting:
            call.cancel()


@pytest.mark.parametrize("ended", ["grace", "end_grace"])
async def test_a_call_still_running_when_the_grace_ends_is_cut_off(mode: Mode, ended: str) -> None:
    records: list[CallRecord] = []
    mark = mode.mark("endless")
    async with mode.host(records=records) as host:
        call = asyncio.create_task(host.call("held", {"mark": str(mark)}, timeout=30))
        await until(lambda: (mark / "started").exists(), "the call is running")
        stopping = asyncio.create_task(host.server.stop(grace=0.2 if ended == "grace" else 60))
        if ended == "end_grace":  # a second Ctrl-C
            await until(lambda: endpoint_of(host, "held").stopping, "the host is stopping")
            host.server.end_grace()
        assert await stopping == 1
        stuck = endpoint_of(host, "held").executor.stats().stuck
        if mode.persistent:  # back to the broker, unanswered, for another host
            call.cancel()
        else:
            with pytest.raises(ToolCallError) as info:
                await call
        (mark / "release").touch()  # a plain def's thread runs on until the plugin returns
    assert stuck == (1 if mode.plain and mode.isolation == THREAD else 0)  # a worker process is killed
    if mode.persistent:
        assert [r.status for r in records] == [RETURNED]
        return
    assert info.value.error_type == "unavailable" and "before the call finished" in info.value.message


async def test_progress_reaches_its_caller_paced_and_the_held_back_update_goes_out_before_the_answer(
    mode: Mode,
) -> None:
    updates: list[Progress] = []
    held: list[Progress] = []
    flood: list[Progress] = []
    async with mode.host() as host:
        assert await host.call("report", {"steps": 3}, progress=updates.append) == "fetched 3 pages"
        assert await host.call("hurry", {}, progress=held.append) == "done"
        assert await host.call("chatter", {"times": 20_000}, progress=flood.append) == "said it all"
    assert updates == [Progress(1, 3, "page 1"), Progress(2, 3, "page 2"), Progress(3, 3, "page 3")]
    assert held == [Progress(1, None, "started"), Progress(2, None, "almost")]  # the caller sees where it ended
    assert 2 <= len(flood) < 100  # 20,000 reported; at most 10 a second sent, plus the last
    assert flood[0] == Progress(1, 20_000) and flood[-1] == Progress(20_000, 20_000)


async def test_authorize_runs_before_the_call_and_a_deny_never_invokes(mode: Mode) -> None:
    mark = mode.mark("count")
    catalog = mode.catalog()
    catalog.authorize = lambda user, *_: None if user == "alice" else f"{user} may not"
    async with mode.host(catalog) as host, RawWire(mode.url, endpoint_of(host, "count").descriptor) as raw:
        [(_, denied)] = await raw.request({"mark": str(mark)}, user="bob")
        [(_, allowed)] = await raw.request({"mark": str(mark)}, user="alice")
    assert (denied["error"]["type"], denied["error"]["message"]) == ("not-allowed", "bob may not")
    assert allowed["response"] == "counted" and len(list(mark.iterdir())) == 1


async def test_an_access_policy_refuses_a_caller_it_does_not_admit_before_the_call(mode: Mode) -> None:
    mark = mode.mark("count")
    catalog = mode.catalog()
    catalog.access = AccessPolicy.from_table({"anonymous": ["picky"]}, mode.tmp)
    async with mode.host(catalog) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("count", {"mark": str(mark)})
        assert await host.call("picky", {"n": 1}) == "2"
    assert info.value.error_type == wire.UNAUTHORIZED and not list(mark.iterdir())


async def test_an_answered_request_is_acknowledged_and_never_delivered_again(mode: Mode) -> None:
    mark = mode.mark("count")
    catalog = mode.catalog()
    records: list[CallRecord] = []
    async with mode.host(catalog) as host:
        assert await host.call("count", {"mark": str(mark)}) == "counted"
    async with mode.host(catalog, records=records):  # a persistent topic redelivers what was not acknowledged
        await asyncio.sleep(1.0)
    assert len(list(mark.iterdir())) == 1 and records == []


async def test_a_tool_that_exits_is_answered_an_error_and_the_service_serves_on(mode: Mode) -> None:
    async with mode.host() as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("bail", {"code": 3}, timeout=10)
        assert await host.call("picky", {"n": 2}) == "4"
        with pytest.raises(ToolCallError):
            await host.call("bail", {"code": 3}, timeout=10)  # and again, on the same service
    said = "died during the call (exit code 3)" if mode.isolation == PROCESS else "SystemExit: 3"  # a new worker
    assert info.value.error_type == wire.TOOL_SERVICE_ERROR and said in info.value.message


async def test_a_stopped_host_leaves_no_thread_behind(mode: Mode) -> None:
    before = set(threading.enumerate())
    async with mode.host() as host:
        for n in range(12):  # the inline driver's measured calls, then inline ones
            assert await host.call("picky", {"n": n}) == str(n * 2)
        assert [chunk async for chunk in host.stream("ticker", {"count": 1})] == ["tick-0"]  # well within 0.5 s
        during = {thread.name for thread in set(threading.enumerate()) - before}

    def left() -> list[str]:  # the loop's own executor (asyncio.to_thread) is the test's, not the host's
        return [t.name for t in set(threading.enumerate()) - before if not t.name.startswith("asyncio_")]

    await until(lambda: not left(), f"the host's threads end (left: {left()}, during: {sorted(during)})", timeout=10)
