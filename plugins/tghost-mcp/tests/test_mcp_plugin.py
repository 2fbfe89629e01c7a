"""plugin: each [mcp-servers.<name>] table is a plugin of kind ``mcp`` that serves its server's
tools, discovered as ``tghost run`` discovers plugins, then served by a real host on the embedded
broker and called through a ``ToolDirectory``: the tools with their schemas, hints and output
schemas, calls that keep state, progress, cancel, a list change, a crash and the restart, the
official ``mcp-server-time``, an HTTP server; and every bad input, which fails its server alone."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp_helpers import HttpNotes, eventually, mount, notes_table

import tghost
from tghost import Catalog, PluginSelection, ToolCallError, ToolDirectory
from tghost.protocol import Progress
from tghost.testing import EmbeddedBroker, LocalHost

#: mcp-server-time, the official reference server (PyPI), as a user mounts it.
TIME = {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}


def reports(catalog: Catalog) -> dict[str, Any]:
    return {report.name: report for report in catalog.plugins}


def test_each_server_is_a_plugin_of_kind_mcp_serving_its_tools_over_one_service() -> None:
    catalog = mount({"notes": notes_table(), "time": TIME})
    try:
        notes, time = reports(catalog)["notes"], reports(catalog)["time"]
        assert (notes.kind, notes.added_by, notes.status) == ("mcp", "mcp", "loaded")
        assert notes.value == f"{sys.executable} {notes_table()['args'][0]}"
        assert notes.services == ["notes"] and time.services == ["time"]
        assert {"remember", "recall", "word_count", "say-hello"} <= set(notes.tools)
        assert set(time.tools) == {"get_current_time", "convert_time"}
        recall = catalog.tools["recall"]
        assert (recall.service, recall.config) == ("notes", {"tool": "recall"})
        assert catalog.tools["say-hello"].config == {"tool": "say hello"}  # its MCP name, mapped by the rule
        assert catalog.descriptors["notes"].config_params[0].model_dump() == {"name": "tool", "required": True}
    finally:
        catalog.shutdown()


def test_a_bad_table_or_a_server_that_does_not_start_fails_that_server_alone(notes_log: Path) -> None:
    catalog = mount({
        "typo": {"comand": "npx"},
        "missing": {"command": "no-such-mcp-server"},
        "neither": {"prefix": "x-"},
        "bad name": notes_table(),
        "notes": notes_table(env={"NOTES_LOG": str(notes_log)}),
    })
    try:
        found = reports(catalog)
        assert found["notes"].status == "loaded" and "recall" in catalog.tools
        for name in ("typo", "missing", "neither", "bad name"):
            assert found[name].status == "failed", name
        (typo,) = found["typo"].errors
        assert "[mcp-servers.typo] in the config file: key 'comand' is not a setting of an MCP server" in typo
        assert "command 'no-such-mcp-server' not found; install it" in found["missing"].errors[0]
        assert "give either 'command' (a stdio server) or 'url'" in found["neither"].errors[0]
        assert "service 'bad name': field 'id'" in found["bad name"].errors[0]
        assert found["mcp"].status == "loaded"
    finally:
        catalog.shutdown()


def test_a_disabled_server_is_never_started(notes_log: Path) -> None:
    catalog = mount({"notes": notes_table(env={"NOTES_LOG": str(notes_log)})},
                    selection=PluginSelection(disable=frozenset({"notes"})))
    try:
        assert reports(catalog)["notes"].status == "blocked"
    finally:
        catalog.shutdown()
    assert notes_log.read_text() == ""


def test_a_name_two_servers_offer_is_served_by_the_first_and_refused_to_the_second_naming_both(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "tghost_mcp")
    catalog = mount({"first": notes_table(), "second": notes_table(), "third": notes_table(prefix="third-")})
    try:
        assert catalog.tools["recall"].service == "first" and catalog.tools["third-recall"].service == "third"
        assert reports(catalog)["second"].tools == []
        assert ("MCP server 'second': tool 'recall' is not served: MCP server 'first' serves a tool named 'recall'; "
                "give one of them a prefix ([mcp-servers.second] prefix)") in caplog.messages
    finally:
        catalog.shutdown()


@asynccontextmanager
async def served(broker: EmbeddedBroker, topic: str, servers: dict[str, Any]) -> AsyncIterator[ToolDirectory]:
    """``servers`` mounted and served by a host announcing on ``topic``, and a directory
    following it that has seen every tool the host serves."""
    catalog = mount(servers)
    try:
        async with LocalHost(broker.url, catalog, announce_as="mcp-host", topic=topic), \
                ToolDirectory(tghost.PulsarSettings(broker.url), topic) as directory:
            for name in list(catalog.tools):
                await directory.wait_for(name, timeout=30)
            yield directory
    finally:
        catalog.shutdown()


async def test_the_tools_are_announced_with_their_schemas_hints_and_output_schema_and_keep_state(
    pulsar_broker: EmbeddedBroker, topic: str,
) -> None:
    table = notes_table(**{"max-concurrency": 4, "timeout": 20})
    async with served(pulsar_broker, topic, {"notes": table}) as directory:
        remember = directory.tools["remember"].descriptor
        assert remember.title == "Remember a note" and remember.input_schema is not None
        assert remember.input_schema["required"] == ["key", "text"]
        assert [a.name for a in remember.arguments] == ["key", "text"]
        assert remember.annotations is not None and remember.annotations.model_dump(by_alias=True) == {
            "read-only": False, "destructive": False, "idempotent": True, "open-world": False}
        recall = directory.tools["recall"].descriptor
        assert recall.title == "Recall a note" and recall.read_only
        assert directory.tools["word_count"].descriptor.output_schema is not None
        service = directory.tools["recall"].service.descriptor
        assert (service.timeout, service.max_concurrency) == (20, 4)

        assert await directory.invoke("remember", {"key": "colour", "text": "teal"}) == "remembered colour"
        assert await directory.invoke("recall", {"key": "colour"}) == "teal"
        assert await directory.invoke("word_count", {"text": "a bb ccc"}) == {"words": 3, "longest": "ccc"}
        assert await directory.invoke("say-hello", {"name": "ada"}) == "hello ada"


async def test_bad_arguments_and_error_results_are_error_replies_naming_the_server(
    pulsar_broker: EmbeddedBroker, topic: str,
) -> None:
    async with served(pulsar_broker, topic, {"notes": notes_table()}) as directory:
        with pytest.raises(ToolCallError) as invalid:
            await directory.invoke("recall", {"kee": "colour"})
        assert invalid.value.error_type == "invalid-arguments" and "argument 'key'" in invalid.value.message
        with pytest.raises(ToolCallError) as failed:
            await directory.invoke("fail", {"reason": "out of ink"})
        assert (failed.value.error_type, failed.value.message) == (
            "tool-service-error", "MCP server 'notes', tool 'fail': Error executing tool fail: out of ink")


async def test_progress_streams_to_the_caller_while_the_tool_runs(
    pulsar_broker: EmbeddedBroker, topic: str, tmp_path: Path,
) -> None:
    go = tmp_path / "go"
    async with served(pulsar_broker, topic, {"notes": notes_table(env={"NOTES_GO": str(go)})}) as directory:
        updates: list[Progress] = []
        call = asyncio.ensure_future(directory.invoke("progress", {"steps": 3}, progress=updates.append))
        await eventually(lambda: updates, "the first update, while the tool waits")
        assert updates == [Progress(1, 3, "step 1")] and not call.done()
        go.write_text("")
        assert await call == "done in 3 steps"
        assert updates[-1] == Progress(3, 3, "step 3")


async def test_a_call_the_caller_gives_up_on_is_cancelled_on_the_mcp_server(
    pulsar_broker: EmbeddedBroker, topic: str, notes_log: Path,
) -> None:
    async with served(pulsar_broker, topic, {"notes": notes_table(env={"NOTES_LOG": str(notes_log)})}) as directory:
        with pytest.raises(ToolCallError) as late:
            await directory.invoke("sleep", {"seconds": 60}, timeout=1)
        assert late.value.error_type == "timeout"
        await eventually(lambda: "cancelled" in notes_log.read_text(), "notifications/cancelled reached the server")


async def test_the_services_timeout_cancels_the_call_on_the_mcp_server(
    pulsar_broker: EmbeddedBroker, topic: str, notes_log: Path,
) -> None:
    table = notes_table(env={"NOTES_LOG": str(notes_log)}, timeout=1)
    async with served(pulsar_broker, topic, {"notes": table}) as directory:
        with pytest.raises(ToolCallError) as late:
            await directory.invoke("sleep", {"seconds": 60}, timeout=10)
        assert (late.value.error_type, late.value.message) == ("timeout", "service 'notes' did not finish within 1.0s")
        await eventually(lambda: "cancelled" in notes_log.read_text(), "notifications/cancelled reached the server")


async def test_a_tool_the_server_adds_is_announced_at_once_unless_its_name_cannot_be_served(
    pulsar_broker: EmbeddedBroker, topic: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "tghost_mcp")
    async with served(pulsar_broker, topic, {"notes": notes_table()}) as directory:
        assert await directory.invoke("grow", {"name": "echo"}) == "added echo"
        await directory.wait_for("echo", timeout=10)
        assert await directory.invoke("echo", {"text": "hi"}) == "hi"
        for name in ("日本", "say-hello"):  # no letter or digit; the name "say hello" maps to
            assert await directory.invoke("grow", {"name": name}) == f"added {name}"
        await eventually(lambda: len(caplog.messages) == 2, "the two tools refused")
        assert caplog.messages == [
            "MCP server 'notes': tool '日本' is not served: it has no letter or digit to make a tool name of",
            "MCP server 'notes': tool 'say-hello' is not served: its name maps to 'say-hello', which tool "
            "'say hello' of this server has"]
        assert directory.tools["say-hello"].descriptor.config == {"tool": "say hello"}


async def test_a_killed_server_is_withdrawn_while_down_and_restarted_and_calls_work_again(
    pulsar_broker: EmbeddedBroker, topic: str,
) -> None:
    catalog = mount({"notes": notes_table()})
    try:
        async with LocalHost(pulsar_broker.url, catalog, announce_as="mcp-host", topic=topic), \
                ToolDirectory(tghost.PulsarSettings(pulsar_broker.url), topic) as directory:
            await directory.wait_for("recall", timeout=30)
            assert await directory.invoke("remember", {"key": "k", "text": "v"}) == "remembered k"
            changes = asyncio.ensure_future(recall_changes(directory, 2))
            await asyncio.sleep(0.1)  # the changes are followed from here on
            os.kill(int(str(await directory.invoke("pid", {}))), signal.SIGKILL)
            toolset = reports(catalog)["notes"].toolsets[0].toolset
            problem = await eventually(lambda: toolset.problem, "the problem said")
            assert problem.startswith("MCP server 'notes' exited; restarting in 1 s")
            assert await asyncio.wait_for(changes, 30) == ["removed", "added"]  # withdrawn while down, then back
            assert toolset.problem is None
            assert await directory.invoke("recall", {"key": "k"}) == "nothing remembered under k"  # a new process
    finally:
        catalog.shutdown()


async def recall_changes(directory: ToolDirectory, count: int) -> list[str]:
    """The kinds of the next ``count`` changes of the tool ``recall``."""
    kinds: list[str] = []
    async for change in directory.changes():
        if change.name == "recall":
            kinds.append(change.kind)
            if len(kinds) == count:
                return kinds
    return kinds


async def test_the_official_time_server_is_served_with_its_hints_and_typed_results(
    pulsar_broker: EmbeddedBroker, topic: str,
) -> None:
    async with served(pulsar_broker, topic, {"time": {**TIME, "prefix": "time."}}) as directory:
        convert = directory.tools["time.convert_time"].descriptor
        assert convert.read_only and convert.output_schema is not None
        converted = await directory.invoke("time.convert_time", {
            "source_timezone": "Europe/Paris", "time": "12:00", "target_timezone": "Asia/Tokyo"})
        assert isinstance(converted, dict) and converted["time_difference"] == "+8.0h"


async def test_a_streamable_http_server_is_served_with_its_token(
    pulsar_broker: EmbeddedBroker, topic: str, http_notes: HttpNotes, tmp_path: Path,
) -> None:
    (tmp_path / "token").write_text(http_notes.token)
    table = {"url": http_notes.url, "token-file": str(tmp_path / "token"), "prefix": "web-", "group": ["web"]}
    async with served(pulsar_broker, topic, {"web": table}) as directory:
        assert directory.tools["web-recall"].descriptor.group == ("web",)
        assert await directory.invoke("web-remember", {"key": "k", "text": "over http"}, groups=["web"]) \
            == "remembered k"
        assert await directory.invoke("web-recall", {"key": "k"}, groups=["web"]) == "over http"
