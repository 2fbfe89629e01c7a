"""Amplifier interop, both ways, as a user runs it on the embedded broker with amplifier-core from PyPI.

Serve: a real Amplifier tool module (``tests/adapters/amplifier-module-tool-readonly-fs``) is pip-installed
and served by ``tghost run`` through tghost-amplifier; ``tghost plugins``, ``tools``, ``call`` and
``export`` see it, its failures are error replies, and the audit log records every call.
Session: an Amplifier coordinator mounts ``tool-tghost``, calls ``tell-joke``, and gets a tool
installed on a running ``tghost run --watch-plugins`` host without a restart.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import shutil
import signal
import uuid
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from amplifier_core import ModuleLoader
from amplifier_core.testing import MockCoordinator

from tests.author.test_scaffold import OFFLINE_PIP
from tests.conftest import READY, HostProcess, PluginDir, live_tools, tghost_cli
from tests.operate.test_plugin_watch import FIRST, SECOND
from tghost.broker import EmbeddedBroker
from tghost.discovery.discover import ENTRY_POINT_GROUP

MODULE_SOURCE = Path(__file__).parent / "amplifier-module-tool-readonly-fs"


def install_module(tmp_path: Path) -> Path:
    """pip-install the Amplifier module into a private target dir (the test venv stays as it was)."""
    source, site = tmp_path / "module-source", tmp_path / "site"
    shutil.copytree(MODULE_SOURCE, source)
    installed = tghost_cli("install", "--no-index", "--no-deps", "--no-build-isolation", "--target", str(site),
                       str(source), env=OFFLINE_PIP, timeout=180)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert (site / "amplifier_module_tool_readonly_fs-1.0.0.dist-info").is_dir()
    return site


def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    (root / "docs").mkdir(parents=True)
    (root / "notes.txt").write_text("first line\nsecond line\n")
    (root / "big.txt").write_text("x" * 100)
    return root


def test_a_pip_installed_amplifier_tool_module_is_served_called_and_exported_as_it_is(
    tmp_path: Path, pulsar_broker: EmbeddedBroker, host_process: Callable[..., HostProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    site, root = install_module(tmp_path), workspace(tmp_path)
    config, audit = tmp_path / "tghost.toml", tmp_path / "audit.jsonl"
    config.write_text("[amplifier.tool-readonly-fs]\nconfig = { max_bytes = 64 }\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p),
           "TGHOST_PULSAR_URL": pulsar_broker.url, "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "TGHOST_DESCRIPTORS_TOPIC": f"persistent://tg/config/amplifier-{uuid.uuid4().hex[:8]}",
           "TGHOST_LOAD_PLUGINS": "amplifier", "TGHOST_CONFIG": str(config)}

    listed = tghost_cli("plugins", "--json", env=env)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    module = next(r for r in json.loads(listed.stdout) if r["name"] == "tool-readonly-fs")
    assert (module["kind"], module["added_by"], module["status"], module["tools"]) == (
        "amplifier", "amplifier", "loaded", ["read_file", "list_dir"])
    assert (module["distribution"], module["version"]) == ("amplifier-module-tool-readonly-fs", "1.0.0")

    host = host_process("--audit-log", str(audit), env=env, cwd=root)  # session.working_dir: the host's cwd
    host.wait_for(READY)
    assert {"read_file", "list_dir"} <= set(live_tools(env))

    read = tghost_cli("call", "read_file", "file_path=notes.txt", env=env)
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout) == {"file_path": "notes.txt", "content": "     1\tfirst line\n     2\tsecond line",
                                       "total_lines": 2, "lines_read": 2}
    listing = tghost_cli("call", "list_dir", env=env)
    assert (listing.returncode, listing.stdout) == (0, "DIR  docs\nFILE big.txt\nFILE notes.txt\n")
    outside = tghost_cli("call", "read_file", "file_path=../audit.jsonl", env=env)
    assert outside.returncode == 1
    assert "Error: tool-service-error: Access denied: ../audit.jsonl is outside the workspace" in outside.stderr
    too_big = tghost_cli("call", "read_file", "file_path=big.txt", env=env)  # max_bytes from the config file
    assert too_big.returncode == 1
    assert "Error: FileTooLarge: big.txt is 100 bytes, over the limit of 64" in too_big.stderr
    invalid = tghost_cli("call", "read_file", "file_path=notes.txt", "offset:=0", env=env)
    assert invalid.returncode == 1
    assert "Error: invalid-arguments: argument 'offset': 0 is less than the minimum of 1" in invalid.stderr

    exported = tghost_cli("export", "--format", "mcp", env=env)
    assert exported.returncode == 0, exported.stderr
    mcp = {tool["name"]: tool for tool in json.loads(exported.stdout)}
    monkeypatch.syspath_prepend(str(site))
    source = importlib.import_module("amplifier_module_tool_readonly_fs")
    assert mcp["read_file"]["inputSchema"] == source.ReadFileTool(None).input_schema
    assert mcp["list_dir"]["inputSchema"] == source.ListDirTool(None).get_schema()
    assert mcp["read_file"]["description"] == source.ReadFileTool.description

    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0
    assert f"Unmounted read-only filesystem tools under {root.resolve()}" in host.log  # its cleanup ran
    calls = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(c["service"], c["status"]) for c in calls] == [
        ("read_file", "ok"), ("list_dir", "ok"), ("read_file", "tool-service-error"),
        ("read_file", "FileTooLarge"), ("read_file", "invalid-arguments")]


async def eventually(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not check():
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"{what}: not seen within {timeout}s") from None


def tools(coordinator: MockCoordinator) -> dict[str, Any]:
    return dict(coordinator.get("tools") or {})


async def test_an_amplifier_session_mounts_tool_tghost_calls_tell_joke_and_gets_tools_installed_later(
    pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, tmp_path: Path, host_process: Callable[..., HostProcess],
) -> None:
    plugin_dir.add("first", FIRST)
    env = plugin_dir.user_env(pulsar_broker.url, tmp_path / "config", "amplifier-session")
    env["TGHOST_DISABLE_PLUGINS"] = ",".join(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)
                                             if ep.name not in {"joke", *plugin_dir.names})
    host = host_process("--watch-plugins", "--watch-interval", "0.5", env=env)
    host.wait_for(READY)
    host.wait_for("watching for plugins")

    coordinator = MockCoordinator()
    load = await ModuleLoader(coordinator=coordinator).load(
        "tool-tghost", {"pulsar_url": pulsar_broker.url, "topic": env["TGHOST_DESCRIPTORS_TOPIC"]})
    cleanup = await load(coordinator)
    try:
        assert {"tell-joke", "first-echo"} <= set(tools(coordinator))
        joke = await tools(coordinator)["tell-joke"].execute({"topic": "cats"})
        assert joke.success and "cat" in joke.output.lower(), joke

        plugin_dir.add("second", SECOND)
        await eventually(lambda: "second-shout" in tools(coordinator), "second-shout mounted")
        shout = await tools(coordinator)["second-shout"].execute({"text": "no restart"})
        assert (shout.success, shout.output) == (True, "NO RESTART")

        shutil.rmtree(plugin_dir.root / "tghost_test_second-1.0.dist-info")
        await eventually(lambda: "second-shout" not in tools(coordinator), "second-shout unmounted")
        assert "tell-joke" in tools(coordinator)
    finally:
        await cleanup()
    assert not {"tell-joke", "first-echo"} & set(tools(coordinator))
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0
