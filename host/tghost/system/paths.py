"""paths: where tghost keeps its files on this machine."""

from __future__ import annotations

from pathlib import Path

__all__ = ["app_dir", "config_path", "default_config_path"]


def app_dir() -> Path:
    """tghost's own folder in the platform's place for an app's files (``click.get_app_dir``):
    ``$XDG_CONFIG_HOME/tghost``, by default ``~/.config/tghost``, on Linux. Holds the default
    config file, embedded brokers' data dirs, host identity slots and signing keys."""
    import click

    return Path(click.get_app_dir("tghost"))


def default_config_path() -> Path:
    """``tools.toml`` in the platform's app dir for tghost, e.g. ``~/.config/tghost/tools.toml``."""
    return app_dir() / "tools.toml"


def config_path(given: Path | None) -> Path | None:
    """The config file to read: ``given`` (``--config``/``TGHOST_CONFIG``), else the default one
    if it exists, else ``None``."""
    if given is None and default_config_path().exists():
        return default_config_path()
    return given
