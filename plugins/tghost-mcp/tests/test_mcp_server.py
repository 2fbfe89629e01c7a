"""server: a mounted MCP server against real ones (the notes server on stdio and on streamable
HTTP, written with the SDK's MCPServer), with no broker: its start and why one fails, calls with
progress and cancel, tools/list_changed, and a server that crashes, is killed or stops answering,
then comes back."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tghost_mcp.server
from mcp import types
from mcp_helpers import HttpNotes, eventually, free_port, notes_table
from tghost_mcp.server import MountedServer
from tghost_mcp.settings import ServerSettings

import tghost
from tghost.protocol import UNAVAILABLE, Progress


class Heard:
    """A listener that keeps what it was told: each listing's tool names, each problem."""

    def __init__(self) -> None:
        self.listings: list[list[str]] = []
        self.problems: list[str] = []

    def up(self, tools: list[types.Tool]) -> None:
        self.listings.append([tool.name for tool in tools])

    def down(self, problem: str) -> None:
        self.problems.append(problem)


def mounted(table: dict[str, Any], heard: Heard, name: str = "notes") -> MountedServer:
    server = MountedServer(name, ServerSettings.of(name, table), heard)
    server.start()
    return server


@pytest.fixture
def heard() -> Heard:
    return Heard()


@pytest.fixture
def notes(heard: Heard, notes_log: Path) -> Iterator[MountedServer]:
    """The notes server on stdio, started; stopped at the end."""
    server = mounted(notes_table(env={"NOTES_LOG": str(notes_log)}), heard)
    try:
        yield server
    finally:
        server.stop()


def text(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def test_a_started_server_lists_its_tools_and_answers_calls(notes: MountedServer, heard: Heard) -> None:
    (listing,) = heard.listings
    assert {"remember", "recall", "word_count", "say hello", "crash"} <= set(listing)
    assert text(await notes.call("remember", {"key": "k", "text": "v"}, None)) == "remembered k"
    assert text(await notes.call("recall", {"key": "k"}, None)) == "v"
    counted = await notes.call("word_count", {"text": "a bb ccc"}, None)
    assert counted.structured_content == {"words": 3, "longest": "ccc"}
    failed = await notes.call("fail", {"reason": "out of ink"}, None)
    assert failed.is_error and text(failed) == "Error executing tool fail: out of ink"
    unknown = await notes.call("nope", {}, None)
    assert unknown.is_error and text(unknown) == "Unknown tool: nope"


async def test_progress_notifications_reach_the_calls_context(notes: MountedServer) -> None:
    updates: list[Progress] = []
    context = tghost.Context(user="ada", report=updates.append)
    assert text(await notes.call("progress", {"steps": 3}, context)) == "done in 3 steps"
    assert updates == [Progress(1, 3, "step 1"), Progress(2, 3, "step 2"), Progress(3, 3, "step 3")]


async def test_cancelling_a_call_cancels_the_request_on_the_server(notes: MountedServer, notes_log: Path) -> None:
    call = asyncio.ensure_future(notes.call("sleep", {"seconds": 60}, None))
    await eventually(lambda: "sleeping" in notes_log.read_text(), "the server sleeps")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await eventually(lambda: "cancelled" in notes_log.read_text(), "the server heard notifications/cancelled")
    assert text(await notes.call("recall", {"key": "k"}, None)) == "nothing remembered under k"  # still up


async def test_a_list_changed_notification_lists_the_tools_again(notes: MountedServer, heard: Heard) -> None:
    assert text(await notes.call("grow", {"name": "echo"}, None)) == "added echo"
    listing = await eventually(lambda: heard.listings[1:], "a second listing")
    assert "echo" in listing[0] and "echo" not in heard.listings[0]
    assert text(await notes.call("echo", {"text": "hi"}, None)) == "hi"


async def test_a_crash_ends_calls_in_flight_unavailable_and_the_server_is_started_again(
    notes: MountedServer, heard: Heard, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "tghost_mcp")
    sleeping = asyncio.ensure_future(notes.call("sleep", {"seconds": 60}, None))
    await asyncio.sleep(0.2)
    with pytest.raises(tghost.ToolError) as crashed:
        await notes.call("crash", {"code": 3}, None)
    with pytest.raises(tghost.ToolError) as cut:
        await sleeping
    for error in (crashed.value, cut.value):
        assert error.error_type == UNAVAILABLE
        assert str(error).startswith("MCP server 'notes' went down during the call")
    assert await eventually(lambda: heard.problems, "the server went down") == ["exited; restarting in 1 s"]
    (logged,) = [r.getMessage() for r in caplog.records if "exited" in r.getMessage()]
    assert logged.startswith("MCP server 'notes' exited; restarting in 1 s; its stderr ended: \"")
    assert logged.endswith('| notes: starting | notes: crashing on purpose with code 3"')
    await eventually(lambda: len(heard.listings) == 2, "the server started again")
    assert text(await notes.call("recall", {"key": "k"}, None)) == "nothing remembered under k"
    assert any("MCP server 'notes' is back" in r.getMessage() for r in caplog.records)


async def test_while_it_is_down_a_call_is_unavailable_at_once(notes: MountedServer, heard: Heard) -> None:
    os.kill(int(text(await notes.call("pid", {}, None))), signal.SIGKILL)
    await eventually(lambda: heard.problems, "the server went down")
    if len(heard.listings) == 1:  # not back yet
        with pytest.raises(tghost.ToolError, match=r"^MCP server 'notes' is down \(exited; restarting in 1 s\)"):
            await notes.call("recall", {"key": "k"}, None)
    await eventually(lambda: len(heard.listings) == 2, "the server started again")
    assert text(await notes.call("recall", {"key": "k"}, None)) == "nothing remembered under k"


@pytest.mark.parametrize(("table", "says"), [
    ({"command": "no-such-mcp-server"},
     "the MCP server cannot start: command 'no-such-mcp-server' not found; install it, or give its full path in "
     "[mcp-servers.notes] command"),
    (notes_table(cwd="/no/such/dir"),
     "the MCP server cannot start: its cwd '/no/such/dir' is no directory ([mcp-servers.notes] cwd)"),
    ({"command": sys.executable, "args": ["-c", "import sys; print('no API key', file=sys.stderr); sys.exit(2)"]},
     'the MCP server exited before it answered; its stderr ended: "no API key"'),
    ({"command": sys.executable, "args": ["-c", "import sys, time; print('waiting', file=sys.stderr); time.sleep(60)"],
      "start-timeout": 1},
     "the MCP server did not complete MCP's initialize and tools/list within 1 s (start-timeout in "
     '[mcp-servers.notes]); its stderr ended: "waiting"'),
    ({"url": f"http://127.0.0.1:{free_port()}/mcp"}, "the MCP server does not answer at http://127.0.0.1:"),
])
def test_a_server_that_does_not_start_says_why(table: dict[str, Any], says: str, heard: Heard) -> None:
    with pytest.raises(RuntimeError) as failed:
        mounted(table, heard)
    assert str(failed.value).startswith(says), str(failed.value)
    assert heard.listings == []


def test_an_http_server_gets_the_bearer_token_of_its_token_file(
    http_notes: HttpNotes, heard: Heard, tmp_path: Path,
) -> None:
    token = tmp_path / "token"
    with pytest.raises(RuntimeError, match=r"^the MCP server cannot read the token file .*: No such file"):
        mounted({"url": http_notes.url, "token-file": str(token)}, heard)
    token.write_text("wrong\n")
    with pytest.raises(RuntimeError, match=r"^the MCP server answered HTTP 401 Unauthorized at .*; check its token"):
        mounted({"url": http_notes.url, "token-file": str(token)}, heard)
    token.write_text(http_notes.token + "\n")
    server = mounted({"url": http_notes.url, "token-file": str(token)}, heard)
    server.stop()
    assert "recall" in heard.listings[0]


async def test_an_http_server_that_stops_answering_is_down_until_it_answers_again(
    http_notes: HttpNotes, heard: Heard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tghost_mcp.server, "PING_INTERVAL", 0.5)
    (tmp_path / "token").write_text(http_notes.token)
    server = mounted({"url": http_notes.url, "token-file": str(tmp_path / "token")}, heard)
    try:
        assert text(await server.call("remember", {"key": "k", "text": "v"}, None)) == "remembered k"
        sleeping = asyncio.ensure_future(server.call("sleep", {"seconds": 60}, None))
        await asyncio.sleep(0.2)
        http_notes.stop()
        with pytest.raises(tghost.ToolError) as cut:
            await sleeping
        assert cut.value.error_type == UNAVAILABLE
        problem = await eventually(lambda: heard.problems, "the server is down")
        assert problem[0].startswith(f"does not answer at {http_notes.url}")
        assert server.problem is not None and "reconnecting in" in server.problem
        http_notes.start()
        await eventually(lambda: len(heard.listings) == 2, "the server answers again")
        assert server.problem is None
        assert text(await server.call("recall", {"key": "k"}, None)) == "nothing remembered under k"  # a new process
    finally:
        server.stop()
