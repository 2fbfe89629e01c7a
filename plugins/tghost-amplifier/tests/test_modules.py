"""modules: which Amplifier modules are tool modules (Amplifier's naming convention, as
amplifier-core's loader applies it), and each module's [amplifier.<name>] settings."""

from __future__ import annotations

import os

import pytest
from amplifier_helpers import ModuleDir
from tghost_amplifier.modules import ModuleSettings, is_tool_module, tool_modules


@pytest.mark.parametrize(("name", "tool"), [
    ("tool-filesystem", True), ("tool-bash", True), ("my-module", True),  # no keyword: a tool, as in Amplifier
    ("provider-anthropic", False), ("loop-basic", False), ("orchestrator-x", False),
    ("hooks-logging", False), ("context-simple", False), ("provider-tool-proxy", False),  # first keyword wins
])
def test_modules_are_typed_by_amplifiers_naming_convention(name: str, tool: bool) -> None:
    assert is_tool_module(name) is tool


def test_tool_modules_are_the_installed_tool_entry_points_by_name_without_tool_tghost(modules: ModuleDir) -> None:
    modules.add("tool-zeta", "async def mount(coordinator, config): pass\n")
    modules.add("provider-x", "async def mount(coordinator, config): pass\n")
    modules.add("tool-alpha", "async def mount(coordinator, config): pass\n")
    names = [ep.name for ep in tool_modules()]
    assert names == sorted(names) and {"tool-zeta", "tool-alpha"} <= set(names)
    assert "provider-x" not in names and "tool-tghost" not in names


def test_settings_default_to_an_empty_config_and_the_hosts_working_directory() -> None:
    settings = ModuleSettings.of("tool-x", {"tools": {}})
    assert (settings.config, settings.working_dir, settings.mount_timeout) == ({}, os.getcwd(), 60.0)
    given = ModuleSettings.of("tool-x", {"amplifier": {"tool-x": {"config": {"a": [1]}, "working_dir": "/srv"}}})
    assert (given.config, given.working_dir) == ({"a": [1]}, "/srv")


@pytest.mark.parametrize(("config", "problem"), [
    ({"amplifier": "x"}, "the table: Input should be a valid dictionary"),
    ({"amplifier": {"tool-x": {"config": "x"}}}, "config: Input should be a valid dictionary"),
    ({"amplifier": {"tool-x": {"workdir": "/"}}}, "workdir: Extra inputs are not permitted"),
])
def test_a_bad_table_is_refused_naming_the_table_and_key(config: dict[str, object], problem: str) -> None:
    with pytest.raises(ValueError, match=r"^\[amplifier\.tool-x\] in the config file: ") as raised:
        ModuleSettings.of("tool-x", config)
    assert problem in str(raised.value)
