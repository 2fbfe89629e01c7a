"""scaffold: ``tghost new`` as a user runs it (generate, install, run the plugin's own test, serve
it), and ``tghost install``/``uninstall`` as thin wrappers around this environment's pip."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from tests.conftest import READY, HostProcess, tghost_cli
from tests.test_docs import commands
from tghost.author.scaffold import BadPluginName, PluginNames
from tghost.broker import EmbeddedBroker
from tghost.cli import pip_command
from tghost.discovery.discover import ENTRY_POINT_GROUP

#: pip, with no look at an index for its own new version: tests stay offline, and stderr stays pip's answer.
OFFLINE_PIP = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.mark.parametrize("name", ["Word", "1count", "word--count", "word count", "wörd", "", "word-"])
def test_new_rejects_a_bad_name_with_the_rule_and_writes_nothing(tmp_path: Path, name: str) -> None:
    result = tghost_cli("new", name, "--dir", str(tmp_path))
    assert result.returncode == 2
    assert "is not a plugin name: use lowercase letters and digits" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("raw", ["word-count", "word_count", "tghost-word-count", "tghost_word_count"])
def test_plugin_names_are_normalised_to_one_dash_form(raw: str) -> None:
    names = PluginNames.parse(raw)
    assert (names.name, names.dist, names.module, names.tool) == (
        "word-count", "tghost-word-count", "tghost_word_count", "word-count-word-count")


def test_plugin_names_reject_an_upper_case_name() -> None:
    with pytest.raises(BadPluginName, match="'Weather' is not a plugin name"):
        PluginNames.parse("Weather")


def test_new_refuses_to_overwrite_a_plugin_without_force(tmp_path: Path) -> None:
    assert tghost_cli("new", "notes", "--dir", str(tmp_path)).returncode == 0
    module = tmp_path / "tghost-notes" / "tghost_notes" / "__init__.py"
    module.write_text("# my own work\n")
    refused = tghost_cli("new", "notes", "--dir", str(tmp_path))
    assert refused.returncode == 1 and "--force" in refused.stderr
    assert module.read_text() == "# my own work\n"
    assert tghost_cli("new", "notes", "--dir", str(tmp_path), "--force").returncode == 0
    assert "@tghost.tool" in module.read_text()


#: The README's "Write your first tool" session, run as written (tests/test_docs.py).
FIRST_TOOL = "$ . .venv/bin/activate                  # tghost and its python on PATH"


def test_generated_plugin_installs_passes_its_own_test_and_serves(
    tmp_path: Path, pulsar_broker: EmbeddedBroker, host_process: Callable[..., HostProcess]
) -> None:
    activate, run, new, cd, install, own_test_run, (call, shown) = commands("README.md", FIRST_TOOL)
    tghost_cmd = [sys.executable, "-m", "tghost"]
    assert activate[0] == [".", ".venv/bin/activate"] and run[0] == [*tghost_cmd, "run", "--reload"]
    assert install[0] == [*tghost_cmd, "install", "-e", ".[test]"]
    assert own_test_run[0] == [sys.executable, "-m", "pytest"]
    name = new[0][4]
    names = PluginNames.parse(name)
    assert cd[0] == ["cd", names.dist] and call[:5] == [*tghost_cmd, "call", names.tool]

    site = tmp_path / "site"  # a private install target: the test venv stays as it was
    site.mkdir()
    examples = ",".join(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    env = _env(site, pulsar_broker, tmp_path, TGHOST_DISABLE_PLUGINS=examples)
    host = host_process(*run[0][len(tghost_cmd) + 1:], "--watch-interval", "0.5", "--log-level", "info", env=env)
    host.wait_for(READY)

    # Written inside another project's tree, whose pytest config names options this env may not know
    # (as tghost's own checkout does): the plugin's tests never take that config.
    outer = tmp_path / "outer-project"
    outer.mkdir()
    (outer / "pyproject.toml").write_text('[tool.pytest.ini_options]\nasyncio_mode = "auto"\nnot_an_option = 1\n')
    made = tghost_cli(*new[0][len(tghost_cmd):], "--dir", str(outer))
    assert made.returncode == 0, made.stderr
    root = outer / names.dist
    assert f"cd {root}" in made.stdout and f"tghost call {names.tool}" in made.stdout
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == [
        "README.md", "pyproject.toml", f"tests/test_{names.module.removeprefix('tghost_')}.py",
        f"{names.module}/__init__.py"]

    # Not editable, into the private target; offline.
    installed = tghost_cli("install", "--no-index", "--no-deps", "--no-build-isolation", "--target", str(site),
                           str(root), env=OFFLINE_PIP, timeout=180)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert (site / names.module / "__init__.py").is_file()

    # Its async test needs no pytest-asyncio (tghost's pytest plugin runs it; its own pytest config
    # turns pytest-asyncio off where installed), and every warning is an error: none is raised.
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["tool"]["pytest"]["ini_options"]["testpaths"] == ["tests"]
    assert project["project"]["optional-dependencies"] == {"test": ["pytest>=8"]}
    own_test = subprocess.run([*own_test_run[0], "-q", "-p", "no:cacheprovider", "-W", "error"], cwd=root, env=env,
                              capture_output=True, text=True, timeout=180)
    assert own_test.returncode == 0, own_test.stdout + own_test.stderr
    assert "3 passed" in own_test.stdout and "warning" not in own_test.stdout, own_test.stdout

    host.wait_for(f"reload: serving .*{names.name} 0.1.0")  # by the running host, no restart
    called = subprocess.run(call, env=env, capture_output=True, text=True, timeout=60)
    assert called.returncode == 0, called.stderr
    assert called.stdout == shown == "4\n"
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


def _env(site: Path, broker: EmbeddedBroker, tmp_path: Path, **extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "TGHOST_PULSAR_URL": broker.url,
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "TGHOST_DESCRIPTORS_TOPIC": f"persistent://tg/config/scaffold-{uuid.uuid4().hex[:8]}", **extra}


def test_pip_command_is_this_interpreters_pip_with_yes_for_uninstall() -> None:
    assert pip_command("install", ("-U", "tghost-weather")) == [
        sys.executable, "-m", "pip", "install", "-U", "tghost-weather"]
    assert pip_command("uninstall", ("tghost-weather",)) == [
        sys.executable, "-m", "pip", "uninstall", "-y", "tghost-weather"]


def test_uninstall_of_a_name_not_installed_says_so_and_exits_as_pip_does() -> None:
    name = f"tghost-not-installed-{uuid.uuid4().hex[:8]}"
    ours = tghost_cli("uninstall", name, env=OFFLINE_PIP)
    pips = subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", name], env=OFFLINE_PIP,
                          capture_output=True, text=True)
    assert f"Skipping {name} as it is not installed" in ours.stderr
    assert ours.returncode == pips.returncode


def test_install_failure_exits_with_pips_code_and_message(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-plugin")
    ours = tghost_cli("install", "--no-index", missing, env=OFFLINE_PIP, timeout=120)
    pips = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", missing], env=OFFLINE_PIP,
                          capture_output=True, text=True, timeout=120)
    assert ours.returncode == pips.returncode != 0
    assert "installed:" not in ours.stderr
    assert ours.stderr.strip() == pips.stderr.strip()
