"""The fingerprint of a plugin's code (docs/protocol.md §4.3): an installed wheel's files as
RECORD lists them, without what the installer writes; an editable install's (or a distribution's
without RECORD) source files, so an edit changes it. Never imports the plugin."""

from __future__ import annotations

import json
import sys
from importlib.metadata import PathDistribution
from pathlib import Path

import pytest

from tests.conftest import PluginDir
from tghost.discovery.discover import discover
from tghost.discovery.fingerprint import fingerprint

PLUGIN = '''
import tghost

@tghost.tool(service="echo-svc")
def echo(text: str) -> str:
    """Echo."""
    return text
'''


def wheel(site: Path, record: list[str], editable: bool = False) -> PathDistribution:
    """A distribution ``fp_pkg`` installed in ``site``, its RECORD listing ``record``."""
    info = site / "fp_pkg-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fp-pkg\nVersion: 1.0\n")
    (info / "INSTALLER").write_text("pip\n")
    if editable:
        (info / "direct_url.json").write_text(json.dumps({"dir_info": {"editable": True}, "url": "file:///x"}))
    (info / "RECORD").write_text("".join(f"{name},,\n" for name in record))
    return PathDistribution(info)


def test_an_installed_wheel_is_its_files_without_the_installers_own(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "fp_pkg" / "__pycache__").mkdir(parents=True)
    (site / "fp_pkg" / "__init__.py").write_text("X = 1\n")
    (site / "fp_pkg" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"compiled")
    dist = wheel(site, ["fp_pkg/__init__.py", "fp_pkg/__pycache__/__init__.cpython-311.pyc",
                        "fp_pkg-1.0.dist-info/INSTALLER", "../../bin/fp"])
    first = fingerprint(dist, "fp_pkg")
    assert first is not None and len(first) == 64
    (site / "fp_pkg-1.0.dist-info" / "INSTALLER").write_text("uv\n")  # another installer: the same code
    (site / "fp_pkg" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"recompiled")
    assert fingerprint(dist, "fp_pkg") == first
    (site / "fp_pkg" / "__init__.py").write_text("X = 2\n")
    assert fingerprint(dist, "fp_pkg") != first


def test_an_editable_install_is_its_package_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site, source = tmp_path / "site", tmp_path / "src"
    (source / "fp_pkg" / "templates").mkdir(parents=True)
    site.mkdir()
    (site / "_fp_pkg.pth").write_text(str(source))
    monkeypatch.syspath_prepend(str(source))
    (source / "fp_pkg" / "__init__.py").write_text("X = 1\n")
    (source / "fp_pkg" / "templates" / "t.txt").write_text("a template")
    dist = wheel(site, ["_fp_pkg.pth"], editable=True)
    first = fingerprint(dist, "fp_pkg.plugin")
    (source / "fp_pkg" / "templates" / "t.txt").write_text("another template")
    second = fingerprint(dist, "fp_pkg.plugin")
    assert None not in (first, second) and first != second
    assert "fp_pkg" not in sys.modules  # found on sys.path, never imported


def test_a_plugin_edited_between_two_discoveries_has_another_fingerprint(plugin_dir: PluginDir) -> None:
    plugin_dir.add("echo", PLUGIN)
    [first] = discover(plugin_dir.entry_points()).plugins
    module = plugin_dir.root / "tghost_test_echo.py"
    module.write_text(module.read_text() + "\n# edited\n")
    [second] = discover(plugin_dir.entry_points()).plugins
    assert first.fingerprint is not None and second.fingerprint is not None
    assert first.fingerprint != second.fingerprint
    assert first.origin_json() == {"entry_point": "echo", "distribution": "tghost-test-echo", "version": "1.0",
                                   "fingerprint": first.fingerprint}
