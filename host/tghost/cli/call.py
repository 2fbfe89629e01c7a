"""cli.call: ``tghost call``, a tool by name through the directory or a service by id; its
errors say what an installed plugin that failed to load, or a host serving a plugin's old code,
has to do with them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import sys
from collections.abc import AsyncIterator, Collection
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import click

from tghost.agent.calls import NO_PROVIDER, NoProvider, UnknownTool, described
from tghost.agent.client import ToolCallError, call_timeout
from tghost.agent.entries import describe_old_code, old_code
from tghost.cli.app import cli
from tghost.cli.options import (
    filter_options,
    identity_options,
    json_value,
    open_directory,
    otel_option,
    parse_pairs,
    pulsar_options,
    trust_options,
    verbosity,
)
from tghost.protocol.descriptors import DEFAULT_TIMEOUT, ToolServiceDescriptor, request_queue, response_queue
from tghost.protocol.groups import DEFAULT_STATE, next_state
from tghost.protocol.trust import Signer, TrustedKeys
from tghost.protocol.wire import INVALID_ARGUMENTS, TOOL_SERVICE_ERROR, Progress
from tghost.pulsar.clients import PulsarSettings

if TYPE_CHECKING:
    from tghost.agent.directory import ToolDirectory
    from tghost.discovery.catalog import PluginReport


@cli.command()
@pulsar_options(waits=False)
@filter_options
@trust_options
@identity_options
@otel_option
@click.option("--service", "service_id", default=None,
              help="Call a tool service by id instead of a tool by name.")
@click.option("--topic", default=None,
              help="With --service: the short topic T (non-persistent://tg/request/T) [default: as announced, "
                   "else from the installed plugin].")
@click.option("--config", "config_pairs", multiple=True, metavar="KEY=VALUE",
              help="With --service: a config value; repeatable. KEY:=JSON for non-strings.")
@click.option("--json", "json_args", default=None, metavar="ARGS",
              help="All arguments as one JSON object, instead of KEY=VALUE pairs.")
@click.option("--user", default=None, help="The request's user (omitted if not given).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds to wait for the whole answer [default: the service's announced timeout, else "
                   f"{DEFAULT_TIMEOUT:g}, a host's default].")
@click.option("--wait", type=click.FloatRange(min=0), default=0.0, metavar="SECONDS",
              help="Wait up to SECONDS for a live host to serve the tool or service (one that is starting) "
                   "[default: 0, fail at once when none does].")
@click.option("--progress/--no-progress", "show_progress", default=None,
              help="Show the tool's progress updates on stderr [default: when stderr is a terminal].")
@click.argument("arguments", nargs=-1, metavar="[TOOL] [KEY=VALUE | KEY:=JSON]...")
def call(pulsar: PulsarSettings, descriptors_topic: str, groups: tuple[str, ...], state: str | None,
         trusted: TrustedKeys | None, identity: Signer | None, service_id: str | None, topic: str | None,
         config_pairs: tuple[str, ...], json_args: str | None, user: str | None, timeout: float | None,
         wait: float, show_progress: bool | None, arguments: tuple[str, ...]) -> None:
    """Call a tool by name (through the live directory), or a service with --service.

    A tool call merges the tool's config values into the request and is refused, with the
    reason, when the request's --group/--state (TrustGraph's tool groups) do not allow the
    tool. --config and --topic go with --service only (a usage error with a tool name, exit 2). The
    observation is printed as it streams in, and the tool's progress updates (if it reports
    any) on stderr, on one line rewritten in place on a terminal. Exits 1 on a refusal, an error reply or a
    timeout (the error goes to stderr; a tool's failure with the answering host's id and the request id
    that its log names the traceback by). A tool or --service that no live host serves fails at
    once (exit 1), saying whether a host announced it lately or its plugin is installed here,
    unless --wait gives a host time to start (or --topic says where a --service is). An unknown
    tool name is answered with the closest names. Ctrl-C cancels the call on the host that runs
    it, freeing its slot, and exits 130.
    """
    if service_id is None and not arguments:
        raise click.UsageError("give a TOOL name, or --service ID")
    tool_name, arguments = (None, arguments) if service_id else (arguments[0], arguments[1:])
    if tool_name is not None and (config_pairs or topic):
        given = "--config" if config_pairs else "--topic"
        raise click.UsageError(
            f"{given} goes with --service, not with a tool name: a tool brings its own config values and topic. "
            f"Call the service instead (tghost call --service ID {given} ...), or declare a tool with those "
            "config values in a config file ('Tools from configuration' in docs/guides/writing-plugins.md)")
    if json_args is not None and arguments:
        raise click.UsageError("give arguments as KEY=VALUE pairs or --json, not both")
    args = parse_pairs(arguments, "ARGUMENTS") if json_args is None else _json_object(json_args)
    config = parse_pairs(config_pairs, "--config")
    directory = open_directory(pulsar, descriptors_topic, trusted, identity=identity, installed=_installed)
    line = ProgressLine(sys.stderr.isatty() if show_progress is None else show_progress)
    try:
        if tool_name is not None:
            asyncio.run(_call_tool(directory, tool_name, args, user, list(groups) or None, state, timeout, wait, line))
        else:
            asyncio.run(_call_service(directory, service_id or "", topic, config, args, user, timeout, wait, line))
    except ToolCallError as exc:
        line.clear()
        line.end_line()
        kind, name = ("tool", tool_name) if tool_name is not None else ("tool-service", service_id or "")
        click.echo(f"Error: {_with_broken_plugins(exc, name)}{_where(exc)}{_old_code(directory, exc, kind, name)}",
                   err=True)
        sys.exit(1)
    except KeyboardInterrupt:  # the call was cancelled on its host as asyncio.run unwound (docs/protocol.md §2.11)
        line.clear()
        line.end_line()
        click.echo("cancelled: the host running the call was told to stop it" if line.sent
                   else "cancelled before a call was sent", err=True)
        sys.exit(130)
    finally:
        line.clear()


def _where(error: ToolCallError) -> str:
    """`` (host H, request R)`` after a ``tool-service-error``: the host that answered and the call's
    request id, under which that host's log has the traceback; ``""`` for any other error, or when
    the message says it already (a host's ``--error-detail type`` or ``none``)."""
    if error.error_type != TOOL_SERVICE_ERROR or (error.request_id and error.request_id in error.message):
        return ""
    known = [f"{label} {value}" for label, value in (("host", error.host), ("request", error.request_id)) if value]
    return f" ({', '.join(known)})" if known else ""


def _json_object(text: str) -> dict[str, Any]:
    value = json_value(text, "ARGS", "--json")
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--json")
    return value


class ProgressLine:
    """A call's progress updates on stderr (``shown``): one line rewritten in place on a
    terminal, else one line per update (``progress: 3/10 page 3``). On a terminal, an update
    waits while the observation's last line is unfinished, so the line never erases output."""

    def __init__(self, shown: bool) -> None:
        self.report = self.show if shown else None
        self._stderr = sys.stderr
        self._in_place = self._stderr.isatty()
        self._showing = False
        self._mid_line = False  # the observation printed so far ends inside a line
        self.sent = False
        """Whether the call went out (its stream began): a Ctrl-C before it cancels nothing on a host."""

    def printed(self, chunk: str) -> None:
        """The observation's ``chunk`` was printed on stdout."""
        if chunk:
            self._mid_line = not chunk.endswith("\n")

    def end_line(self) -> None:
        """End an unfinished observation line (before a message on stderr)."""
        if self._mid_line:
            click.echo()
            self._mid_line = False

    def show(self, update: Progress) -> None:
        """Show ``update``: ``done/total (percent)`` or ``done``, then the message."""
        amount = (f"{update.done:g}/{update.total:g} ({100 * update.done / update.total:.0f}%)"
                  if update.total else f"{update.done:g}")
        text = f"progress: {amount}{' ' + update.message if update.message else ''}"
        if self._in_place:
            if self._mid_line:
                return  # drawn in place, it would erase the unfinished line
            self._stderr.write(f"\r\033[K{text}")
            self._showing = True
        else:
            self._stderr.write(text + "\n")
        self._stderr.flush()

    def clear(self) -> None:
        """Take a line shown in place away (before output, or at the end)."""
        if self._showing:
            self._stderr.write("\r\033[K")
            self._stderr.flush()
            self._showing = False


async def _call_tool(directory: ToolDirectory, name: str, arguments: dict[str, Any], user: str | None,
                     groups: list[str] | None, state: str | None, timeout: float | None, wait: float,
                     line: ProgressLine) -> None:
    async with directory:
        await _wait_for(directory, name, wait, "tool")
        tool = directory.check(name, groups, state)
        await _echo_stream(directory.stream(name, arguments, user=user, groups=groups, state=state,
                                            timeout=timeout, progress=line.report), line)
        before, after = state or DEFAULT_STATE, next_state(tool.descriptor, state, True)
        if after != before:
            click.echo(f"state: {before} -> {after}", err=True)


async def _call_service(directory: ToolDirectory, service_id: str, topic: str | None, config: dict[str, Any],
                        arguments: dict[str, Any], user: str | None, timeout: float | None, wait: float,
                        line: ProgressLine) -> None:
    async with directory:
        if not topic:
            await _wait_for(directory, service_id, wait, "tool-service")
        announced = directory.services.get(service_id)
        if announced and announced.rivals and directory.calls.refuse_conflicts and not topic:
            sides = "; ".join(side.describe() for side in announced.rivals)
            raise click.ClickException(
                f"service {service_id!r} on {announced.descriptor.request_queue} is contested: {sides}. Not calling "
                "it: without trusted keys nothing proves which is real (--topic calls a topic you name)")
        descriptor = announced.descriptor if announced and not topic else _unannounced(directory, service_id, topic)
        service = await directory.caller(descriptor)
        await _echo_stream(service.stream(config, arguments, user=user, timeout=call_timeout(descriptor, timeout),
                                          progress=line.report), line)


async def _echo_stream(chunks: AsyncIterator[str], line: ProgressLine) -> None:
    """Print observation chunks as they arrive, then end the line unless the last chunk did."""
    line.sent = True
    last = "\n"
    async for chunk in chunks:
        line.clear()
        click.echo(chunk, nl=False)
        line.printed(chunk)
        last = chunk or last
    if not last.endswith("\n"):
        click.echo()


async def _wait_for(directory: ToolDirectory, name: str, wait: float, kind: Literal["tool", "tool-service"]) -> None:
    """Give a host that is starting ``wait`` seconds to serve ``name``, saying so on stderr; then
    the call goes on (and is refused if none does)."""
    if wait and name not in directory.calls.live(kind):
        click.echo(f"waiting up to {wait:g}s for a live host to serve {described(kind, name)} (Ctrl-C stops)", err=True)
        try:
            await directory.wait_for(name, wait, kind=kind)
        except TimeoutError:
            click.echo(f"waited {wait:g}s: no live host serves {described(kind, name)} yet", err=True)


def _unannounced(directory: ToolDirectory, service_id: str, topic: str | None) -> ToolServiceDescriptor:
    """The service on --topic.

    Raises:
        tghost.agent.calls.NoProvider: no --topic, and no live host serves ``service_id``, but one
            announced it lately or its plugin is installed here (exit 1).
        click.ClickException: no --topic, and ``service_id`` is neither announced nor installed (exit 1).
    """
    if topic:
        return ToolServiceDescriptor.model_validate(
            {"id": service_id, "request-queue": request_queue(topic), "response-queue": response_queue(topic)})
    raise directory.calls.unserved("tool-service", service_id) or click.ClickException(
        f"tool service {service_id!r} is neither announced nor installed here: check the id ('tghost tools' lists "
        f"the live services), or give --topic T to call it on {request_queue('T')} anyway")


def _installed() -> Collection[tuple[str, str]]:
    """(kind, name) of every tool and tool service of the plugins installed here (they are loaded
    to tell, once: only when a call names something that is not live)."""
    return _discovered().served


class Discovered(NamedTuple):
    """What the plugins installed here serve, as :func:`_discovered` loaded them."""

    served: frozenset[tuple[str, str]]
    """(kind, name) of every tool and tool service: :func:`_installed`."""
    broken: tuple[PluginReport, ...]
    """The report of each plugin that failed to load."""
    origins: dict[tuple[str, str], dict[str, Any]]
    """(kind, name) -> the plugin it comes from, as a host serving it announces it (docs/protocol.md
    §4.3 ``plugin``)."""


@functools.cache
def _discovered() -> Discovered:
    """The plugins installed here (:class:`Discovered`). Loaded quietly: a plugin's failure is told
    where a call names what it may serve (:func:`_with_broken_plugins`), never as a traceback in the log."""
    from tghost.discovery.discover import discover

    quiet = logging.getLogger("tghost.discovery")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL + 1)
    try:
        catalog = discover(strict=False)
    finally:
        quiet.setLevel(level)
    catalog.shutdown()  # only its descriptors are needed
    origins = {**{("tool", name): report.origin_json() for name, report in catalog.tool_origin.items()},
               **{("tool-service", sid): report.origin_json() for sid, report in catalog.service_origin.items()}}
    served = {("tool", name) for name in catalog.tools} | {("tool-service", sid) for sid in catalog.descriptors}
    return Discovered(frozenset(served), tuple(report for report in catalog.plugins if report.status == "failed"),
                      origins)


def _with_broken_plugins(exc: ToolCallError, name: str) -> str:
    """``exc`` in words, saying in one line which installed plugin that failed to load may serve
    ``name`` and why it failed (with -v, its traceback first, on stderr), or, for an unknown tool,
    which plugins failed to load; ``exc`` alone when none did."""
    if not isinstance(exc, UnknownTool | NoProvider) or not (broken := _discovered().broken):
        return str(exc)
    suspects = [report for report in broken if _may_serve(report, name)]
    for report in suspects if verbosity() else ():
        click.echo("".join(report.tracebacks), err=True, nl=False)
    failed = "; ".join(f"plugin {report.name!r} failed to load ({_why(report)})" for report in suspects)
    if suspects and isinstance(exc, NoProvider):  # what the directory knows of its hosts stays the news
        return f"{exc}. Here, {failed}"
    if suspects:
        more = "" if verbosity() else " (-v: the traceback)"
        return (f"{exc.error_type}: no live tool named {name!r}: {failed}, and it may serve it. Fix the plugin; "
                f"'tghost plugins' says what loaded{more}")
    if isinstance(exc, UnknownTool):
        names = ", ".join(repr(report.name) for report in broken)
        return f"{exc} ({len(broken)} installed plugin(s) failed to load: {names}; 'tghost plugins' says why)"
    return str(exc)


def _may_serve(report: PluginReport, name: str) -> bool:
    """Whether the plugin of ``report`` (which failed to load, so its tools are unknown) may serve
    the tool or tool service ``name``: ``name`` is, or begins with, its entry point's name, its
    distribution's or its module's, each without a ``tghost`` prefix, ``_`` read as ``-``
    (the entry point ``broken`` and ``broken-word-count``)."""
    stems = {_stem(report.name), _stem(report.distribution or ""), _stem(report.value.split(":")[0].split(".")[0])}
    called = name.lower().replace("_", "-")
    return any(stem and (called == stem or called.startswith(f"{stem}-")) for stem in stems)


def _stem(text: str) -> str:
    """``tghost_test_broken`` -> ``test-broken``: lower case, ``-`` for ``_``, no ``tghost-`` prefix."""
    return text.lower().replace("_", "-").removeprefix("tghost-")


def _why(report: PluginReport) -> str:
    """A failed plugin's first error in short: the exception and where the plugin's code raised it
    (``SyntaxError: invalid syntax at /src/x.py:3``), from its traceback; else its first error line."""
    if not report.tracebacks:
        return report.errors[0] if report.errors else "no reason given"
    text = report.tracebacks[0].rstrip().splitlines()
    frames = [f"{path}:{line}" for path, line in re.findall(r'File "([^"]+)", line (\d+)', report.tracebacks[0])
              if not path.startswith("<")]
    return text[-1] + (f" at {frames[-1]}" if frames else "")


def _old_code(directory: ToolDirectory, error: ToolCallError, kind: str, name: str) -> str:
    """``. Host H serves plugin 'p' at its old code (before your edit): restart it or run it with
    --reload`` after a ``no-provider`` or ``invalid-arguments`` error (an edit may have added the
    tool or argument) when the ``tool`` or ``tool-service`` ``name`` comes from a plugin installed
    here that a live host on this machine serves at other code (:func:`tghost.agent.entries.old_code`);
    else ``""``. Fingerprints that plugin alone, once."""
    if error.error_type not in (NO_PROVIDER, INVALID_ARGUMENTS):
        return ""
    plugin = _plugin_of(directory, kind, name)
    versions = old_code(directory.services.values(), plugin) if plugin is not None else ()
    said = describe_old_code(f"plugin {plugin['entry_point']!r}", plugin["version"], versions) if plugin else ""
    return f". {said[:1].upper()}{said[1:]}" if said else ""


def _plugin_of(directory: ToolDirectory, kind: str, name: str) -> dict[str, Any] | None:
    """The installed plugin the ``tool`` or ``tool-service`` ``name`` comes from, as a host starting
    here would announce it (docs/protocol.md §4.3 ``plugin``), or ``None``: when it is live, the
    entry point its providers name, looked up here without importing it; else as the installed
    plugins say (:func:`_discovered`, loaded already to tell the name was not live)."""
    live = directory.tools[name].service if kind == "tool" and name in directory.tools else (
        directory.services.get(name) if kind == "tool-service" else None)
    if live is None:
        return _discovered().origins.get((kind, name))
    named = dict.fromkeys(((p.plugin or {}).get("entry_point"), (p.plugin or {}).get("distribution"))
                          for p in live.providers)
    return next((found for entry_point, distribution in named
                 if (found := _installed_plugin(entry_point, distribution)) is not None), None)


def _installed_plugin(entry_point: Any, distribution: Any) -> dict[str, Any] | None:
    """The entry point ``entry_point`` of ``distribution``, installed here, as a host starting here
    would announce it (:func:`tghost.discovery.discover.report_of`); ``None`` when not installed."""
    from tghost.discovery.discover import ENTRY_POINT_GROUP, report_of

    if not isinstance(entry_point, str) or not isinstance(distribution, str):
        return None
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP, name=entry_point)
             if ep.dist is not None and ep.dist.name == distribution]
    return report_of(found[0]).origin_json() if found else None
