"""cli.packages: the plugin author's and installer's commands that load no plugin: ``tghost
new`` (a plugin distribution to start from), ``install`` and ``uninstall`` (pip, in the
environment tghost runs in). They import neither the plugins nor Pulsar.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

from tghost.cli.app import cli


@cli.command()
@click.argument("name")
@click.option("--dir", "parent", type=click.Path(path_type=Path, file_okay=False), default=Path("."),
              show_default=True, metavar="PARENT",
              help="Where to make tghost-NAME/: the plugin is written to PARENT/tghost-NAME/.")
@click.option("--force", is_flag=True, help="Write into an existing, non-empty tghost-NAME/, overwriting its files.")
def new(name: str, parent: Path, force: bool) -> None:
    """Write a new plugin distribution, tghost-NAME/, ready to install, test and serve.

    It has a pyproject.toml with the 'tghost.plugins' entry point, one @tghost.tool function
    (a word count), a test that calls it through a real embedded broker, and a README.
    NAME is lowercase letters and digits, words joined by '-', e.g. 'word-count'.
    """
    from tghost.author.scaffold import BadPluginName, PluginNames, write_plugin  # jinja2 only for this command

    try:
        names = PluginNames.parse(name)
    except BadPluginName as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    try:
        root = write_plugin(names, parent, force)
    except OSError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {root}/ with the tool {names.tool} ({names.module}/__init__.py)\n\nnext steps:\n"
               f"  cd {root}\n"
               "  tghost install -e '.[test]'   # into the environment tghost runs in\n"
               "  python -m pytest              # calls the tool through a real embedded broker\n"
               "  tghost run                    # (or keep one running with --watch-plugins)\n"
               f"  tghost call {names.tool} text=\"hello tool world\"   # in another terminal")


_PIP_CONTEXT = {"ignore_unknown_options": True, "help_option_names": ["-h", "--help"]}


def pip_command(action: str, args: tuple[str, ...]) -> list[str]:
    """The pip command line for ``tghost install|uninstall``: this interpreter's own pip (the
    environment tghost runs in), ``-y`` for uninstall, then ``args`` as given."""
    return [sys.executable, "-m", "pip", action, *(["-y"] if action == "uninstall" else []), *args]


def _pip(action: str, args: tuple[str, ...]) -> int:
    try:
        return subprocess.run(pip_command(action, args), check=False).returncode
    except OSError as exc:
        raise click.ClickException(f"cannot run pip ({exc}): is pip installed for {sys.executable}?") from None


@cli.command(context_settings=_PIP_CONTEXT)
@click.argument("args", nargs=-1, required=True, metavar="[PIP OPTIONS] PACKAGE...")
def install(args: tuple[str, ...]) -> None:
    """pip install plugins into the environment tghost runs in, as 'llm install' does.

    Every argument goes to pip as given, e.g. 'tghost install -e ./tghost-weather' or
    'tghost install -U tghost-weather'. A 'tghost run --watch-plugins' serves what it
    installs within seconds; otherwise restart 'tghost run'. Exits with pip's exit code.
    """
    code = _pip("install", args)
    if code == 0:
        click.echo("installed: 'tghost plugins' lists it; a 'tghost run --watch-plugins' serves it now, "
                   "any other 'tghost run' after a restart", err=True)
    sys.exit(code)


@cli.command(context_settings=_PIP_CONTEXT)
@click.argument("args", nargs=-1, required=True, metavar="[PIP OPTIONS] PACKAGE...")
def uninstall(args: tuple[str, ...]) -> None:
    """pip uninstall -y plugins from the environment tghost runs in.

    A 'tghost run --watch-plugins' withdraws their tools within seconds. Exits with pip's
    exit code (pip only warns, and exits 0, for a name that is not installed).
    """
    sys.exit(_pip("uninstall", args))
