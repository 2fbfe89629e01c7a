"""probe: a plugin that kills or hangs its importer is reported failed, with the signal or exit
code, by ``tghost plugins`` and ``tghost run --isolation process``, which serve the rest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import PluginDir
from tghost.broker import EmbeddedBroker
from tghost.discovery.discover import discover, load_in_probe
from tghost.discovery.probe import probe

GOOD = '''
import tghost


@tghost.tool
def good(text: str) -> str:
    """Echoes the text."""
    return text


@tghost.hookimpl
def tghost_register_services(register):
    register(good)
'''

SEGFAULT_ON_IMPORT = '''
import ctypes

ctypes.string_at(0)
'''


def test_a_plugin_that_kills_or_hangs_its_importer_is_reported_and_never_imported(plugin_dir: PluginDir) -> None:
    plugin_dir.add("good", GOOD)
    plugin_dir.add("crash", SEGFAULT_ON_IMPORT)
    plugin_dir.add("bye", "import os\nos._exit(7)\n")
    plugin_dir.add("sysexit", "import sys\nsys.exit('no thanks')\n")
    plugin_dir.add("hang", "import time\ntime.sleep(60)\n")
    plugin_dir.add("raises", "raise RuntimeError('broken on purpose')\n")
    fatal = probe(plugin_dir.entry_points(), load_in_probe, timeout=3.0)
    assert set(fatal) == {"crash", "bye", "sysexit", "hang"}  # an ordinary exception is the host's to report
    assert fatal["crash"].startswith("importing it killed the process (killed by SIGSEGV)")
    assert fatal["bye"].startswith("importing it killed the process (exit code 7)")
    assert fatal["sysexit"].startswith("importing it raised SystemExit(no thanks)")
    assert fatal["hang"].startswith("importing it did not finish within 3s")


def test_discover_with_isolated_imports_skips_what_the_probe_found_fatal(plugin_dir: PluginDir) -> None:
    plugin_dir.add("good", GOOD)
    plugin_dir.add("crash", SEGFAULT_ON_IMPORT)
    catalog = discover(plugin_dir.entry_points(), isolate_imports=True)
    reports = {report.name: report for report in catalog.plugins}
    assert reports["good"].status == "loaded" and list(catalog.services) == ["good"]
    assert reports["crash"].status == "failed"
    assert "killed by SIGSEGV" in reports["crash"].errors[0] and "tghost_test_crash" not in sys.modules


def test_tghost_plugins_lists_a_plugin_that_segfaults_on_import_as_failed(
    plugin_dir: PluginDir, pulsar_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    plugin_dir.add("good", GOOD)
    plugin_dir.add("crash", SEGFAULT_ON_IMPORT)
    env = plugin_dir.user_env(pulsar_broker.url, tmp_path, "probe")
    listed = subprocess.run([sys.executable, "-m", "tghost", "plugins", "--json"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert listed.returncode == 1, listed.stderr
    reports: dict[str, Any] = {r["name"]: r for r in json.loads(listed.stdout) if r["status"] != "blocked"}
    assert reports["good"]["status"] == "loaded" and reports["good"]["services"] == ["good"]
    assert reports["crash"]["status"] == "failed"
    assert reports["crash"]["errors"] == ["importing it killed the process (killed by SIGSEGV) in a probe process, "
                                          "so the host did not import it"]


def test_tghost_run_isolated_serves_the_rest_when_a_plugin_segfaults_on_import(
    plugin_dir: PluginDir, pulsar_broker: EmbeddedBroker, tmp_path: Path, host_process: Any
) -> None:
    plugin_dir.add("good", GOOD)
    plugin_dir.add("crash", SEGFAULT_ON_IMPORT)
    env = plugin_dir.user_env(pulsar_broker.url, tmp_path, "probe")
    host = host_process("--isolation", "process", env=env)
    host.wait_for(r"plugin crash: importing it killed the process \(killed by SIGSEGV\)")
    host.wait_for(r"serving good")
    answer = subprocess.run([sys.executable, "-m", "tghost", "call", "good", "text=still here"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() == "still here"
    host.process.terminate()
    assert host.finish() == 0
