"""cli.app: the ``tghost`` click group and the console-script entry point. Exit codes: 0 ok,
1 failure, 2 usage error.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys

import click

from tghost._version import __version__
from tghost.pulsar.clients import BrokerError
from tghost.system import tracing


def main() -> None:
    """The ``tghost`` console script: run the command, then leave without interpreter
    finalization, where pulsar-client's C++ threads can crash the process after the work is
    done (apache/pulsar-client-python#153, #203). Output is flushed first; the exit code is kept.

    A :class:`~tghost.pulsar.clients.BrokerError` (no broker, not a Pulsar broker at the URL) is an
    ``Error:`` line and exit code 1, as click prints its own errors.

    Ctrl-C (SIGINT) always stops a command, even when the parent started it with SIGINT
    ignored, as a non-interactive shell does for ``cmd &``.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        cli(prog_name="tghost")
        code = 0
    except BrokerError as exc:  # any command that could not reach Pulsar: the message says what to do
        click.echo(f"Error: {exc}", err=True)
        code = 1
    except SystemExit as exc:
        if isinstance(exc.code, str):
            click.echo(exc.code, err=True)
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    tracing.flush()  # spans still buffered: os._exit runs no atexit hook
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


#: Each command's module (``tghost.cli.<module>``), imported only when that command runs (or
#: ``--help`` lists them all): ``tghost tools`` never imports what ``tghost run`` needs.
COMMANDS = {"broker": "broker", "call": "call", "tools": "directory", "watch": "directory",
            "export": "directory", "mcp": "directory", "inspect": "directory", "keygen": "keys", "new": "plugins",
            "install": "plugins", "uninstall": "plugins", "plugins": "plugins", "run": "run",
            "status": "status", "trustgraph": "trustgraph"}


class LazyGroup(click.Group):
    """A click group whose commands register themselves when :data:`COMMANDS` says their module
    is imported (click's documented lazy-loading pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(f"{__package__}.{COMMANDS[cmd_name]}")
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tghost")
def cli() -> None:
    """Host pip-installed agent tool services on Apache Pulsar.

    \b
    Quick start:
      tghost run                      serve every installed plugin (starts a local broker if needed)
      tghost tools                    the live tools every agent sees
      tghost call tell-joke topic=cats
      tghost new NAME                 write a plugin to start from
      tghost mcp                      serve the live tools to MCP clients
      tghost inspect                  see and try the live tools in a web browser
      tghost trustgraph sync          keep a TrustGraph deployment's tool config in step
      tghost plugins                  what loaded, what failed and why
    """
