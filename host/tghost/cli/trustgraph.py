"""cli.trustgraph: ``tghost trustgraph sync``, which keeps a TrustGraph deployment's tool config
items in step with the live directory (:mod:`tghost.adapters.trustgraph.sync`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal

import click
from pulsar.asyncio import PulsarException

from tghost.adapters.trustgraph.config_service import (
    PUSH_QUEUE,
    REQUEST_QUEUE,
    RESPONSE_QUEUE,
    ConfigServiceClient,
    ConfigServiceError,
    pulsar_topic,
)
from tghost.adapters.trustgraph.sync import MARKER, ItemChange, TrustGraphSync, summary
from tghost.cli.app import cli
from tghost.cli.options import (
    directory_bounds,
    filter_options,
    identity_options,
    pulsar_options,
    require_broker,
    setup_logging,
    trust_options,
)
from tghost.protocol.trust import Signer, TrustedKeys
from tghost.pulsar.clients import PulsarSettings

log = logging.getLogger("tghost")


@cli.group()
def trustgraph() -> None:
    """Work with a TrustGraph deployment on the same Pulsar cluster."""


def _workspace(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not value:
        raise click.BadParameter("TrustGraph's config service needs a workspace name")
    return value


def _queue(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return pulsar_topic(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@trustgraph.command()
@pulsar_options
@filter_options
@trust_options
@identity_options
@click.option("--workspace", envvar="TGHOST_TRUSTGRAPH_WORKSPACE", default="default", show_default=True,
              callback=_workspace,
              help="TrustGraph workspace whose config items to keep (env TGHOST_TRUSTGRAPH_WORKSPACE).")
@click.option("--owner", default="tghost", show_default=True,
              help=f"Name written in the {MARKER!r} key of every item this sync writes; it deletes or changes "
                   "only items with its own name. One name per sync.")
@click.option("--config-request-queue", default=REQUEST_QUEUE, show_default=True, callback=_queue,
              help="Config service request queue: a TrustGraph queue id or a Pulsar topic.")
@click.option("--config-response-queue", default=RESPONSE_QUEUE, show_default=True, callback=_queue,
              help="Config service response queue: a TrustGraph queue id or a Pulsar topic.")
@click.option("--config-push-queue", default=PUSH_QUEUE, show_default=True, callback=_queue,
              help="Config push queue, followed to put back items changed by others.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="Seconds the config service gets to answer one request.")
@click.option("--resync-interval", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds between two passes when nothing triggers one.")
@click.option("--once", is_flag=True, help="One pass, print what it did, exit (for cron or CI).")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: with --once one object, else one object per change (JSON Lines).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None,
              help="Log level; the log goes to stderr [default: info; warning with --once].")
def sync(pulsar: PulsarSettings, descriptors_topic: str, groups: tuple[str, ...], state: str | None,
         trusted: TrustedKeys | None, identity: Signer | None, workspace: str, owner: str, config_request_queue: str,
         config_response_queue: str, config_push_queue: str, timeout: float, resync_interval: float, once: bool,
         as_json: bool, log_level: str | None) -> None:
    """Keep TrustGraph's tool config items in step with the live tools.

    Puts a tool-service/<id> and a tool/<name> config item for every live tool, and deletes
    them when the tool is withdrawn or expires, until Ctrl-C or SIGTERM. It talks to
    TrustGraph's config service (trustgraph-flow's config-svc, 2.11) over Pulsar, as
    TrustGraph's own services do, and changes only items it wrote (marked with its --owner).
    Without --group/--state every live tool is written; with them, only those a
    request with those groups and state may use. Exits 1 when no broker answers, or with
    --once when the config service does not answer. Stopping it leaves the items in place.
    """
    setup_logging(log_level or ("warning" if once else "info"))
    require_broker(pulsar.url)
    bounds = directory_bounds()
    from tghost.agent.directory import ToolDirectory

    def report(change: ItemChange) -> None:
        if as_json and not once:
            click.echo(json.dumps({"workspace": workspace, **change.to_json()}))

    async def main() -> list[ItemChange]:
        async with ToolDirectory(pulsar, descriptors_topic, trusted=trusted, identity=identity,
                                 **bounds) as directory:
            client = await pulsar.connect()
            config = ConfigServiceClient(client, config_request_queue, config_response_queue,
                                         None if once else config_push_queue, timeout)
            try:
                await config.start()
                syncer = TrustGraphSync(directory, config, workspace, owner, groups=list(groups) or None,
                                        state=state, resync_interval=resync_interval, on_change=report)
                if once:
                    return await syncer.sync_once()
                log.info("keeping workspace %s of TrustGraph's config service (%s) in step with %s; Ctrl-C to stop",
                         workspace, config.request_topic, descriptors_topic)
                await syncer.run(_stop_on_signals())
                return []
            finally:
                await config.close()
                await client.close()

    try:
        changes = asyncio.run(main())
    except KeyboardInterrupt:
        return
    except TimeoutError as exc:
        raise click.ClickException(f"{exc}: is TrustGraph's config-svc running on {pulsar.url}? Check "
                                   "--config-request-queue/--config-response-queue") from None
    except ConfigServiceError as exc:
        raise click.ClickException(f"TrustGraph's config service refused a request: {exc}") from None
    except PulsarException as exc:
        raise click.ClickException(f"Pulsar at {pulsar.url} failed: {exc}") from None
    if once:
        _print_pass(changes, workspace, as_json)


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


def _print_pass(changes: list[ItemChange], workspace: str, as_json: bool) -> None:
    counts = summary(changes)
    if as_json:
        click.echo(json.dumps({"workspace": workspace, "changes": [c.to_json() for c in changes], **counts},
                              indent=2))
        return
    for change in changes:
        click.echo(str(change))
    click.echo(f"workspace {workspace}: {counts['put']} put, {counts['delete']} deleted, {counts['skip']} skipped"
               if changes else f"workspace {workspace}: in step, nothing to change")
