"""cli.app: the ``tghost`` click group and the console-script entry point. Exit codes: 0 ok,
1 failure, 2 usage error.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
from typing import NamedTuple

import click

from tghost._version import __version__
from tghost.system import exits


def _broker_error(exc: Exception) -> bool:
    """Whether ``exc`` is a :class:`~tghost.pulsar.clients.BrokerError` (looked up only if that
    module was imported: a command that never reached for Pulsar never raises one)."""
    clients = sys.modules.get("tghost.pulsar.clients")
    return clients is not None and isinstance(exc, clients.BrokerError)


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
    exits.end_at_once()
    try:
        cli(prog_name="tghost")
        code = 0
    except SystemExit as exc:
        if isinstance(exc.code, str):
            click.echo(exc.code, err=True)
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except Exception as exc:
        if not _broker_error(exc):
            raise
        click.echo(f"Error: {exc}", err=True)  # a command that could not reach Pulsar: it says what to do
        code = 1
    if (tracing := sys.modules.get("tghost.system.tracing")) is not None:
        tracing.flush()  # spans still buffered: os._exit runs no atexit hook
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Entry(NamedTuple):
    """A command's module (``tghost.cli.<module>``) and its one-line help."""

    module: str
    help: str


#: Each command's module, imported only when that command runs: ``tghost tools`` never imports
#: what ``tghost run`` needs, and ``tghost --help`` imports none (it lists the ``help`` here,
#: which a test keeps equal to each command's own first line).
COMMANDS = {
    "broker": Entry("broker", "Run the embedded pulsar-lite broker here until Ctrl-C, SIGTERM or SIGHUP."),
    "call": Entry("call", "Call a tool by name (through the live directory), or a service with --service."),
    "export": Entry("directory", "Write the live tools as JSON on stdout, in the shape another agent loads."),
    "inspect": Entry("directory", "See and try the live directory in a web browser, until Ctrl-C."),
    "install": Entry("packages", "pip install plugins into the environment tghost runs in, as 'llm install' does."),
    "keygen": Entry("keys", "Write an Ed25519 key pair for signed announcements."),
    "mcp": Entry("directory", "Serve the live tools to MCP clients (Model Context Protocol), until Ctrl-C or the "
                              "client leaves."),
    "new": Entry("packages", "Write a new plugin distribution, tghost-NAME/, ready to install, test and serve."),
    "plugins": Entry("plugins", "List every installed plugin: what it serves, what failed and why, and what was "
                                "blocked (by --load-plugins/--disable-plugins or their env vars) and by which "
                                "setting."),
    "pulsar": Entry("deploy", "Set up an Apache Pulsar cluster for tghost."),
    "run": Entry("run", "Serve every installed tool-service plugin on Pulsar."),
    "status": Entry("status", "Show every live host: its services, tools, lease, signature, conflicts and health."),
    "tools": Entry("directory", "List the live tools every agent can see, as announced by running hosts."),
    "trustgraph": Entry("trustgraph", "Work with a TrustGraph deployment on the same Pulsar cluster."),
    "uninstall": Entry("packages", "pip uninstall -y plugins from the environment tghost runs in."),
    "watch": Entry("directory", "Follow the live tool set: tools added, updated, removed or expired, until Ctrl-C."),
}


class LazyGroup(click.Group):
    """A click group whose commands register themselves when :data:`COMMANDS` says their module
    is imported (click's documented lazy-loading pattern); its help lists them without importing."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(f"{__package__}.{COMMANDS[cmd_name].module}")
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their one-line help, as click lists them, from :data:`COMMANDS`."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        with formatter.section("Commands"):
            formatter.write_dl([(name, click.Command(name, help=COMMANDS[name].help).get_short_help_str(limit))
                                for name in names])


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
