"""cli.plugins: the plugin author's and installer's commands: ``tghost new``, ``install``,
``uninstall`` and ``plugins`` (what loaded, what failed and why).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

from tghost.cli.app import cli
from tghost.cli.options import config_option, selection_options
from tghost.cli.status import default_status_url, describe_workers, read_health
from tghost.discovery.config import ConfigError, read_config
from tghost.discovery.discover import PluginReport, PluginSelection, discover

log = logging.getLogger("tghost")


@cli.command()
@click.argument("name")
@click.option("--dir", "parent", type=click.Path(path_type=Path, file_okay=False), default=Path("."),
              show_default=True, help="Directory to write tghost-NAME/ in.")
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


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
@click.option("--url", default=None, help="The /health URL of a running 'tghost run --metrics-port', to show its "
                                          "services' workers and restarts by reason [default: from "
                                          "TGHOST_STATUS_URL or TGHOST_METRICS_PORT, if set].")
@config_option
@selection_options
def plugins(as_json: bool, url: str | None, config_path: Path | None, selection: PluginSelection) -> None:
    """List every installed plugin: what it serves, what failed and why, and what was blocked
    (by --load-plugins/--disable-plugins or their env vars) and by which setting. Plugins that
    other plugins add (e.g. each Amplifier tool module, with tghost-amplifier) are listed with
    their kind and the plugin that added them; --config gives them their settings.

    Each plugin is imported in a probe process first, so one that crashes or hangs on import
    is listed as failed (with the signal or exit code) and the rest are still listed. Given a
    running host (--url), each service's workers are shown too: isolation, stuck threads, and
    worker processes restarted by reason (timeout, crash, memory, recycled).

    Exits 1 when any plugin reported an error, a setting names an entry point not installed, or
    the config file cannot be read.
    """
    logging.basicConfig(level=logging.CRITICAL)
    try:
        document = {} if config_path is None else read_config(config_path)
        config_error = None
    except ConfigError as exc:
        document, config_error = {}, str(exc)
    catalog = discover(strict=False, selection=selection, config=document, isolate_imports=True)
    catalog.shutdown()  # listed, not served
    workers = _live_workers(url or default_status_url())
    if as_json:
        click.echo(json.dumps([{**report.to_json(), "workers": {sid: workers[sid] for sid in report.services
                                                                 if sid in workers}}
                               for report in catalog.plugins], indent=2))
    else:
        _print_plugins(catalog.plugins, workers)
    if config_error is not None:
        click.echo(click.style(f"Error: {config_error} (plugins were loaded without it)", fg="red"), err=True)
    if config_error is not None or any(report.errors for report in catalog.plugins):
        sys.exit(1)


_STATUS_COLOUR = {"loaded": "green", "blocked": "yellow"}


def _live_workers(url: str | None) -> dict[str, Any]:
    """Worker stats by service id from a running host's /health, or none (a note says why)."""
    if url is None:
        return {}
    try:
        workers: dict[str, Any] = read_health(url, 5.0).get("workers") or {}
    except (OSError, ValueError) as exc:
        click.echo(f"note: no tghost host answers at {url} ({exc}): workers not shown", err=True)
        return {}
    return workers


def _print_plugins(reports: list[PluginReport], workers: dict[str, Any]) -> None:
    if not reports:
        click.echo("no plugins installed (entry point group 'tghost.plugins')")
    for report in reports:
        status = click.style(report.status, fg=_STATUS_COLOUR.get(report.status, "red"))
        click.echo(f"{report.name} ({report.distribution or '?'} {report.version or '?'}) {status}")
        if report.added_by is not None:
            click.echo(f"  kind:        {report.kind} (added by plugin {report.added_by})")
        click.echo(f"  entry point: {report.value}")
        if report.blocked is not None:
            click.echo(f"  blocked:     {report.blocked}")
        elif report.installed:
            click.echo(f"  services:    {', '.join(report.services) or '-'}")
            click.echo(f"  tools:       {', '.join(report.tools) or '-'}")
            for sid in report.services:
                if sid in workers:
                    click.echo(f"  workers:     {sid}: {describe_workers(workers[sid])}")
        for error in report.errors:
            click.echo(click.style(f"  error: {error}", fg="red"))
