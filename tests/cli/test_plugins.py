"""cli.plugins: ``tghost plugins`` lists what loaded, what failed and why, and what was blocked
and by which setting, as a person reads it and as JSON; it exits 1 on any error. In process,
with test distributions on ``sys.path`` (each plugin imported in a probe process first)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from tests.cli.test_cli import ECHO, SHOUT
from tests.conftest import PluginDir
from tests.discovery.test_discover import GREETER
from tghost.cli.app import cli


def _plugins(*args: str, env: dict[str, str | None] | None = None) -> Result:
    """``tghost plugins ARGS`` in process, with no plugin selection or config file from this process's environment."""
    unset: dict[str, str | None] = dict.fromkeys(("TGHOST_LOAD_PLUGINS", "TGHOST_DISABLE_PLUGINS", "TGHOST_CONFIG",
                                                  "TGHOST_STATUS_URL", "TGHOST_METRICS_PORT"))
    return CliRunner().invoke(cli, ["plugins", *args], env={**unset, **(env or {})})


def test_plugins_json_lists_loaded_and_failed_plugins_and_exits_1(plugin_dir: PluginDir) -> None:
    plugin_dir.add("echo", ECHO, version="3.1")
    plugin_dir.add("broken", "import not_a_module_anywhere\n")
    result = _plugins("--json")
    reports = {r["name"]: r for r in json.loads(result.stdout)}
    assert result.exit_code == 1
    assert reports["echo"]["status"] == "loaded" and reports["echo"]["version"] == "3.1"
    assert reports["echo"]["services"] == ["echo", "unhurried", "failing", "kb"]
    assert reports["broken"]["status"] == "failed"
    assert "not_a_module_anywhere" in reports["broken"]["errors"][0]


def test_plugins_human_output_says_what_failed(plugin_dir: PluginDir) -> None:
    plugin_dir.add("broken", "import not_a_module_anywhere\n")
    result = _plugins()
    assert "broken (tghost-test-broken 1.0) failed" in result.stdout
    assert "error: cannot load entry point 'tghost_test_broken'" in result.stdout


def test_plugins_lists_added_plugins_with_their_kind_and_gives_the_config_file_to_their_adder(
    plugin_dir: PluginDir, tmp_path: Path
) -> None:
    plugin_dir.add("greeter", GREETER)
    config = tmp_path / "tghost.toml"
    config.write_text('[greeter]\ngreetings = ["hi"]\n')
    result = _plugins("--config", str(config), env={"TGHOST_LOAD_PLUGINS": "greeter"})
    assert result.exit_code == 0, result.stdout + result.stderr
    assert ("greeter-hi (? ?) loaded\n  kind:        greeter (added by plugin greeter)\n"
            "  entry point: greeting 'hi'\n  services:    greet-hi\n") in result.stdout
    config.write_text("[greeter\n")
    unreadable = _plugins(env={"TGHOST_LOAD_PLUGINS": "greeter", "TGHOST_CONFIG": str(config)})
    assert unreadable.exit_code == 1
    assert f"Error: cannot read {config}: " in unreadable.stderr
    assert "greeter-hello (? ?) loaded" in unreadable.stdout  # listed as without a config file


def test_plugin_flags_block_plugins_and_plugins_lists_why(plugin_dir: PluginDir) -> None:
    plugin_dir.add("echo", ECHO)
    plugin_dir.add("shout", SHOUT)
    env: dict[str, str | None] = {"TGHOST_DISABLE_PLUGINS": "echo"}
    result = _plugins("--json", "--load-plugins", "echo,shout,typo", env=env)
    reports = {r["name"]: r for r in json.loads(result.stdout)}
    assert reports["echo"]["status"] == "blocked" and reports["echo"]["blocked"] == "disabled by TGHOST_DISABLE_PLUGINS"
    assert reports["shout"]["status"] == "loaded" and reports["shout"]["services"] == ["shout"]
    assert reports["typo"]["status"] == "missing" and "--load-plugins names entry point 'typo'" in (
        reports["typo"]["errors"][0])
    assert result.exit_code == 1  # the unknown name is an error
    assert {r["status"] for name, r in reports.items() if name not in ("echo", "shout", "typo")} == {"blocked"}
    human = _plugins("--load-plugins", "shout", "--disable-plugins", "", env=env)
    assert human.exit_code == 0, human.stdout
    assert "echo (tghost-test-echo 1.0) blocked\n  entry point: tghost_test_echo\n  blocked:     not listed in " \
           "--load-plugins" in human.stdout


def test_errors_start_with_click_s_error(tmp_path: Path) -> None:
    config = tmp_path / "tools.toml"
    config.write_text("not toml [")
    result = _plugins("--config", str(config), env={"TGHOST_LOAD_PLUGINS": ""})
    assert result.exit_code == 1 and "Error: " in result.output and "\nerror: " not in "\n" + result.output

