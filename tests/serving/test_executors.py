"""executors: a call runs the same in worker threads and in worker processes (streaming chunk by
chunk, async invoke, ToolError types, argument checks, tghost_authorize, call records); in
process mode a plugin that crashes, hangs or leaks costs one worker, never the host; in thread
mode stuck threads are counted and reported. Faults are caused for real, on the embedded broker.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import tghost
from tests.conftest import HostProcess, PluginDir, until
from tghost.agent.client import ToolCallError, ToolServiceClient
from tghost.broker import EmbeddedBroker
from tghost.discovery.catalog import Catalog
from tghost.discovery.discover import discover
from tghost.operate.host import Host, HostConfig
from tghost.protocol.descriptors import request_queue, response_queue
from tghost.pulsar.clients import PulsarSettings
from tghost.serving.executors.base import PROCESS, THREAD, WorkerLimits
from tghost.serving.request import CallRecord
from tghost.serving.settings import ServeSettings
from tghost.system.net import free_port
from tghost.testing import LocalHost

#: One plugin, one service that misbehaves on request, and services that stream and run async.
MISBEHAVE = '''
import asyncio, ctypes, os, time
from pathlib import Path

import tghost

LEAK = []


class QuotaError(tghost.ToolError):
    def __init__(self, message):
        super().__init__(message, "quota-exceeded")


@tghost.tool(service="misbehave", timeout=2.0, max_concurrency=2)
def misbehave(behaviour: str = "normal") -> str:
    """Answers with its pid, or misbehaves as asked."""
    if behaviour == "segfault":
        ctypes.string_at(0)
    elif behaviour == "exit":
        os._exit(3)
    elif behaviour == "spin":
        while True:
            pass
    elif behaviour == "allocate":
        hog = []
        while True:
            hog.append(bytearray(16 * 1024 * 1024))
    elif behaviour == "leak":
        LEAK.append(bytearray(64 * 1024 * 1024))
    elif behaviour == "quota":
        raise QuotaError("no quota left for today")
    return f"pid {os.getpid()}"


@tghost.tool(service="count", timeout=10.0)
def count(n: int, gate: str = ""):
    """Yields n chunks; with a gate dir, waits before chunk i+1 until the caller creates gate/i."""
    for i in range(n):
        yield f"{i} from {os.getpid()}"
        if gate and i + 1 < n:
            while not (Path(gate) / str(i)).exists():
                time.sleep(0.005)


@tghost.tool(service="acount")
async def acount(n: int):
    for i in range(n):
        await asyncio.sleep(0)
        yield f"a{i}"


@tghost.tool(service="shout")
async def shout(text: str) -> str:
    await asyncio.sleep(0.001)
    return text.upper()


@tghost.hookimpl
def tghost_register_services(register):
    for service in (misbehave, count, acount, shout):
        register(service)


@tghost.hookimpl
def tghost_authorize(user):
    return "mallory may not call anything" if user == "mallory" else None
'''


@pytest.fixture
def misbehave(plugin_dir: PluginDir) -> Catalog:
    """The MISBEHAVE plugin installed and discovered as ``tghost run`` discovers it."""
    plugin_dir.add("misbehave", MISBEHAVE)
    return discover(plugin_dir.entry_points(), strict=True)


def pid_of(answer: str) -> int:
    return int(answer.rsplit(" ", 1)[1])


@pytest.mark.parametrize("isolation", [THREAD, PROCESS])
async def test_a_call_behaves_the_same_in_threads_and_in_processes(
    pulsar_broker: EmbeddedBroker, misbehave: Catalog, isolation: str, tmp_path: Path
) -> None:
    records: list[CallRecord] = []
    async with LocalHost(pulsar_broker.url, misbehave, ServeSettings(isolation=isolation),
                         listeners=[records.append]) as host:
        pid = pid_of(await host.call("misbehave"))
        assert (pid == os.getpid()) is (isolation == THREAD)
        # Streaming is chunk by chunk: chunk 1 is produced only after the caller has chunk 0.
        chunks = []
        async for chunk in host.stream("count", {"n": 3, "gate": str(tmp_path)}):
            chunks.append(chunk)
            (tmp_path / str(len(chunks) - 1)).touch()
        streamer = pid_of(chunks[0])  # each service has workers of its own
        assert chunks == [f"{i} from {streamer}" for i in range(3)]
        assert (streamer == os.getpid()) is (isolation == THREAD)
        assert [c async for c in host.stream("acount", {"n": 3})] == ["a0", "a1", "a2"]
        assert await host.call("shout", {"text": "hi"}) == "HI"
        errors = {}
        for name, arguments, user in [("quota", {"behaviour": "quota"}, "test"), ("invalid", {"behaviour": 5}, "test"),
                                      ("denied", {}, "mallory")]:
            with pytest.raises(ToolCallError) as info:
                await host.call("misbehave", arguments, user=user)
            errors[name] = (info.value.error_type, str(info.value))
    assert errors["quota"] == ("quota-exceeded", "quota-exceeded: no quota left for today")
    assert errors["invalid"][0] == "invalid-arguments" and "argument 'behaviour'" in errors["invalid"][1]
    assert errors["denied"] == ("not-allowed", "not-allowed: mallory may not call anything")
    await until(lambda: len(records) == 7)
    assert sorted((r.service, r.status) for r in records) == [
        ("acount", "ok"), ("count", "ok"), ("misbehave", "invalid-arguments"), ("misbehave", "not-allowed"),
        ("misbehave", "ok"), ("misbehave", "quota-exceeded"), ("shout", "ok")]


async def test_a_worker_is_recycled_after_max_calls(pulsar_broker: EmbeddedBroker, misbehave: Catalog) -> None:
    settings = ServeSettings(isolation=PROCESS, worker_limits=WorkerLimits(max_calls=2))
    async with LocalHost(pulsar_broker.url, misbehave, settings) as host:
        pids = [pid_of(await host.call("misbehave")) for _ in range(4)]
        stats = next(w for w in host.server.endpoints if w.descriptor.id == "misbehave").executor.stats()
    assert pids[0] == pids[1] != pids[2] == pids[3]
    assert stats.restarts == {"timeout": 0, "cancelled": 0, "crash": 0, "memory": 0, "recycled": 2}


async def test_a_worker_above_max_memory_after_a_call_is_replaced(
    pulsar_broker: EmbeddedBroker, misbehave: Catalog
) -> None:
    settings = ServeSettings(isolation=PROCESS, worker_limits=WorkerLimits(max_memory=60))
    async with LocalHost(pulsar_broker.url, misbehave, settings) as host:
        leaky = pid_of(await host.call("misbehave", {"behaviour": "leak"}))
        after = pid_of(await host.call("misbehave"))
        stats = next(w for w in host.server.endpoints if w.descriptor.id == "misbehave").executor.stats()
    assert after != leaky and stats.restarts["memory"] == 1


async def test_an_idle_worker_killed_from_outside_is_replaced_before_the_next_call(
    pulsar_broker: EmbeddedBroker, misbehave: Catalog
) -> None:
    async with LocalHost(pulsar_broker.url, misbehave, ServeSettings(isolation=PROCESS)) as host:
        idle = pid_of(await host.call("misbehave"))
        os.kill(idle, signal.SIGKILL)  # as the OOM killer would, between two calls
        await until(lambda: not alive(idle))
        after = pid_of(await host.call("misbehave"))
        stats = next(w for w in host.server.endpoints if w.descriptor.id == "misbehave").executor.stats()
    assert after != idle and stats.restarts["crash"] == 1


def health(port: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
            body = answer.read()
    except urllib.error.HTTPError as exc:  # 503 when degraded
        body = exc.read()
    result: dict[str, Any] = json.loads(body)
    return result


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text: str = answer.read().decode()
    return text


@pytest.fixture
async def misbehave_client(pulsar_broker: EmbeddedBroker) -> AsyncIterator[ToolServiceClient]:
    client = await PulsarSettings(pulsar_broker.url).connect()
    caller = await ToolServiceClient(client, request_queue("misbehave"), response_queue("misbehave")).start()
    yield caller
    await caller.close()
    await client.close()


async def test_under_process_isolation_a_crash_a_hang_or_a_leak_costs_one_worker_never_the_host(
    pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, tmp_path: Path, host_process: Any,
    misbehave_client: ToolServiceClient,
) -> None:
    plugin_dir.add("misbehave", MISBEHAVE)
    env = plugin_dir.user_env(pulsar_broker.url, tmp_path, "isolation")
    port = free_port()
    host: HostProcess = host_process("--isolation", "process", "--max-worker-memory", "100", "--metrics-port",
                                     str(port), env=env)
    host.wait_for(r"serving misbehave")
    pid = host.process.pid
    first = pid_of(await misbehave_client.call({}, {}, timeout=10))
    assert first != pid

    expected = {
        "segfault": ("tool-service-error", "died during the call (killed by SIGSEGV)"),
        "exit": ("tool-service-error", "died during the call (exit code 3)"),
        "spin": ("timeout", "did not finish within 2.0s"),
        "allocate": ("tool-service-error", "MemoryError"),
    }
    for behaviour, (error_type, words) in expected.items():
        with pytest.raises(ToolCallError) as info:
            await misbehave_client.call({}, {"behaviour": behaviour}, timeout=10)
        assert info.value.error_type == error_type and words in str(info.value), (behaviour, str(info.value))
        # the next call succeeds, within the tool's own 2 s timeout, which counts the wait for the
        # replacement worker to start (the caller's timeout only bounds the test)
        answer = await misbehave_client.call({}, {}, timeout=10)
        assert pid_of(answer) != pid
        assert host.process.poll() is None and host.process.pid == pid  # the host lives on

    # Six spinning calls, more than max_concurrency (2): every one is answered 'timeout'.
    spins = await asyncio.gather(*(misbehave_client.call({}, {"behaviour": "spin"}, timeout=60) for _ in range(6)),
                                 return_exceptions=True)
    assert [e.error_type if isinstance(e, ToolCallError) else e for e in spins] == ["timeout"] * 6
    assert pid_of(await misbehave_client.call({}, {}, timeout=10)) != pid

    state = await asyncio.to_thread(health, port)
    workers = state["workers"]["misbehave"]
    assert state["status"] == "ok" and workers["isolation"] == "process" and workers["max_workers"] == 2
    # Every spin that got a worker had it killed; one whose deadline passed while it waited for a
    # replacement worker to start was answered 'timeout' without running.
    killed = workers["restarts"]["timeout"]
    assert workers["restarts"] == {"crash": 2, "timeout": killed, "cancelled": 0, "memory": 1, "recycled": 0}
    assert 2 <= killed <= 7
    text = await asyncio.to_thread(metrics, port)
    assert 'tghost_worker_restarts_total{reason="crash",service="misbehave"} 2.0' in text
    assert f'tghost_worker_restarts_total{{reason="timeout",service="misbehave"}} {killed}.0' in text
    status = subprocess.run([sys.executable, "-m", "tghost", "status", "--url", f"http://127.0.0.1:{port}/health"],
                            capture_output=True, text=True, env=env, timeout=30)
    assert status.returncode == 0, status.stderr
    assert (f"misbehave: process, 2 of 2 worker processes, 0 busy; restarts: timeout {killed}, crash 2, memory 1"
            in status.stdout)
    listed = subprocess.run([sys.executable, "-m", "tghost", "plugins", "--url", f"http://127.0.0.1:{port}/health"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert (f"workers:     misbehave: process, 2 of 2 worker processes, 0 busy; restarts: timeout {killed}, crash 2, "
            "memory 1") in listed.stdout
    host.process.terminate()
    assert host.finish() == 0
    assert "worker process" in host.log and "killed by SIGSEGV" in host.log


STUCK = '''
import threading
import tghost

RELEASE = threading.Event()


@tghost.tool(max_concurrency=2, timeout=0.2)
def stuck() -> str:
    """Returns only once released."""
    RELEASE.wait(60)
    return "released"


@tghost.hookimpl
def tghost_register_services(register):
    register(stuck)
'''


async def test_thread_mode_counts_stuck_threads_and_reports_the_service_degraded(
    pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir
) -> None:
    plugin_dir.add("stuck", STUCK)
    catalog = discover(plugin_dir.entry_points(), strict=True)
    module = sys.modules["tghost_test_stuck"]
    async with Host(HostConfig(pulsar=PulsarSettings(pulsar_broker.url), announce=False, metrics_port=0),
                    catalog) as host:
        monitor = host.monitor
        assert monitor is not None
        await until(lambda: monitor.health.connected() is not None, "the monitor connects", 10)
        client = await PulsarSettings(pulsar_broker.url).connect()
        caller = await ToolServiceClient(client, request_queue("stuck"), response_queue("stuck")).start()
        try:
            errors = []
            for _ in range(5):
                with pytest.raises(ToolCallError) as info:
                    await caller.call({}, {}, timeout=10)
                errors.append((info.value.error_type, str(info.value)))
            degraded = await asyncio.to_thread(health, monitor.http.port)
            text = await asyncio.to_thread(metrics, monitor.http.port)
            status = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "tghost", "status", "--url",
                                 f"http://127.0.0.1:{monitor.http.port}/health"], capture_output=True, text=True)
            module.RELEASE.set()
            await until(lambda: monitor.health.snapshot()["status"] == "ok")
            assert await caller.call({}, {}, timeout=10) == "released"
        finally:
            module.RELEASE.set()
            await caller.close()
            await client.close()
    # Each timed-out call gave its slot back at once: two stuck threads did not stop the next two
    # calls; four (all its threads: twice its max concurrency) do.
    assert [e[0] for e in errors] == ["timeout"] * 4 + ["overloaded"]
    assert "all 4 of its threads (twice its max concurrency) are stuck in calls that timed out" in errors[4][1]
    assert degraded["status"] == "degraded" and degraded["connected"] is True
    assert degraded["workers"]["stuck"]["stuck"] == 4
    assert degraded["problems"] == ["service 'stuck': 4 of its 4 worker threads are stuck in calls that timed out "
                                    "or were cancelled (Python cannot stop a thread; serve it with --isolation "
                                    "process to have such calls killed)"]
    assert 'tghost_stuck_workers{service="stuck"} 4.0' in text
    assert status.returncode == 1
    assert "stuck: thread, 4 worker threads for 2 calls at once, 0 busy, 4 stuck" in status.stdout
    assert "Error: service 'stuck': 4 of its 4 worker threads are stuck" in status.stderr


class PidService(tghost.ToolService):
    """A class service registered in-process (no entry point): sent to its worker pickled."""

    id = "pid-class"

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        return str(os.getpid())


async def test_a_service_registered_in_process_runs_in_a_worker_process_too(pulsar_broker: EmbeddedBroker) -> None:
    async with LocalHost(pulsar_broker.url, [PidService()], ServeSettings(isolation=PROCESS)) as host:
        assert int(await host.call("pid-class")) != os.getpid()


class ThreadPid(PidService):
    id = "pid-thread"
    isolation = "thread"


class ProcessPid(PidService):
    id = "pid-process"
    isolation = "process"


@tghost.tool(isolation="process")
def pid_tool() -> str:
    """Answers with the pid of the process it runs in."""
    return str(os.getpid())


@pytest.mark.parametrize("host_default", [THREAD, PROCESS])
async def test_a_service_that_chooses_its_isolation_gets_it_whatever_the_hosts_default(
    pulsar_broker: EmbeddedBroker, host_default: str
) -> None:
    services = [PidService(), ThreadPid(), ProcessPid(), pid_tool]
    async with LocalHost(pulsar_broker.url, services, ServeSettings(isolation=host_default)) as host:
        in_host = {sid: int(await host.call(sid)) == os.getpid()
                   for sid in ("pid-class", "pid-thread", "pid-process", "pid-tool")}
    assert in_host == {"pid-class": host_default == THREAD, "pid-thread": True, "pid-process": False,
                       "pid-tool": False}


def test_an_unknown_isolation_is_refused_naming_the_service() -> None:
    class Odd(PidService):
        id = "odd"
        isolation = "fiber"

    with pytest.raises(ValueError, match="service 'odd': field 'isolation': 'fiber' is not 'thread' or 'process'"):
        Odd().descriptor()


async def test_tghost_isolation_in_the_environment_sets_the_hosts_default(
    pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, tmp_path: Path, host_process: Any,
    misbehave_client: ToolServiceClient,
) -> None:
    plugin_dir.add("misbehave", MISBEHAVE)
    env = {**plugin_dir.user_env(pulsar_broker.url, tmp_path, "isolation"), "TGHOST_ISOLATION": "process"}
    host: HostProcess = host_process(env=env)
    host.wait_for(r"serving misbehave")
    assert pid_of(await misbehave_client.call({}, {}, timeout=10)) != host.process.pid
    host.process.terminate()
    assert host.finish() == 0


async def test_a_host_killed_by_sigkill_leaves_no_worker_process_behind(
    pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, tmp_path: Path, host_process: Any,
    misbehave_client: ToolServiceClient,
) -> None:
    plugin_dir.add("misbehave", MISBEHAVE)
    host: HostProcess = host_process("--isolation", "process",
                                     env=plugin_dir.user_env(pulsar_broker.url, tmp_path, "isolation"))
    host.wait_for(r"serving misbehave")
    worker = pid_of(await misbehave_client.call({}, {}, timeout=10))
    spinning = asyncio.create_task(misbehave_client.call({}, {"behaviour": "spin"}, timeout=30))
    await asyncio.sleep(0.3)  # the spin is running in that worker (the only one started)
    host.process.kill()
    host.process.wait()
    deadline = time.monotonic() + 5
    while alive(worker) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    spinning.cancel()
    assert not alive(worker)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as stat:  # a zombie (reaped later by init) is not running
            return stat.read().split(")")[-1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):  # gone, also between the two looks
        return False


async def test_a_stuck_thread_on_the_loop_path_is_freed_when_its_plugin_returns(pulsar_broker: EmbeddedBroker) -> None:
    # A persistent request topic takes the event loop's path (not the thread lane): the timed-out
    # call's future is given up there, and the thread must still come back when the plugin returns.
    release = threading.Event()

    @tghost.tool(timeout=0.2, persistent=True)
    def held() -> str:
        """Return once released."""
        release.wait(30)
        return "released"

    async with LocalHost(pulsar_broker.url, [held]) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("held", timeout=10)
        [endpoint] = host.server.endpoints
        stuck = endpoint.executor.stats().stuck
        release.set()
        deadline = time.monotonic() + 10
        while endpoint.executor.stats().stuck:
            assert time.monotonic() < deadline, "the stuck thread never came back"
            await asyncio.sleep(0.02)
        assert await host.call("held", timeout=10) == "released"
    assert info.value.error_type == "timeout" and stuck == 1
