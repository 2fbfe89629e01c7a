"""The plugin of docs/guides/writing-plugins.md, built from the page's own blocks, works as written:
its ``pyproject.toml`` builds and installs, its test passes with no pytest configuration (and no
pytest-asyncio), and ``tghost run`` serves it: each ``tghost call`` of the console block answers
exactly what the page shows under it."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

from tests.author.test_scaffold import OFFLINE_PIP, _env
from tests.test_docs import block, commands
from tghost.broker import EmbeddedBroker
from tghost.discovery.discover import ENTRY_POINT_GROUP

from .conftest import HostProcess

GUIDE = "docs/guides/writing-plugins.md"


def write_plugin(root: Path) -> None:
    """The plugin's three files, from the page's blocks, each named by its first line."""
    (root / "tests").mkdir(parents=True)
    (root / "pyproject.toml").write_text(block(GUIDE, "# pyproject.toml"))
    (root / "tghost_weather.py").write_text(
        block(GUIDE, "# tghost_weather.py") + "\n" + block(GUIDE, "# tghost_weather.py, continued"))
    (root / "tests" / "test_weather.py").write_text(block(GUIDE, "# tests/test_weather.py"))


def test_the_readme_plugin_builds_installs_passes_its_test_and_is_served(
    tmp_path: Path, pulsar_broker: EmbeddedBroker, host_process: Callable[..., HostProcess]
) -> None:
    root = tmp_path / "tghost-weather"
    write_plugin(root)
    install, pytest_run, run, *calls = commands(GUIDE, "$ tghost install -e '.[test]'")
    tghost = [sys.executable, "-m", "tghost"]
    assert (install[0], pytest_run[0], run[0]) == ([*tghost, "install", "-e", ".[test]"],
                                                   [sys.executable, "-m", "pytest"], [*tghost, "run"])

    # tghost install, into a private target (not editable: the test venv stays as it was; offline).
    site = tmp_path / "site"
    installed = subprocess.run([*install[0][:-2], "--no-index", "--no-deps", "--no-build-isolation", "--target",
                                str(site), ".[test]"], cwd=root, env=OFFLINE_PIP, capture_output=True, text=True,
                               timeout=180)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert (site / "tghost_weather.py").is_file()

    # python -m pytest: no pytest configuration in the project, no pytest-asyncio, every warning an error.
    examples = ",".join(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    env = _env(site, pulsar_broker, tmp_path, TGHOST_DISABLE_PLUGINS=examples)
    tested = subprocess.run([*pytest_run[0], "-q", "-p", "no:asyncio", "-p", "no:cacheprovider", "-W", "error"],
                            cwd=root, env=env, capture_output=True, text=True, timeout=180)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "2 passed" in tested.stdout and "warning" not in tested.stdout.lower()

    # tghost run, then every tghost call as shown, with its output.
    host = host_process(*run[0][len(tghost) + 1:], env=env, cwd=root)
    host.wait_for("announced")
    assert calls and all(argv[:4] == [*tghost, "call"] for argv, _ in calls)
    for argv, shown in calls:
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert result.stdout + result.stderr == shown, argv
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0
