"""progress: a tool's ``ctx.progress`` reaches the caller that asked for it (docs/protocol.md
§2.12), on the embedded broker: in the thread lane, on the event loop and from a worker process;
in order with a stream's chunks; paced to 10 a second; through ``ToolDirectory``, ``tghost
call`` and the MCP bridge. A caller that did not ask gets nothing new, and TrustGraph's own
client, sharing the response topic with one that did, gets its answer as before."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pty
import re
import subprocess
import sys
import uuid
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.shared.memory import create_client_server_memory_streams

from tests.conftest import PluginDir
from tests.test_docs import block
from tghost import Context, Progress
from tghost.adapters.mcp import Bridge
from tghost.agent.directory import ToolDirectory
from tghost.broker import EmbeddedBroker
from tghost.conformance import RawWire
from tghost.discovery.catalog import Catalog
from tghost.discovery.discover import discover
from tghost.protocol import wire
from tghost.pulsar.clients import PulsarSettings
from tghost.serving.executors.base import PROCESS, THREAD
from tghost.serving.settings import ServeSettings
from tghost.testing import LocalHost

#: More tools that report progress: async and streaming. (Pacing, and progress in each driver and
#: isolation mode: tests/serving/test_parity.py.)
MORE = '''
import asyncio

import tghost


@tghost.tool
async def survey(steps: int, ctx: tghost.Context) -> str:
    """Survey in steps (async), saying how far it has got."""
    for step in range(1, steps + 1):
        await asyncio.sleep(0.15)
        ctx.progress(step, steps)
    return "surveyed"


@tghost.tool
def chapters(count: int, ctx: tghost.Context):
    """Stream chapters, each announced by a progress update first."""
    import time
    for n in range(1, count + 1):
        time.sleep(0.15)
        ctx.progress(n, count, f"writing chapter {n}")
        yield f"chapter {n}\\n"


@tghost.tool
def words(count: int, ctx: tghost.Context):
    """Stream words on one line, with progress between them."""
    import time
    for n in range(1, count + 1):
        ctx.progress(n, count)
        time.sleep(0.15)
        yield f"w{n} "


@tghost.hookimpl
def tghost_register_services(register):
    register(survey)
    register(chapters)
    register(words)
'''


@pytest.fixture
def reporting(plugin_dir: PluginDir) -> Catalog:
    plugin_dir.add("crawl", block("docs/reference/plugin-api.md", "# tghost_crawl.py"))
    plugin_dir.add("more", MORE)
    return discover(plugin_dir.entry_points(), strict=True)


CRAWLED = [Progress(1, 3, "page 1"), Progress(2, 3, "page 2"), Progress(3, 3, "page 3")]


@pytest.mark.parametrize("isolation", [THREAD, PROCESS])
async def test_a_plain_def_tools_progress_reaches_its_caller_in_each_isolation_mode(
    pulsar_broker: EmbeddedBroker, reporting: Catalog, isolation: str
) -> None:
    updates: list[Progress] = []
    async with LocalHost(pulsar_broker.url, reporting, ServeSettings(isolation=isolation)) as host:
        assert await host.call("crawl", {"pages": 3}, progress=updates.append) == "fetched 3 pages"
    if isolation == THREAD:
        assert updates == CRAWLED
    else:  # paced where the host reads the worker's pipe: a stall there may merge two updates into the later
        assert updates[-1] == CRAWLED[-1] and updates == [u for u in CRAWLED if u in updates], updates


async def test_progress_comes_through_the_directory_from_an_async_tool_and_in_order_with_chunks(
    pulsar_broker: EmbeddedBroker, reporting: Catalog
) -> None:
    topic = f"persistent://tg/config/progress-{uuid.uuid4().hex[:8]}"
    seen: list[Any] = []

    async def told(update: Progress) -> None:  # a coroutine function is awaited
        seen.append(update)

    async with LocalHost(pulsar_broker.url, reporting, announce_as="reporting", topic=topic), \
            ToolDirectory(PulsarSettings(pulsar_broker.url), topic) as directory:
        await directory.wait_for("chapters")
        assert await directory.invoke("survey", {"steps": 2}, progress=told) == "surveyed"
        surveyed, seen[:] = list(seen), []
        async for chunk in directory.stream("chapters", {"count": 2}, progress=seen.append):
            seen.append(chunk)
    assert surveyed == [Progress(1, 2), Progress(2, 2)]
    assert seen == [Progress(1, 2, "writing chapter 1"), "chapter 1\n", Progress(2, 2, "writing chapter 2"),
                    "chapter 2\n"]


async def test_only_a_caller_that_asks_gets_progress_and_each_update_is_an_empty_seed_000_chunk(
    pulsar_broker: EmbeddedBroker, reporting: Catalog
) -> None:
    async with LocalHost(pulsar_broker.url, reporting) as host, \
            RawWire(host.pulsar.url, host.descriptors["crawl"]) as raw:
        body = wire.encode_request(None, {}, {"pages": 2})
        await raw.send(body, {"id": "unasked"})
        await raw.send(body, {"id": "asked", wire.PROGRESS: "1"})
        unasked, asked = await raw.replies("unasked"), await raw.replies("asked")
    assert [reply for _, reply in unasked] == [{"error": None, "response": "fetched 2 pages", "end_of_stream": True}]
    assert [reply for _, reply in asked] == [
        {"error": None, "response": "", "end_of_stream": False,
         "progress": {"done": 1, "total": 2, "message": "page 1"}},
        {"error": None, "response": "", "end_of_stream": False,
         "progress": {"done": 2, "total": 2, "message": "page 2"}},
        {"error": None, "response": "fetched 2 pages", "end_of_stream": True}]
    assert all(properties["id"] == "asked" for properties, _ in asked)


async def test_trustgraphs_own_client_is_unaffected_by_another_callers_progress(
    pulsar_broker: EmbeddedBroker, reporting: Catalog
) -> None:
    base = pytest.importorskip("trustgraph.base.request_response_client", reason="trustgraph-base is not installed")
    backend_module = pytest.importorskip("trustgraph.base.async_pulsar_backend")
    schema = pytest.importorskip("trustgraph.schema")
    updates: list[Progress] = []
    async with LocalHost(pulsar_broker.url, reporting) as host:
        descriptor = host.descriptors["crawl"]
        client = await base.RequestResponseClient.create(
            backend=backend_module.AsyncPulsarBackend(pulsar_broker.url), request_topic=descriptor.request_queue,
            response_topic=descriptor.response_queue, request_schema=schema.ToolServiceRequest,
            response_schema=schema.ToolServiceResponse)
        try:
            theirs, ours = await asyncio.gather(
                client.request(schema.ToolServiceRequest(config="{}", arguments=json.dumps({"pages": 2})), timeout=30),
                host.call("crawl", {"pages": 3}, progress=updates.append, timeout=30))
        finally:
            await client.close()
    assert theirs.error is None and theirs.response == "fetched 2 pages"
    assert ours == "fetched 3 pages" and updates == CRAWLED


async def test_the_mcp_bridge_forwards_progress_as_notifications_progress(
    pulsar_broker: EmbeddedBroker, reporting: Catalog
) -> None:
    topic = f"persistent://tg/config/progress-{uuid.uuid4().hex[:8]}"
    notified: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notified.append((progress, total, message))

    async with LocalHost(pulsar_broker.url, reporting, announce_as="reporting", topic=topic), \
            ToolDirectory(PulsarSettings(pulsar_broker.url), topic) as directory, \
            create_client_server_memory_streams() as (client_streams, (read, write)):
        await directory.wait_for("crawl")
        bridge = Bridge(directory, ["*"], None)
        async with anyio.create_task_group() as group:
            group.start_soon(bridge.server.run, read, write, bridge.server.create_initialization_options())
            async with ClientSession(*client_streams) as session:
                await session.initialize()
                result = await session.call_tool("crawl", {"pages": 3}, progress_callback=on_progress)
                unasked = await session.call_tool("crawl", {"pages": 1})
            group.cancel_scope.cancel()
    assert result.content[0].text == "fetched 3 pages" and unasked.content[0].text == "fetched 1 pages"
    assert notified == [(1, 3, "page 1"), (2, 3, "page 2"), (3, 3, "page 3")]


async def test_tghost_call_shows_progress_on_stderr_and_only_the_observation_on_stdout(
    pulsar_broker: EmbeddedBroker, reporting: Catalog, plugin_dir: PluginDir
) -> None:
    topic = f"persistent://tg/config/progress-{uuid.uuid4().hex[:8]}"
    async with LocalHost(pulsar_broker.url, reporting, announce_as="reporting", topic=topic):
        env = plugin_dir.env(TGHOST_PULSAR_URL=pulsar_broker.url, TGHOST_DESCRIPTORS_TOPIC=topic)
        shown, hidden = await asyncio.gather(*(asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "tghost", "call", "crawl", "pages:=2", *flag], env=env,
            capture_output=True, text=True, timeout=60) for flag in (["--progress"], [])))
    assert shown.returncode == 0 and shown.stdout == "fetched 2 pages\n", shown.stderr
    assert shown.stderr.splitlines() == ["progress: 1/2 (50%) page 1", "progress: 2/2 (100%) page 2"]
    assert hidden.stdout == "fetched 2 pages\n" and hidden.stderr == ""  # stderr is not a terminal here


def screen(output: bytes) -> list[str]:
    """The lines a terminal shows after ``output``: ``\\r`` returns to the line's start, ``ESC[K``
    clears to its end, ``\\n`` starts the next."""
    lines, column = [""], 0
    for token in re.split(r"(\r|\n|\x1b\[K)", output.decode()):
        if token == "\r":
            column = 0
        elif token == "\n":
            lines.append("")
            column = 0
        elif token == "\x1b[K":
            lines[-1] = lines[-1][:column]
        elif token:
            lines[-1] = lines[-1][:column] + token + lines[-1][column + len(token):]
            column += len(token)
    return lines


async def test_on_a_terminal_the_progress_line_never_erases_the_observation(
    pulsar_broker: EmbeddedBroker, reporting: Catalog, plugin_dir: PluginDir
) -> None:
    topic = f"persistent://tg/config/progress-{uuid.uuid4().hex[:8]}"
    async with LocalHost(pulsar_broker.url, reporting, announce_as="reporting", topic=topic):
        env = plugin_dir.env(TGHOST_PULSAR_URL=pulsar_broker.url, TGHOST_DESCRIPTORS_TOPIC=topic)
        for tool, argument in (("words", "count:=3"), ("crawl", "pages:=2")):
            controller, terminal = pty.openpty()  # stdout and stderr on one terminal, as in a shell
            try:
                command = [sys.executable, "-m", "tghost", "call", tool, argument]
                called = await asyncio.to_thread(subprocess.run, command, env=env, stdout=terminal, stderr=terminal,
                                                 timeout=60)
                os.close(terminal)
                output = b""
                with contextlib.suppress(OSError):  # EIO once everything written is read
                    while chunk := os.read(controller, 65536):
                        output += chunk
            finally:
                os.close(controller)
            assert called.returncode == 0, output
            shown = [line.rstrip() for line in screen(output.replace(b"\r\n", b"\n")) if line.strip()]
            if tool == "words":  # the words stay; the progress line waited for the line's end
                assert shown == ["w1 w2 w3"], output
            else:  # drawn in place while the call ran, then cleared: only the observation stays
                assert b"progress: 1/2 (50%) page 1" in output and shown == ["fetched 2 pages"], output


def test_context_progress_refuses_what_is_not_progress_and_outside_a_call_does_nothing() -> None:
    sent: list[Progress] = []
    ctx = Context(user="u", report=sent.append)
    ctx.progress(1, message="x" * 500)
    ctx.progress(0.5, 2.0)
    assert sent == [Progress(1, None, "x" * 200), Progress(0.5, 2.0, None)]
    for done, total, message, error in (("1", None, None, TypeError), (True, None, None, TypeError),
                                        (-1, None, None, ValueError), (float("nan"), None, None, ValueError),
                                        (1, 0, None, ValueError), (1, float("inf"), None, ValueError),
                                        (1, None, 3, TypeError)):
        with pytest.raises(error):
            ctx.progress(done, total, message)
    Context(user="u").progress(1, 2)  # no report: a tool called directly, as in a unit test


@pytest.mark.parametrize("value", [None, "half", [1], {"total": 2}, {"done": "1"}, {"done": True},
                                   {"done": 1, "total": "2"}])
def test_a_malformed_progress_key_in_a_response_is_dropped(value: Any) -> None:
    payload = json.dumps({"error": None, "response": "", "end_of_stream": False, "progress": value}).encode()
    assert wire.decode_response(payload).progress is None
