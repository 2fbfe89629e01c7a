"""host: ``tghost.Host`` is what ``tghost run``, ``LocalHost`` and an embedding program share.
Each stops in one order (withdraw, drain, the plugins' ``tghost_shutdown`` hooks once, close),
whether it stops on exit, on SIGTERM or because it failed to start; docs/guides/embedding.md's
programs run as written and its table is ``HostConfig``'s fields."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import signal
import socket
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

import tghost
from tests.conftest import READY, HostProcess, OwnBrokers, PluginDir, tghost_cli
from tests.test_docs import ROOT, block
from tghost.broker import EmbeddedBroker
from tghost.system.net import free_port
from tghost.testing import LocalHost

EMBEDDING = "docs/guides/embedding.md"


def lifecycle_plugin(events: list[str], release: asyncio.Event) -> types.SimpleNamespace:
    """A plugin whose tool waits for ``release`` and whose ``tghost_shutdown`` hook notes it ran."""

    @tghost.tool
    async def slow() -> str:
        """Answer once released."""
        events.append("call started")
        await release.wait()
        events.append("call answered")
        return "done"

    def register(register: Callable[[object], None]) -> None:
        register(slow)

    def shutdown() -> None:
        events.append("shutdown hook")

    return types.SimpleNamespace(tghost_register_services=tghost.hookimpl(register),
                                 tghost_shutdown=tghost.hookimpl(shutdown), __name__="lifecycle")


async def test_local_host_exit_drains_then_runs_the_shutdown_hook_once(pulsar_broker: EmbeddedBroker) -> None:
    events: list[str] = []
    release = asyncio.Event()
    host = LocalHost(pulsar_broker.url, plugin=lifecycle_plugin(events, release))
    async with host:
        call = asyncio.create_task(host.call("slow", timeout=20))
        while "call started" not in events:
            await asyncio.sleep(0.01)
        stopping = asyncio.create_task(host.stop())  # what leaving the block does, while the call runs
        await asyncio.sleep(0.3)
        assert events == ["call started"], "the shutdown hook ran while a call was in flight"
        release.set()
        assert await stopping == 0
    assert events == ["call started", "call answered", "shutdown hook"]
    assert await call == "done"
    await host.stop()  # idempotent: no second shutdown
    assert events.count("shutdown hook") == 1


async def test_a_host_that_cannot_start_stops_what_it_started_and_runs_the_shutdown_hook_once() -> None:
    events: list[str] = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        plugin = lifecycle_plugin(events, asyncio.Event())
        host = tghost.Host(tghost.HostConfig(metrics_port=port), plugin=plugin)
        with pytest.raises(tghost.HostError) as info:
            await host.start()
    assert info.value.setting == "metrics_port"
    assert f"cannot serve metrics on 127.0.0.1:{port}" in str(info.value)
    assert events == ["shutdown hook"]
    await host.stop()
    assert events == ["shutdown hook"]


async def test_overlapping_stops_wait_for_the_one_stop_and_a_cancelled_serve_still_stops(
    pulsar_broker: EmbeddedBroker,
) -> None:
    events: list[str] = []
    release = asyncio.Event()
    host = tghost.Host(tghost.HostConfig(pulsar=tghost.PulsarSettings(pulsar_broker.url), announce=False),
                       plugin=lifecycle_plugin(events, release))
    serving = asyncio.create_task(host.serve(handle_signals=False))
    while not host._serving:
        await asyncio.sleep(0.01)
    first, second = asyncio.create_task(host.stop()), asyncio.create_task(host.stop())
    await asyncio.sleep(0)
    serving.cancel()  # the serve() that was waiting: its stop is the same stop
    assert await first == await second == 0
    with pytest.raises(asyncio.CancelledError):
        await serving
    assert events == ["shutdown hook"]
    with pytest.raises(RuntimeError, match="starts once"):
        await host.start()


async def test_cancelling_serve_withdraws_drains_and_runs_the_shutdown_hook(pulsar_broker: EmbeddedBroker) -> None:
    events: list[str] = []
    host = tghost.Host(tghost.HostConfig(pulsar=tghost.PulsarSettings(pulsar_broker.url), announce=False),
                       plugin=lifecycle_plugin(events, asyncio.Event()))
    serving = asyncio.create_task(host.serve(handle_signals=False))
    while not host._serving:
        await asyncio.sleep(0.01)
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serving
    assert events == ["shutdown hook"]
    assert host.server.endpoints[0].counters["received"] == 0


def test_a_host_given_its_services_takes_the_config_files_access_policy_and_refuses_plugin_settings(
    tmp_path: Path,
) -> None:
    @tghost.tool
    def shout(text: str) -> str:
        """Say it louder."""
        return text.upper()

    policy = tmp_path / "access.toml"
    policy.write_text('[access]\nanonymous = ["shout"]\n')
    host = tghost.Host(tghost.HostConfig(config_file=policy), [shout])
    access = host.load().access
    assert access is not None and access.anonymous == frozenset({"shout"})
    for config in (tghost.HostConfig(watch_plugins=True), tghost.HostConfig(plugins=tghost.PluginSelection())):
        with pytest.raises(ValueError, match="choose installed plugins"):
            tghost.Host(config, [shout])
    with pytest.raises(ValueError, match="at most 600s"):
        tghost.HostConfig(lease=601)


SHUTDOWN_COUNTER = """
import os
import pathlib

import tghost


@tghost.tool
def ping() -> str:
    '''Answer pong.'''
    return "pong"


@tghost.hookimpl
def tghost_register_services(register):
    register(ping)


@tghost.hookimpl
def tghost_shutdown():
    with pathlib.Path(os.environ["TGHOST_TEST_SHUTDOWNS"]).open("a") as shutdowns:
        shutdowns.write("shutdown\\n")
"""


def test_tghost_run_runs_the_shutdown_hook_once_on_sigterm_after_withdrawing(
    pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, tmp_path: Path,
    host_process: Callable[..., HostProcess],
) -> None:
    plugin_dir.add("shutdown-counter", SHUTDOWN_COUNTER)
    shutdowns = tmp_path / "shutdowns"
    env = {**plugin_dir.user_env(pulsar_broker.url, tmp_path / "config", "host-stop"),
           "TGHOST_TEST_SHUTDOWNS": str(shutdowns)}
    host = host_process(env=env)
    host.wait_for(READY)
    answer = tghost_cli("call", "ping", "--wait", "10", env=env)
    assert answer.returncode == 0 and answer.stdout.strip() == "pong", answer.stderr
    host.process.send_signal(signal.SIGTERM)
    assert host.finish() == 0, host.log
    assert shutdowns.read_text() == "shutdown\n", host.log
    assert host.log.index("stopping: no new requests") < host.log.index("stopped after 1 request(s)"), host.log
    assert json.loads(tghost_cli("tools", "--json", env=env).stdout) == []


def test_tghost_run_runs_the_shutdown_hook_once_when_its_broker_cannot_start(
    plugin_dir: PluginDir, tmp_path: Path,
) -> None:
    plugin_dir.add("shutdown-counter", SHUTDOWN_COUNTER)
    shutdowns = tmp_path / "shutdowns"
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # a data dir inside a file cannot be made
    env = {**plugin_dir.user_env(f"pulsar://127.0.0.1:{free_port()}", tmp_path / "config", "host-stop"),
           "TGHOST_TEST_SHUTDOWNS": str(shutdowns)}
    ran = tghost_cli("run", "--data-dir", str(blocked / "broker"), env=env)
    assert ran.returncode == 1, ran.stderr
    assert ran.stderr.startswith("Error: ") or "\nError: " in ran.stderr, ran.stderr
    assert shutdowns.read_text() == "shutdown\n", ran.stderr


# docs/guides/embedding.md


@pytest.fixture
def own_broker(own_brokers: OwnBrokers) -> EmbeddedBroker:
    """A broker of this test's own: the docs' programs announce on the default topic, which
    no other test's host may share."""
    return own_brokers.start()


@pytest.fixture
def program_env(own_broker: EmbeddedBroker, tmp_path: Path) -> dict[str, str]:
    """A user's environment for the docs' programs and the tghost commands that call them."""
    env = PluginDir(tmp_path).user_env(own_broker.url, tmp_path / "config", "embedding")
    del env["TGHOST_DESCRIPTORS_TOPIC"]  # the programs announce on the default topic
    return env


def test_the_embedding_program_serves_its_tool_until_sigterm(
    own_broker: EmbeddedBroker, program_env: dict[str, str], tmp_path: Path,
) -> None:
    program = tmp_path / "my_app.py"
    program.write_text(block(EMBEDDING, "# my_app.py: a program that serves a tool of its own on Pulsar"))
    process = subprocess.Popen([sys.executable, str(program), own_broker.url], env=program_env,
                               stderr=subprocess.PIPE, text=True)
    try:
        answer = tghost_cli("call", "shout", "text=hi", "--wait", "20", env=program_env)
        assert answer.returncode == 0 and answer.stdout.strip() == "HI!", answer.stderr
        process.send_signal(signal.SIGTERM)
        _, errors = process.communicate(timeout=30)
        assert process.returncode == 0, errors
        assert "Traceback" not in errors, errors
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    after = tghost_cli("call", "shout", "text=hi", env=program_env)  # withdrawn: refused at once
    assert after.returncode == 1 and "no-provider" in after.stderr, after.stderr


def test_the_async_with_program_serves_while_its_block_runs_then_withdraws(
    own_broker: EmbeddedBroker, program_env: dict[str, str], tmp_path: Path,
) -> None:
    program = tmp_path / "with_my_app.py"
    program.write_text(block(EMBEDDING, "# with_my_app.py: a host that lives as long as the block around it"))
    ran = subprocess.run([sys.executable, str(program), own_broker.url, "1"], env=program_env, capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["serving ['shout']", "stopped"], ran.stdout
    after = tghost_cli("call", "shout", "text=hi", env=program_env)  # withdrawn, not left to expire
    assert after.returncode == 1 and "no-provider" in after.stderr, after.stderr


def test_the_host_config_table_lists_every_field_with_its_default() -> None:
    text = (ROOT / EMBEDDING).read_text()
    table = text[text.index("| field | default |"):]
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", table, re.M))
    fields = {f.name: f for f in dataclasses.fields(tghost.HostConfig)}
    assert list(rows) == list(fields)
    for name, shown in rows.items():
        default = fields[name].default
        if isinstance(default, (bool, int, float)) or default is None:
            assert shown.strip() == f"`{default!r}`", (name, shown, default)
        elif isinstance(default, str) and name != "topic":
            assert default in shown, (name, shown, default)
