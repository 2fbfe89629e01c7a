"""cli.directory: the agent-side views of the live directory: ``tghost tools``, ``watch``,
``export``, ``mcp`` and ``inspect``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import importlib.metadata
import json
import shutil
import sys
import textwrap
import time
import webbrowser
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from tghost.adapters.export import FORMATS, select_tools
from tghost.agent.directory import Change
from tghost.agent.entries import CodeVersion, Side
from tghost.agent.hosts import late_hosts
from tghost.agent.search import SearchError, check_limit, words_of
from tghost.cli import output
from tghost.cli.app import cli
from tghost.cli.options import (
    LogLevel,
    filter_options,
    identity_options,
    open_directory,
    otel_option,
    pulsar_options,
    read_token_file,
    setup_logging,
    trust_options,
)
from tghost.cli.status import NO_HOSTS
from tghost.protocol.trust import Signer, TrustedKeys
from tghost.pulsar.clients import PulsarSettings
from tghost.system.net import is_loopback

F = TypeVar("F", bound=Callable[..., Any])
#: What ``tghost mcp`` needs of the MCP SDK: the ``mcp`` extra of pyproject.toml.
MCP_SDK = "mcp>=2.3,<3"
#: ``tghost inspect``'s default port: one above the MCP bridge's 8765, so both run side by side.
INSPECT_PORT = 8766


@cli.command()
@pulsar_options(waits=False)
@filter_options
@trust_options
@identity_options
@click.option("--all", "show_all", is_flag=True,
              help="List every live tool, whoever may call it, with an ACCESS column [default: those the "
                   "--identity, or an anonymous caller, may call].")
@click.option("--search", "query", metavar="QUERY",
              help="Rank the tools for a plain-language request, best first (BM25 over name, description and "
                   "arguments), e.g. --search 'weather forecast for a city'.")
@click.option("--limit", type=int, default=None, help="With --search: how many tools (1-1000) [default: 10].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
def tools(pulsar: PulsarSettings, descriptors_topic: str, groups: tuple[str, ...], state: str | None,
          trusted: TrustedKeys | None, identity: Signer | None, show_all: bool, query: str | None,
          limit: int | None, as_json: bool) -> None:
    """List the live tools every agent can see, as announced by running hosts.

    Without --group/--state, every live tool is listed; with them, only those a
    request with those groups and state may use. Hosts with an [access] policy announce who may
    call each tool: only those the --identity (or an anonymous caller) may call are listed,
    unless --all. A tool whose name or service another host
    announces differently is marked CONFLICT, and the conflicts are listed on stderr; one that a
    provider announces with another descriptor (timeout, description, access...) is marked DRIFT,
    and listed there too: the descriptor of the host seen first is the one shown. One whose
    service's hosts announce different [access] policies is marked POLICY: each of them admits a
    caller only where all of them do, and ACCESS shows who that is. One whose
    service's hosts serve different versions of its code (distribution, version or fingerprint)
    is marked SKEW, and the versions are listed there too ("skew" in --json). A provider silent
    for half its lease (perhaps killed) is marked "(late)". With
    --search, the same tools are ranked for the request and the best --limit listed, with a
    SCORE column (--json: each row has a "score"). A terminal wide enough gets a DESCRIPTION
    column last, each cut to fit (a pipe never does; --json has each whole).

    \b
    Exit codes:
      0  live hosts found (even if none of their tools is listed)
      1  no broker answers
      2  usage error
      3  no live host (is a 'tghost run' up on this broker and --descriptors-topic?), as 'tghost status'
    """
    limit = _search_limit(query, limit)

    live = hosts = 0
    late: Mapping[str, float] = {}

    async def fetch() -> list[dict[str, Any]]:
        nonlocal live, hosts, late
        async with open_directory(pulsar, descriptors_topic, trusted, identity=identity) as directory:
            live, hosts = len(directory.tools), len(directory.hosts)
            names = [t.name for t in directory.available(groups or ["*"], state)]
            if not groups and state is None:
                names = sorted(directory.tools)
            listed = [n for n in names if show_all or directory.calls.admits(directory.tools[n])]
            late = late_hosts(directory, time.time())
            if query is None:
                return [directory.tools[name].to_json() for name in listed]
            return [{**directory.tools[name].to_json(), "score": round(score, 4)}
                    for name, score in directory.index.ranked(query, set(listed).__contains__, limit)]

    rows = asyncio.run(fetch())
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif not rows:
        click.echo(_none_listed(live, query, groups, state, show_all))
    if not hosts:
        sys.exit(NO_HOSTS)  # as 'tghost status'
    if as_json or not rows:
        return
    scored = query is not None
    table = [("TOOL", "SERVICE", "PROVIDERS", "GROUPS", "STATES", "-> STATE", *(("ACCESS",) if show_all else ()),
              *(("SCORE",) if scored else ()))] + [
        (r["name"] + (" CONFLICT" if r["conflicts"] else "") + (" DRIFT" if r["drift"] else "")
         + (" POLICY" if r["policy_mismatch"] else "") + (" SKEW" if r["skew"] else ""),
         r["service"] + (" (external)" if r["external"] else ""),
         _providers_cell(r["providers"], late), ",".join(r["group"]),
         ",".join(r.get("available_in_states") or ["*"]),
         r.get("state", "-"), *((r["access"],) if show_all else ()), *((f"{r['score']:.2f}",) if scored else ()))
        for r in rows]
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else 0  # a pipe gets the same columns
    for line in output.table(described(table, [r["description"] for r in rows], width)):
        click.echo(line)
    _print_conflicts(rows, refused=trusted is None)
    _print_drift(rows)
    _print_policy_mismatch(rows)
    _print_skew(rows)


#: The fewest characters of a description worth a DESCRIPTION column.
MIN_DESCRIPTION = 20


def described(table: list[tuple[str, ...]], descriptions: list[str], width: int) -> list[tuple[str, ...]]:
    """``table`` (a header row, then one row per tool) with a last DESCRIPTION column, each
    description's first line cut at a word to what the terminal's ``width`` (characters) leaves,
    ending in ``…`` when cut; ``table`` itself when fewer than :data:`MIN_DESCRIPTION` characters are left."""
    used = sum(max(len(row[i]) for row in table) + 2 for i in range(len(table[0])))
    room = width - used
    if room < MIN_DESCRIPTION:
        return table
    cells = [text.strip().splitlines()[0] if text.strip() else "" for text in descriptions]
    cut = [textwrap.shorten(cell, room, placeholder="…") for cell in cells]  # at a word
    return [(*table[0], "DESCRIPTION"), *((*row, cell) for row, cell in zip(table[1:], cut, strict=True))]


def _providers_cell(providers: list[str], late: Mapping[str, float]) -> str:
    """The providers, each ``late`` one (docs/protocol.md §4.9) marked ``(late)``."""
    return ",".join(host + (" (late)" if host in late else "") for host in providers)


def _none_listed(live: int, query: str | None, groups: tuple[str, ...], state: str | None, show_all: bool) -> str:
    """Why ``tghost tools`` lists nothing, when ``live`` tools are live in all."""
    if not live:
        return "no live tools (is a 'tghost run' up on this broker and --descriptors-topic?)"
    if query is not None:
        return "no live tool matches the search"
    asked = " and ".join(part for part in (groups and f"groups {list(groups)}", state and f"state {state!r}") if part)
    others = f"none of the {live} live tool(s) is for {asked}" if asked else f"{live} live tool(s), none listed"
    hint = "" if show_all else " or --all for those your identity may not call"
    return f"{others}: 'tghost tools' without --group/--state lists every one{hint}"


def _search_limit(query: str | None, limit: int | None) -> int:
    """The --limit of a --search (10 if not given), once both are checked.

    Raises:
        click.BadParameter: the query has no words, or the limit is out of range.
        click.UsageError: --limit without --search.
    """
    if query is None:
        if limit is not None:
            raise click.UsageError("--limit goes with --search, e.g. --search 'weather forecast' --limit 3")
        return 10
    limit = 10 if limit is None else limit
    try:
        words_of(query)
    except SearchError as exc:
        raise click.BadParameter(str(exc), param_hint="--search") from None
    try:
        return check_limit(limit)
    except SearchError as exc:
        raise click.BadParameter(str(exc), param_hint="--limit") from None


def _print_conflicts(rows: list[dict[str, Any]], refused: bool) -> None:
    """Each contested tool of ``rows`` and the other side of its conflicts, on stderr."""
    contested = [r for r in rows if r["conflicts"]]
    if not contested:
        return
    effect = ("calls to them are refused ('conflict') until the other claims end; sign announcements "
              "(tghost keygen) on a shared broker" if refused else "calls go to the claims seen first")
    click.secho(f"\n{len(contested)} tool(s) contested by another host: {effect}", fg="red", err=True)
    for r in contested:
        first = Side(",".join(r["providers"]), r["service"])
        others = "; ".join(Side.from_json(side).describe() for side in r["conflicts"])
        click.echo(f"  {r['name']}: {first.describe()} (seen first) vs {others}", err=True)


def _print_drift(rows: list[dict[str, Any]]) -> None:
    """Each tool of ``rows`` that a provider announces with another descriptor, on stderr."""
    drifted = [r for r in rows if r["drift"]]
    if not drifted:
        return
    click.secho(f"\n{len(drifted)} tool(s) announced with another descriptor by a provider (drift): calls go ahead "
                "with the descriptor seen first; expected during a rolling upgrade, otherwise stop that provider",
                fg="yellow", err=True)
    for r in drifted:
        click.echo(f"  {r['name']}: " + "; ".join(Side.from_json(side).describe() for side in r["drift"]), err=True)


def _print_policy_mismatch(rows: list[dict[str, Any]]) -> None:
    """Each tool of ``rows`` whose service's providers announce different access policies, on stderr."""
    mismatched = [r for r in rows if r["policy_mismatch"]]
    if not mismatched:
        return
    click.secho(f"\n{len(mismatched)} tool(s) served under different access policies (POLICY): each host admits only "
                "what all of them admit until they agree; give every host of the service the same [access] policy",
                fg="yellow", err=True)
    for r in mismatched:
        click.echo(f"  {r['name']}: " + "; ".join(f"{side['policy']} on host(s) {','.join(side['hosts'])}"
                                                  for side in r["policy_mismatch"]), err=True)


def _print_skew(rows: list[dict[str, Any]]) -> None:
    """Each service of ``rows`` whose hosts serve different versions of its code, once, on stderr."""
    skewed = {r["service"]: r["skew"] for r in rows if r["skew"]}
    if not skewed:
        return
    click.secho(f"\n{len(skewed)} service(s) skewed: their hosts serve different versions of the code, and a call "
                "goes to any of them; finish the upgrade, or restart the hosts on one version", fg="yellow", err=True)
    for service, versions in sorted(skewed.items()):
        click.echo(f"  {service}: " + "; ".join(CodeVersion.from_json(version).describe() for version in versions),
                   err=True)


@cli.command()
@pulsar_options
@trust_options
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object per change (JSON Lines): the tool as 'tghost tools --json' gives it, "
                   "plus \"change\" (added, updated, removed or expired) and \"time\" (when it was seen, local "
                   "ISO 8601 with its UTC offset, e.g. 2025-06-01T14:02:07+02:00).")
def watch(pulsar: PulsarSettings, descriptors_topic: str, trusted: TrustedKeys | None, as_json: bool) -> None:
    """Follow the live tool set: tools added, updated, removed or expired, until Ctrl-C.

    Starts with the tools live now, reported as added, then one line per change: the local TIME it
    was seen (HH:MM:SS), CHANGE (added,
    updated: its descriptor, hosts, conflicts or drift changed; removed: withdrawn; expired: its hosts'
    leases ran out), TOOL, SERVICE and the HOSTS that serve it. Waits for a broker that is not
    up yet (--connect-timeout).
    """
    async def follow() -> None:
        async with open_directory(pulsar, descriptors_topic, trusted, wait=True) as directory:
            if not as_json:
                click.echo(output.columns(("TIME", "CHANGE", "TOOL", "SERVICE", "HOSTS"), WATCH_WIDTHS))
            async for change in directory.changes(replay=True):
                _print_change(change, as_json)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(follow())


#: ``tghost watch``'s columns (characters): time, change, tool, service, hosts. Lines print as
#: changes come, so the widths are fixed; a longer name pushes the rest of its line right.
WATCH_WIDTHS = (8, 7, 28, 24, 0)


def _print_change(change: Change, as_json: bool) -> None:
    """One ``tghost watch`` line for ``change``, seen now (local time)."""
    seen = datetime.datetime.now().astimezone()
    if as_json:
        click.echo(json.dumps({**change.to_json(), "time": seen.isoformat(timespec="seconds")}), nl=True)
        return
    tool = change.tool
    service, hosts = (tool.descriptor.service, ",".join(p.host["id"] for p in tool.providers)) if tool else ("", "")
    clock = seen.strftime("%H:%M:%S")
    line = output.columns((clock, change.kind, change.name, service, hosts), WATCH_WIDTHS)
    colour = {"added": "green", "updated": "yellow"}.get(change.kind, "red")
    start = len(clock) + 2  # the change after the time, in colour
    click.echo(line[:start] + click.style(change.kind, fg=colour) + line[start + len(change.kind):])
    sys.stdout.flush()


@cli.command("export")
@pulsar_options(waits=False)
@filter_options
@trust_options
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), required=True,
              help="trustgraph: the tool-service/<id> and tool/<name> config items a TrustGraph agent loads; "
                   "openai: function-calling tool definitions; mcp: MCP Tool objects.")
def export_tools(pulsar: PulsarSettings, descriptors_topic: str, groups: tuple[str, ...], state: str | None,
                 trusted: TrustedKeys | None, fmt: str) -> None:
    """Write the live tools as JSON on stdout, in the shape another agent loads.

    Without --group/--state every live tool is written; with them, only those a
    request with those groups and state may use. Exits 1 when no broker answers.
    """
    async def fetch() -> Any:
        async with open_directory(pulsar, descriptors_topic, trusted) as directory:
            return FORMATS[fmt](select_tools(directory, list(groups) or None, state))

    click.echo(json.dumps(asyncio.run(fetch()), indent=2))


def _host_names(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """The --allowed-host names (a click callback), each value split at commas and whitespace.

    Raises:
        click.BadParameter: a name is a URL or path (has a '/'), not a Host header value.
    """
    names = tuple(name for value in values for name in value.replace(",", " ").split())
    for name in names:
        if "/" in name:
            raise click.BadParameter(f"{name!r} is not a Host header value: give NAME or NAME:PORT, e.g. "
                                     "tools.example.com:443", param_hint=f"--allowed-host / {param.envvar}")
    return names


@cli.command("mcp")
@pulsar_options
@filter_options
@trust_options
@identity_options
@otel_option
@click.option("--transport", type=click.Choice(["stdio", "http"]), default="stdio", show_default=True,
              help="stdio for a client that starts this command; http for streamable HTTP at /mcp.")
@click.option("--host", "http_host", default="127.0.0.1", show_default=True,
              help="With --transport http: the address to bind; 0.0.0.0 for every interface.")
@click.option("--port", "http_port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="With --transport http: the port to bind.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME", envvar="TGHOST_MCP_ALLOWED_HOSTS",
              callback=_host_names,
              help="With --transport http: a Host header clients may send besides the loopback names (127.0.0.1, "
                   "localhost, [::1], any port), e.g. mcp.example.com, mcp.example.com:8765, or mcp.example.com:* "
                   "for any port; Origin http(s)://NAME is accepted with it. Repeatable (env TGHOST_MCP_ALLOWED_HOSTS, "
                   "space- or comma-separated). On every bind, other Host headers get 421 and other Origins 403 "
                   "(DNS-rebinding protection): bound off loopback, give the names clients use.")
@click.option("--token-file", type=click.Path(path_type=Path, dir_okay=False), envvar="TGHOST_MCP_TOKEN_FILE",
              help="With --transport http: a file holding the bearer token every request must carry "
                   "('Authorization: Bearer <token>'; others get 401) (env TGHOST_MCP_TOKEN_FILE). Required when "
                   "--host is not a loopback address; loopback works without one.")
@click.option("--tool-search", is_flag=True,
              help="List two tools instead of every tool: search_tools(query, limit), which ranks the live tools "
                   "for a request and whose description says how many there are and of which groups, and "
                   "call_tool(name, arguments), which calls one; for clients with a limit on tools.")
@click.option("--read-only", is_flag=True,
              help="Serve only the tools hinted read-only (their annotations say read-only: true); the others are "
                   "left out of tools/list and search_tools, and a call of one is refused. Hints are what the "
                   "announcing host says: with --trusted-key, only signed hosts are believed.")
@click.option("--include", "include", multiple=True, metavar="NAME_GLOB",
              help="Serve only the tools whose name matches a shell pattern (*, ?, [seq]; case-sensitive), e.g. "
                   "'notes-*'. Repeatable: a tool that matches any is served.")
@click.option("--exclude", "exclude", multiple=True, metavar="NAME_GLOB",
              help="Never serve a tool whose name matches this pattern, e.g. 'admin-*'. Repeatable; wins over "
                   "--include.")
@click.option("--log-level", type=LogLevel(), default="warning",
              show_default=True, help="Log level; the log always goes to stderr.")
def mcp_bridge(pulsar: PulsarSettings, descriptors_topic: str, groups: tuple[str, ...], state: str | None,
               trusted: TrustedKeys | None, identity: Signer | None, transport: str, http_host: str, http_port: int,
               allowed_hosts: tuple[str, ...], token_file: Path | None, tool_search: bool, read_only: bool,
               include: tuple[str, ...], exclude: tuple[str, ...], log_level: str) -> None:
    """Serve the live tools to MCP clients (Model Context Protocol), until Ctrl-C or the client leaves.

    tools/list gives the tools a request with --group (default: the 'default' group)
    and --state may use, and that the hosts admit --identity to (anonymous without one),
    narrowed by --read-only, --include and --exclude: sorted by name, at most 100 a page,
    each with its title, behaviour hints (annotations) and output schema when it has them.
    tools/call calls one over Pulsar, signed with --identity (an error reply is a result with
    isError true; a tool with an output schema answers structuredContent and its JSON text);
    a tool outside the set is refused as an unknown one. Clients get
    notifications/tools/list_changed when that list changes. Over HTTP bound off loopback it
    asks every request for the bearer token in --token-file.

    Needs the MCP SDK, the 'mcp' extra: pip install "tghost[mcp]".
    """
    try:
        from tghost.adapters.mcp import Selection, serve  # the mcp SDK is imported only by this command
    except ImportError as exc:
        _no_mcp_sdk(exc)
        raise
    token = _web_token(token_file, transport == "http", http_host, "the MCP bridge", "TGHOST_MCP_TOKEN_FILE")
    setup_logging(log_level)

    def ready(url: str) -> None:
        where = f"port {http_port} of every address of this machine" if http_host in ("0.0.0.0", "::") else url
        click.echo(f"tghost mcp: the live tools on {descriptors_topic}, over MCP's streamable HTTP at {where} "
                   "(Ctrl-C to stop)" + ("; clients send 'Authorization: Bearer <the secret in the token file>'"
                                         if token else ""), err=True)

    directory = open_directory(pulsar, descriptors_topic, trusted, wait=True, identity=identity)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(directory, list(groups) or None, state, transport, http_host, http_port, allowed_hosts,
                              token, tool_search, on_ready=ready, selection=Selection(read_only, include, exclude)))
    except OSError as exc:
        raise click.ClickException(str(exc)) from None


class MissingExtra(click.ClickException):
    """An optional part of tghost is not installed (its message names the extra): exit code 2,
    as for a usage error, and ``--otel`` without its SDK."""

    exit_code = 2


def _no_mcp_sdk(exc: ImportError) -> None:
    """What ``tghost mcp`` says when importing the bridge failed for the MCP SDK (``exc`` names
    an ``mcp`` module): it is not installed, or it is not of :data:`MCP_SDK`'s versions.

    Raises:
        MissingExtra: exit code 2, naming the fix, when ``exc`` is about the SDK; else
            returns, for the caller to raise ``exc``.
    """
    if (exc.name or "").partition(".")[0] != "mcp":
        return
    fix = 'pip install "tghost[mcp]"'
    try:
        found = importlib.metadata.version("mcp")
    except importlib.metadata.PackageNotFoundError:
        error = MissingExtra(f"tghost mcp needs the MCP SDK ({MCP_SDK}), which is not installed: {fix}")
    else:
        error = MissingExtra(f"tghost mcp needs the MCP SDK ({MCP_SDK}), and this environment has mcp {found}: "
                             f"{fix}, or, where another package needs an older mcp (langchain-mcp-adapters pins "
                             "mcp<2), run tghost mcp from a venv of its own")
    raise error from None


@cli.command("inspect")
@pulsar_options
@trust_options
@identity_options
@otel_option
@click.option("--host", "http_host", default="127.0.0.1", show_default=True,
              help="The address to bind; 0.0.0.0 for every interface (then --token-file is required).")
@click.option("--port", "http_port", type=click.IntRange(0, 65535), default=INSPECT_PORT, show_default=True,
              help="The port to bind (the MCP bridge's is 8765, so both can run).")
@click.option("--open", "open_browser", is_flag=True, help="Open the page in the default web browser.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME", envvar="TGHOST_INSPECT_ALLOWED_HOSTS",
              callback=_host_names,
              help="A Host header browsers may send besides the loopback names (127.0.0.1, localhost, [::1], any "
                   "port), e.g. tools.example.com:8766, or tools.example.com:* for any port. Repeatable (env "
                   "TGHOST_INSPECT_ALLOWED_HOSTS). Other Host headers get 421, other Origins 403.")
@click.option("--token-file", type=click.Path(path_type=Path, dir_okay=False), envvar="TGHOST_INSPECT_TOKEN_FILE",
              help="A file holding the secret every request must carry: open /?token=SECRET once (it is kept in "
                   "a cookie), or send 'Authorization: Bearer SECRET' (env TGHOST_INSPECT_TOKEN_FILE). Required "
                   "when --host is not a loopback address.")
@click.option("--log-level", type=LogLevel(), default="warning",
              show_default=True, help="Log level; the log always goes to stderr.")
def inspect(pulsar: PulsarSettings, descriptors_topic: str, trusted: TrustedKeys | None, identity: Signer | None,
            http_host: str, http_port: int, open_browser: bool, allowed_hosts: tuple[str, ...],
            token_file: Path | None, log_level: str) -> None:
    """See and try the live directory in a web browser, until Ctrl-C.

    One page shows every live tool, its hosts and providers, leases counting down, conflicts
    and rejected announcements, and updates as announcements arrive. Each tool has a call form
    drawn from its input schema; calls go through the directory as an agent's do (signed with
    --identity), and their output streams in as it arrives.
    """
    token = _web_token(token_file, True, http_host, "the inspector", "TGHOST_INSPECT_TOKEN_FILE")
    setup_logging(log_level)
    from tghost.adapters.inspector import serve  # Starlette and uvicorn are imported only by this command

    def ready(url: str) -> None:
        where = f"port {http_port} of every address of this machine" if http_host in ("0.0.0.0", "::") else url
        click.echo(f"tghost inspect: the live directory on {descriptors_topic} at {where} (Ctrl-C to stop)"
                   + (f"; open /?token=<the secret in {token_file}> once in the browser" if token else ""), err=True)
        if open_browser:
            webbrowser.open(url)

    directory = open_directory(pulsar, descriptors_topic, trusted, wait=True, identity=identity)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(directory, http_host, http_port, allowed_hosts, token, ready))
    except OSError as exc:
        raise click.ClickException(str(exc)) from None


def _web_token(path: Path | None, needed: bool, host: str, what: str, env: str) -> str | None:
    """The bearer token in ``path`` (whitespace stripped) of ``--token-file`` (or ``env``), for
    ``what`` (``the MCP bridge``, ...) served over HTTP on ``host`` (``needed``: over HTTP at all).

    Raises:
        click.UsageError: HTTP bound off loopback without a token file.
        click.BadParameter: the file is unreadable or empty.
    """
    if path is None:
        if needed and not is_loopback(host):
            raise click.UsageError(
                f"--host {host} makes {what} reachable from other machines: give --token-file FILE (env {env}) "
                "holding a secret its clients send as 'Authorization: Bearer <token>', e.g. "
                "python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE")
        return None
    return read_token_file(path, f"--token-file / {env}")
