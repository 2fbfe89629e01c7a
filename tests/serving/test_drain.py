"""drain: draining after SIGTERM, SIGINT, a watched uninstall or ``Server.remove``, on the embedded broker:
calls sent at a steady rate while a host drains are all answered: with another host, ``ok`` (a
call the draining host answered ``unavailable`` did not start, and its caller sent it again,
docs/protocol.md §2.6); alone, ``unavailable``. None is left without a reply. Counts, not timing.

Every drain test runs twice (the ``style`` fixture): with an ``async def`` tool, served on the
event loop, and with a plain ``def`` one, served by the thread lane (tghost/serving/lane.py). (The
grace's end and the calls waiting for a slot, in every driver: tests/serving/test_parity.py.)"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import signal
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

import tghost
from tests.conftest import READY, HostProcess, PluginDir, until
from tghost.agent.client import ToolCallError, ToolServiceClient
from tghost.agent.directory import ToolDirectory
from tghost.broker import EmbeddedBroker
from tghost.protocol.wire import RESENDS
from tghost.pulsar.clients import PulsarSettings
from tghost.serving.handoff import PeerLookout
from tghost.testing import LocalHost, RawWire

#: Calls per second sent while a host drains.
RATE = 100
#: Seconds a short call waits for its reply before it counts as never answered.
CALL_TIMEOUT = 10.0
NEVER_ANSWERED = "never answered"

GATED = """
import asyncio
import os
import pathlib
import time

import tghost

GATE = pathlib.Path(os.environ["TGHOST_TEST_GATE"])


@tghost.tool(timeout=120)
async def gated(hold: bool = False) -> str:
    '''Answer at once, or (hold) note which host took the call and wait for the test to release it.'''
    if hold:
        (GATE / f"started-{os.getpid()}-{os.urandom(4).hex()}").touch()
        while not (GATE / "release").exists():
            await asyncio.sleep(0.05)
    return "done"


@tghost.hookimpl
def tghost_register_services(register):
    register(gated)


@tghost.hookimpl
def tghost_shutdown():
    time.sleep(float(os.environ.get("TGHOST_TEST_SHUTDOWN_SECONDS", "0")))
"""


#: The tool of :data:`GATED` as a plain ``def`` (the thread lane).
PLAIN_GATED = GATED.replace("async def gated", "def gated").replace("await asyncio.sleep", "time.sleep")


@pytest.fixture(params=["async def", "def"])
def style(request: pytest.FixtureRequest) -> str:
    """How the drained tool is written: ``async def`` (the event loop) or ``def`` (the thread lane)."""
    return str(request.param)


async def outcome(caller: ToolServiceClient, arguments: dict[str, object] | None = None,
                  timeout: float = CALL_TIMEOUT) -> str:
    """``ok``, the error type of the reply, or :data:`NEVER_ANSWERED` (the caller's own timeout)."""
    try:
        await caller.call({}, arguments or {}, timeout=timeout)
    except ToolCallError as exc:
        return NEVER_ANSWERED if "gave no complete answer" in exc.message else exc.error_type
    return "ok"


class SteadyLoad:
    """Short calls at :data:`RATE` per second until :meth:`stop`; :meth:`stop` returns how each
    ended (:meth:`in_order`: in the order they were sent)."""

    def __init__(self, caller: ToolServiceClient) -> None:
        self._caller = caller
        self._calls: list[asyncio.Task[str]] = []
        self._stopped = asyncio.Event()
        self._sender = asyncio.create_task(self._send())

    async def _send(self) -> None:
        while not self._stopped.is_set():
            self._calls.append(asyncio.create_task(outcome(self._caller)))
            await asyncio.sleep(1 / RATE)

    @property
    def sent(self) -> int:
        return len(self._calls)

    async def stop(self) -> collections.Counter[str]:
        return collections.Counter(await self.in_order())

    async def in_order(self) -> list[str]:
        self._stopped.set()
        await self._sender
        return list(await asyncio.gather(*self._calls))


def test_peer_lookout_tells_another_consumer_by_the_order_of_requests_and_never_for_a_lone_one() -> None:
    lone: list[bool] = []
    shared: list[bool] = []
    alone = PeerLookout(lambda: lone.append(True))
    for i in range(50):  # the draining consumer gets every request, before or after the lookout sees it
        first, second = (alone._seen, alone.mine) if i % 2 else (alone.mine, alone._seen)
        first(f"r{i}")
        second(f"r{i}")
    assert not lone and not alone.peer_found
    two = PeerLookout(lambda: shared.append(True))
    two._seen("r0")  # dealt to another consumer: the draining one never gets it
    two._seen("r1")
    two.mine("r1")
    assert shared == [True] and two.peer_found
    two.mine("r3")
    assert shared == [True]  # told once


# ---- in process: Server.remove (a watched uninstall calls it) and Server.end_grace ----


def held_service(style: str) -> tuple[tghost.ToolService, Callable[[], None]]:
    """The ``drained`` tool in ``style``, and what releases its held calls."""
    if style == "def":
        released = threading.Event()

        @tghost.tool(timeout=60, service="drained")
        def plain(hold: bool = False) -> str:
            """Answer at once, or wait for the test's release."""
            if hold:
                released.wait(60)
            return "done"

        return plain, released.set
    release = asyncio.Event()

    @tghost.tool(timeout=60)
    async def drained(hold: bool = False) -> str:
        """Answer at once, or wait for the test's release."""
        if hold:
            await release.wait()
        return "done"

    return drained, release.set


async def hold_a_call(host: LocalHost, via: LocalHost, held: list[asyncio.Task[str]]) -> None:
    """Send held calls (through ``via``) until ``host`` runs one."""
    endpoint = host.server.endpoints[0]
    while endpoint.in_flight == 0:
        held.append(asyncio.create_task(via.call("drained", {"hold": True}, timeout=60)))
        await until(lambda: sum(w.in_flight for h in (host, via) for w in h.server.endpoints) >= len(held),
                    "a held call is running")


async def test_server_remove_hands_new_requests_to_the_other_host_and_leaves_none_unanswered(
    pulsar_broker: EmbeddedBroker, style: str
) -> None:
    service, release = held_service(style)
    async with LocalHost(pulsar_broker.url, [service]) as leaving, LocalHost(pulsar_broker.url, [service]) as staying:
        held: list[asyncio.Task[str]] = []
        await hold_a_call(leaving, staying, held)
        load = SteadyLoad(await staying.caller("drained"))
        await until(lambda: load.sent >= 30, "calls before the removal")
        removal = asyncio.create_task(leaving.server.remove(["drained"], grace=30))
        sent_before = load.sent
        await until(lambda: load.sent >= sent_before + 100, "calls during the drain")
        release()  # the held call finishes within its grace
        assert await removal == 0
        sent_at_end = load.sent
        await until(lambda: load.sent >= sent_at_end + 30, "calls after the drain")
        counts = await load.stop()
        assert [await task for task in held] == ["done"] * len(held)
    assert set(counts) == {"ok"}, counts  # what reached the leaving host did not start: sent again, to the other


async def test_a_stopping_host_says_a_call_did_not_start_and_a_caller_sends_it_again_a_bounded_number_of_times(
    pulsar_broker: EmbeddedBroker, style: str
) -> None:
    service, release = held_service(style)
    async with LocalHost(pulsar_broker.url, [service]) as host:
        held: list[asyncio.Task[str]] = []
        await hold_a_call(host, host, held)
        [endpoint] = host.server.endpoints
        removal = asyncio.create_task(host.server.remove(["drained"], grace=30))  # alone: it stays subscribed
        await until(lambda: endpoint.stopping, "the service stops")
        async with RawWire(pulsar_broker.url, endpoint.descriptor) as raw:  # a seed 000 caller, by hand
            [(_, reply)] = await raw.request({})
        assert reply["error"]["type"] == "unavailable" and reply["end_of_stream"] is True  # what seed 000 reads
        assert reply["error"]["started"] is False  # one more key, which a seed 000 caller ignores
        received = endpoint.counters["received"]
        with pytest.raises(ToolCallError) as refused:
            await host.call("drained", {})
        assert refused.value.error_type == "unavailable"
        assert endpoint.counters["received"] - received == RESENDS + 1  # sent again RESENDS times, then told
        release()
        assert await removal == 0
        assert [await task for task in held] == ["done"] * len(held)


async def test_the_only_host_closing_says_nothing_of_a_start_so_no_caller_sends_to_a_subscription_nobody_reads(
    pulsar_broker: EmbeddedBroker, style: str
) -> None:
    service, _ = held_service(style)
    async with LocalHost(pulsar_broker.url, [service]) as host:
        [endpoint] = host.server.endpoints
        await endpoint.stop_receiving()  # alone: it stays subscribed until it closes
        async with RawWire(pulsar_broker.url, endpoint.descriptor) as raw:
            [(_, stopping)] = await raw.request({})
            closing = asyncio.create_task(endpoint.close())  # waits out a caller's longest pause first
            [(_, last)] = await raw.request({})
            await closing
    assert stopping["error"]["started"] is False  # its caller sends it again, and reaches this host
    assert last["error"]["type"] == "unavailable" and "started" not in last["error"]  # told once, at the end


@pytest.fixture
def gated_env(plugin_dir: PluginDir, pulsar_broker: EmbeddedBroker, tmp_path: Path, style: str) -> dict[str, str]:
    gate = tmp_path / "gate"
    gate.mkdir()
    plugin_dir.add("gated", PLAIN_GATED if style == "def" else GATED)
    return plugin_dir.env(TGHOST_PULSAR_URL=pulsar_broker.url, TGHOST_TEST_GATE=str(gate),
                          XDG_CONFIG_HOME=str(tmp_path / "config"), TGHOST_LOAD_PLUGINS="gated",
                          TGHOST_DESCRIPTORS_TOPIC=f"persistent://tg/config/drain-{uuid.uuid4().hex[:8]}")


@pytest.fixture
async def caller(pulsar_broker: EmbeddedBroker) -> AsyncIterator[ToolServiceClient]:
    client = await PulsarSettings(pulsar_broker.url).connect()
    try:
        async with ToolServiceClient(client, "non-persistent://tg/request/gated",
                                     "non-persistent://tg/response/gated") as started:
            yield started
    finally:
        await client.close()


def gate_of(env: dict[str, str]) -> Path:
    return Path(env["TGHOST_TEST_GATE"])


async def serving(hosts: list[HostProcess], caller: ToolServiceClient) -> None:
    """Wait until every host is up and has subscribed (answers calls)."""
    for host in hosts:
        host.wait_for(READY)
    assert await outcome(caller, timeout=30) == "ok"


async def hold_on(victim: HostProcess, caller: ToolServiceClient, gate: Path) -> list[asyncio.Task[str]]:
    """Send held calls until ``victim`` runs one; returns them all (the others run elsewhere)."""
    held: list[asyncio.Task[str]] = []
    while not list(gate.glob(f"started-{victim.process.pid}-*")):
        held.append(asyncio.create_task(outcome(caller, {"hold": True}, timeout=120)))
        await until(lambda: len(list(gate.glob("started-*"))) >= len(held), "a held call is running")
    return held


async def sigterm_while_holding_a_call(host: HostProcess, caller: ToolServiceClient,
                                       gate: Path) -> list[asyncio.Task[str]]:
    """Start ``host`` serving, hold a call on it, SIGTERM it and wait until it drains."""
    await serving([host], caller)
    held = await hold_on(host, caller, gate)
    host.process.send_signal(signal.SIGTERM)
    await asyncio.to_thread(host.wait_for, "stopping: no new requests")
    return held


@contextlib.asynccontextmanager
async def probing_caller(url: str, env: dict[str, str]) -> AsyncIterator[ToolServiceClient]:
    """The client a :class:`tghost.ToolDirectory` on the hosts' announcement topic calls ``gated``
    with: it probes a silent call and sends again a request dropped as a draining host left the
    subscription (docs/protocol.md §2.15), which a bare ``ToolServiceClient`` does not."""
    async with ToolDirectory(PulsarSettings(url), env["TGHOST_DESCRIPTORS_TOPIC"]) as directory:
        await directory.wait_for("gated", 30)
        yield await directory.calls.caller(directory.tools["gated"].service.descriptor)


async def test_sigterm_under_load_with_two_hosts_leaves_no_call_unanswered(
    gated_env: dict[str, str], host_process: Callable[..., HostProcess], pulsar_broker: EmbeddedBroker,
) -> None:
    # The callers an agent uses: a request the broker deals the victim at the very moment it
    # leaves the Shared subscription is dropped (non-persistent), and sent again after a probe.
    victim, survivor = (host_process("--grace", "30", env=gated_env) for _ in range(2))
    async with probing_caller(pulsar_broker.url, gated_env) as caller:
        await serving([victim, survivor], caller)
        held = await hold_on(victim, caller, gate_of(gated_env))
        load = SteadyLoad(caller)
        await until(lambda: load.sent >= 50, "calls before the signal")
        victim.process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(victim.wait_for, "stopping: no new requests")
        sent = load.sent
        await until(lambda: load.sent >= sent + 150, "calls during the drain")
        (gate_of(gated_env) / "release").touch()  # the held call finishes within the grace
        assert await asyncio.to_thread(victim.finish) == 0
        sent = load.sent
        await until(lambda: load.sent >= sent + 30, "calls after the victim exited")
        counts = await load.stop()
        assert [await task for task in held] == ["ok"] * len(held)
    survivor.process.send_signal(signal.SIGINT)
    assert survivor.finish() == 0
    assert set(counts) == {"ok"}, (counts, victim.log)  # none 'unavailable', none unanswered: sent again
    assert "another host serves it; stopped receiving its requests here" in victim.log


async def test_a_single_draining_host_answers_every_call_sent_during_the_drain(
    gated_env: dict[str, str], host_process: Callable[..., HostProcess], caller: ToolServiceClient
) -> None:
    host = host_process("--grace", "30", env=gated_env)
    held = await sigterm_while_holding_a_call(host, caller, gate_of(gated_env))
    load = SteadyLoad(caller)
    await until(lambda: load.sent >= 100, "calls during the drain")
    counts = await load.stop()
    (gate_of(gated_env) / "release").touch()
    assert await asyncio.gather(*held) == ["ok"]
    assert host.finish() == 0
    assert set(counts) == {"unavailable"} and counts["unavailable"] >= 100, counts


async def test_a_lone_host_with_nothing_in_flight_answers_every_request_that_reaches_it_until_it_exits(
    gated_env: dict[str, str], host_process: Callable[..., HostProcess], caller: ToolServiceClient
) -> None:
    # its plugin's shutdown hook takes a second: the host stays subscribed meanwhile
    host = host_process(env={**gated_env, "TGHOST_TEST_SHUTDOWN_SECONDS": "1"})
    await serving([host], caller)
    load = SteadyLoad(caller)
    await until(lambda: load.sent >= 20, "calls before the signal")
    host.process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(host.finish) == 0
    sent = load.sent
    await until(lambda: load.sent >= sent + 20, "calls after the host exited")
    outcomes = await load.in_order()
    # every call was answered until the host closed its consumer as its last step; none after
    answered = outcomes[:len(outcomes) - outcomes[::-1].index("unavailable")]
    assert set(answered) == {"ok", "unavailable"}, collections.Counter(outcomes)
    assert set(outcomes[len(answered):]) == {NEVER_ANSWERED}
    assert answered == sorted(answered)  # "ok" before the signal, "unavailable" after it, nothing lost between
    [stopped] = [line for line in host.log.splitlines() if "while stopping" in line]
    told = re.search(r"stopped after \d+ request\(s\): (\d+) answered 'unavailable' while stopping, 0 cancelled at "
                     "the end of the grace", stopped)
    assert told, stopped
    # a call answered 'unavailable' was sent up to RESENDS more times (the host said it did not start),
    # until the host closed: its last answers, while the only host, say nothing of a start (no resend)
    assert answered.count("unavailable") < int(told.group(1)) <= (RESENDS + 1) * answered.count("unavailable")
    assert int(told.group(1)) >= RATE // 2  # it answered through the slow shutdown hook


async def test_a_second_sigterm_ends_the_grace_and_the_running_call_is_answered_unavailable(
    gated_env: dict[str, str], host_process: Callable[..., HostProcess], caller: ToolServiceClient
) -> None:
    host = host_process("--grace", "120", env=gated_env)
    held = await sigterm_while_holding_a_call(host, caller, gate_of(gated_env))
    host.process.send_signal(signal.SIGTERM)
    assert await asyncio.gather(*held) == ["unavailable"]
    assert await asyncio.to_thread(host.finish) == 0
    assert "second signal: ending the grace period now" in host.log
    assert "1 call(s) cancelled at the end of the grace period" in host.log
