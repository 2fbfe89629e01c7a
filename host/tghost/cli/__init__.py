"""cli: the ``tghost`` command, one module per command family. Each module parses options,
calls the stage modules and prints for humans or (``--json``) for programs; none holds
logic a library user would need. Exit codes: 0 ok, 1 failure, 2 usage error.

A command's module is imported when the command runs (:class:`tghost.cli.app.LazyGroup`).
"""

from typing import TYPE_CHECKING, Any

from tghost.cli.app import cli, main

if TYPE_CHECKING:
    from tghost.cli.options import pulsar_options
    from tghost.cli.packages import pip_command

__all__ = ["cli", "main", "pip_command", "pulsar_options"]

_LAZY = {"pulsar_options": "options", "pip_command": "packages"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
