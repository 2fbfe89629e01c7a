"""cli: the ``tghost`` command. Parses options, calls the stage modules, prints for humans
or (``--json``) for programs. Exit codes: 0 ok, 1 failure, 2 usage error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import click
from pulsar.asyncio import PulsarException

from . import __version__
from .announce import DEFAULT_TOPIC, Announcer, HostIdentity
from .audit import AuditLog
from .broker import (
    DEFAULT_URL,
    BrokerError,
    EmbeddedBroker,
    PulsarSettings,
    default_data_dir,
    ensure_broker,
    is_reachable,
)
from .client import ToolCallError
from .config import default_config_path, load_config_tools
from .descriptors import ToolServiceDescriptor, request_queue, response_queue
from .directory import Change, DirectoryTool, ToolDirectory
from .discover import Catalog, PluginLoadError, PluginReport, PluginSelection, discover
from .export import FORMATS, select_tools
from .groups import DEFAULT_STATE, next_state
from .host import run_host
from .metrics import HostMonitor
from .serve import CallListener, ServeSettings
from .trust import KeyFileError, Signer, TrustedKeys, write_key_pair
from .watch import WatchSettings

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("tghost")


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")


def pulsar_options(fn: F) -> F:
    """The connection options every command that talks to Pulsar takes. The command gets one
    ``pulsar: PulsarSettings`` built from --pulsar-url, --pulsar-token and the TLS options, and
    ``descriptors_topic``.
    """
    @functools.wraps(fn)
    def with_settings(*args: Any, pulsar_url: str, pulsar_token: str | None, tls_trust_certs: Path | None,
                      tls_allow_insecure: bool, tls_validate_hostname: bool, **kwargs: Any) -> Any:
        settings = PulsarSettings(pulsar_url, token=pulsar_token or None,
                                  tls_trust_certs=str(tls_trust_certs) if tls_trust_certs else None,
                                  tls_allow_insecure=tls_allow_insecure, tls_validate_hostname=tls_validate_hostname)
        return fn(*args, pulsar=settings, **kwargs)

    options = [
        click.option("--pulsar-url", envvar="TGHOST_PULSAR_URL", default=DEFAULT_URL, show_default=True,
                     help="Pulsar service URL, pulsar:// or pulsar+ssl:// (env TGHOST_PULSAR_URL)."),
        click.option("--pulsar-token", envvar="TGHOST_PULSAR_TOKEN", default=None, show_envvar=False,
                     help="Pulsar auth token (JWT) (env TGHOST_PULSAR_TOKEN). The embedded broker "
                          "(pulsar-lite) accepts any token and does not enforce auth."),
        click.option("--tls-trust-certs", envvar="TGHOST_TLS_TRUST_CERTS", default=None,
                     type=click.Path(path_type=Path, dir_okay=False, exists=True),
                     help="PEM file of CA certificates to trust for pulsar+ssl:// (env TGHOST_TLS_TRUST_CERTS)."),
        click.option("--tls-allow-insecure", envvar="TGHOST_TLS_ALLOW_INSECURE", is_flag=True,
                     help="Accept any broker TLS certificate; for testing only (env TGHOST_TLS_ALLOW_INSECURE)."),
        click.option("--tls-validate-hostname", envvar="TGHOST_TLS_VALIDATE_HOSTNAME", is_flag=True,
                     help="Check the broker certificate names the URL's host (env TGHOST_TLS_VALIDATE_HOSTNAME)."),
        click.option("--descriptors-topic", envvar="TGHOST_DESCRIPTORS_TOPIC", default=DEFAULT_TOPIC,
                     show_default=True, help="Topic where hosts announce their tools (env TGHOST_DESCRIPTORS_TOPIC)."),
    ]
    wrapped: Any = with_settings
    for option in reversed(options):
        wrapped = option(wrapped)
    return cast(F, wrapped)


def selection_options(fn: F) -> F:
    """--load-plugins / --disable-plugins; the command gets one ``selection: PluginSelection``."""
    @functools.wraps(fn)
    def with_selection(*args: Any, load_plugins: str | None, disable_plugins: str | None, **kwargs: Any) -> Any:
        return fn(*args, selection=PluginSelection.from_settings(load_plugins, disable_plugins), **kwargs)

    wrapped: Any = click.option(
        "--load-plugins", default=None, metavar="NAMES",
        help="Comma list of the only entry points to load; '' loads none (overrides env TGHOST_LOAD_PLUGINS) "
             "[default: all].")(with_selection)
    wrapped = click.option(
        "--disable-plugins", default=None, metavar="NAMES",
        help="Comma list of entry points never to import (overrides env TGHOST_DISABLE_PLUGINS).")(wrapped)
    return cast(F, wrapped)


def trust_options(fn: F) -> F:
    """--trusted-key (repeatable; env TGHOST_TRUSTED_KEYS, os.pathsep-separated); the command
    gets one ``trusted: TrustedKeys | None`` (``None``: open mode, every host is believed)."""
    @functools.wraps(fn)
    def with_trust(*args: Any, trusted_keys: tuple[Path, ...], **kwargs: Any) -> Any:
        try:
            trusted = TrustedKeys.from_files(trusted_keys) if trusted_keys else None
        except KeyFileError as exc:
            raise click.BadParameter(str(exc), param_hint="--trusted-key / TGHOST_TRUSTED_KEYS") from None
        return fn(*args, trusted=trusted, **kwargs)

    return cast(F, click.option(
        "--trusted-key", "trusted_keys", multiple=True, type=click.Path(path_type=Path, dir_okay=False),
        envvar="TGHOST_TRUSTED_KEYS",
        help="Public key (.pub from 'tghost keygen') whose signed announcements to accept; repeatable "
             f"(env TGHOST_TRUSTED_KEYS, '{os.pathsep}'-separated). With any, unsigned and other hosts "
             "are ignored [default: accept every host].")(with_trust))


@dataclass(frozen=True)
class _Operations:
    """What ``tghost run`` exposes for operators: metrics and /health, and the audit log."""

    metrics_host: str
    metrics_port: int | None
    audit_log: str | None
    audit_arguments: bool

    @contextlib.contextmanager
    def open(self) -> Iterator[tuple[list[CallListener], HostMonitor | None]]:
        """Bind the metrics port and open the audit log; yields the call listeners and the monitor."""
        with contextlib.ExitStack() as stack:
            listeners: list[CallListener] = []
            monitor = None
            if self.metrics_port is not None:
                try:
                    monitor = stack.enter_context(HostMonitor(self.metrics_host, self.metrics_port))
                except OSError as exc:
                    raise click.ClickException(
                        f"cannot serve metrics on {self.metrics_host}:{self.metrics_port} ({exc}): choose another "
                        "--metrics-port (env TGHOST_METRICS_PORT) or --metrics-host") from None
                listeners += monitor.listeners
            if self.audit_log is not None:
                try:
                    listeners.append(stack.enter_context(AuditLog.open(self.audit_log, arguments=self.audit_arguments)))
                except OSError as exc:
                    raise click.ClickException(f"cannot open the audit log ({exc}): check --audit-log "
                                               "(env TGHOST_AUDIT_LOG), or give '-' for stderr") from None
            yield listeners, monitor


def operations_options(fn: F) -> F:
    """--metrics-port/--metrics-host and --audit-log/--audit-arguments; the command gets one
    ``operations: _Operations``."""
    @functools.wraps(fn)
    def with_operations(*args: Any, metrics_host: str, metrics_port: int | None, audit_log: str | None,
                        audit_arguments: bool, **kwargs: Any) -> Any:
        return fn(*args, operations=_Operations(metrics_host, metrics_port, audit_log, audit_arguments), **kwargs)

    options = [
        click.option("--metrics-port", type=click.IntRange(0, 65535), envvar="TGHOST_METRICS_PORT", default=None,
                     help="Serve Prometheus metrics on /metrics and health on /health at this port "
                          "(env TGHOST_METRICS_PORT) [default: off]."),
        click.option("--metrics-host", envvar="TGHOST_METRICS_HOST", default="127.0.0.1", show_default=True,
                     help="Address the metrics port binds (env TGHOST_METRICS_HOST); 0.0.0.0 for every interface."),
        click.option("--audit-log", envvar="TGHOST_AUDIT_LOG", default=None, metavar="PATH",
                     help="Append one JSON line per call to PATH, or '-' for stderr (env TGHOST_AUDIT_LOG) "
                          "[default: off]. Argument names only, never config values."),
        click.option("--audit-arguments", is_flag=True, envvar="TGHOST_AUDIT_ARGUMENTS",
                     help="Also log argument values in the audit log (env TGHOST_AUDIT_ARGUMENTS)."),
    ]
    wrapped: Any = with_operations
    for option in reversed(options):
        wrapped = option(wrapped)
    return cast(F, wrapped)


def filter_options(fn: F) -> F:
    """Seed 001 request groups and state."""
    fn = click.option("--state", default=None, help="The agent's current state [default: undefined].")(fn)
    return click.option("--group", "groups", multiple=True,
                        help="A group the request may use; repeatable; '*' for all [default: default].")(fn)


def main() -> None:
    """The ``tghost`` console script: run the command, then leave without interpreter
    finalization, where pulsar-client's C++ threads can crash the process after the work is
    done (apache/pulsar-client-python#153, #203). Output is flushed first; the exit code is kept.

    Ctrl-C (SIGINT) always stops a command, even when the parent started it with SIGINT
    ignored, as a non-interactive shell does for ``cmd &``.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        cli(prog_name="tghost")
        code = 0
    except SystemExit as exc:
        if isinstance(exc.code, str):
            click.echo(exc.code, err=True)
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
      tghost plugins                  what loaded, what failed and why
    """


@cli.command()
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
@click.option("--max-payload", type=click.IntRange(min=1), default=ServeSettings.max_payload, show_default=True,
              help="Bytes a request may have; a larger one is answered 'bad-request' and never decoded.")
@click.option("--max-redeliveries", type=click.IntRange(min=0), default=ServeSettings.max_redeliveries,
              show_default=True, help="Times a request on a persistent topic is invoked again after its host "
                                      "died mid-call; one more delivery is answered 'redelivery-limit'.")
@click.option("--stall-threshold", type=click.FloatRange(min=0), default=ServeSettings.stall_threshold,
              show_default=True, help="Seconds the event loop may be blocked before a warning names the "
                                      "service blocking it; 0 turns the watchdog off.")
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False), envvar="TGHOST_CONFIG",
              default=None, help=f"TOML file of extra tools (env TGHOST_CONFIG) [default: {default_config_path()}, "
                                 "if it exists].")
@click.option("--lease", type=click.FloatRange(min=0.5, max=86_400), default=30.0, show_default=True,
              help="Seconds an announcement lives without a heartbeat (heartbeat every lease/3).")
@click.option("--host-id", envvar="TGHOST_HOST_ID", default=None,
              help="This host's id in announcements (env TGHOST_HOST_ID) [default: a stable id per host slot].")
@click.option("--signing-key", type=click.Path(path_type=Path, dir_okay=False), envvar="TGHOST_SIGNING_KEY",
              default=None, help="Ed25519 private key (.key from 'tghost keygen') to sign announcements with "
                                 "(env TGHOST_SIGNING_KEY) [default: unsigned].")
@click.option("--watch-plugins", is_flag=True, envvar="TGHOST_WATCH_PLUGINS",
              help="Serve plugins pip-installed while running, and withdraw uninstalled ones, with no restart "
                   "(env TGHOST_WATCH_PLUGINS). An upgraded plugin is logged as 'restart needed'.")
@click.option("--watch-interval", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True,
              help="With --watch-plugins: seconds between two looks at the installed plugins.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
@selection_options
@operations_options
def run(pulsar: PulsarSettings, descriptors_topic: str, data_dir: Path | None, timeout: float, max_concurrency: int,
        max_queue: int, grace: float, max_payload: int, max_redeliveries: int, stall_threshold: float,
        config_path: Path | None, lease: float, host_id: str | None,
        signing_key: Path | None, watch_plugins: bool, watch_interval: float, log_level: str,
        selection: PluginSelection, operations: _Operations) -> None:
    """Serve every installed tool-service plugin on Pulsar.

    If nothing answers at a local --pulsar-url, an embedded pulsar-lite broker is started
    there. Stops cleanly on Ctrl-C or SIGTERM: no new requests, in-flight calls finish.
    With --watch-plugins, plugins installed or uninstalled meanwhile are served or withdrawn live.
    """
    _setup_logging(log_level)
    signer = _signer(signing_key)
    try:
        catalog = discover(selection=selection)
    except PluginLoadError as exc:
        raise click.ClickException(str(exc)) from None
    _add_config_tools(catalog, config_path)
    for report in catalog.plugins:
        for error in report.errors:
            log.error("plugin %s: %s (run 'tghost plugins' for details)", report.name, error)
    if not catalog.services:
        log.warning("no tool services to serve: pip install a tghost plugin (see 'tghost plugins')")
    broker = _start_broker_if_needed(pulsar.url, data_dir)
    settings = ServeSettings(timeout=timeout, max_concurrency=max_concurrency, max_queue=max_queue, grace=grace,
                             max_payload=max_payload, max_redeliveries=max_redeliveries,
                             stall_threshold=stall_threshold)
    try:
        with HostIdentity.claim(Path(click.get_app_dir("tghost")), host_id) as identity:
            announcer = Announcer(catalog, identity, descriptors_topic, lease, signer)
            with operations.open() as (listeners, monitor):
                asyncio.run(run_host(catalog, pulsar, settings, announcer, listeners=listeners, monitor=monitor,
                                     watch=WatchSettings(watch_interval, selection) if watch_plugins else None))
    except PulsarException as exc:
        raise click.ClickException(f"Pulsar at {pulsar.url} failed: {exc}; check --pulsar-url "
                                   "(env TGHOST_PULSAR_URL) and that the broker is up") from None
    finally:
        if broker is not None:
            broker.stop()


def _signer(path: Path | None) -> Signer | None:
    try:
        return None if path is None else Signer.from_file(path)
    except KeyFileError as exc:
        raise click.BadParameter(str(exc), param_hint="--signing-key / TGHOST_SIGNING_KEY") from None


def _add_config_tools(catalog: Catalog, path: Path | None) -> None:
    if path is None:
        path = default_config_path()
        if not path.exists():
            return
    report = load_config_tools(catalog, path)
    if report.tools:
        log.info("config %s: added tools %s", path, ", ".join(report.tools))


def _start_broker_if_needed(url: str, data_dir: Path | None) -> EmbeddedBroker | None:
    try:
        broker = ensure_broker(url, data_dir)
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from None
    if broker is not None:
        log.info("nothing answered at %s: started the embedded broker there (data %s, log %s)",
                 url, broker.data_dir, broker.log_path)
    return broker


def _default_key_prefix() -> Path:
    return Path(click.get_app_dir("tghost")) / "keys" / "announce"


@cli.command()
@click.option("--out", "prefix", type=click.Path(path_type=Path, dir_okay=False), default=None, metavar="PATH_PREFIX",
              help=f"Write PATH_PREFIX.key and PATH_PREFIX.pub [default: {_default_key_prefix()}].")
@click.option("--force", is_flag=True, help="Overwrite existing key files.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
def keygen(prefix: Path | None, force: bool, as_json: bool) -> None:
    """Write an Ed25519 key pair for signed announcements.

    The private key (.key, PKCS#8 PEM, mode 0600) goes to 'tghost run --signing-key'; the
    public key (.pub) to every directory that should trust this host: '--trusted-key' on
    tools/watch/call, or ToolDirectory(trusted=...). Refuses to overwrite without --force.
    """
    try:
        written = write_key_pair(prefix or _default_key_prefix(), force)
    except (FileExistsError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"key_id": written.key_id, "private_key": str(written.private),
                               "public_key": str(written.public)}, indent=2))
        return
    click.echo(f"key id:      {written.key_id}")
    click.echo(f"private key: {written.private}  (keep secret; tghost run --signing-key {written.private})")
    click.echo(f"public key:  {written.public}  (share; tghost tools --trusted-key {written.public})")


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
    from .scaffold import BadPluginName, PluginNames, write_plugin  # jinja2 only for this command

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


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
@selection_options
def plugins(as_json: bool, selection: PluginSelection) -> None:
    """List every installed plugin: what it serves, what failed and why, and what was blocked
    (by --load-plugins/--disable-plugins or their env vars) and by which setting.

    Exits 1 when any plugin reported an error, or a setting names an entry point not installed.
    """
    logging.basicConfig(level=logging.CRITICAL)
    catalog = discover(strict=False, selection=selection)
    if as_json:
        click.echo(json.dumps([report.to_json() for report in catalog.plugins], indent=2))
    else:
        _print_plugins(catalog.plugins)
    if any(report.errors for report in catalog.plugins):
        sys.exit(1)


_STATUS_COLOUR = {"loaded": "green", "blocked": "yellow"}


def _print_plugins(reports: list[PluginReport]) -> None:
    if not reports:
        click.echo("no plugins installed (entry point group 'tghost.plugins')")
    for report in reports:
        status = click.style(report.status, fg=_STATUS_COLOUR.get(report.status, "red"))
        click.echo(f"{report.name} ({report.distribution or '?'} {report.version or '?'}) {status}")
        click.echo(f"  entry point: {report.value}")
        if report.blocked is not None:
            click.echo(f"  blocked:     {report.blocked}")
        elif report.installed:
            click.echo(f"  services:    {', '.join(report.services) or '-'}")
            click.echo(f"  tools:       {', '.join(report.tools) or '-'}")
        for error in report.errors:
            click.echo(click.style(f"  error: {error}", fg="red"))


def _default_status_url() -> str | None:
    port = os.environ.get("TGHOST_METRICS_PORT")
    host = os.environ.get("TGHOST_METRICS_HOST", "127.0.0.1")
    return f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}/health" if port else None


@cli.command()
@click.option("--url", envvar="TGHOST_STATUS_URL", default=None,
              help="The host's health URL (env TGHOST_STATUS_URL) [default: http://TGHOST_METRICS_HOST:"
                   "TGHOST_METRICS_PORT/health].")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True,
              help="Seconds to wait for the answer.")
@click.option("--json", "as_json", is_flag=True, help="Print the health JSON for programs.")
def status(url: str | None, timeout: float, as_json: bool) -> None:
    """Ask a running 'tghost run --metrics-port PORT' how it is: connected to Pulsar or not,
    the services it serves, its uptime and the last error it logged.

    Exits 1 when the host is degraded (not connected to Pulsar), still starting, or does not answer.
    """
    url = url or _default_status_url()
    if url is None:
        raise click.UsageError("give --url http://HOST:PORT/health, or set TGHOST_METRICS_PORT to the port "
                               "'tghost run --metrics-port' serves on")
    health = _fetch_health(url, timeout, as_json)
    if as_json:
        click.echo(json.dumps(health, indent=2))
    else:
        _print_health(health)
    if health.get("status") != "ok":
        click.echo(_STATUS_ADVICE.get(str(health.get("status")), f"error: unknown status {health.get('status')!r}"),
                   err=True)
        sys.exit(1)


_STATUS_ADVICE = {
    "degraded": "error: the host is not connected to Pulsar; check that the broker at its --pulsar-url is up "
                "(the host reconnects and announces again by itself)",
    "starting": "error: the host is still starting (not serving yet); try again in a moment, and see its log "
                "if it stays so",
}


def _fetch_health(url: str, timeout: float, as_json: bool) -> dict[str, Any]:
    """The health JSON at ``url`` (also from a 503 answer); exits 1 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if as_json:
            click.echo(json.dumps({"status": "unreachable", "url": url, "error": str(reason)}, indent=2))
        click.echo(f"error: no tghost host answers at {url} ({reason}): is 'tghost run --metrics-port PORT' "
                   "running? Check --url (env TGHOST_STATUS_URL or TGHOST_METRICS_PORT)", err=True)
        sys.exit(1)
    try:
        health: dict[str, Any] = json.loads(body)
    except ValueError:
        raise click.ClickException(f"{url} did not answer health JSON: is it a tghost metrics port?") from None
    return health


def _print_health(health: dict[str, Any]) -> None:
    ok = health.get("status") == "ok"
    click.echo(f"status:     {click.style(str(health.get('status')), fg='green' if ok else 'red')}")
    connected = health.get("connected")
    click.echo(f"connected:  {'unknown' if connected is None else 'yes' if connected else 'no'}")
    click.echo(f"services:   {', '.join(health.get('services') or []) or '-'}")
    click.echo(f"uptime:     {health.get('uptime_seconds')} s")
    error = health.get("last_error")
    click.echo(f"last error: {error['time']} {error['logger']}: {error['message']}" if error else "last error: -")


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


def _require_broker(url: str) -> None:
    if not is_reachable(url):
        raise click.ClickException(f"no Pulsar broker answers at {url}: start one with 'tghost run', "
                                   "or pass --pulsar-url / TGHOST_PULSAR_URL")


def _directory(pulsar: PulsarSettings, topic: str, trusted: TrustedKeys | None) -> ToolDirectory:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    _require_broker(pulsar.url)
    return ToolDirectory(pulsar, topic, trusted=trusted)


def _tool_json(tool: DirectoryTool) -> dict[str, Any]:
    d = tool.descriptor
    return {"name": d.name, "service": d.service, "description": d.description, "group": list(d.group),
            "state": d.state, "available_in_states": list(d.available_in_states) if d.available_in_states else None,
            "config": d.config, "arguments": [a.model_dump() for a in d.arguments],
            "providers": [p.host["id"] for p in tool.providers]}


@cli.command()
@pulsar_options
@filter_options
@trust_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
def tools(pulsar: PulsarSettings, descriptors_topic: str, groups: tuple[str, ...], state: str | None,
          trusted: TrustedKeys | None, as_json: bool) -> None:
    """List the live tools every agent can see, as announced by running hosts.

    Without --group/--state, every live tool is listed; with them, only those a seed 001
    request with those groups and state may use.
    """
    async def fetch() -> list[dict[str, Any]]:
        async with _directory(pulsar, descriptors_topic, trusted) as directory:
            names = [t.name for t in directory.available(groups or ["*"], state)]
            if not groups and state is None:
                names = sorted(directory.tools)
            return [_tool_json(directory.tools[name]) for name in names]

    rows = asyncio.run(fetch())
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no live tools (is a 'tghost run' up on this broker?)")
        return
    table = [("TOOL", "SERVICE", "PROVIDERS", "GROUPS", "STATES", "-> STATE")] + [
        (r["name"], r["service"], ",".join(r["providers"]), ",".join(r["group"]),
         ",".join(r["available_in_states"] or ["*"]), r["state"] or "-") for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


@cli.command()
@pulsar_options
@trust_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per change (JSON Lines).")
def watch(pulsar: PulsarSettings, descriptors_topic: str, trusted: TrustedKeys | None, as_json: bool) -> None:
    """Follow the live tool set: tools added, updated, removed or expired, until Ctrl-C.

    Starts with the tools live now, reported as added.
    """
    async def follow() -> None:
        async with _directory(pulsar, descriptors_topic, trusted) as directory:
            changes = directory.changes()
            for name in sorted(directory.tools):
                _print_change(Change("added", name, directory.tools[name]), as_json)
            async for change in changes:
                _print_change(change, as_json)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(follow())


def _print_change(change: Change, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(change.to_json()), nl=True)
        return
    tool = change.tool
    detail = f"service {tool.descriptor.service} on {','.join(p.host['id'] for p in tool.providers)}" if tool else ""
    colour = {"added": "green", "updated": "yellow"}.get(change.kind, "red")
    click.echo(f"{click.style(change.kind.ljust(7), fg=colour)} {change.name}  {detail}".rstrip())
    sys.stdout.flush()


@cli.command("export")
@pulsar_options
@filter_options
@trust_options
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), required=True,
              help="trustgraph: the tool-service/<id> and tool/<name> config items a TrustGraph agent loads; "
                   "openai: function-calling tool definitions; mcp: MCP Tool objects.")
def export_tools(pulsar: PulsarSettings, descriptors_topic: str, groups: tuple[str, ...], state: str | None,
                 trusted: TrustedKeys | None, fmt: str) -> None:
    """Write the live tools as JSON on stdout, in the shape another agent loads.

    Without --group/--state every live tool is written; with them, only those a seed 001
    request with those groups and state may use. Exits 1 when no broker answers.
    """
    async def fetch() -> Any:
        async with _directory(pulsar, descriptors_topic, trusted) as directory:
            return FORMATS[fmt](select_tools(directory, list(groups) or None, state))

    click.echo(json.dumps(asyncio.run(fetch()), indent=2))


@cli.command("mcp")
@pulsar_options
@filter_options
@trust_options
@click.option("--transport", type=click.Choice(["stdio", "http"]), default="stdio", show_default=True,
              help="stdio for a client that starts this command; http for streamable HTTP at /mcp.")
@click.option("--host", "http_host", default="127.0.0.1", show_default=True,
              help="With --transport http: the address to bind; 0.0.0.0 for every interface.")
@click.option("--port", "http_port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="With --transport http: the port to bind.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="warning",
              show_default=True, help="Log level; the log always goes to stderr.")
def mcp_bridge(pulsar: PulsarSettings, descriptors_topic: str, groups: tuple[str, ...], state: str | None,
               trusted: TrustedKeys | None, transport: str, http_host: str, http_port: int, log_level: str) -> None:
    """Serve the live tools to MCP clients (Model Context Protocol), until Ctrl-C or the client leaves.

    tools/list gives the tools a seed 001 request with --group (default: the 'default' group)
    and --state may use; tools/call calls one over Pulsar (an error reply is a result with
    isError true). Clients get notifications/tools/list_changed when that list changes.
    """
    _setup_logging(log_level)
    from .bridge import serve  # the mcp SDK is imported only by this command

    directory = _directory(pulsar, descriptors_topic, trusted)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(directory, list(groups) or None, state, transport, http_host, http_port))


@cli.command()
@pulsar_options
@filter_options
@trust_options
@click.option("--service", "service_id", default=None,
              help="Call a tool service by id instead of a tool by name.")
@click.option("--topic", default=None,
              help="With --service: the short topic T (non-persistent://tg/request/T) [default: as announced, "
                   "else from the installed plugin, else the service id].")
@click.option("--config", "config_pairs", multiple=True, metavar="KEY=VALUE",
              help="With --service: a config value; repeatable. KEY:=JSON for non-strings.")
@click.option("--json", "json_args", default=None, metavar="ARGS",
              help="All arguments as one JSON object, instead of KEY=VALUE pairs.")
@click.option("--user", default=None, help="The request's user (omitted if not given).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Seconds to wait for the whole answer.")
@click.argument("arguments", nargs=-1, metavar="[TOOL] [KEY=VALUE | KEY:=JSON]...")
def call(pulsar: PulsarSettings, descriptors_topic: str, groups: tuple[str, ...], state: str | None,
         trusted: TrustedKeys | None, service_id: str | None, topic: str | None, config_pairs: tuple[str, ...],
         json_args: str | None, user: str | None, timeout: float, arguments: tuple[str, ...]) -> None:
    """Call a tool by name (through the live directory), or a service with --service.

    A tool call merges the tool's config values into the request and is refused, with the
    reason, when the request's --group/--state (seed 001) do not allow the tool. The
    observation is printed as it streams in. Exits 1 on a refusal, an error reply or a
    timeout (the error goes to stderr).
    """
    if service_id is None and not arguments:
        raise click.UsageError("give a TOOL name, or --service ID")
    tool_name, arguments = (None, arguments) if service_id else (arguments[0], arguments[1:])
    if json_args is not None and arguments:
        raise click.UsageError("give arguments as KEY=VALUE pairs or --json, not both")
    args = _parse_pairs(arguments, "ARGUMENTS") if json_args is None else _json_object(json_args)
    config = _parse_pairs(config_pairs, "--config")
    directory = _directory(pulsar, descriptors_topic, trusted)
    try:
        if tool_name is not None:
            asyncio.run(_call_tool(directory, tool_name, args, user, list(groups) or None, state, timeout))
        else:
            asyncio.run(_call_service(directory, service_id or "", topic, config, args, user, timeout))
    except ToolCallError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


def _json_object(text: str) -> dict[str, Any]:
    value = _json_value(text, "ARGS", "--json")
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--json")
    return value


async def _call_tool(directory: ToolDirectory, name: str, arguments: dict[str, Any], user: str | None,
                     groups: list[str] | None, state: str | None, timeout: float) -> None:
    async with directory:
        tool = directory.check(name, groups, state)
        await _echo_stream(directory.stream(name, arguments, user=user, groups=groups, state=state, timeout=timeout))
        if tool.descriptor.state is not None:
            click.echo(f"state: {state or DEFAULT_STATE} -> {next_state(tool.descriptor, state, True)}", err=True)


async def _call_service(directory: ToolDirectory, service_id: str, topic: str | None, config: dict[str, Any],
                        arguments: dict[str, Any], user: str | None, timeout: float) -> None:
    async with directory:
        announced = directory.services.get(service_id)
        descriptor = announced.descriptor if announced and not topic else _installed_service(service_id, topic)
        service = await directory.caller(descriptor)
        await _echo_stream(service.stream(config, arguments, user=user, timeout=timeout))


async def _echo_stream(chunks: AsyncIterator[str]) -> None:
    """Print observation chunks as they arrive, then end the line unless the last chunk did."""
    last = "\n"
    async for chunk in chunks:
        click.echo(chunk, nl=False)
        last = chunk or last
    if not last.endswith("\n"):
        click.echo()


def _installed_service(service_id: str, topic: str | None) -> ToolServiceDescriptor:
    """The service by --topic, else as an installed plugin declares it, else topic = service id."""
    descriptor = None if topic else discover(strict=False).descriptors.get(service_id)
    if descriptor is None:
        if not topic:
            log.warning("service %r is neither announced nor installed here; assuming topic %r (use --topic)",
                        service_id, service_id)
        topic = topic or service_id
        descriptor = ToolServiceDescriptor.model_validate(
            {"id": service_id, "request-queue": request_queue(topic), "response-queue": response_queue(topic)})
    return descriptor
