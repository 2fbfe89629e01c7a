"""liveness: a call whose hosts stopped without withdrawing ends ``no-provider`` naming the tool,
the host and when it was last heard, not at its timeout; a slow tool on a live host is not
failed; a directory shows a silent host late before its lease ends; a timeout names the tool
(docs/protocol.md §2.15, §4.9). On the embedded broker; the host is killed for real (SIGKILL)."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PluginDir, tghost_cli, until
from tghost.agent.answers import Answers
from tghost.agent.calls import NoProvider
from tghost.agent.client import ToolCallError, _may_resend, _Sent
from tghost.agent.directory import ToolDirectory
from tghost.agent.hosts import late_hosts, live_hosts
from tghost.agent.liveness import PROBE_AFTER, PROBE_EVERY, PROBE_WAIT, Silent, Watch
from tghost.broker import EmbeddedBroker
from tghost.discovery.discover import discover
from tghost.protocol import wire
from tghost.protocol.wire import RESEND_PAUSE, RESENDS
from tghost.pulsar.clients import PulsarSettings
from tghost.testing import LocalHost

#: A plugin whose tool sleeps (a plain ``def``), leaving a file once it started.
SLEEPY = '''
import pathlib
import time

import tghost


@tghost.tool
def doze(seconds: float, mark: str = "") -> str:
    """Sleep, then say so."""
    if mark:
        pathlib.Path(mark).touch()
    time.sleep(seconds)
    return f"slept {seconds}"


@tghost.hookimpl
def tghost_register_services(register):
    register(doze)
'''


@pytest.fixture
def topic() -> str:
    return f"persistent://tg/config/liveness-{uuid.uuid4().hex[:8]}"


def host_env(broker: EmbeddedBroker, topic: str, plugins: PluginDir) -> dict[str, str]:
    plugins.add("sleepy", SLEEPY)
    return plugins.env(TGHOST_PULSAR_URL=broker.url, TGHOST_DESCRIPTORS_TOPIC=topic, TGHOST_LOAD_PLUGINS="sleepy")


async def test_a_call_whose_only_host_was_killed_ends_no_provider_naming_tool_host_and_last_heard(
    pulsar_broker: EmbeddedBroker, topic: str, plugin_dir: PluginDir, host_process: Any, tmp_path: Path
) -> None:
    host = host_process("--host-id", "doomed", env=host_env(pulsar_broker, topic, plugin_dir))
    await asyncio.to_thread(host.wait_for, "announced")
    mark = tmp_path / "started"
    async with ToolDirectory(PulsarSettings(pulsar_broker.url), topic) as directory:
        await directory.wait_for("doze", 30)
        in_flight = asyncio.create_task(directory.invoke("doze", {"seconds": 50, "mark": str(mark)}, timeout=60))
        await until(mark.exists)
        os.kill(host.process.pid, signal.SIGKILL)  # dies with the call, withdrawing nothing
        host.process.wait()
        with pytest.raises(NoProvider) as died_with_it:
            await in_flight
        with pytest.raises(NoProvider) as after:  # the directory still lists it: its lease runs
            await directory.invoke("doze", {"seconds": 0}, timeout=60)
        assert "doomed" in directory.hosts
    for error in (died_with_it.value, after.value):
        assert error.error_type == "no-provider" and error.hosts == ("doomed",) and set(error.heard) == {"doomed"}
        assert re.fullmatch(r"[0-9a-f]{32}", error.request_id or ""), error.request_id  # it was sent
        assert re.search(r"no live host serves tool 'doze' \(tool service 'doze'\): host\(s\) doomed \(last heard "
                         r"[\d.]+s ago\) answered none of its liveness probes: stopped without withdrawing",
                         error.message)


async def test_a_slow_tool_on_a_live_host_is_not_failed_by_the_probes(pulsar_broker: EmbeddedBroker, topic: str,
                                                                        plugin_dir: PluginDir) -> None:
    plugin_dir.add("sleepy", SLEEPY)
    catalog = discover(plugin_dir.entry_points(), strict=True)
    async with LocalHost(pulsar_broker.url, catalog, announce_as="alive", topic=topic), \
            ToolDirectory(PulsarSettings(pulsar_broker.url), topic) as directory:
        await directory.wait_for("doze", 30)
        assert directory.calls.probed("doze")  # its host says it answers probes
        assert await directory.invoke("doze", {"seconds": 5}, timeout=60) == "slept 5.0"


async def test_a_timeout_names_the_tool_and_service_and_what_the_probes_found(
    pulsar_broker: EmbeddedBroker, topic: str, plugin_dir: PluginDir
) -> None:
    plugin_dir.add("sleepy", SLEEPY)
    catalog = discover(plugin_dir.entry_points(), strict=True)
    async with LocalHost(pulsar_broker.url, catalog, announce_as="alive", topic=topic), \
            ToolDirectory(PulsarSettings(pulsar_broker.url), topic) as directory:
        await directory.wait_for("doze", 30)
        with pytest.raises(ToolCallError) as timed_out:
            await directory.invoke("doze", {"seconds": 10}, timeout=4)
    assert timed_out.value.error_type == wire.TIMEOUT
    assert timed_out.value.message.startswith("tool 'doze' (tool service 'doze') gave no complete answer within 4s "
                                              "(request topic non-persistent://tg/request/doze)")
    assert "a host answered a liveness probe holding the call: the tool is slow" in timed_out.value.message


async def test_a_killed_host_is_late_before_its_lease_ends_in_the_directory_tghost_status_and_tools(
    pulsar_broker: EmbeddedBroker, topic: str, plugin_dir: PluginDir, host_process: Any
) -> None:
    env = host_env(pulsar_broker, topic, plugin_dir)
    host = host_process("--host-id", "doomed", "--lease", "20", env=env)
    await asyncio.to_thread(host.wait_for, "announced")
    async with ToolDirectory(PulsarSettings(pulsar_broker.url), topic) as directory:
        await directory.wait_for("doze", 30)
        assert late_hosts(directory, time.time()) == {}
        os.kill(host.process.pid, signal.SIGKILL)
        host.process.wait()
        await until(lambda: late_hosts(directory, time.time()), timeout=20)
        [live] = live_hosts(directory)  # late, and still live: its lease runs
        assert live.id == "doomed" and live.late(time.time()) and live.lease_end > time.time()
        status = await asyncio.to_thread(tghost_cli, "status", env=env)
        tools = await asyncio.to_thread(tghost_cli, "tools", env=env)
    assert re.search(r"^doze +doze +doomed \(late\) ", tools.stdout, re.MULTILINE), tools.stdout
    assert status.returncode == 1
    assert re.search(r"^doomed .* LATE ", status.stdout, re.MULTILINE), status.stdout
    assert "host doomed: late: not heard for" in status.stderr


# -- the probes' schedule, without a broker --


def test_a_watch_probes_after_a_second_of_silence_and_ends_the_call_after_two_unanswered_probes() -> None:
    sent: list[str] = []
    watch = Watch(sent.append)
    assert watch.heard() == PROBE_AFTER == 1.0 and sent == []  # a call that hears its answer sends nothing
    assert watch.silent() == PROBE_WAIT and len(sent) == 1
    assert watch.silent() == PROBE_WAIT and len(sent) == 2  # one lost probe is not a dead host
    with pytest.raises(Silent, match=r"no host of the service answered 2 liveness probes within 2s"):
        watch.silent()
    assert watch.probes == sent and watch.told() == ""


def test_while_a_host_answers_the_probes_come_ever_less_often_and_say_whether_it_holds_the_call() -> None:
    sent: list[str] = []
    watch = Watch(sent.append)
    rests = []
    for _ in range(6):
        assert watch.silent() == PROBE_WAIT  # a probe goes out
        watch.answer({wire.ALIVE: "1", wire.HOLDS: "0"})
        rests.append(watch.silent())  # answered: rest before the next
    assert rests == [2.0, 4.0, 8.0, PROBE_EVERY, PROBE_EVERY, PROBE_EVERY] and len(sent) == 6
    assert "none holds the call" in watch.told()
    watch.answer({wire.ALIVE: "1", wire.HOLDS: "1"})
    assert "the tool is slow" in watch.told()
    watch.heard()  # a chunk came: the next probe after a second again
    assert watch.silent() == PROBE_WAIT and len(sent) == 7


def test_a_watch_asks_once_whether_to_send_again_only_when_hosts_that_serve_answered_and_none_holds() -> None:
    sent: list[str] = []
    asked: list[int] = []
    watch = Watch(sent.append, lambda serving: asked.append(serving) or serving >= 2)
    watch.silent()
    watch.answer({"id": sent[-1], wire.ALIVE: "1", wire.HOLDS: "1"})  # held: never asked
    watch.answer({"id": sent[-1], wire.ALIVE: "1", wire.HOLDS: "0"})
    assert watch.silent() == 2.0 and asked == []
    watch.silent()
    watch.answer({"id": sent[-1], wire.ALIVE: "1", wire.HOLDS: "0", wire.DRAINING: "1"})  # a stopping host
    watch.answer({"id": sent[0], wire.ALIVE: "1", wire.HOLDS: "0"})  # late, for an earlier probe
    watch.answer({"id": sent[-1], wire.ALIVE: "1", wire.HOLDS: "0"})
    assert watch.silent() == 4.0 and asked == [1]  # one serving host answered: not sent again
    watch.silent()
    for _ in range(2):
        watch.answer({"id": sent[-1], wire.ALIVE: "1", wire.HOLDS: "0"})
    assert watch.silent() == PROBE_AFTER and asked == [1, 2] and watch.resent  # sent again: probed as anew
    watch.silent()
    for _ in range(2):
        watch.answer({"id": sent[-1], wire.ALIVE: "1", wire.HOLDS: "0"})
    assert watch.silent() == 2.0 and asked == [1, 2]  # once at most


def test_an_unavailable_is_sent_again_only_when_its_host_says_the_call_did_not_start_before_any_chunk() -> None:
    def unavailable(started: bool | None) -> wire.Response:
        return wire.decode_response(wire.encode_error(wire.UNAVAILABLE, "stopping", "h", "r", started))

    fresh = _Sent("r", Answers(None), 0.0)
    assert _may_resend(unavailable(False), fresh, 0) and _may_resend(unavailable(False), fresh, RESENDS - 1)
    assert not _may_resend(unavailable(False), fresh, RESENDS)  # the bound
    assert not _may_resend(unavailable(None), fresh, 0)  # may have started (the grace's end), or a seed 000 host
    assert not _may_resend(wire.decode_response(wire.encode_error(wire.OVERLOADED, "full", started=False)), fresh, 0)
    assert not _may_resend(unavailable(False), _Sent("r", Answers(None), 0.0, heard=True), 0)  # a chunk came
    assert sum(RESEND_PAUSE * 2 ** n for n in range(RESENDS)) < 1.0  # the pauses, 0.63 s in all: well within a timeout


#: A tool that notes which process ran each call; it sleeps only where ``TGHOST_TEST_SLEEP`` is set.
NOTED = '''
import os
import time

import tghost


@tghost.tool
def noted(mark: str) -> str:
    """Note this process in the file ``mark``, then sleep where told to."""
    with open(mark, "a") as file:
        file.write(f"{os.getpid()}\\n")
    time.sleep(float(os.environ.get("TGHOST_TEST_SLEEP", "0")))
    return "noted"


@tghost.hookimpl
def tghost_register_services(register):
    register(noted)
'''


async def test_the_call_a_killed_host_took_is_never_sent_again_though_another_host_answers_the_probes(
    pulsar_broker: EmbeddedBroker, topic: str, plugin_dir: PluginDir, host_process: Any, tmp_path: Path
) -> None:
    plugin_dir.add("noted", NOTED)
    env = plugin_dir.env(TGHOST_PULSAR_URL=pulsar_broker.url, TGHOST_DESCRIPTORS_TOPIC=topic,
                         TGHOST_LOAD_PLUGINS="noted")
    doomed = host_process("--host-id", "doomed", env={**env, "TGHOST_TEST_SLEEP": "50"})
    other = host_process("--host-id", "other", env=env)
    for host in (doomed, other):
        await asyncio.to_thread(host.wait_for, "announced")
    async with ToolDirectory(PulsarSettings(pulsar_broker.url), topic) as directory:
        await until(lambda: "noted" in directory.services and len(directory.services["noted"].providers) == 2)
        for n in itertools.count():  # until a call runs on the doomed host (the other answers at once)
            mark = tmp_path / f"call-{n}"
            call = asyncio.create_task(directory.invoke("noted", {"mark": str(mark)}, timeout=8))
            await until(mark.exists)
            if mark.read_text() == f"{doomed.process.pid}\n":
                break
            assert await call == "noted"
        os.kill(doomed.process.pid, signal.SIGKILL)  # dies with the call, withdrawing nothing
        doomed.process.wait()
        with pytest.raises(ToolCallError) as lost:
            await call
    assert lost.value.error_type == wire.TIMEOUT and "none holds the call" in lost.value.message
    assert mark.read_text() == f"{doomed.process.pid}\n"  # never sent again: the other host never ran it
