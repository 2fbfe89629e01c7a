"""cli.run: ``tghost run``, the host: discover plugins, start the embedded broker if needed,
serve and announce until a signal.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import click
from pulsar.asyncio import PulsarException

from tghost.broker import default_data_dir, ensure_broker
from tghost.cli.app import cli
from tghost.cli.options import (
    LogLevel,
    config_option,
    operations_options,
    otel_option,
    pulsar_options,
    selection_options,
    setup_logging,
)
from tghost.discovery.config import ConfigError
from tghost.discovery.discover import PluginLoadError, PluginSelection
from tghost.operate.host import Host, HostConfig, HostError
from tghost.operate.reload import STALE_EXIT, WORKER_ENV, Reloader, ReloadWorker, broken_after_change, standing_by
from tghost.protocol.epochs import MAX_LEASE
from tghost.protocol.trust import KeyFileError, Signer, TrustedKeys
from tghost.pulsar.clients import BrokerError, PulsarSettings
from tghost.serving.executors.base import ISOLATIONS, THREAD, WorkerLimits
from tghost.serving.settings import ERROR_DETAILS, FULL, ServeSettings
from tghost.system import tracing

log = logging.getLogger("tghost")


@cli.command()
@pulsar_options
@otel_option
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="Data directory of the embedded broker started on a local --pulsar-url [default: "
                   f"{default_data_dir().parent}/PORT].")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True,
              help="Seconds per call, unless the service descriptor sets its own.")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=16, show_default=True,
              help="Calls in flight per service, unless the service descriptor sets its own.")
@click.option("--max-queue", type=click.IntRange(min=0), default=64, show_default=True,
              help="Requests per service that may wait for a slot before 'overloaded' replies.")
@click.option("--grace", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Seconds in-flight calls get to finish on SIGINT/SIGTERM; a second signal ends the wait.")
@click.option("--max-payload", type=click.IntRange(min=1), default=ServeSettings.max_payload, show_default=True,
              help="Bytes a request may have; a larger one is answered 'bad-request' and never decoded.")
@click.option("--max-redeliveries", type=click.IntRange(min=0), default=ServeSettings.max_redeliveries,
              show_default=True, help="Times a request on a persistent topic is invoked again after its host "
                                      "died mid-call; one more delivery is answered 'redelivery-limit'.")
@click.option("--stall-threshold", type=click.FloatRange(min=0), default=ServeSettings.stall_threshold,
              show_default=True, help="Seconds the event loop may be blocked before a warning names the "
                                      "service blocking it; 0 turns the stall detector off.")
@click.option("--isolation", type=click.Choice(ISOLATIONS), envvar="TGHOST_ISOLATION", default=THREAD,
              show_default=True, help="Where plugin code runs, unless a service sets its own (env TGHOST_ISOLATION): "
                                      "'thread' in this process (fastest), 'process' in worker processes, so a call "
                                      "that crashes, hangs or leaks costs one worker, never the host; plugins are "
                                      "then imported in a probe process first.")
@click.option("--max-calls-per-worker", type=click.IntRange(min=0), envvar="TGHOST_MAX_CALLS_PER_WORKER", default=0,
              show_default=True, help="Replace a worker process after this many calls; 0 never (env "
                                      "TGHOST_MAX_CALLS_PER_WORKER).")
@click.option("--max-worker-memory", type=click.IntRange(min=0), envvar="TGHOST_MAX_WORKER_MEMORY", default=0,
              show_default=True, metavar="MIB",
              help="Replace a worker process whose resident memory is above MIB after a call; one call fails with "
                   "MemoryError past twice that. 0: no bound (env TGHOST_MAX_WORKER_MEMORY).")
@click.option("--error-detail", type=click.Choice(ERROR_DETAILS), envvar="TGHOST_ERROR_DETAIL", default=FULL,
              show_default=True, help="What callers are told of an exception a tool raises by mistake (env "
                                      "TGHOST_ERROR_DETAIL): 'full' its class and message, 'type' its class, 'none' "
                                      "neither; those two name this host and the request id, whose log line has the "
                                      "traceback. A tghost.ToolError's message is always told.")
@config_option
@click.option("--lease", type=click.FloatRange(min=0.5, max=MAX_LEASE), default=30.0, show_default=True,
              help="Seconds an announcement lives without a heartbeat (heartbeat every lease/3). At most "
                   f"{MAX_LEASE:.0f}: the longest lease a directory honours.")
@click.option("--host-id", envvar="TGHOST_HOST_ID", default=None,
              help="This host's id in announcements (env TGHOST_HOST_ID) [default: a stable id per host slot].")
@click.option("--signing-key", type=click.Path(path_type=Path, dir_okay=False), envvar="TGHOST_SIGNING_KEY",
              default=None, help="Ed25519 private key (.key from 'tghost keygen') to sign announcements with "
                                 "(env TGHOST_SIGNING_KEY) [default: unsigned].")
@click.option("--trusted-key", "trusted_keys", multiple=True, type=click.Path(path_type=Path, dir_okay=False),
              envvar="TGHOST_TRUSTED_KEYS",
              help="Public key (.pub from 'tghost keygen') of a host whose signed announcements this host believes "
                   "of its peers (their access policies, code versions, contests); repeatable, this host's own "
                   f"included (env TGHOST_TRUSTED_KEYS, '{os.pathsep}'-separated) [default: every host's word].")
@click.option("--watch-plugins", is_flag=True, envvar="TGHOST_WATCH_PLUGINS",
              help="Serve plugins pip-installed while running, and withdraw uninstalled ones, with no restart "
                   "(env TGHOST_WATCH_PLUGINS). An upgraded plugin is logged as 'restart needed'.")
@click.option("--reload", is_flag=True, envvar="TGHOST_RELOAD",
              help="For plugin development: restart serving the plugins when their source files change (editable "
                   "installs included) or a plugin is installed, upgraded or removed, in a new worker process that "
                   "takes over before the old one stops, so no call is refused (env TGHOST_RELOAD).")
@click.option("--watch-interval", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True,
              help="With --watch-plugins: seconds between two looks at the installed plugins.")
@click.option("--log-level", type=LogLevel(), default="info", show_default=True,
              help="Least severe log line printed on stderr ('warn' works too).")
@selection_options
@operations_options
def run(pulsar: PulsarSettings, descriptors_topic: str, data_dir: Path | None, timeout: float, max_concurrency: int,
        max_queue: int, grace: float, max_payload: int, max_redeliveries: int, stall_threshold: float,
        isolation: str, max_calls_per_worker: int, max_worker_memory: int, error_detail: str,
        config_path: Path | None, lease: float, host_id: str | None, signing_key: Path | None,
        trusted_keys: tuple[Path, ...], watch_plugins: bool,
        reload: bool, watch_interval: float, log_level: str,
        selection: PluginSelection, metrics_host: str, metrics_port: int | None, audit_log: str | None,
        audit_arguments: bool) -> None:
    """Serve every installed tool-service plugin on Pulsar.

    If nothing answers at a local --pulsar-url, an embedded pulsar-lite broker is started
    there, detached: it keeps serving every host and agent on that URL after this host stops
    ('tghost broker stop' stops it). Stops cleanly on Ctrl-C or SIGTERM: requests that did not
    start are answered 'unavailable', other hosts take the new ones, in-flight calls finish
    (a second Ctrl-C ends the wait).
    With --watch-plugins, plugins installed or uninstalled meanwhile are served or withdrawn live.
    With --isolation process, plugin code runs in worker processes that are killed and replaced
    when a call crashes, outlives its timeout, or leaks.
    With --reload, an edited plugin is served anew within seconds of the save.
    """
    setup_logging(log_level)
    worker = os.environ.get(WORKER_ENV)
    if reload and worker is None:
        sys.exit(Reloader(sys.argv[1:], host_id).run())
    if worker is not None and not standing_by():
        return  # a reload's worker on standby, not needed after all
    if (traced := tracing.summary()) is not None:
        log.info("%s", traced)  # --otel: say so once, and where the spans go
    config = HostConfig(
        pulsar=pulsar, topic=descriptors_topic, lease=lease, host_id=host_id, signer=_signer(signing_key),
        trusted=_trusted(trusted_keys),
        serve=ServeSettings(timeout=timeout, max_concurrency=max_concurrency, max_queue=max_queue, grace=grace,
                            max_payload=max_payload, max_redeliveries=max_redeliveries,
                            stall_threshold=stall_threshold, isolation=isolation,
                            worker_limits=WorkerLimits(max_calls_per_worker, max_worker_memory),
                            error_detail=error_detail),
        config_file=config_path, plugins=selection, watch_plugins=watch_plugins, watch_interval=watch_interval,
        metrics_port=metrics_port, metrics_host=metrics_host, audit_log=audit_log, audit_arguments=audit_arguments)
    host = Host(config) if worker is None else ReloadWorker(config, ready_fd=int(worker))
    try:
        catalog = host.load()  # a plugin or config error is told before a broker is started
    except (ConfigError, PluginLoadError) as exc:
        raise click.ClickException(str(exc)) from None
    if broken_after_change(catalog):
        sys.exit(STALE_EXIT)  # a reload's new worker: the previous one serves on
    try:
        _start_broker_if_needed(pulsar.url, data_dir)
        asyncio.run(host.serve())
    except HostError as exc:
        raise click.ClickException(f"{exc.problem}: {_FIXES[exc.setting]}") from None
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from None
    except PulsarException as exc:
        raise click.ClickException(f"Pulsar at {pulsar.url} failed: {exc}; check --pulsar-url "
                                   "(env TGHOST_PULSAR_URL) and that the broker is up") from None
    finally:
        catalog.shutdown()  # the plugins' tghost_shutdown hooks, if the host never got to run them (idempotent)


#: What to change, on the command line, for each :class:`HostError`'s setting.
_FIXES = {
    "metrics_port": "choose another --metrics-port (env TGHOST_METRICS_PORT) or --metrics-host",
    "audit_log": "check --audit-log (env TGHOST_AUDIT_LOG), or give '-' for stderr",
}


def _signer(path: Path | None) -> Signer | None:
    try:
        return None if path is None else Signer.from_file(path)
    except KeyFileError as exc:
        raise click.BadParameter(str(exc), param_hint="--signing-key / TGHOST_SIGNING_KEY") from None


def _trusted(paths: tuple[Path, ...]) -> TrustedKeys | None:
    try:
        return TrustedKeys.from_files(paths) if paths else None
    except KeyFileError as exc:
        raise click.BadParameter(str(exc), param_hint="--trusted-key / TGHOST_TRUSTED_KEYS") from None


def _start_broker_if_needed(url: str, data_dir: Path | None) -> None:
    """On a local URL: start the detached embedded broker if nothing answers, and say where it is."""
    try:
        status = ensure_broker(url, data_dir)
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from None
    if status is None or status.record is None:
        return  # a cluster, or a broker tghost did not start with this data dir
    record = status.record
    if not status.started:
        log.info("using the embedded broker at %s (pid %s, data %s); '%s' stops it",
                 url, record.pid, record.data_dir, status.stop_command())
    else:
        log.info("nothing answered at %s: started the embedded broker there (pid %s, data %s, log %s). It keeps "
                 "serving every host and agent on this URL after this host stops; '%s' stops it",
                 url, record.pid, record.data_dir, record.log, status.stop_command())
