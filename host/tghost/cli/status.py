"""cli.status: ``tghost status``: every live host as the announcements show it, with the health
its host message points to (:mod:`tghost.agent.hosts`); or, given --url (or TGHOST_METRICS_PORT),
the health of one running ``tghost run --metrics-port``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

import click

from tghost.cli import output
from tghost.cli.app import cli
from tghost.cli.options import open_directory, pulsar_options, trust_options
from tghost.pulsar.clients import PulsarSettings
from tghost.system.net import is_loopback

if TYPE_CHECKING:
    from tghost.agent.hosts import LiveHost
    from tghost.protocol.trust import TrustedKeys

#: ``tghost status`` exit code when the directory knows of no live host.
NO_HOSTS = 3


def default_status_url() -> str | None:
    """The health URL of a host named by TGHOST_STATUS_URL, or by TGHOST_METRICS_PORT (and _HOST)."""
    return os.environ.get("TGHOST_STATUS_URL") or _default_status_url()


#: Bytes of a health answer read at most: a tghost host's is a few KiB.
MAX_HEALTH_BYTES = 1 << 20


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A health URL answers itself: a redirect is an error, never followed."""

    def redirect_request(self, *args: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def read_health(url: str, timeout: float) -> dict[str, Any]:
    """The health JSON at ``url`` (also from a 503 answer), with no redirect followed and at most
    :data:`MAX_HEALTH_BYTES` read; ``timeout`` is seconds per socket operation.

    Raises:
        OSError: nothing answers, or it redirects (``urllib.error.URLError`` is one).
        ValueError: the answer is not JSON (or is longer than the limit).
    """
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            body = response.read(MAX_HEALTH_BYTES + 1)
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            raise urllib.error.URLError(f"it redirects ({exc.code}); give the health URL itself") from None
        body = exc.read(MAX_HEALTH_BYTES + 1)
    if len(body) > MAX_HEALTH_BYTES:
        raise ValueError(f"longer than {MAX_HEALTH_BYTES} bytes")
    health: dict[str, Any] = json.loads(body)
    return health


def _default_status_url() -> str | None:
    port = os.environ.get("TGHOST_METRICS_PORT")
    host = os.environ.get("TGHOST_METRICS_HOST", "127.0.0.1")
    return f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}/health" if port else None


@cli.command()
@pulsar_options(waits=False)
@trust_options
@click.option("--url", envvar="TGHOST_STATUS_URL", default=None,
              help="Ask only this host's health URL (env TGHOST_STATUS_URL); "
                   "TGHOST_METRICS_PORT (and TGHOST_METRICS_HOST) set does the same for http://HOST:PORT/health "
                   "[default: every live host the announcements show].")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True,
              help="Seconds to wait for each health answer.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
def status(pulsar: PulsarSettings, descriptors_topic: str, trusted: TrustedKeys | None, url: str | None,
           timeout: float, as_json: bool) -> None:
    """Show every live host: its services, tools, lease, signature, conflicts and health.

    One row per host id the announcements show live: its services (external ones marked), tool
    count, lease left, the key its announcements are signed with, its contested tools and
    services, and its health where its host message names a health URL ('tghost run
    --metrics-port'). A loopback health URL is asked only on the host's own machine.

    With --json: {"topic", "trusted", "clashes", "policy_mismatch" (service id -> the mismatch in
    words, for each service whose hosts announce different [access] policies), "skewed" (service
    id -> [{"distribution", "version", "fingerprint", "hosts"}], for each service whose hosts serve
    different code), "hosts": [{"id", "instances", "hostname", "version", "lease_seconds",
    "lease_remaining", "heard_ago", "late", "signed", "signed_by", "verified", "services",
    "external", "tools" (a count), "conflicts", "skewed", "health_url", "health"}]}; a field with
    no value is left out. "health" is the host's /health JSON, or {"status": "unreachable",
    "error"}, or {"status": "elsewhere"} for a loopback URL of another machine, or {"status":
    "unverified"} for a URL that no --trusted-key vouches for (not asked: anyone on the broker may
    announce a URL), unless it is this machine's loopback in the plain form
    http://127.0.0.1:PORT/health.

    With --url (or TGHOST_METRICS_PORT), ask that one host how it is, as 'tghost run
    --metrics-port' serves it: connected to Pulsar or not, the services it serves and their
    workers (isolation, stuck threads, restarted processes by reason), its uptime and the last
    error it logged.

    \b
    Exit codes:
      0  live hosts found, none with a problem (with --url: the host is ok)
      1  a host has a problem: its health is not ok or does not answer, a tool or service of
         it is contested, two processes share its id, or it is late (silent for half its
         lease); the hosts of a service announce different [access] policies, or serve different
         versions of its code (skew); or no broker answers
      2  usage error
      3  no live host (is a 'tghost run' up on this broker and --descriptors-topic?)
    """
    url = url or _default_status_url()
    if url is not None:
        _one_host(url, timeout, as_json)
        return
    report = asyncio.run(_fleet(pulsar, descriptors_topic, trusted, timeout))
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print_fleet(report)
    if not report["hosts"]:
        click.echo("no live host on this broker and topic: is a 'tghost run' up? (check --pulsar-url and "
                   "--descriptors-topic)", err=True)
        sys.exit(NO_HOSTS)
    problems = [problem for host in report["hosts"] for problem in _problems(host, report["clashes"])]
    problems += report["policy_mismatch"].values()
    problems += _skew_problems(report["skewed"])
    for problem in problems:
        click.echo(f"Error: {problem}", err=True)
    if problems:
        sys.exit(1)


def _one_host(url: str, timeout: float, as_json: bool) -> None:
    """``tghost status --url``: the health of one host; exits 1 unless it is ok."""
    health = _fetch_health(url, timeout, as_json)
    if as_json:
        click.echo(json.dumps(health, indent=2))
    else:
        _print_health(health)
    if health.get("status") != "ok":
        problems = health.get("problems") or []
        if health.get("status") == "degraded" and problems:
            click.echo("\n".join(f"Error: {problem}" for problem in problems), err=True)
        else:
            click.echo(_STATUS_ADVICE.get(str(health.get("status")),
                                          f"Error: unknown status {health.get('status')!r}"), err=True)
        sys.exit(1)


async def _fleet(pulsar: PulsarSettings, topic: str, trusted: TrustedKeys | None,
                 timeout: float) -> dict[str, Any]:
    """The ``--json`` report of the live hosts of the directory on ``topic``, health included."""
    from tghost.agent.hosts import live_hosts

    async with open_directory(pulsar, topic, trusted) as directory:
        hosts, now = live_hosts(directory), time.time()
        clashes = {host: list(instances) for host, instances in directory.clashes.items()}
        mismatched = {sid: entry.mismatch() for sid, entry in sorted(directory.services.items())
                      if entry.policy_mismatch}
        skewed = {sid: [version.to_json() for version in service.skew]
                  for sid, service in sorted(directory.services.items()) if service.skew}
    rows = [host.to_json(now) for host in hosts]
    for row, health in zip(rows, await _healths(hosts, timeout), strict=True):
        if health is not None:
            row["health"] = health
    return {"topic": topic, "trusted": trusted is not None, "hosts": rows, "clashes": clashes,
            "policy_mismatch": mismatched, "skewed": skewed}


async def _healths(hosts: list[LiveHost], timeout: float) -> list[dict[str, Any] | None]:
    """Each host's :func:`_announced_health`, asked all at once (up to 32 at a time) within
    ``timeout`` seconds in all: one that has not answered by then is ``unreachable``."""
    if not hosts:
        return []
    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(hosts)), thread_name_prefix="health")
    try:
        futures = [loop.run_in_executor(pool, _announced_health, host, timeout) for host in hosts]
        await asyncio.wait(futures, timeout=timeout)
        late = {"status": "unreachable", "error": f"no answer within {timeout:g}s"}
        return [future.result() if future.done() else late for future in futures]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _announced_health(host: LiveHost, timeout: float) -> dict[str, Any] | None:
    """The health JSON at the URL ``host`` announces (``None``: none announced), without asking
    a loopback URL of another machine (``{"status": "elsewhere"}``), a URL that is not http(s),
    or one that no trusted key vouches for, unless it is this machine's loopback in the form
    :func:`_plain_health_url` allows (``{"status": "unverified"}``: anyone on the broker may
    announce a URL and a host name; docs/protocol.md §4.3)."""
    if host.health is None:
        return None
    parsed = urllib.parse.urlsplit(host.health)
    if parsed.scheme not in ("http", "https"):
        return {"status": "unreachable", "error": "not an http(s) URL"}
    local = is_loopback(parsed.hostname or "")
    if local and host.host.get("hostname") != socket.gethostname():
        return {"status": "elsewhere"}
    if not (host.verified or (local and _plain_health_url(parsed))):
        return {"status": "unverified"}
    try:
        return read_health(host.health, timeout)
    except OSError as exc:
        return {"status": "unreachable", "error": str(getattr(exc, "reason", exc))}
    except ValueError:
        return {"status": "unreachable", "error": "the answer is not health JSON"}


def _plain_health_url(url: urllib.parse.SplitResult) -> bool:
    """``http://HOST:PORT/health`` and nothing else (no user, query or fragment): all an unsigned
    host message may make ``tghost status`` ask of this machine's loopback."""
    return (url.scheme == "http" and url.path == "/health" and not (url.query or url.fragment or url.username)
            and url.port is not None)


def _problems(host: dict[str, Any], clashes: dict[str, list[str]]) -> list[str]:
    """What is wrong with one host of the ``--json`` report, in words."""
    who, health = f"host {host['id']}", host.get("health") or {}
    problems = [f"{who}: {problem}" for problem in health.get("problems") or []]
    if health.get("status") == "unreachable":
        problems.append(f"{who}: its health URL {host.get('health_url')} does not answer ({health.get('error')})")
    elif health.get("status") not in (None, "ok", "elsewhere", "unverified") and not problems:
        problems.append(f"{who}: health {health.get('status')}")
    if host["conflicts"]:
        problems.append(f"{who}: contested by another host: {', '.join(host['conflicts'])} (see 'tghost tools')")
    problems.extend(_late_problem(host))
    if host["id"] in clashes:
        problems.append(f"{who}: {len(clashes[host['id']])} live processes share this host id: give each its own "
                        "--host-id (env TGHOST_HOST_ID)")
    return problems


def _skew_problems(skewed: dict[str, list[dict[str, Any]]]) -> list[str]:
    """One line per skewed service of the ``--json`` report, naming each version and its hosts."""
    from tghost.agent.entries import CodeVersion, describe_skew

    return [describe_skew(sid, map(CodeVersion.from_json, versions)) for sid, versions in skewed.items()]


def _late_problem(host: dict[str, Any]) -> list[str]:
    """A late host (docs/protocol.md §4.9) in words, if it is one."""
    if not host.get("late"):
        return []
    return [f"host {host['id']}: late: not heard for {host['heard_ago']:.0f}s (heartbeats come every "
            f"{host['lease_seconds'] / 3:g}s); it may have stopped without withdrawing. Its lease ends in "
            f"{host['lease_remaining']:.0f}s; calls of its tools end 'no-provider' when it does not answer"]


def _lease_cell(host: dict[str, Any]) -> str:
    """Lease left, and ``LATE`` for a late host."""
    return f"{host['lease_remaining']:.0f}s of {host['lease_seconds']:g}s" + (" LATE" if host.get("late") else "")


def _print_fleet(report: dict[str, Any]) -> None:
    """The live hosts as a table: one row per host."""
    if not report["hosts"]:
        return
    table = [("HOST", "SERVICES", "TOOLS", "LEASE", "SIGNED", "CONFLICTS", "HEALTH")] + [
        (host["id"] + (f" ({len(host['instances'])} processes)" if len(host["instances"]) > 1 else ""),
         ",".join([*host["services"], *(f"{sid} (external)" for sid in host["external"])]) or "-",
         str(host["tools"]), _lease_cell(host),
         _signed_cell(host), str(len(host["conflicts"])) if host["conflicts"] else "-",
         _health_cell(host))
        for host in report["hosts"]]
    for line in output.table(table):
        click.echo(line)
    for host in report["hosts"]:
        for sid, stats in ((host.get("health") or {}).get("workers") or {}).items():
            click.echo(f"  {host['id']} {sid}: {describe_workers(stats)}")


def _signed_cell(host: dict[str, Any]) -> str:
    """``no``, the key id, or the key id and ``(unchecked)`` when no trusted key vouched for it."""
    key = host.get("signed_by")
    return "no" if key is None else key if host.get("verified") else f"{key} (unchecked)"


def _health_cell(host: dict[str, Any]) -> str:
    """``ok``, ``degraded``, ``unreachable``, ``on HOSTNAME only`` (a loopback URL elsewhere),
    ``not asked (unsigned)`` or ``-``."""
    status = (host.get("health") or {}).get("status")
    if status == "elsewhere":
        return f"on {host.get('hostname', '?')} only"
    if status == "unverified":
        return "not asked (unsigned)"
    return str(status) if status is not None else "-"


_STATUS_ADVICE = {
    "degraded": "Error: the host is not connected to Pulsar; check that the broker at its --pulsar-url is up "
                "(the host reconnects and announces again by itself)",
    "starting": "Error: the host is still starting (not serving yet); try again in a moment, and see its log "
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
        click.echo(f"Error: no tghost host answers at {url} ({reason}): is 'tghost run --metrics-port PORT' "
                   "running? Check --url (env TGHOST_STATUS_URL or TGHOST_METRICS_PORT)", err=True)
        sys.exit(1)
    except ValueError:
        hint = "" if urllib.parse.urlsplit(url).path == "/health" else " (a host's health is at its /health path)"
        raise click.ClickException(f"{url} did not answer health JSON: is it a tghost metrics port?{hint}") from None


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
        workers = stats.get("workers")
        text = (f"thread, {workers} worker thread{'' if workers == 1 else 's'} for {stats.get('max_workers')} calls "
                f"at once, {stats.get('busy')} busy")
    if stats.get("stuck"):
        text += click.style(f", {stats['stuck']} stuck", fg="red")
    restarts = {reason: n for reason, n in (stats.get("restarts") or {}).items() if n}
    if restarts:
        text += "; restarts: " + ", ".join(f"{reason} {n}" for reason, n in restarts.items())
    return text
