"""cli.plugins: ``tghost plugins``, what loaded, what failed and why, and which live hosts on
this machine serve a plugin at its old code (the plugin author's other commands, which load no
plugin, are :mod:`tghost.cli.packages`').
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from tghost.agent.entries import CodeVersion, ServiceEntry, describe_old_code, old_code
from tghost.cli.app import cli
from tghost.cli.options import config_option, open_directory, pulsar_options, selection_options
from tghost.cli.status import default_status_url, describe_workers, read_health
from tghost.discovery.catalog import PluginReport, ToolSetReport
from tghost.discovery.config import ConfigError, read_config
from tghost.discovery.discover import PluginSelection, discover
from tghost.pulsar.clients import BrokerError, PulsarSettings, is_reachable

#: By plugin name, the versions of its code other than the installed one that live hosts on this
#: machine serve; ``None``: not checked (no broker answers).
OldCode = dict[str, tuple[CodeVersion, ...]] | None

log = logging.getLogger("tghost")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
@click.option("--url", default=None, help="The /health URL of a running 'tghost run --metrics-port', to show its "
                                          "services' workers and restarts by reason [default: from "
                                          "TGHOST_STATUS_URL or TGHOST_METRICS_PORT, if set].")
@config_option
@selection_options
@pulsar_options(waits=False)
def plugins(as_json: bool, url: str | None, config_path: Path | None, selection: PluginSelection,
            pulsar: PulsarSettings, descriptors_topic: str) -> None:
    """List every installed plugin: what it serves, what failed and why, and what was blocked
    (by --load-plugins/--disable-plugins or their env vars) and by which setting. Plugins that
    other plugins add (e.g. each Amplifier tool module, with tghost-amplifier) are listed with
    their kind and the plugin that added them; --config gives them their settings. A plugin's
    toolsets (tool sets it changes while a host runs) are listed with the tools they hold as
    loaded here, what they say is wrong, and what of them was refused.

    Each plugin is imported in a probe process first, so one that crashes or hangs on import
    is listed as failed (with the signal or exit code) and the rest are still listed. Given a
    running host (--url), each service's workers are shown too: isolation, stuck threads, and
    worker processes restarted by reason (timeout, crash, memory, recycled).

    When a broker answers (--pulsar-url), a plugin that a live host on this machine serves at
    other code than installed here (it was edited or upgraded after that host started, without
    --reload) is marked 'old code', naming the host; --json gives those versions as 'old_code'
    (null: no broker answered, not checked).

    Exits 1 when any plugin (or toolset) reported an error, a setting names an entry point not
    installed, or the config file cannot be read.
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
    old = _old_code(catalog.plugins, pulsar, descriptors_topic)
    if as_json:
        click.echo(json.dumps([{**report.to_json(), "workers": {sid: workers[sid] for sid in report.services
                                                                 if sid in workers},
                                "old_code": None if old is None else [v.to_json() for v in old[report.name]]}
                               for report in catalog.plugins], indent=2))
    else:
        _print_plugins(catalog.plugins, workers, old or {})
    if config_error is not None:
        click.echo(click.style(f"Error: {config_error} (plugins were loaded without it)", fg="red"), err=True)
    if config_error is not None or any(report.errors or any(t.errors for t in report.toolsets)
                                       for report in catalog.plugins):
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


def _old_code(reports: Sequence[PluginReport], pulsar: PulsarSettings, topic: str) -> OldCode:
    """What :data:`OldCode` says of each of ``reports``' plugins, from the live hosts' announcements
    on ``topic`` (:func:`tghost.agent.entries.old_code`); ``None`` when no broker answers, the
    broker refuses the directory (a note says why), or no plugin comes from a distribution
    (nothing to compare)."""
    if not any(report.distribution for report in reports) or not is_reachable(pulsar.url):
        return None
    try:
        services = asyncio.run(_live_services(pulsar, topic))
    except BrokerError as exc:
        click.echo(f"note: cannot read the live hosts at {pulsar.url} ({exc}): not checked whether one serves "
                   "a plugin at its old code", err=True)
        return None
    return {report.name: old_code(services, report.origin_json()) for report in reports}


async def _live_services(pulsar: PulsarSettings, topic: str) -> list[ServiceEntry]:
    """The live tool services, as a directory that has caught up on ``topic`` holds them (open mode)."""
    async with open_directory(pulsar, topic, None) as directory:
        return list(directory.services.values())


def _print_plugins(reports: list[PluginReport], workers: dict[str, Any],
                   old: dict[str, tuple[CodeVersion, ...]]) -> None:
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
        if old.get(report.name):
            said = describe_old_code("it", report.version, old[report.name])
            click.echo(click.style(f"  old code:    {said}", fg="yellow"))
        for error in report.errors:
            click.echo(click.style(f"  error: {error}", fg="red"))
        for toolset in report.toolsets:
            _print_toolset(toolset)


def _print_toolset(toolset: ToolSetReport) -> None:
    name = toolset.toolset.name
    click.echo(f"  toolset:     {name}: {', '.join(toolset.tools) or 'no tools'}")
    if toolset.toolset.problem:
        click.echo(click.style(f"  problem:     {name}: {toolset.toolset.problem}", fg="yellow"))
    for error in toolset.errors:
        click.echo(click.style(f"  error: toolset {name}: {error}", fg="red"))
