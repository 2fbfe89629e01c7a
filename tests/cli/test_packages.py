"""packages: what ``tghost install`` says a running host does with the plugins it added, and with
those it installed again (upgraded or reinstalled), read from the installed distributions."""

from __future__ import annotations

import os

from tests.conftest import PluginDir
from tghost.cli.packages import install_outcome, installed_plugins

SOURCE = "import tghost\n"


def test_a_new_plugin_is_served_by_watching_or_reloading_hosts(plugin_dir: PluginDir) -> None:
    before = installed_plugins()
    plugin_dir.add("textkit", SOURCE, version="0.1.0")
    said = install_outcome(before, installed_plugins())
    assert said == ("installed plugin textkit (tghost-test-textkit 0.1.0): 'tghost plugins' lists it; a running "
                    "'tghost run --watch-plugins' or 'tghost run --reload' serves it within seconds, any other "
                    "'tghost run' once restarted")


def test_a_plugin_installed_again_is_served_anew_by_reloading_hosts_only(plugin_dir: PluginDir) -> None:
    plugin_dir.add("textkit", SOURCE, version="0.1.0")
    before = installed_plugins()
    metadata = plugin_dir.root / "tghost_test_textkit-0.1.0.dist-info" / "METADATA"
    metadata.write_text(metadata.read_text().replace("0.1.0", "0.2.0"))
    said = install_outcome(before, installed_plugins())
    assert said.startswith("installed plugin textkit (tghost-test-textkit 0.1.0 -> 0.2.0) again: a running "
                           "'tghost run --reload' serves the new code within seconds; any other running 'tghost run' "
                           "(--watch-plugins too) keeps serving the code it started with: restart it")
    before = installed_plugins()
    stamp = metadata.stat().st_mtime + 5
    os.utime(metadata, (stamp, stamp))  # pip install -e . again: the same version, its metadata written anew
    assert "installed plugin textkit (tghost-test-textkit 0.2.0) again" in install_outcome(before, installed_plugins())


def test_an_install_of_no_plugin_says_so(plugin_dir: PluginDir) -> None:
    plugin_dir.add("textkit", SOURCE)
    now = installed_plugins()
    assert install_outcome(now, now) == "installed: no tghost plugin was added or changed ('tghost plugins' lists them)"
