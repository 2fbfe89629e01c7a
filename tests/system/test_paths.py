"""paths: tghost's folder follows the platform's place for an app's files (``XDG_CONFIG_HOME`` on
Linux), and the config file read is the one given, else the default one if it exists."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tghost.system.paths import app_dir, config_path, default_config_path

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG_CONFIG_HOME is Linux's place")


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private ``XDG_CONFIG_HOME`` for this test."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config"


@linux_only
def test_tghost_s_folder_is_in_xdg_config_home_and_its_config_file_there(config_home: Path) -> None:
    assert app_dir() == config_home / "tghost"
    assert default_config_path() == config_home / "tghost" / "tools.toml"


@linux_only
def test_without_xdg_config_home_tghost_s_folder_is_in_dot_config(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert app_dir() == tmp_path / ".config" / "tghost"


def test_the_config_file_given_wins_else_the_default_one_if_it_exists(config_home: Path, tmp_path: Path) -> None:
    given = tmp_path / "mine.toml"
    assert config_path(None) is None  # no default file: no config
    assert config_path(given) == given  # given, read even if missing (the reader says so)
    default_config_path().parent.mkdir(parents=True)
    default_config_path().write_text("")
    assert config_path(None) == default_config_path()
    assert config_path(given) == given
