"""MCP servers served by ``tghost run --config`` through tghost-mcp, as a user runs it on the
embedded broker: docs/integrations/mcp-servers.md's tables and worked example (the official
``mcp-server-time`` from PyPI) as written, then the notes server of plugins/tghost-mcp/tests
(written with the SDK's MCPServer): its tools in ``tghost tools`` with their schemas, calls that
write state and read it back, an MCP client of ``tghost mcp`` seeing the original hints,
TrustGraph's own ``ToolServiceClient`` calling a mounted tool on the seed 000 wire, ``tghost
plugins`` showing each server, a server killed under the host started again, after which calls
work again, and a streamable-HTTP server that stops answering shown in ``/health``."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tghost_mcp", reason="the MCP servers' mount: tox -e mcp-servers installs tghost-mcp")

from tghost_mcp.settings import ServerSettings, server_tables

from tests.adapters.test_mcp import mcp_client
from tests.conftest import HostProcess, tghost_cli
from tests.operate.test_metrics import get
from tests.test_docs import ROOT, block, commands
from tghost.broker import EmbeddedBroker
from tghost.protocol import request_queue, response_queue
from tghost.system.net import free_port

PAGE = "docs/integrations/mcp-servers.md"
NOTES = ROOT / "plugins" / "tghost-mcp" / "tests" / "notes_server.py"
sys.path.insert(0, str(NOTES.parent))  # the plugin's test helpers, as its own tests import them
from mcp_helpers import HttpNotes  # noqa: E402

CONFIG = f"""
[mcp-servers.notes]
command = "{sys.executable}"
args = ["{NOTES}"]

[mcp-servers.time]
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]

[mcp-servers.broken]
command = "no-such-mcp-server"
"""


def user_env(broker: EmbeddedBroker, tmp_path: Path, config: str | None = None) -> dict[str, str]:
    """A user's environment: this broker, a fresh descriptors topic, a private config dir, only
    tghost-mcp's plugin (and the servers it adds), ``config`` as the config file (if given), and
    this venv's scripts (``mcp-server-time``) on ``PATH``."""
    env = {**os.environ, "TGHOST_PULSAR_URL": broker.url, "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
           "TGHOST_DESCRIPTORS_TOPIC": f"persistent://tg/config/mcp-servers-{uuid.uuid4().hex[:8]}",
           "TGHOST_LOAD_PLUGINS": "mcp",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    if config is not None:
        (tmp_path / "tghost.toml").write_text(config)
        env["TGHOST_CONFIG"] = str(tmp_path / "tghost.toml")
    return env


def call(env: dict[str, str], *args: str) -> str:
    called = tghost_cli("call", *args, env=env)
    assert called.returncode == 0, called.stdout + called.stderr
    return called.stdout.strip()


def test_the_pages_tables_are_servers_tghost_mcp_takes() -> None:
    tables = server_tables(tomllib.loads(block(PAGE, "[mcp-servers.memory]")))
    memory, tickets = (ServerSettings.of(name, table) for name, table in tables.items())
    assert memory.stdio and memory.env == {"MEMORY_FILE_PATH": "/var/lib/tghost/memory.jsonl"}
    assert (tickets.url, tickets.prefix, tickets.group) == ("https://tickets.example.com/mcp", "tickets-",
                                                            ["default", "support"])


def test_the_pages_worked_example_serves_the_official_time_server_as_written(
    pulsar_broker: EmbeddedBroker, tmp_path: Path, host_process: Callable[..., HostProcess],
) -> None:
    (tmp_path / "time.toml").write_text(block(PAGE, "# time.toml"))
    env = user_env(pulsar_broker, tmp_path)
    (run, _), (tools, tools_shown), (convert, convert_shown) = commands(PAGE, "$ tghost run --config time.toml &")
    host = host_process(*run[4:], env=env, cwd=tmp_path)  # python -m tghost run --config time.toml
    host.wait_for("announced")
    listed = tghost_cli(*tools[3:], env=env)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[:2] for line in listed.stdout.splitlines()] == [
        line.split()[:2] for line in tools_shown.splitlines()]  # the provider is this machine's host id
    called = tghost_cli(*convert[3:], env=env)
    assert called.returncode == 0, called.stderr
    converted = json.loads(called.stdout)  # its dates are today's
    assert converted["time_difference"] == json.loads(convert_shown)["time_difference"] == "+8.0h"
    assert [converted[side]["timezone"] for side in ("source", "target")] == ["Europe/Paris", "Asia/Tokyo"]
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


@pytest.fixture
def env(pulsar_broker: EmbeddedBroker, tmp_path: Path) -> dict[str, str]:
    return user_env(pulsar_broker, tmp_path, CONFIG)


@pytest.fixture
def host(env: dict[str, str], host_process: Callable[..., HostProcess]) -> HostProcess:
    started = host_process("--host-id", "mcp-servers", env=env)
    started.wait_for("announced")
    return started


def test_the_servers_tools_are_listed_with_their_schemas_and_calls_keep_state(
    env: dict[str, str], host: HostProcess,
) -> None:
    assert "plugin 'broken': cannot load mcp plugin 'no-such-mcp-server'" in host.log  # the others are served
    rows = {row["name"]: row for row in json.loads(tghost_cli("tools", "--json", env=env).stdout)}
    assert {"remember", "recall", "get_current_time", "convert_time"} <= set(rows)
    remember = rows["remember"]
    assert (remember["service"], remember["config"], remember["title"]) == ("notes", {"tool": "remember"},
                                                                            "Remember a note")
    assert remember["input-schema"]["required"] == ["key", "text"]
    assert [argument["name"] for argument in remember["arguments"]] == ["key", "text"]
    assert rows["recall"]["annotations"] == {"read-only": True}
    assert rows["convert_time"]["output-schema"]["required"] == ["source", "target", "time_difference"]

    assert call(env, "remember", "key=colour", "text=teal") == "remembered colour"
    assert call(env, "recall", "key=colour") == "teal"


async def test_an_mcp_client_of_tghost_mcp_sees_the_original_hints(env: dict[str, str], host: HostProcess) -> None:
    async with mcp_client(env) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        converted = await session.call_tool("convert_time", {
            "source_timezone": "Europe/Paris", "time": "12:00", "target_timezone": "Asia/Tokyo"})
    remember, recall = tools["remember"], tools["recall"]
    assert remember.title == "Remember a note" and remember.annotations is not None
    assert (remember.annotations.read_only_hint, remember.annotations.destructive_hint,
            remember.annotations.idempotent_hint, remember.annotations.open_world_hint) == (False, False, True, False)
    assert recall.annotations is not None and recall.annotations.read_only_hint is True
    assert tools["convert_time"].output_schema is not None
    assert not converted.is_error and converted.structured_content is not None
    assert converted.structured_content["time_difference"] == "+8.0h"


async def test_trustgraphs_own_tool_service_client_calls_a_mounted_tool(
    env: dict[str, str], host: HostProcess, pulsar_broker: EmbeddedBroker,
) -> None:
    tool_service_client = pytest.importorskip("trustgraph.base.tool_service_client",
                                              reason="trustgraph-base is not installed")
    request_response_client = pytest.importorskip("trustgraph.base.request_response_client")
    backend_module = pytest.importorskip("trustgraph.base.async_pulsar_backend")
    schema = pytest.importorskip("trustgraph.schema")

    class Client(tool_service_client.ToolServiceClient,  # type: ignore[misc,name-defined]
                 request_response_client.RequestResponseClient):  # type: ignore[misc,name-defined]
        """TrustGraph's ToolServiceClient (its call()) over its RequestResponseClient, as its agent joins them."""

    client: Any = await Client.create(
        backend=backend_module.AsyncPulsarBackend(pulsar_broker.url), request_topic=request_queue("notes"),
        response_topic=response_queue("notes"), request_schema=schema.ToolServiceRequest,
        response_schema=schema.ToolServiceResponse)
    try:
        assert await client.call({"tool": "remember"}, {"key": "wire", "text": "seed 000"}, timeout=30) \
            == "remembered wire"
        assert await client.call({"tool": "recall"}, {"key": "wire"}, timeout=30) == "seed 000"
    finally:
        await client.close()


def test_tghost_plugins_shows_each_server_its_state_and_its_tools(
    env: dict[str, str], pulsar_broker: EmbeddedBroker,
) -> None:
    listed = tghost_cli("plugins", env=env)
    assert listed.returncode == 1  # the broken server failed
    assert "notes (tghost-mcp " in listed.stdout and "kind:        mcp (added by plugin mcp)" in listed.stdout
    assert "command 'no-such-mcp-server' not found; install it" in listed.stdout
    reports = {r["name"]: r for r in json.loads(tghost_cli("plugins", "--json", env=env).stdout)}
    assert (reports["notes"]["kind"], reports["notes"]["status"], reports["broken"]["status"]) == (
        "mcp", "loaded", "failed")
    assert {"remember", "recall", "say-hello"} <= set(reports["notes"]["tools"])
    assert reports["time"]["tools"] == ["get_current_time", "convert_time"]


def test_a_server_killed_under_the_host_is_started_again_and_calls_work_again(
    env: dict[str, str], host: HostProcess,
) -> None:
    assert call(env, "remember", "key=k", "text=v") == "remembered k"
    os.kill(int(call(env, "pid")), signal.SIGKILL)
    host.wait_for(r"MCP server 'notes' exited; restarting in 1 s; its stderr ended: ")
    host.wait_for(r"MCP server 'notes' is back")
    assert call(env, "recall", "key=k") == "nothing remembered under k"  # a new process: its memory is new
    server = int(call(env, "pid"))
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0
    with pytest.raises(ProcessLookupError):
        os.kill(server, 0)  # the host stopped the server it started


@pytest.fixture
def http_notes() -> Iterator[HttpNotes]:
    """The notes server on streamable HTTP (the plugin's own test helper), listening."""
    server = HttpNotes(token=uuid.uuid4().hex).start()
    try:
        yield server
    finally:
        server.stop()


def health(port: int) -> dict[str, Any]:
    """``GET /health``'s JSON (its status is 503 when degraded, with the same body)."""
    return json.loads(get(f"http://127.0.0.1:{port}/health")[1])  # type: ignore[no-any-return]


def problems_until(port: int, wanted: Callable[[list[str]], bool], timeout: float = 60) -> list[str]:
    """/health's problems once ``wanted(problems)`` (polled)."""
    deadline = time.monotonic() + timeout
    while not wanted(problems := health(port)["problems"]):
        assert time.monotonic() < deadline, problems
        time.sleep(0.2)
    return problems


def test_an_http_server_that_stops_answering_is_a_problem_in_health_until_it_answers_again(
    pulsar_broker: EmbeddedBroker, tmp_path: Path, host_process: Callable[..., HostProcess], http_notes: HttpNotes,
) -> None:
    (tmp_path / "token").write_text(http_notes.token)
    config = f'[mcp-servers.web]\nurl = "{http_notes.url}"\ntoken-file = "{tmp_path / "token"}"\nstart-timeout = 60\n'
    env, metrics = user_env(pulsar_broker, tmp_path, config), free_port()
    host = host_process("--metrics-port", str(metrics), env=env)
    host.wait_for("announced")
    assert call(env, "remember", "key=k", "text=v") == "remembered k"
    assert health(metrics)["problems"] == []

    http_notes.stop()
    tghost_cli("call", "recall", "key=k", "--timeout", "5", env=env)  # fails: its lost connection pings at once
    (problem,) = problems_until(metrics, bool)
    assert f"MCP server 'web' does not answer at {http_notes.url}" in problem and "reconnecting in" in problem
    assert "recall" in {row["name"] for row in json.loads(tghost_cli("tools", "--json", env=env).stdout)}
    refused = tghost_cli("call", "recall", "key=k", env=env)
    assert refused.returncode == 1 and "unavailable" in refused.stderr, refused.stderr

    http_notes.start()
    problems_until(metrics, lambda problems: not problems)
    assert call(env, "recall", "key=k") == "nothing remembered under k"  # the server's new process
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0
