"""mcp: ``tghost mcp`` as an MCP client sees it, with the SDK's own client, over a live host
and the embedded broker."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.transport_security import TransportSecurityMiddleware
from mcp.shared.exceptions import MCPError
from mcp.shared.memory import create_client_server_memory_streams
from starlette.requests import Request

import tghost
from tests.cli.test_cli import ECHO, SHOUT
from tests.conftest import HostProcess, PluginDir, tghost_cli
from tests.test_docs import ROOT, block, commands
from tghost import ToolDescriptor
from tghost.adapters.mcp import (
    CALL_TOOL,
    PAGE_SIZE,
    SEARCH_TOOLS,
    Bridge,
    Selection,
    meta_tools,
    page,
    transport_security,
)
from tghost.adapters.web import allowed_host_patterns, is_allowed_host
from tghost.agent.directory import ToolDirectory
from tghost.broker import EmbeddedBroker
from tghost.pulsar.clients import PulsarSettings
from tghost.system.net import free_port
from tghost.testing import LocalHost


@pytest.fixture
def env(pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, tmp_path: Path) -> dict[str, str]:
    """The ECHO plugin installed, this broker, a fresh descriptors topic, a private config dir."""
    plugin_dir.add("echo", ECHO)
    return plugin_dir.user_env(pulsar_broker.url, tmp_path / "config", "mcp")


class Notifications:
    """Collects the server's ``notifications/tools/list_changed`` for a ClientSession."""

    def __init__(self) -> None:
        self.list_changed = asyncio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.list_changed.set()


@asynccontextmanager
async def mcp_client(env: dict[str, str], *args: str,
                     notifications: Notifications | None = None) -> AsyncIterator[ClientSession]:
    """``tghost mcp ARGS`` as a stdio MCP server, and an initialized SDK client session on it."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "tghost", "mcp", *args], env=env)
    async with stdio_client(params) as (read, write), \
            ClientSession(read, write, message_handler=notifications) as session:
        await session.initialize()
        yield session


def text(result: types.CallToolResult) -> str:
    (content,) = result.content
    assert isinstance(content, types.TextContent)
    return content.text


async def test_lists_the_default_groups_tools_with_their_schemas(
        env: dict[str, str], host_process: Callable[..., HostProcess]) -> None:
    host = host_process(env=env)
    host.wait_for("announced")
    async with mcp_client(env) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        capabilities = session.initialize_result.capabilities if session.initialize_result else None
    assert capabilities is not None and capabilities.tools is not None and capabilities.tools.list_changed
    assert set(tools) == {"echo", "unhurried", "failing"}  # ask-staff is in group hr only
    echo = tools["echo"]
    assert echo.description == "Echo the text back."
    assert echo.input_schema["required"] == ["text"]
    assert echo.input_schema["properties"]["text"]["type"] == "string"
    assert echo.annotations is not None and echo.annotations.title == "Echo"
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


async def test_calls_a_tool_over_pulsar_and_errors_come_back_as_is_error(
        env: dict[str, str], host_process: Callable[..., HostProcess]) -> None:
    host = host_process(env=env)
    host.wait_for("announced")
    async with mcp_client(env, "--group", "hr", "--group", "default") as session:
        echoed = await session.call_tool("echo", {"text": "hello over MCP"})
        asked = await session.call_tool("ask-staff", {"question": "holidays?"})
        failed = await session.call_tool("failing", {})
        invalid = await session.call_tool("echo", {})
        unknown = await session.call_tool("no-such-tool", {})
    assert (echoed.is_error, text(echoed)) == (False, "hello over MCP")
    assert (asked.is_error, text(asked)) == (False, "staff says: holidays?")  # the tool's config merged in
    assert failed.is_error and text(failed) == "tool-service-error: RuntimeError: out of coffee"
    assert invalid.is_error and text(invalid).startswith("invalid-arguments:")
    assert unknown.is_error and text(unknown).startswith("unknown-tool:")
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


async def test_a_tool_whose_host_left_is_an_error_saying_no_live_host_serves_it(
        env: dict[str, str], host_process: Callable[..., HostProcess]) -> None:
    host = host_process("--host-id", "gone", env=env)
    host.wait_for("announced")
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0  # withdrawn: the bridge's directory remembers who announced it
    async with mcp_client(env) as session:
        started = time.monotonic()
        left = await session.call_tool("echo", {"text": "anyone?"})
        typo = await session.call_tool("ecno", {"text": "anyone?"})
    assert time.monotonic() - started < 10  # at once, not after the call's timeout
    assert left.is_error and text(left).startswith(
        "no-provider: no live host serves tool 'echo': host(s) gone announced it lately")
    assert typo.is_error and text(typo) == ("unknown-tool: no live tool named 'ecno'; did you mean 'echo' (no live "
                                            "host serves it)? find one with tools/list")


async def test_a_tool_outside_the_bridges_groups_is_refused(
        env: dict[str, str], host_process: Callable[..., HostProcess]) -> None:
    host = host_process(env=env)
    host.wait_for("announced")
    async with mcp_client(env) as session:
        refused = await session.call_tool("ask-staff", {"question": "holidays?"})
    assert refused.is_error and text(refused).startswith("not-allowed: tool 'ask-staff' is in groups ['hr']")
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


async def test_a_second_host_with_a_new_plugin_sends_list_changed_and_the_new_tool(
        env: dict[str, str], plugin_dir: PluginDir, host_process: Callable[..., HostProcess]) -> None:
    first = host_process("--host-id", "first", env=env)
    first.wait_for("announced")
    notifications = Notifications()
    async with mcp_client(env, notifications=notifications) as session:
        before = {tool.name for tool in (await session.list_tools()).tools}
        assert "shout" not in before and not notifications.list_changed.is_set()
        plugin_dir.add("shout", SHOUT)  # "pip install" a plugin, then start a second host
        second = host_process("--host-id", "second", env=env)
        await asyncio.to_thread(second.wait_for, "announced")
        await asyncio.wait_for(notifications.list_changed.wait(), 20)
        after = {tool.name for tool in (await session.list_tools()).tools}
        shouted = await session.call_tool("shout", {"text": "hey"})
    assert after == before | {"shout"}
    assert text(shouted) == "HEY"
    for host in (second, first):
        host.process.send_signal(signal.SIGINT)
        assert host.finish() == 0


def wait_for_port(port: int, process: subprocess.Popen[str], timeout: float = 30.0) -> None:
    """Wait until something accepts connections on 127.0.0.1:``port``, or fail if ``process`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on port {port} (exit code {process.poll()})")


async def test_streamable_http_transport_lists_and_calls(
        env: dict[str, str], host_process: Callable[..., HostProcess]) -> None:
    host = host_process(env=env)
    host.wait_for("announced")
    port = free_port()
    bridge = subprocess.Popen([sys.executable, "-m", "tghost", "mcp", "--transport", "http", "--port", str(port)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        await asyncio.to_thread(wait_for_port, port, bridge)
        async with streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write), \
                ClientSession(read, write) as session:
            initialized = await session.initialize()
            tools = {tool.name for tool in (await session.list_tools()).tools}
            echoed = await session.call_tool("echo", {"text": "over HTTP"})
        assert initialized.capabilities.tools is not None and initialized.capabilities.tools.list_changed
        assert tools == {"echo", "unhurried", "failing"}
        assert (echoed.is_error, text(echoed)) == (False, "over HTTP")
    finally:
        bridge.send_signal(signal.SIGINT)
        out, err = bridge.communicate(timeout=30)
    assert bridge.returncode == 0, err
    assert out == ""  # HTTP mode writes nothing to stdout either
    assert f"over MCP's streamable HTTP at http://localhost:{port}/mcp (Ctrl-C to stop)" in err  # says where
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


#: Starts ``tghost mcp --transport http`` with more args; gives the process and its port.
StartBridge = Callable[..., tuple[HostProcess, int]]


#: The bearer token of a bridge bound off loopback, and the header that carries it.
TOKEN = "s3cret-" + uuid.uuid4().hex
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def http_bridge(env: dict[str, str], host_process: Callable[..., HostProcess], tmp_path: Path) -> StartBridge:
    """Start ``tghost mcp --transport http --port P ARGS`` (P free; with ``--token-file`` holding
    :data:`TOKEN` when bound off loopback) and wait until it listens; returns the process and P.
    Any still running at the end is killed."""
    token_file = tmp_path / "mcp-token"
    token_file.write_text(f"{TOKEN}\n")

    def start(*args: str) -> tuple[HostProcess, int]:
        port = free_port()
        if "0.0.0.0" in args:
            args = (*args, "--token-file", str(token_file))
        bridge = host_process("--transport", "http", "--port", str(port), *args, env=env, command=("mcp",))
        wait_for_port(port, bridge.process)
        return bridge, port

    return start


#: A handshake-era ``initialize``, which the bridge answers 200 when the headers pass.
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "probe", "version": "0"}}}


async def post_initialize(port: int, headers: dict[str, str]) -> httpx2.Response:
    """POST :data:`INITIALIZE` to the bridge at 127.0.0.1:``port`` with these extra headers."""
    async with httpx2.AsyncClient() as client:
        return await client.post(f"http://127.0.0.1:{port}/mcp", json=INITIALIZE,
                                 headers={"Accept": "application/json, text/event-stream", **headers})


@asynccontextmanager
async def http_session(port: int, headers: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    """An initialized SDK client session with the bridge at 127.0.0.1:``port``, sending ``headers``."""
    async with httpx2.AsyncClient(headers=headers) as http, \
            streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


def stop(bridge: HostProcess) -> str:
    """Ctrl-C the bridge; returns its whole log once it exited 0."""
    bridge.process.send_signal(signal.SIGINT)
    assert bridge.finish() == 0, bridge.log
    return bridge.log


async def test_http_on_every_interface_refuses_a_foreign_host_header_with_421(http_bridge: StartBridge) -> None:
    bridge, port = http_bridge("--host", "0.0.0.0")
    refused = await post_initialize(port, {"Host": "evil.example.com", **AUTH})
    assert (refused.status_code, refused.text) == (421, "Invalid Host header")
    stop(bridge)


async def test_http_on_every_interface_refuses_a_foreign_origin_with_403(http_bridge: StartBridge) -> None:
    bridge, port = http_bridge("--host", "0.0.0.0", "--allowed-host", "mcp.example.com:*")
    refused = await post_initialize(port, {"Host": f"mcp.example.com:{port}", "Origin": "http://evil.example.com",
                                           **AUTH})
    assert (refused.status_code, refused.text) == (403, "Invalid Origin header")
    stop(bridge)


async def test_http_on_every_interface_serves_an_allowed_host_and_its_https_origin(http_bridge: StartBridge) -> None:
    bridge, port = http_bridge("--host", "0.0.0.0", "--allowed-host", "other.example.com",
                               "--allowed-host", "mcp.example.com:*")
    name = f"mcp.example.com:{port}"
    async with http_session(port, {"Host": name, "Origin": f"https://{name}", **AUTH}) as session:
        server = session.initialize_result.server_info if session.initialize_result else None
        listed = await session.list_tools()
    assert server is not None and server.name == "tghost"
    assert listed.tools == []  # no host runs: the round trip, not the tools, is the point here
    stop(bridge)


async def test_http_on_every_interface_with_allowed_hosts_still_serves_loopback_names(http_bridge: StartBridge) -> None:
    bridge, port = http_bridge("--host", "0.0.0.0", "--allowed-host", "mcp.example.com")
    for name in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
        async with http_session(port, {"Host": name, "Origin": f"http://{name}", **AUTH}) as session:
            assert (await session.list_tools()).tools == []
    stop(bridge)


async def test_http_off_loopback_without_allowed_hosts_warns_once_and_serves_loopback(http_bridge: StartBridge) -> None:
    bridge, port = http_bridge("--host", "0.0.0.0")
    async with http_session(port, AUTH) as session:
        assert (await session.list_tools()).tools == []
    log = stop(bridge)
    warnings = [line for line in log.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, log
    assert "only loopback Host names" in warnings[0] and "--allowed-host" in warnings[0]


async def test_http_on_loopback_without_allowed_hosts_does_not_warn(http_bridge: StartBridge) -> None:
    bridge, port = http_bridge()
    async with http_session(port) as session:
        assert (await session.list_tools()).tools == []
    assert "WARNING" not in stop(bridge)


def test_http_off_loopback_without_a_token_file_refuses_to_start_saying_how_to_make_one() -> None:
    result = tghost_cli("mcp", "--transport", "http", "--host", "0.0.0.0", "--pulsar-url", "pulsar://127.0.0.1:1")
    assert result.returncode == 2, result.stderr
    assert "--host 0.0.0.0 makes the MCP bridge reachable from other machines: give --token-file FILE" in result.stderr


async def test_http_with_a_token_answers_401_without_it_or_with_a_wrong_one_and_serves_the_right_one(
    http_bridge: StartBridge,
) -> None:
    bridge, port = http_bridge("--host", "0.0.0.0")
    missing = await post_initialize(port, {})
    wrong = await post_initialize(port, {"Authorization": "Bearer not-the-token"})
    right = await post_initialize(port, AUTH)
    assert (missing.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    async with http_session(port, AUTH) as session:
        assert (await session.list_tools()).tools == []
    stop(bridge)


def test_an_allowed_host_given_as_a_url_is_a_usage_error_naming_the_option() -> None:
    result = tghost_cli("mcp", "--transport", "http", "--pulsar-url", "pulsar://127.0.0.1:1",
                        env={**os.environ, "TGHOST_MCP_ALLOWED_HOSTS": "mcp.example.com,https://mcp.example.com"})
    assert result.returncode == 2, result.stderr
    assert "--allowed-host / TGHOST_MCP_ALLOWED_HOSTS" in result.stderr
    assert "'https://mcp.example.com' is not a Host header value" in result.stderr


@pytest.mark.parametrize("allowed", [(), ("mcp.example.com",), ("mcp.example.com:8765",), ("mcp.example.com:*",)])
async def test_the_bridge_and_the_inspector_answer_the_same_host_headers(allowed: tuple[str, ...]) -> None:
    """The inspector's check (:func:`tghost.adapters.web.is_allowed_host`, no SDK) accepts what the
    SDK's checker accepts for the bridge, with the same ``--allowed-host`` names."""
    sdk = TransportSecurityMiddleware(transport_security(allowed))
    for host in ("127.0.0.1", "127.0.0.1:8766", "localhost:1", "[::1]:8765", "[::1]", "mcp.example.com",
                 "mcp.example.com:8765", "mcp.example.com:80", "MCP.example.com", "evil.example.com",
                 "localhost.evil.com", "127.0.0.1.evil.com:8765", "mcp.example.com.evil.com", ""):
        request = Request({"type": "http", "method": "GET", "headers": [(b"host", host.encode())] if host else []})
        assert is_allowed_host(host, allowed_host_patterns(allowed)) == (await sdk.validate_request(request) is None), \
            (allowed, host)


async def test_a_session_is_remembered_from_its_handshake_until_its_connection_closes(
        pulsar_broker: EmbeddedBroker) -> None:
    topic = f"persistent://tg/config/mcp-{uuid.uuid4().hex[:8]}"
    async with ToolDirectory(PulsarSettings(pulsar_broker.url), topic) as directory, \
            create_client_server_memory_streams() as (client_streams, (read, write)):
        bridge = Bridge(directory, None, None)
        async with anyio.create_task_group() as group:
            group.start_soon(bridge.server.run, read, write, bridge.server.create_initialization_options())
            async with ClientSession(*client_streams) as session:
                assert bridge.sessions == set()
                await session.initialize()
                assert (await session.list_tools()).tools == []
                assert len(bridge.sessions) == 1
            group.cancel_scope.cancel()  # the connection ends
    assert bridge.sessions == set()


def test_mcp_without_a_broker_says_how_to_start_one() -> None:
    result = tghost_cli("mcp", "--pulsar-url", "pulsar://127.0.0.1:1", "--connect-timeout", "0")  # else it waits 30 s
    assert result.returncode == 1 and result.stdout == ""
    assert "no Pulsar broker answers at pulsar://127.0.0.1:1" in result.stderr


async def test_the_readme_search_command_and_tool_search_client_config_find_and_call_a_tool(
        env: dict[str, str], host_process: Callable[..., HostProcess]) -> None:
    """docs/guides/search.md: its 'tghost tools --search' command, and its MCP client
    config run as a client runs it (the command and args from the JSON, over stdio)."""
    host = host_process(env=env)
    host.wait_for("announced")
    jokes = host_process(env={**env, "TGHOST_DISABLE_PLUGINS": "", "TGHOST_LOAD_PLUGINS": "joke"})
    jokes.wait_for("announced")
    [(argv, _)] = commands("docs/guides/search.md", 'tghost tools --search "joke about cats" --limit 3      '
                                        "# add --json for the same rows as 'tghost tools --json', with a score")
    searched = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert searched.returncode == 0, searched.stderr
    assert searched.stdout.splitlines()[1].startswith("tell-joke"), searched.stdout
    config = json.loads(block("docs/guides/search.md", '{"mcpServers": {"tghost-search": {"command": "tghost", "args": '
                                           '["mcp", "--tool-search", "--group", "*"],'))
    server = config["mcpServers"]["tghost-search"]
    assert server["command"] == "tghost"
    async with mcp_client(env, *server["args"][1:]) as session:
        listed = [tool.name for tool in (await session.list_tools()).tools]
        found = json.loads(text(await session.call_tool("search_tools", {"query": "echo the text back"})))
        called = await session.call_tool("call_tool", {"name": found[0]["name"], "arguments": {"text": "hi"}})
    assert listed == ["search_tools", "call_tool"] and found[0]["name"] == "echo" and text(called) == "hi"
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


@pytest.mark.parametrize("command", [("mcp", "--transport", "http"), ("inspect",)])
def test_a_port_in_use_is_a_clear_error_not_a_server_log(env: dict[str, str], command: tuple[str, ...]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = tghost_cli(*command, "--port", str(port), env=env)
    what = "the MCP bridge" if command[0] == "mcp" else "the inspector"
    assert result.returncode == 1 and result.stderr.startswith(
        f"Error: cannot serve {what} on 127.0.0.1:{port}: Address already in use; choose another --port"), result.stderr
    assert "uvicorn" not in result.stderr


# -- title, hints and typed results ---------------------------------------------------------------

#: The output schema of NOTES' ``read-notes`` tool.
READ_SCHEMA = {"type": "object", "required": ["notes", "count"],
               "properties": {"notes": {"type": "array", "items": {"type": "string"}}, "count": {"type": "integer"}}}
#: A notebook whose three tools declare hints as tool keys: ``read-notes`` (read-only, with a
#: title and an output schema: it answers JSON text), ``delete-notes`` and ``admin-purge``
#: (destructive).
NOTES = f"READ_SCHEMA = {READ_SCHEMA!r}\n" + """
import json
import tghost

class Notes(tghost.ToolService):
    id = "notes"
    description = "A notebook."
    config_params = ["action"]

    def invoke(self, user, config, arguments):
        if config["action"] == "read":
            return json.dumps({"notes": ["buy milk"], "count": 1})
        return f"{config['action']}: done"

@tghost.hookimpl
def tghost_register_services(register):
    register(Notes())

@tghost.hookimpl
def tghost_register_tools(register):
    notes = Notes()
    register(notes.tool("read-notes", "Read every note.", action="read", title="Read the notes",
                        annotations={"read-only": True, "idempotent": True, "open-world": False},
                        **{"output-schema": READ_SCHEMA}))
    register(notes.tool("delete-notes", "Delete every note.", action="delete",
                        annotations={"destructive": True, "idempotent": True}))
    register(notes.tool("admin-purge", "Purge the notebook's store.", action="purge",
                        annotations={"destructive": True}))
"""


@pytest.fixture
def notes_host(env: dict[str, str], plugin_dir: PluginDir,
               host_process: Callable[..., HostProcess]) -> Iterator[dict[str, str]]:
    """A host serving ECHO and NOTES (announced); Ctrl-C'd and checked to exit 0 at the end.
    Gives the environment to run ``tghost mcp`` in."""
    plugin_dir.add("notes", NOTES)
    host = host_process(env=env)
    host.wait_for("announced")
    yield env
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


async def test_a_typed_tool_lists_its_title_hints_and_output_schema_and_answers_structured_content(
        notes_host: dict[str, str]) -> None:
    async with mcp_client(notes_host) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        read = await session.call_tool("read-notes", {})  # the SDK checks structuredContent against the schema
        deleted = await session.call_tool("delete-notes", {})
    notes = tools["read-notes"]
    assert notes.title == "Read the notes" and notes.output_schema == READ_SCHEMA
    assert notes.annotations == types.ToolAnnotations(title="Read the notes", read_only_hint=True,
                                                      idempotent_hint=True, open_world_hint=False)
    assert tools["delete-notes"].annotations == types.ToolAnnotations(title="Delete notes", destructive_hint=True,
                                                                      idempotent_hint=True)
    assert tools["echo"].annotations == types.ToolAnnotations(title="Echo") and tools["echo"].output_schema is None
    assert not read.is_error and read.structured_content == {"notes": ["buy milk"], "count": 1}
    assert json.loads(text(read)) == read.structured_content  # the same object as text, for clients of text
    assert (deleted.is_error, deleted.structured_content, text(deleted)) == (False, None, "delete: done")


#: docs/guides/mcp.md's MCP client config of a read-only view (its first line).
READ_ONLY_CONFIG = ('{"mcpServers": {"tghost-read-only": {"command": "tghost", "args": ["mcp", "--read-only", '
                    '"--group", "*",')


async def test_read_only_include_and_exclude_narrow_what_is_listed_and_called(notes_host: dict[str, str]) -> None:
    """Also docs/guides/mcp.md's read-only client config, run as a client runs it."""
    [server] = json.loads(block("docs/guides/mcp.md", READ_ONLY_CONFIG))["mcpServers"].values()
    assert server["command"] == "tghost" and "--read-only" in server["args"]
    async with mcp_client(notes_host, *server["args"][1:]) as session:
        read_only = {tool.name for tool in (await session.list_tools()).tools}
        destroyed = await session.call_tool("delete-notes", {})
        typo = await session.call_tool("delete-note", {})
        read = await session.call_tool("read-notes", {})
    async with mcp_client(notes_host, "--group", "*", "--include", "*-notes", "--include", "echo",
                          "--exclude", "delete-*") as session:
        narrowed = {tool.name for tool in (await session.list_tools()).tools}
        excluded = await session.call_tool("delete-notes", {})
        not_included = await session.call_tool("admin-purge", {})
        echoed = await session.call_tool("echo", {"text": "in"})
    assert read_only == {"read-notes"}  # echo sets no hints: not read-only either
    assert destroyed.is_error and text(destroyed) == (
        "unknown-tool: tool 'delete-notes' is outside this bridge's set (it is not hinted read-only, and only "
        "read-only tools are served here); find one with tools/list")
    assert typo.is_error and "delete-notes" not in text(typo)  # a hidden tool is never suggested
    assert typo.is_error and "delete-notes" not in text(typo)  # a hidden tool is never suggested
    assert not read.is_error and read.structured_content == {"notes": ["buy milk"], "count": 1}
    assert narrowed == {"read-notes", "echo"}
    assert excluded.is_error and text(excluded) == ("unknown-tool: tool 'delete-notes' is outside this bridge's set "
                                                    "(its name matches the excluded 'delete-*'); find one with "
                                                    "tools/list")
    assert not_included.is_error and "its name matches none of the included '*-notes', 'echo'" in text(not_included)
    assert text(echoed) == "in"


def test_call_tool_is_hinted_read_only_when_every_tool_it_calls_is() -> None:
    assert meta_tools([], None, read_only=True)[1]["annotations"] == {"title": "Call a tool", "readOnlyHint": True}
    assert meta_tools([], None)[1]["annotations"] == {"title": "Call a tool"}


def test_the_mcp_help_and_guide_say_the_page_size() -> None:
    result = tghost_cli("mcp", "--help")
    assert f"at most {PAGE_SIZE} a page" in " ".join(result.stdout.split())
    assert f"in pages of at most {PAGE_SIZE} tools" in " ".join((ROOT / "docs/guides/mcp.md").read_text().split())


# -- pages -------------------------------------------------------------------------------------------


class Numbered(tghost.ToolService):
    """A service whose tools are named by the test; every call answers ``ok``."""

    id = "numbered"
    description = "Numbered tools."

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        return "ok"


def numbered(*names: str, **fields: Any) -> list[ToolDescriptor]:
    """Tools of :class:`Numbered` with these names (and fields)."""
    return [Numbered().tool(name, f"The tool {name}.", **fields) for name in names]


def mcp_topic() -> str:
    return f"persistent://tg/config/mcp-{uuid.uuid4().hex[:8]}"


@asynccontextmanager
async def bridge_session(bridge: Bridge, notifications: Notifications | None = None) -> AsyncIterator[ClientSession]:
    """An initialized SDK client session with ``bridge`` in this process (memory streams), its
    :meth:`Bridge.follow` running."""
    async with create_client_server_memory_streams() as (client_streams, (read, write)), \
            anyio.create_task_group() as group:
        group.start_soon(bridge.server.run, read, write, bridge.server.create_initialization_options())
        group.start_soon(bridge.follow)
        async with ClientSession(*client_streams, message_handler=notifications) as session:
            await session.initialize()
            yield session
        group.cancel_scope.cancel()


async def pages(session: ClientSession, cursor: str | None = None) -> list[list[str]]:
    """The tool names of each page of ``tools/list``, from ``cursor`` (the first page without) to the last."""
    found: list[list[str]] = []
    while True:
        listed = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
        found.append([tool.name for tool in listed.tools])
        if listed.next_cursor is None:
            return found
        cursor = listed.next_cursor


async def test_250_tools_come_in_3_pages_and_a_list_that_changes_between_pages_loses_and_repeats_none(
        pulsar_broker: EmbeddedBroker) -> None:
    where = mcp_topic()
    names = [f"tool-{i:03}" for i in range(250)]
    async with LocalHost(pulsar_broker.url, [Numbered()], tools=numbered(*names[:99], *names[100:]),
                         announce_as="many", topic=where), \
            ToolDirectory(PulsarSettings(pulsar_broker.url), where) as directory:
        async with LocalHost(pulsar_broker.url, [Numbered()], tools=numbered(names[99]), announce_as="one",
                             topic=where):
            for name in names:
                await directory.wait_for(name)
            async with bridge_session(Bridge(directory, None, None)) as session:
                whole = await pages(session)
                first = await session.list_tools()
        await directory.wait_for(names[99], present=False)  # the last name the first page gave is gone
        async with LocalHost(pulsar_broker.url, [Numbered()], tools=numbered("tool-150a", "tool-050a"),
                             announce_as="new", topic=where):
            await directory.wait_for("tool-150a")
            await directory.wait_for("tool-050a")
            async with bridge_session(Bridge(directory, None, None)) as session:
                rest = await pages(session, first.next_cursor)
    assert [len(names_of_page) for names_of_page in whole] == [100, 100, 50]
    assert [name for names_of_page in whole for name in names_of_page] == names  # sorted, each once
    assert [tool.name for tool in first.tools] == names[:100] and first.next_cursor is not None
    assert [len(names_of_page) for names_of_page in rest] == [100, 51]
    assert [name for names_of_page in rest for name in names_of_page] == sorted([*names[100:], "tool-150a"])
    # tool-050a sorts before the cursor: not on the pages after it


async def test_an_invalid_cursor_is_an_invalid_params_error_saying_to_list_again(pulsar_broker: EmbeddedBroker) -> None:
    async with ToolDirectory(PulsarSettings(pulsar_broker.url), mcp_topic()) as directory, \
            bridge_session(Bridge(directory, None, None)) as session:
        with pytest.raises(MCPError) as raised:
            await session.list_tools(params=types.PaginatedRequestParams(cursor="not-a-cursor"))
    assert raised.value.code == types.INVALID_PARAMS == -32602
    assert raised.value.message == ("invalid cursor 'not-a-cursor': it is not one this server gave; list the tools "
                                    "again without a cursor")


def test_a_page_is_the_tools_after_the_cursors_name() -> None:
    tools = numbered("a", "b", "c", "d", "e")
    first, cursor = page(tools, None, size=2)
    assert [t.name for t in first] == ["a", "b"] and cursor is not None
    second, cursor = page([t for t in tools if t.name != "b"], cursor, size=2)  # b left meanwhile
    assert [t.name for t in second] == ["c", "d"] and cursor is not None
    third, last = page(tools, cursor, size=2)
    assert [t.name for t in third] == ["e"] and last is None
    assert page(tools, None, size=5) == (tools, None)  # a full last page has no next
    assert page([], None) == ([], None)


@pytest.mark.parametrize("cursor", ["", "***", base64.urlsafe_b64encode(b"not json").decode(),
                                    base64.urlsafe_b64encode(b'{"before": "x"}').decode(),
                                    base64.urlsafe_b64encode(b'{"after": 5}').decode()])
def test_a_cursor_that_is_not_a_name_in_base64url_json_is_refused(cursor: str) -> None:
    with pytest.raises(MCPError) as raised:
        page(numbered("a"), cursor)
    assert raised.value.code == types.INVALID_PARAMS and "list the tools again without a cursor" in raised.value.message


# -- the selection and --tool-search -----------------------------------------------------------


def test_a_selection_refuses_by_exclude_then_include_then_read_only() -> None:
    [plain] = numbered("notes-write")
    [reader] = numbered("notes-read", annotations={"read-only": True})
    selection = Selection(read_only=True, include=("notes-*",), exclude=("*-write", "*-purge"))
    assert selection.refusal("notes-read", reader) is None
    assert selection.refusal("notes-write", plain) == "its name matches the excluded '*-write'"
    assert selection.refusal("echo", None) == "its name matches none of the included 'notes-*'"
    assert Selection(read_only=True).refusal("notes-write", plain) == (
        "it is not hinted read-only, and only read-only tools are served here")
    assert Selection(read_only=True).refusal("not-live", None) is None  # the directory says it is unknown
    assert Selection().select([plain, reader]) == [plain, reader] and not Selection().narrows
    assert Selection(include=("NOTES-*",)).select([plain, reader]) == []  # case-sensitive


def test_search_tools_description_names_the_count_and_the_groups() -> None:
    def described(tools: list[ToolDescriptor], groups: list[str] | None, read_only: bool = False) -> str:
        search, _ = meta_tools(tools, groups, read_only)
        return str(search["description"]).split(", the ones")[0]

    assert described([], None) == "Find, among the 0 tools of group default"
    assert described([], ["*"]) == "Find, among the 0 tools of any group"
    assert described(numbered("a", group=["default", "hr"]), None) == "Find, among the 1 tool of group default"
    assert described(numbered("a", "b", group=["research", "hr"]), ["*"], read_only=True) == (
        "Find, among the 2 read-only tools of groups hr and research")
    many = [tool for i in range(12) for tool in numbered(f"t{i}", group=[f"g{i:02}"])]
    assert described(many, ["*"]) == ("Find, among the 12 tools of groups g00, g01, g02, g03, g04, g05, g06, g07, "
                                      "g08, g09 and 2 more")


async def test_search_tools_description_follows_the_count_with_list_changed(pulsar_broker: EmbeddedBroker) -> None:
    where = mcp_topic()
    notifications = Notifications()
    async with LocalHost(pulsar_broker.url, [Numbered()], tools=numbered("tool-a", "tool-b"), announce_as="first",
                         topic=where), \
            ToolDirectory(PulsarSettings(pulsar_broker.url), where) as directory:
        await directory.wait_for("tool-b")
        bridge = Bridge(directory, ["default", "research"], None, tool_search=True)
        async with bridge_session(bridge, notifications) as session:
            before = {tool.name: tool for tool in (await session.list_tools()).tools}
            async with LocalHost(pulsar_broker.url, [Numbered()], tools=numbered("tool-c", group=["research"]),
                                 announce_as="second", topic=where):
                await asyncio.wait_for(notifications.list_changed.wait(), 20)
                after = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert list(before) == list(after) == [SEARCH_TOOLS, CALL_TOOL]
    assert str(before[SEARCH_TOOLS].description).startswith("Find, among the 2 tools of group default, the ones")
    assert str(after[SEARCH_TOOLS].description).startswith("Find, among the 3 tools of groups default and research,")


async def test_tool_search_finds_and_calls_only_the_tools_of_the_selection(pulsar_broker: EmbeddedBroker) -> None:
    where = mcp_topic()
    tools = [*numbered("notes-read", annotations={"read-only": True}, title="Read notes"),
             *numbered("notes-delete", annotations={"destructive": True})]
    async with LocalHost(pulsar_broker.url, [Numbered()], tools=tools, announce_as="notes", topic=where), \
            ToolDirectory(PulsarSettings(pulsar_broker.url), where) as directory:
        await directory.wait_for("notes-read")
        await directory.wait_for("notes-delete")
        bridge = Bridge(directory, None, None, tool_search=True, selection=Selection(read_only=True))
        async with bridge_session(bridge) as session:
            [search, _] = (await session.list_tools()).tools
            found = json.loads(text(await session.call_tool(SEARCH_TOOLS, {"query": "the tool notes"})))
            called = await session.call_tool(CALL_TOOL, {"name": "notes-read", "arguments": {}})
            refused = await session.call_tool(CALL_TOOL, {"name": "notes-delete", "arguments": {}})
    assert str(search.description).startswith("Find, among the 1 read-only tool of group default,")
    assert [match["name"] for match in found] == ["notes-read"]
    assert found[0]["title"] == "Read notes" and found[0]["annotations"]["readOnlyHint"] is True
    assert (called.is_error, text(called)) == (False, "ok")
    assert refused.is_error and text(refused) == (
        "unknown-tool: tool 'notes-delete' is outside this bridge's set (it is not hinted read-only, and only "
        "read-only tools are served here); find one with search_tools")
