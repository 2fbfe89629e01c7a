"""paths: where tghost keeps its files on this machine."""

from __future__ import annotations

from pathlib import Path

__all__ = ["app_dir"]


def app_dir() -> Path:
    """tghost's own folder in the platform's place for an app's files (``click.get_app_dir``):
    ``$XDG_CONFIG_HOME/tghost``, by default ``~/.config/tghost``, on Linux. Holds the default
    config file, embedded brokers' data dirs, host identity slots and signing keys."""
    import click

    return Path(click.get_app_dir("tghost"))
