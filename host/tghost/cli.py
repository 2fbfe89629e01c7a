"""cli: the ``tghost`` command. Parses options, calls the stage modules, prints for humans
or (``--json``) for programs. Exit codes: 0 ok, 1 failure, 2 usage error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import pulsar.asyncio

from . import __version__
from .broker import (
    DEFAULT_URL,
    BrokerError,
    EmbeddedBroker,
    PulsarSettings,
    default_data_dir,
    ensure_broker,
    is_reachable,
)
from .client import ToolCallError, ToolServiceClient
from .descriptors import request_queue, response_queue
from .discover import PluginLoadError, discover
from .host import run_host
from .serve import ServeSettings

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("tghost")


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")


def pulsar_options(fn: F) -> F:
    """The connection options every command that talks to Pulsar takes."""
    return click.option(
        "--pulsar-url", envvar="TGHOST_PULSAR_URL", default=DEFAULT_URL, show_default=True,
        help="Pulsar service URL (env TGHOST_PULSAR_URL).",
    )(fn)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tghost")
def main() -> None:
    """Host pip-installed agent tool services on Apache Pulsar.

    \b
    Quick start:
      tghost run                      serve every installed plugin (starts a local broker if needed)
      tghost plugins                  what loaded, what failed and why
      tghost call --service joke-service --config style=pun topic=cats
    """


@main.command()
@pulsar_options
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help=f"Embedded broker data directory [default: {default_data_dir()}].")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True,
              help="Seconds per call, unless the service descriptor sets its own.")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=16, show_default=True,
              help="Calls in flight per service, unless the service descriptor sets its own.")
@click.option("--max-queue", type=click.IntRange(min=0), default=64, show_default=True,
              help="Requests per service that may wait for a slot before 'overloaded' replies.")
@click.option("--grace", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Seconds in-flight calls get to finish on SIGINT/SIGTERM.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
def run(pulsar_url: str, data_dir: Path | None, timeout: float, max_concurrency: int,
        max_queue: int, grace: float, log_level: str) -> None:
    """Serve every installed tool-service plugin on Pulsar.

    If nothing answers at a local --pulsar-url, an embedded pulsar-lite broker is started
    there. Stops cleanly on Ctrl-C or SIGTERM: no new requests, in-flight calls finish.
    """
    _setup_logging(log_level)
    try:
        catalog = discover()
    except PluginLoadError as exc:
        raise click.ClickException(str(exc)) from None
    for report in catalog.plugins:
        for error in report.errors:
            log.error("plugin %s: %s (run 'tghost plugins' for details)", report.name, error)
    if not catalog.services:
        log.warning("no tool services to serve: pip install a tghost plugin (see 'tghost plugins')")
    broker = _start_broker_if_needed(pulsar_url, data_dir)
    settings = ServeSettings(timeout=timeout, max_concurrency=max_concurrency,
                             max_queue=max_queue, grace=grace)
    try:
        asyncio.run(run_host(catalog, PulsarSettings(pulsar_url), settings))
    except pulsar.asyncio.PulsarException as exc:
        raise click.ClickException(f"Pulsar at {pulsar_url} failed: {exc}; check --pulsar-url "
                                   "(env TGHOST_PULSAR_URL) and that the broker is up") from None
    finally:
        if broker is not None:
            broker.stop()


def _start_broker_if_needed(url: str, data_dir: Path | None) -> EmbeddedBroker | None:
    try:
        broker = ensure_broker(url, data_dir)
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from None
    if broker is not None:
        log.info("nothing answered at %s: started the embedded broker there (data %s, log %s)",
                 url, broker.data_dir, broker.log_path)
    return broker


@main.command()
@click.option("--port", type=click.IntRange(1, 65535), default=6650, show_default=True)
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help=f"Data directory [default: {default_data_dir()}].")
def broker(port: int, data_dir: Path | None) -> None:
    """Run only the embedded pulsar-lite broker, until Ctrl-C."""
    _setup_logging("info")
    embedded = EmbeddedBroker(data_dir or default_data_dir(), port)
    try:
        embedded.start()
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"embedded broker at {embedded.url} (data {embedded.data_dir}); Ctrl-C to stop", err=True)
    try:
        assert embedded.process is not None
        embedded.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        embedded.stop()


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
def plugins(as_json: bool) -> None:
    """List every installed plugin: what it serves, and what failed and why.

    Exits 1 when any plugin reported an error.
    """
    logging.basicConfig(level=logging.CRITICAL)
    catalog = discover(strict=False)
    if as_json:
        click.echo(json.dumps([report.to_json() for report in catalog.plugins], indent=2))
    else:
        _print_plugins(catalog.plugins)
    if any(report.errors for report in catalog.plugins):
        sys.exit(1)


def _print_plugins(reports: list[Any]) -> None:
    if not reports:
        click.echo("no plugins installed (entry point group 'tghost.plugins')")
    for report in reports:
        status = click.style("failed", fg="red") if report.failed else click.style("loaded", fg="green")
        click.echo(f"{report.name} ({report.distribution or '?'} {report.version or '?'}) {status}")
        click.echo(f"  entry point: {report.value}")
        click.echo(f"  services:    {', '.join(report.services) or '-'}")
        click.echo(f"  tools:       {', '.join(report.tools) or '-'}")
        for error in report.errors:
            click.echo(click.style(f"  error: {error}", fg="red"))


def _parse_pairs(pairs: tuple[str, ...], what: str) -> dict[str, Any]:
    """``k=v`` gives the string ``v``; ``k:=v`` parses ``v`` as JSON (as httpie does)."""
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or key in ("", ":"):
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE (or KEY:=JSON)", param_hint=what)
        if key.endswith(":"):
            key, raw = key[:-1], _json_value(raw, f"{pair!r}: the value after ':='", what)
        values[key] = raw
    return values


def _json_value(text: str, what: str, hint: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"{what} is not JSON ({exc})", param_hint=hint) from None


def _service_queues(service_id: str, topic: str | None) -> tuple[str, str]:
    if topic:
        return request_queue(topic), response_queue(topic)
    descriptor = discover(strict=False).descriptors.get(service_id)
    if descriptor is None:
        log.warning("service %r is not installed here; assuming topic %r (use --topic)", service_id, service_id)
        return request_queue(service_id), response_queue(service_id)
    return descriptor.request_queue, descriptor.response_queue


@main.command()
@pulsar_options
@click.option("--service", "service_id", required=True, help="Tool service id, e.g. joke-service.")
@click.option("--topic", default=None,
              help="Short topic T of the service (non-persistent://tg/request/T). "
                   "Default: from the installed plugin, else the service id.")
@click.option("--config", "config_pairs", multiple=True, metavar="KEY=VALUE",
              help="A config value; repeatable. KEY:=JSON for non-strings.")
@click.option("--json", "json_args", default=None, metavar="ARGS",
              help="All arguments as one JSON object, instead of KEY=VALUE pairs.")
@click.option("--user", default=None, help="The request's user (omitted if not given).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Seconds to wait for the whole answer.")
@click.argument("arguments", nargs=-1, metavar="[KEY=VALUE | KEY:=JSON]...")
def call(pulsar_url: str, service_id: str, topic: str | None, config_pairs: tuple[str, ...],
         json_args: str | None, user: str | None, timeout: float, arguments: tuple[str, ...]) -> None:
    """Send one request to a tool service and print the observation as it streams in.

    Exits 1 on an error reply or a timeout (the error goes to stderr).
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if json_args is not None and arguments:
        raise click.UsageError("give arguments as KEY=VALUE pairs or --json, not both")
    args = _parse_pairs(arguments, "ARGUMENTS") if json_args is None else _json_object(json_args)
    config = _parse_pairs(config_pairs, "--config")
    queues = _service_queues(service_id, topic)
    if not is_reachable(pulsar_url):
        raise click.ClickException(f"no Pulsar broker answers at {pulsar_url}: start one with "
                                   "'tghost run', or pass --pulsar-url / TGHOST_PULSAR_URL")
    try:
        asyncio.run(_call(PulsarSettings(pulsar_url), queues, config, args, user, timeout))
    except ToolCallError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


def _json_object(text: str) -> dict[str, Any]:
    value = _json_value(text, "ARGS", "--json")
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--json")
    return value


async def _call(settings: PulsarSettings, queues: tuple[str, str], config: dict[str, Any],
                arguments: dict[str, Any], user: str | None, timeout: float) -> None:
    client = await settings.connect()
    try:
        async with ToolServiceClient(client, *queues) as service:
            async for chunk in service.stream(config, arguments, user=user, timeout=timeout):
                click.echo(chunk, nl=False)
        click.echo()
    finally:
        await client.close()
