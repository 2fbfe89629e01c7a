"""serve: installed Amplifier tool modules are added as plugins of kind ``amplifier``, mounted
unchanged on amplifier-core's coordinator, served over a real embedded broker, isolated when they
fail, configured from the host's config file, and cleaned up at shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from importlib.metadata import entry_points

import pytest
from amplifier_helpers import ModuleDir, amplifier_plugin

from tghost import Catalog, PluginSelection, ToolCallError, discover
from tghost.testing import EmbeddedBroker, LocalHost

#: A tool module per seed 002: a ToolResult for success and failure, an input_schema property on one
#: tool and get_schema() on the other, hooks on the tool events (one denies), and a cleanup.
NOTES = """
from amplifier_core import HookResult, ToolResult
from amplifier_core.events import TOOL_ERROR, TOOL_POST, TOOL_PRE

EVENTS = []
CLEANED = []


class Shout:
    name = "shout"
    description = "Shout a text back, upper-cased."

    def __init__(self, config):
        self.prefix = config.get("prefix", "")

    @property
    def input_schema(self):
        return {"type": "object", "properties": {"text": {"type": "string", "description": "What to shout"}},
                "required": ["text"]}

    async def execute(self, input):
        if input["text"] == "boom":
            raise RuntimeError("kaboom")
        if input["text"] == "fail":
            return ToolResult(success=False, error={"message": "cannot shout 'fail'"})
        if input["text"] == "typed":
            return ToolResult(success=False, error={"type": "TooQuiet", "message": "typed failure"})
        return ToolResult(success=True, output=(self.prefix + input["text"]).upper())


class Where:
    name = "where"
    description = "Where this session works, and the config it got."

    def __init__(self, coordinator, config):
        self.coordinator, self.config = coordinator, config

    def get_schema(self):
        return {"type": "object", "properties": {}}

    async def execute(self, input):
        return ToolResult(output={"working_dir": self.coordinator.get_capability("session.working_dir"),
                                  "config": self.config, "session_id": self.coordinator.session_id})


async def record(event, data):
    EVENTS.append((event, data["tool_name"]))
    if event == TOOL_PRE and data["tool_input"].get("text") == "secret":
        return HookResult(action="deny", reason="secrets are not shouted")
    return HookResult(action="continue")


async def mount(coordinator, config):
    await coordinator.mount("tools", Shout(config), name="shout")
    await coordinator.mount("tools", Where(coordinator, config), name="where")
    for event in (TOOL_PRE, TOOL_POST, TOOL_ERROR):
        coordinator.hooks.register(event, record, name="notes-audit")

    async def cleanup():
        CLEANED.append("notes")

    return cleanup
"""

RAISES = """
async def mount(coordinator, config):
    raise RuntimeError("no API key configured")
"""

EMPTY = """
async def mount(coordinator, config):
    coordinator.register_capability("empty.loaded", True)  # a module that mounts no tool
"""

HANGS = """
import asyncio

async def mount(coordinator, config):
    await asyncio.sleep(3600)
"""

NEVER_IMPORTED = """
raise SystemExit("imported although it is not a tool module, or disabled")
"""

#: A tool whose execute() blocks its thread (sync I/O in an async tool, as real modules do).
BLOCKING = """
import threading
from amplifier_core import ToolResult

RELEASE = threading.Event()

class Block:
    name = "block"
    description = "Block until released."
    input_schema = {"type": "object", "properties": {}}

    async def execute(self, input):
        RELEASE.wait(30)
        return ToolResult(output="released")

async def mount(coordinator, config):
    await coordinator.mount("tools", Block(), name="block")
"""


def serve(config: dict[str, object] | None = None, selection: PluginSelection | None = None) -> Catalog:
    """Discover with only this distribution's tghost plugin installed."""
    return discover(amplifier_plugin(), config=config, selection=selection or PluginSelection())


def test_each_tool_module_is_a_plugin_of_kind_amplifier_and_each_tool_a_service_of_its_name(
    modules: ModuleDir,
) -> None:
    modules.add("tool-notes", NOTES, version="2.1")
    catalog = serve()
    try:
        reports = {r.name: r for r in catalog.plugins}
        notes = reports["tool-notes"]
        assert (notes.kind, notes.added_by, notes.distribution, notes.version, notes.status) == (
            "amplifier", "amplifier", "amplifier-module-tool-notes", "2.1", "loaded")
        assert notes.value == "amplifier_test_tool_notes:mount"
        assert notes.services == ["shout", "where"] and notes.tools == ["shout", "where"]
        shout = catalog.tools["shout"]
        assert (shout.service, shout.description) == ("shout", "Shout a text back, upper-cased.")
        assert shout.input_schema == {"type": "object", "required": ["text"],
                                      "properties": {"text": {"type": "string", "description": "What to shout"}}}
        assert [(a.name, a.type, a.description) for a in shout.arguments] == [("text", "string", "What to shout")]
        # from get_schema(), unchanged: an Amplifier module's schema is served as the module wrote it
        assert catalog.tools["where"].input_schema == {"type": "object", "properties": {}}
        assert catalog.descriptors["shout"].version == "2.1"
    finally:
        catalog.shutdown()


async def test_calls_map_tool_results_to_observations_and_error_replies_through_the_tool_events(
    modules: ModuleDir, pulsar_broker: EmbeddedBroker,
) -> None:
    modules.add("tool-notes", NOTES)
    catalog = serve()
    events = modules.module("tool-notes").EVENTS
    try:
        async with LocalHost(pulsar_broker.url, catalog) as host:
            assert await host.call("shout", {"text": "hello"}) == "HELLO"
            with pytest.raises(ToolCallError) as failed:
                await host.call("shout", {"text": "fail"})
            assert (failed.value.error_type, failed.value.message) == ("tool-service-error", "cannot shout 'fail'")
            with pytest.raises(ToolCallError) as typed:
                await host.call("shout", {"text": "typed"})
            assert (typed.value.error_type, typed.value.message) == ("TooQuiet", "typed failure")
            with pytest.raises(ToolCallError) as raised:
                await host.call("shout", {"text": "boom"})
            assert (raised.value.error_type, raised.value.message) == ("tool-service-error", "RuntimeError: kaboom")
            with pytest.raises(ToolCallError) as denied:
                await host.call("shout", {"text": "secret"})
            assert (denied.value.error_type, denied.value.message) == ("not-allowed", "secrets are not shouted")
            with pytest.raises(ToolCallError) as invalid:
                await host.call("shout", {"text": 42})
            assert invalid.value.error_type == "invalid-arguments" and "argument 'text'" in invalid.value.message
            assert events == [("tool:pre", "shout"), ("tool:post", "shout"),   # hello
                              ("tool:pre", "shout"), ("tool:post", "shout"),   # fail: a result, so tool:post
                              ("tool:pre", "shout"), ("tool:post", "shout"),   # typed
                              ("tool:pre", "shout"), ("tool:error", "shout"),  # boom: execute() raised
                              ("tool:pre", "shout")]                           # secret: denied
    finally:
        catalog.shutdown()


async def test_the_config_file_gives_each_module_its_config_and_working_dir(
    modules: ModuleDir, pulsar_broker: EmbeddedBroker, tmp_path: os.PathLike[str],
) -> None:
    modules.add("tool-notes", NOTES)
    configured = serve({"amplifier": {"tool-notes": {"config": {"prefix": "re: "}, "working_dir": str(tmp_path)}}})
    default = None
    try:
        async with LocalHost(pulsar_broker.url, configured) as host:
            assert await host.call("shout", {"text": "hi"}) == "RE: HI"
            assert json.loads(await host.call("where")) == {
                "working_dir": str(tmp_path), "config": {"prefix": "re: "}, "session_id": "tghost-tool-notes"}
        configured.shutdown()
        default = serve()
        async with LocalHost(pulsar_broker.url, default) as host:
            assert json.loads(await host.call("where")) == {
                "working_dir": os.getcwd(), "config": {}, "session_id": "tghost-tool-notes"}
    finally:
        configured.shutdown()
        if default is not None:
            default.shutdown()


def test_a_bad_config_table_is_reported_with_the_table_and_key(modules: ModuleDir) -> None:
    modules.add("tool-notes", NOTES)
    catalog = serve({"amplifier": {"tool-notes": {"confg": {"prefix": "x"}, "mount_timeout": -1}}})
    [notes] = [r for r in catalog.plugins if r.name == "tool-notes"]
    assert notes.status == "failed"
    assert notes.errors[0] == ("cannot load amplifier plugin 'amplifier_test_tool_notes:mount': ValueError: "
                               "[amplifier.tool-notes] in the config file: mount_timeout: Input should be greater "
                               "than 0; confg: Extra inputs are not permitted")
    assert "amplifier_test_tool_notes" not in sys.modules  # never imported


def test_a_module_whose_mount_raises_hangs_or_mounts_nothing_is_reported_and_skipped_alone(
    modules: ModuleDir,
) -> None:
    modules.add("tool-notes", NOTES)
    modules.add("tool-raises", RAISES)
    modules.add("tool-empty", EMPTY)
    modules.add("tool-hangs", HANGS)
    catalog = serve({"amplifier": {"tool-hangs": {"mount_timeout": 0.5}}})
    try:
        reports = {r.name: r for r in catalog.plugins}
        assert {name: r.status for name, r in reports.items()} == {
            "amplifier": "loaded", "tool-notes": "loaded", "tool-raises": "failed", "tool-empty": "failed",
            "tool-hangs": "failed"}
        prefix = "cannot load amplifier plugin 'amplifier_test_tool_{}:mount': RuntimeError: "
        assert reports["tool-raises"].errors == [
            prefix.format("raises") + "mount() raised RuntimeError: no API key configured"]
        assert reports["tool-empty"].errors == [
            prefix.format("empty") + "mount() mounted no tool (no coordinator.mount('tools', ...)): nothing to serve"]
        assert reports["tool-hangs"].errors == [
            prefix.format("hangs") + "mount() raised TimeoutError: did not finish within 0.5s"]
        assert set(catalog.services) == {"shout", "where"}
    finally:
        catalog.shutdown()
    assert not [t for t in threading.enumerate() if t.name.startswith("amplifier ")]  # every module's loop stopped


def test_other_kinds_of_modules_and_tool_tghost_itself_are_never_loaded(modules: ModuleDir) -> None:
    for name in ("provider-fake", "loop-fake", "hooks-fake", "context-fake"):
        modules.add(name, NEVER_IMPORTED)
    modules.add("tool-notes", NOTES)
    assert "tool-tghost" in {ep.name for ep in entry_points(group="amplifier.modules")}  # installed with this plugin
    catalog = serve()
    try:
        assert [r.name for r in catalog.plugins] == ["amplifier", "tool-notes"]
    finally:
        catalog.shutdown()


def test_a_disabled_module_is_never_imported_and_a_load_list_may_name_the_amplifier_plugin(
    modules: ModuleDir,
) -> None:
    modules.add("tool-notes", NOTES)
    modules.add("tool-disabled", NEVER_IMPORTED)
    catalog = serve(selection=PluginSelection(load=frozenset({"amplifier"}), disable=frozenset({"tool-disabled"})))
    try:
        assert {r.name: r.status for r in catalog.plugins} == {
            "amplifier": "loaded", "tool-notes": "loaded", "tool-disabled": "blocked"}
    finally:
        catalog.shutdown()


def test_shutdown_runs_the_cleanup_mount_returned_and_stops_the_modules_loop(modules: ModuleDir) -> None:
    modules.add("tool-notes", NOTES)
    catalog = serve()
    assert [t.name for t in threading.enumerate() if t.name.startswith("amplifier ")] == ["amplifier tool-notes"]
    catalog.shutdown()
    assert modules.module("tool-notes").CLEANED == ["notes"]
    assert not [t for t in threading.enumerate() if t.name.startswith("amplifier ")]


async def test_a_tool_that_blocks_its_thread_stalls_only_its_own_module(
    modules: ModuleDir, pulsar_broker: EmbeddedBroker,
) -> None:
    modules.add("tool-notes", NOTES)
    modules.add("tool-blocking", BLOCKING)
    catalog = serve()
    release = modules.module("tool-blocking").RELEASE
    try:
        async with LocalHost(pulsar_broker.url, catalog) as host:
            blocked = asyncio.create_task(host.call("block"))
            await asyncio.sleep(0.2)
            assert not blocked.done()
            assert await host.call("shout", {"text": "still served"}, timeout=10) == "STILL SERVED"
            release.set()
            assert await blocked == "released"
    finally:
        release.set()
        catalog.shutdown()


GUARD = """
import tghost

@tghost.hookimpl
def tghost_authorize(user, service):
    if service == "shout" and user != "alice":
        return f"{user} may not shout"
"""


async def test_tghost_authorize_checks_calls_to_amplifier_tools_as_to_any_service(
    modules: ModuleDir, pulsar_broker: EmbeddedBroker,
) -> None:
    modules.add("tool-notes", NOTES)
    guard = modules.add_tghost_plugin("guard", GUARD)
    catalog = discover([*amplifier_plugin(), guard], selection=PluginSelection())
    try:
        async with LocalHost(pulsar_broker.url, catalog) as host:
            assert await host.call("shout", {"text": "hi"}, user="alice") == "HI"
            with pytest.raises(ToolCallError) as denied:
                await host.call("shout", {"text": "hi"}, user="bob")
            assert (denied.value.error_type, denied.value.message) == ("not-allowed", "bob may not shout")
        assert modules.module("tool-notes").EVENTS == [("tool:pre", "shout"), ("tool:post", "shout")]  # bob's: never
    finally:
        catalog.shutdown()
