"""cli.broker: ``tghost broker``, the embedded pulsar-lite broker: run it in the foreground, or
start, see and stop the detached one that ``tghost run`` starts on a local URL.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import click
from click.core import ParameterSource

from tghost.broker import (
    DEFAULT_PORT,
    LOG_LEVELS,
    NOTE,
    BrokerRecord,
    BrokerStatus,
    EmbeddedBroker,
    broker_status,
    default_data_dir,
    run_until_stopped,
    running_data_dir,
    start_detached,
    stop_broker,
)
from tghost.broker.store import MIB
from tghost.cli.app import cli
from tghost.cli.options import LogLevel, setup_logging
from tghost.pulsar.clients import BrokerError, endpoints
from tghost.system.net import is_loopback

F = TypeVar("F", bound=Callable[..., Any])

#: pulsar-lite's log levels (:data:`LOG_LEVELS`), with ``warning`` for its ``warn`` as every tghost command spells it.
PULSAR_LITE_LEVELS = tuple("warning" if level == "warn" else level for level in LOG_LEVELS)
#: ``tghost broker status`` exit code when no embedded broker runs (LSB init scripts' "not running").
NOT_RUNNING = 3


#: Where a URL for ``tghost broker`` came from: the flag, or the environment.
_URL_FLAG, _URL_ENV = "--pulsar-url", "TGHOST_PULSAR_URL"
_URL_FROM = {ParameterSource.COMMANDLINE: _URL_FLAG, ParameterSource.ENVIRONMENT: _URL_ENV}


@dataclass(frozen=True)
class _Where:
    """--port, --pulsar-url (or TGHOST_PULSAR_URL: ``url_from`` says which) and --data-dir, as
    given to a ``tghost broker`` command (:meth:`within`: merged with the group's)."""

    port: int | None = None
    data_dir: Path | None = None
    url: str | None = None
    url_from: str | None = None

    def within(self, outer: _Where | None) -> _Where:
        """These options, else the group's (``outer``); a URL on the command line over one from the environment."""
        if outer is None:
            return self
        inner_url = self.url_from == _URL_FLAG or (self.url is not None and outer.url_from != _URL_FLAG)
        url, url_from = (self.url, self.url_from) if inner_url else (outer.url, outer.url_from)
        return _Where(self.port or outer.port, self.data_dir or outer.data_dir, url, url_from)

    def resolve(self) -> tuple[int, Path | None, str | None]:
        """The port; the data dir (``None``: the one of the broker running there, else the
        default); and what named the broker (``"--port 6750"``, ``"TGHOST_PULSAR_URL=URL"``;
        ``None``: nothing did, it is the default port). An explicit --port wins over
        TGHOST_PULSAR_URL; with --pulsar-url it must name the same port.

        Raises:
            click.UsageError: the URL is not a loopback pulsar:// URL, or names another port than --port.
        """
        url = self.url if self.url_from == _URL_FLAG or self.port is None else None
        if url is None:
            return self.port or DEFAULT_PORT, self.data_dir, None if self.port is None else f"--port {self.port}"
        named = f"{_URL_FLAG} {url}" if self.url_from == _URL_FLAG else f"{_URL_ENV}={url}"
        port = _local_port(url, named)
        if self.port not in (None, port):
            raise click.UsageError(f"--port {self.port} and {named} name two brokers: give one of them")
        return port, self.data_dir, named


def _local_port(url: str, named: str) -> int:
    """The port of a loopback ``pulsar://`` URL, the only kind whose broker ``tghost broker`` runs.

    Raises:
        click.UsageError: any other URL (``named`` says where it came from, in the message).
    """
    try:
        found = endpoints(url)
    except ValueError:
        found = []  # e.g. a port that is not a number: not a local URL either
    if urlsplit(url).scheme != "pulsar" or len(found) != 1 or not is_loopback(found[0][0]):
        raise click.UsageError(f"{named} is not a local pulsar:// URL: 'tghost broker' runs, shows and stops only "
                               "the embedded broker on this machine (pulsar://localhost:PORT). Pass --port, or a "
                               "local --pulsar-url")
    return found[0][1]


def _where_options(fn: F) -> F:
    """--port, --pulsar-url and --data-dir; the command gets ``where: _Where``, merged with the group's."""
    @functools.wraps(fn)
    def with_where(*args: Any, port: int | None, data_dir: Path | None, pulsar_url: str | None, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        url_from = _URL_FROM.get(ctx.get_parameter_source("pulsar_url") or ParameterSource.DEFAULT)
        where = _Where(port, data_dir, pulsar_url if url_from else None, url_from)
        return fn(*args, where=where.within(ctx.find_object(_Where)), **kwargs)

    options = [
        click.option("--port", type=click.IntRange(1, 65535), default=None,
                     help=f"Port on 127.0.0.1; wins over env TGHOST_PULSAR_URL [default: {DEFAULT_PORT}, or the "
                          "URL's port]."),
        click.option("--pulsar-url", envvar=_URL_ENV, default=None, show_envvar=False,
                     help="The broker's local URL, pulsar://localhost:PORT, instead of --port (env "
                          "TGHOST_PULSAR_URL); with --port, both must name one port."),
        click.option("--data-dir", type=click.Path(path_type=Path, file_okay=False, resolve_path=True), default=None,
                     help="The broker's data directory: messages, log, record [default: the running broker's, "
                          f"else {default_data_dir(DEFAULT_PORT).parent}/PORT]."),
    ]
    wrapped: Any = with_where
    for option in reversed(options):
        wrapped = option(wrapped)
    return cast(F, wrapped)


def _run_options(fn: F) -> F:
    fn = click.option("--low-space", type=click.FloatRange(min=0), default=None, metavar="MIB",
                      help="Warn (in the broker's log) when its data dir's disk has less than MIB MiB free "
                           "[default: 5% of the disk, at most 1024].")(fn)
    fn = click.option("--ready-timeout", type=click.FloatRange(min=0, min_open=True), default=15.0,
                      show_default=True, help="Seconds pulsar-lite has to accept connections.")(fn)
    fn = click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
                      help="Serve pulsar-lite's Prometheus metrics on http://127.0.0.1:PORT/metrics "
                           "[default: off].")(fn)
    return click.option("--log-level", type=LogLevel(PULSAR_LITE_LEVELS), default="warning", show_default=True,
                        callback=lambda ctx, param, value: "warn" if value == "warning" else value,
                        help="pulsar-lite's log level ('warn' works too).")(fn)


@cli.group(invoke_without_command=True)
@_where_options
@_run_options
@click.option("--detached", is_flag=True, hidden=True,
              help="Run as the detached broker 'tghost broker start' makes: report readiness on stderr, "
                   "then close stdout and stderr.")
@click.pass_context
def broker(ctx: click.Context, where: _Where, log_level: str, metrics_port: int | None, ready_timeout: float,
           low_space: float | None, detached: bool) -> None:
    """Run the embedded pulsar-lite broker here until Ctrl-C, SIGTERM or SIGHUP.

    \b
    tghost broker [--port 6650]     run it in this terminal; its warnings print here
    tghost broker start             start it detached, as 'tghost run' does on a local URL
    tghost broker status [--json]   is it running: URL, pid, data dir, log (exit 3: not running)
    tghost broker stop              stop the detached one (its hosts and agents lose their broker)

    Its data, log (broker.log, rotated at 10 MiB, two old logs kept) and record (broker.json,
    while it runs) are in --data-dir, one per port. Its metrics endpoint is off unless
    --metrics-port. Exits 1 with the cause and the fix when it cannot start (port taken, data dir
    in use, disk full) or when pulsar-lite dies.

    It warns in its log when its disk runs low (--low-space) and when it has room again. A full
    disk makes pulsar-lite refuse persistent messages (announcements) and can tear a message in
    its store, making the ones written after it unreadable: then, once there is room again, it
    moves the store aside (DATA/store.corrupt-TIME) and restarts pulsar-lite on an empty one;
    hosts announce again when they reconnect. A start does the same with a damaged store.
    """
    if ctx.invoked_subcommand is not None:
        ctx.obj = where
        return
    setup_logging("info")
    port, given_dir, _ = where.resolve()
    data_dir = given_dir or default_data_dir(port)
    embedded = EmbeddedBroker(data_dir, port, log_level=log_level, metrics_port=metrics_port,
                              echo=None if detached else sys.stderr, die_with_parent=True,
                              low_space=None if low_space is None else round(low_space * MIB))

    def ready(record: BrokerRecord) -> None:
        status = broker_status(port, data_dir)
        how = f"stop it with '{status.stop_command()}'" if detached else "Ctrl-C to stop"
        for note in embedded.notes if detached else ():  # in the foreground they are on the terminal already
            click.echo(NOTE + note, err=True)
        click.echo(f"embedded broker at {record.url} (pid {record.pid}, data {record.data_dir}, log {record.log}); "
                   f"{how}", err=True)
        if detached:
            _close_stdio()

    try:
        code = run_until_stopped(embedded, detached=detached, on_ready=ready, ready_timeout=ready_timeout)
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from None
    ctx.exit(code)


def _close_stdio() -> None:
    """Point stdout and stderr at /dev/null: the starter reads stderr until it closes."""
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)


def _status_options(fn: F) -> F:
    fn = click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")(fn)
    return _where_options(fn)


@broker.command()
@_status_options
@_run_options
def start(where: _Where, as_json: bool, log_level: str, metrics_port: int | None, ready_timeout: float,
          low_space: float | None) -> None:
    """Start the embedded broker detached: it keeps running after this command, the terminal and
    any 'tghost run' end, and every host and agent on its URL shares it.

    Exits 0 when it runs (started now, or already running), 1 when it cannot start. A damaged
    store is moved aside first (DATA/store.corrupt-TIME), with a note on stderr.
    """
    port, data_dir, _ = where.resolve()
    before = broker_status(port, data_dir)
    if before.answering and not before.running:
        running = broker_status(port, running_data_dir(port))
        if running.running:
            raise click.ClickException(f"the embedded broker at {before.url} already runs, with data dir "
                                       f"{running.data_dir}: stop it first ('{running.stop_command()}'), or pass "
                                       "another --port")
        raise click.ClickException(f"something already answers at {before.url}, and it is not an embedded broker "
                                   f"with data dir {before.data_dir}: pass another --port, or its --data-dir")
    try:
        # One still starting holds the data dir before it answers and writes its record: then
        # start_detached waits for its starter (the start lock) and reports it once it runs.
        ready = before.running and before.answering and before.record is not None
        status = before if ready else start_detached(
            port, data_dir, log_level=log_level, metrics_port=metrics_port, ready_timeout=ready_timeout,
            low_space=None if low_space is None else round(low_space * MIB))
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from None
    for note in status.notes:
        click.echo(f"the embedded broker {note}", err=True)
    if as_json:
        click.echo(json.dumps(status.to_json()))
    else:
        click.echo(("started: " if status.started else "already running: ") + _describe(status))


@broker.command()
@_status_options
def status(where: _Where, as_json: bool) -> None:
    """Show whether the embedded broker runs: its URL, pids, data dir, log and how to stop it.

    Exits 0 when it runs, 3 when it does not.
    """
    port, data_dir, _ = where.resolve()
    found = broker_status(port, data_dir)
    click.echo(json.dumps(found.to_json()) if as_json else _describe(found))
    if not found.running:
        sys.exit(NOT_RUNNING)


@broker.command()
@_status_options
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="Seconds to wait for it to stop before killing it.")
def stop(where: _Where, as_json: bool, timeout: float) -> None:
    """Stop the detached embedded broker. Every host and agent using it loses its broker.

    Exits 0 when it stopped, or when none runs on the default port; 3 when none runs where
    --port, --pulsar-url or TGHOST_PULSAR_URL said; 1 when it could not be stopped.
    """
    port, data_dir, named = where.resolve()
    try:
        before = stop_broker(port, data_dir, timeout=timeout)
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"stopped": before.running, **before.to_json(), "running": False}))
    elif before.running:
        pid = before.record.pid if before.record else "?"
        click.echo(f"stopped the embedded broker at {before.url} (pid {pid})")
    elif named is None:
        click.echo(f"nothing to stop: {_describe(before)}")
    else:
        click.echo(f"Error: nothing stopped ({named}): {_not_running(before)}", err=True)
    if not before.running and named is not None:
        sys.exit(NOT_RUNNING)


def _describe(status: BrokerStatus) -> str:
    """A few lines for a human about ``status``."""
    record = status.record
    if status.running and record is not None:
        mode = "detached" if record.detached else "in a terminal"
        return (f"the embedded broker at {status.url} runs (pid {record.pid}, pulsar-lite pid {record.broker_pid}, "
                f"up {_duration(time.time() - record.started_at)}, {mode})\n"
                f"  data  {status.data_dir}\n  log   {status.log_path}\n  stop  {status.stop_command()}"
                + _disk_line(status))
    if status.running:
        return (f"an embedded broker run inside another program holds {status.data_dir} "
                f"({'answering' if status.answering else 'not answering'} at {status.url})")
    if status.answering:
        return _not_running(status)
    return f"{_not_running(status)}; 'tghost broker start' or 'tghost run' starts one"


def _not_running(status: BrokerStatus) -> str:
    """Why no embedded broker runs at ``status``'s URL with its data dir."""
    if status.answering:
        return (f"no embedded broker runs with data dir {status.data_dir}, but something answers at {status.url}: "
                "a broker started with another --data-dir (pass it with --data-dir), or another program")
    return f"no embedded broker runs at {status.url} (data dir {status.data_dir})"


def _disk_line(status: BrokerStatus) -> str:
    """``"\n  disk  0.4 MiB free of 20.0 MiB (2%) in DIR: LOW, free space there"`` (empty when unknown)."""
    disk = status.disk()
    if disk is None:
        return ""
    low = disk.to_json()["low"]
    return f"\n  disk  {disk.describe()}" + (": LOW, free space there (a full disk stops announcements)" if low else "")


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes}m" if hours else f"{minutes}m {secs}s" if minutes else f"{secs}s"
