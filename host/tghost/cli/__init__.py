"""cli: the ``tghost`` command, one module per command family. Each module parses options,
calls the stage modules and prints for humans or (``--json``) for programs; none holds
logic a library user would need. Exit codes: 0 ok, 1 failure, 2 usage error.
"""

from . import broker, call, directory, keys, plugins, run, status, trustgraph  # noqa: F401  (registers the commands)
from .app import cli, main
from .options import pulsar_options
from .plugins import pip_command

__all__ = ["cli", "main", "pip_command", "pulsar_options"]
