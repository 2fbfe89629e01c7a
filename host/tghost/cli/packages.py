"""cli.packages: the plugin author's and installer's commands that load no plugin: ``tghost
new`` (a plugin distribution to start from), ``install`` and ``uninstall`` (pip, in the
environment tghost runs in). They import neither the plugins nor Pulsar.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from importlib.metadata import Distribution, entry_points
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
               "  tghost run --reload           # serves it, and each edit anew within seconds\n"
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
    'tghost install -U tghost-weather'. Then it says what a running host does: a new plugin is
    served within seconds by a 'tghost run --watch-plugins' or '--reload'; a plugin installed
    again (upgraded, or reinstalled) by a 'tghost run --reload' only, any other host serves the
    code it started with until restarted. Exits with pip's exit code.
    """
    before = installed_plugins()
    code = _pip("install", args)
    if code == 0:
        click.echo(install_outcome(before, installed_plugins()), err=True)
    sys.exit(code)


#: A ``tghost.plugins`` entry point's distribution: (name, version, when its metadata was written).
Installed = tuple[str, str, float]


def installed_plugins() -> dict[str, Installed]:
    """Every installed ``tghost.plugins`` entry point by name, read from disk afresh (no plugin is imported)."""
    from tghost.discovery.discover import ENTRY_POINT_GROUP

    importlib.invalidate_caches()
    return {ep.name: (ep.dist.name, ep.dist.version, _written(ep.dist)) if ep.dist is not None else ("?", "?", 0.0)
            for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _written(dist: Distribution) -> float:
    """When the distribution's metadata was written (a reinstall writes it again); 0 if unknown."""
    listed = next((f for f in dist.files or () if f.name == "METADATA"), None)
    folder = getattr(dist, "_path", None)  # a PathDistribution's .dist-info, when no RECORD lists its files
    metadata = Path(str(dist.locate_file(listed))) if listed is not None else Path(str(folder)) / "METADATA"
    try:
        return metadata.stat().st_mtime if listed is not None or folder is not None else 0.0
    except OSError:
        return 0.0


def install_outcome(before: dict[str, Installed], after: dict[str, Installed]) -> str:
    """What the running hosts do with the plugins an install added or changed, one line each."""
    new = [f"{name} ({after[name][0]} {after[name][1]})" for name in sorted(set(after) - set(before))]
    again = [f"{name} ({after[name][0]} {_moved(before[name][1], after[name][1])})"
             for name in sorted(set(after) & set(before)) if after[name] != before[name]]
    lines = [f"installed plugin {', '.join(new)}: 'tghost plugins' lists it; a running 'tghost run --watch-plugins' "
             "or 'tghost run --reload' serves it within seconds, any other 'tghost run' once restarted"] if new else []
    if again:
        lines.append(f"installed plugin {', '.join(again)} again: a running 'tghost run --reload' serves the new "
                     "code within seconds; any other running 'tghost run' (--watch-plugins too) keeps serving the "
                     "code it started with: restart it, or run it with --reload")
    return "\n".join(lines) or "installed: no tghost plugin was added or changed ('tghost plugins' lists them)"


def _moved(old: str, new: str) -> str:
    return new if old == new else f"{old} -> {new}"


@cli.command(context_settings=_PIP_CONTEXT)
@click.argument("args", nargs=-1, required=True, metavar="[PIP OPTIONS] PACKAGE...")
def uninstall(args: tuple[str, ...]) -> None:
    """pip uninstall -y plugins from the environment tghost runs in.

    A 'tghost run --watch-plugins' withdraws their tools within seconds. Exits with pip's
    exit code (pip only warns, and exits 0, for a name that is not installed).
    """
    sys.exit(_pip("uninstall", args))
