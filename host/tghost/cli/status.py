"""cli.status: ``tghost status``, the health of a running ``tghost run --metrics-port``.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

import click

from tghost.cli.app import cli


def default_status_url() -> str | None:
    """The health URL of a host named by TGHOST_STATUS_URL, or by TGHOST_METRICS_PORT (and _HOST)."""
    return os.environ.get("TGHOST_STATUS_URL") or _default_status_url()


def read_health(url: str, timeout: float) -> dict[str, Any]:
    """The health JSON at ``url`` (also from a 503 answer).

    Raises:
        OSError: nothing answers (``urllib.error.URLError`` is one).
        ValueError: the answer is not JSON.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    health: dict[str, Any] = json.loads(body)
    return health


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
    the services it serves and their workers (isolation, stuck threads, restarted processes by
    reason), its uptime and the last error it logged.

    Exits 1 when the host is degraded (not connected to Pulsar, or worker threads stuck), still
    starting, or does not answer.
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
        problems = health.get("problems") or []
        if health.get("status") == "degraded" and problems:
            click.echo("\n".join(f"error: {problem}" for problem in problems), err=True)
        else:
            click.echo(_STATUS_ADVICE.get(str(health.get("status")),
                                          f"error: unknown status {health.get('status')!r}"), err=True)
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
        return read_health(url, timeout)
    except OSError as exc:
        reason = getattr(exc, "reason", exc)
        if as_json:
            click.echo(json.dumps({"status": "unreachable", "url": url, "error": str(reason)}, indent=2))
        click.echo(f"error: no tghost host answers at {url} ({reason}): is 'tghost run --metrics-port PORT' "
                   "running? Check --url (env TGHOST_STATUS_URL or TGHOST_METRICS_PORT)", err=True)
        sys.exit(1)
    except ValueError:
        raise click.ClickException(f"{url} did not answer health JSON: is it a tghost metrics port?") from None


def _print_health(health: dict[str, Any]) -> None:
    ok = health.get("status") == "ok"
    click.echo(f"status:     {click.style(str(health.get('status')), fg='green' if ok else 'red')}")
    connected = health.get("connected")
    click.echo(f"connected:  {'unknown' if connected is None else 'yes' if connected else 'no'}")
    click.echo(f"services:   {', '.join(health.get('services') or []) or '-'}")
    for sid, stats in (health.get("workers") or {}).items():
        click.echo(f"  {sid}: {describe_workers(stats)}")
    click.echo(f"uptime:     {health.get('uptime_seconds')} s")
    error = health.get("last_error")
    click.echo(f"last error: {error['time']} {error['logger']}: {error['message']}" if error else "last error: -")


def describe_workers(stats: dict[str, Any]) -> str:
    """``process, 2 of 4 worker processes, 1 busy; restarts: crash 1, timeout 3``, or ``thread, 3 worker
    threads for 2 calls at once, 1 busy, 2 stuck``."""
    if stats.get("isolation") == "process":
        text = (f"process, {stats.get('workers')} of {stats.get('max_workers')} worker processes, "
                f"{stats.get('busy')} busy")
    else:
        text = (f"thread, {stats.get('workers')} worker threads for {stats.get('max_workers')} calls at once, "
                f"{stats.get('busy')} busy")
    if stats.get("stuck"):
        text += click.style(f", {stats['stuck']} stuck", fg="red")
    restarts = {reason: n for reason, n in (stats.get("restarts") or {}).items() if n}
    if restarts:
        text += "; restarts: " + ", ".join(f"{reason} {n}" for reason, n in restarts.items())
    return text
