"""cli.options: the options and parsing every command shares (Pulsar connection, plugin
selection, trust, operations, seed 001 filters, KEY=VALUE pairs). Never defines a command.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, cast, overload

import click

from tghost.protocol.epochs import DEFAULT_TOPIC, MAX_HOSTS, MAX_INSTANCES, MAX_TOTAL_ENTRIES
from tghost.pulsar.clients import DEFAULT_URL, START_A_BROKER, PulsarSettings, is_reachable
from tghost.system.paths import config_path, default_config_path

if TYPE_CHECKING:  # imported when used, by the commands that use them (start-up: docs/internals/performance.md §14)
    from tghost.agent.calls import Installed
    from tghost.agent.directory import ToolDirectory
    from tghost.protocol.trust import Signer, TrustedKeys

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("tghost")


class LogLevel(click.Choice[str]):
    """A log level, spelt as Python's logging spells it; ``warn`` is accepted for ``warning``."""

    def __init__(self, levels: tuple[str, ...] = ("debug", "info", "warning", "error")) -> None:
        super().__init__(levels, case_sensitive=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return super().convert("warning" if str(value).lower() == "warn" else value, param, ctx)


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")


def pulsar_token(token: str | None, token_file: Path | None) -> str | None:
    """The Pulsar token: --pulsar-token's, else the contents of --pulsar-token-file without
    surrounding whitespace, else ``None`` (an empty --pulsar-token counts as not given).

    Raises:
        click.UsageError: both are given (on the command line or in the environment).
        click.BadParameter: the file cannot be read, or holds nothing but whitespace.
    """
    if token_file is None:
        return token or None
    if token:
        raise click.UsageError("give the token once: --pulsar-token (env TGHOST_PULSAR_TOKEN) or "
                               "--pulsar-token-file (env TGHOST_PULSAR_TOKEN_FILE), not both")
    return read_token_file(token_file, "--pulsar-token-file / TGHOST_PULSAR_TOKEN_FILE")


def read_token_file(path: Path, hint: str) -> str:
    """The secret in the token file ``path``, without surrounding whitespace; ``hint`` names the
    option that gave it, in errors.

    Raises:
        click.BadParameter: the file cannot be read, or holds nothing but whitespace.
    """
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise click.BadParameter(f"cannot read the token file {str(path)!r}: {reason}", param_hint=hint) from None
    if not text:
        raise click.BadParameter(f"the token file {str(path)!r} is empty (or only whitespace)", param_hint=hint)
    return text


@overload
def pulsar_options(fn: F) -> F: ...


@overload
def pulsar_options(*, waits: bool) -> Callable[[F], F]: ...


def pulsar_options(fn: F | None = None, *, waits: bool = True) -> Any:
    """The connection options every command that talks to Pulsar takes. The command gets one
    ``pulsar: PulsarSettings`` built from --pulsar-url, --pulsar-token or --pulsar-token-file
    (:func:`pulsar_token`) and the TLS options, and ``descriptors_topic``. A one-shot command,
    which fails at once when no broker answers, uses ``@pulsar_options(waits=False)``: its help
    does not show --connect-timeout (which it still accepts).
    """
    if fn is None:
        return functools.partial(pulsar_options, waits=waits)

    @functools.wraps(fn)
    def with_settings(*args: Any, pulsar_url: str, pulsar_token_given: str | None, pulsar_token_file: Path | None,
                      tls_trust_certs: Path | None, tls_allow_insecure: bool, tls_validate_hostname: bool,
                      connect_timeout: float, **kwargs: Any) -> Any:
        token = pulsar_token(pulsar_token_given, pulsar_token_file)
        settings = PulsarSettings(pulsar_url, connect_timeout=connect_timeout, token=token,
                                  tls_trust_certs=str(tls_trust_certs) if tls_trust_certs else None,
                                  tls_allow_insecure=tls_allow_insecure, tls_validate_hostname=tls_validate_hostname)
        return fn(*args, pulsar=settings, **kwargs)

    options = [
        click.option("--pulsar-url", envvar="TGHOST_PULSAR_URL", default=DEFAULT_URL, show_default=True,
                     help="Pulsar service URL, pulsar:// or pulsar+ssl:// (env TGHOST_PULSAR_URL)."),
        click.option("--pulsar-token", "pulsar_token_given", envvar="TGHOST_PULSAR_TOKEN", default=None,
                     show_envvar=False,
                     help="Pulsar auth token (JWT) (env TGHOST_PULSAR_TOKEN). Prefer --pulsar-token-file or the env "
                          "var: a token on the command line is visible to other users in 'ps'. The embedded broker "
                          "(pulsar-lite) accepts any token and does not enforce auth."),
        click.option("--pulsar-token-file", envvar="TGHOST_PULSAR_TOKEN_FILE", default=None, metavar="PATH",
                     type=click.Path(path_type=Path, dir_okay=False),
                     help="File holding the Pulsar auth token, surrounding whitespace stripped (env "
                          "TGHOST_PULSAR_TOKEN_FILE); not with --pulsar-token. Prefer it (or TGHOST_PULSAR_TOKEN) "
                          "to --pulsar-token, whose value other users see in 'ps'."),
        click.option("--tls-trust-certs", envvar="TGHOST_TLS_TRUST_CERTS", default=None,
                     type=click.Path(path_type=Path, dir_okay=False, exists=True),
                     help="PEM file of CA certificates to trust for pulsar+ssl:// (env TGHOST_TLS_TRUST_CERTS)."),
        click.option("--tls-allow-insecure", envvar="TGHOST_TLS_ALLOW_INSECURE", is_flag=True,
                     help="Accept any broker TLS certificate; for testing only (env TGHOST_TLS_ALLOW_INSECURE)."),
        click.option("--tls-validate-hostname", envvar="TGHOST_TLS_VALIDATE_HOSTNAME", is_flag=True,
                     help="Check the broker certificate names the URL's host (env TGHOST_TLS_VALIDATE_HOSTNAME)."),
        click.option("--connect-timeout", envvar="TGHOST_CONNECT_TIMEOUT", type=click.FloatRange(min=0),
                     default=PulsarSettings.connect_timeout, show_default=True, hidden=not waits,
                     help="Seconds 'run', 'watch' and 'mcp' wait for a broker that is not up yet, with a log line "
                          "every 2 s (env TGHOST_CONNECT_TIMEOUT); 'tools', 'call' and 'export' fail at once."),
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
        from tghost.discovery.discover import PluginSelection

        return fn(*args, selection=PluginSelection.from_settings(load_plugins, disable_plugins), **kwargs)

    wrapped: Any = click.option(
        "--load-plugins", default=None, metavar="NAMES",
        help="Comma list of the only entry points to load; '' loads none (overrides env TGHOST_LOAD_PLUGINS) "
             "[default: all].")(with_selection)
    wrapped = click.option(
        "--disable-plugins", default=None, metavar="NAMES",
        help="Comma list of entry points never to import (overrides env TGHOST_DISABLE_PLUGINS).")(wrapped)
    return cast(F, wrapped)


def config_option(fn: F) -> F:
    """--config (env TGHOST_CONFIG); the command gets ``config_path``: the file given, else the
    default one if it exists, else ``None``."""
    @functools.wraps(fn)
    def with_config(*args: Any, config_path_given: Path | None, **kwargs: Any) -> Any:
        return fn(*args, config_path=config_path(config_path_given), **kwargs)

    return cast(F, click.option(
        "--config", "config_path_given", type=click.Path(path_type=Path, dir_okay=False), envvar="TGHOST_CONFIG",
        default=None, help="TOML file of extra tools, external tool services and plugin settings "
                           f"(env TGHOST_CONFIG) [default: {default_config_path()}, if it exists].")(with_config))


def trust_options(fn: F) -> F:
    """--trusted-key (repeatable; env TGHOST_TRUSTED_KEYS, os.pathsep-separated); the command
    gets one ``trusted: TrustedKeys | None`` (``None``: open mode, every host is believed).
    Every command that reads the directory takes them, and the directory's caps with them
    (:func:`bounds_options`), and -v (:func:`verbose_option`)."""
    fn = verbose_option(bounds_options(fn))

    @functools.wraps(fn)
    def with_trust(*args: Any, trusted_keys: tuple[Path, ...], **kwargs: Any) -> Any:
        from tghost.protocol.trust import KeyFileError, TrustedKeys

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


#: Where :func:`bounds_options` keeps the caps for :func:`open_directory`: the click context's ``meta``.
BOUNDS = "tghost.directory_bounds"
#: Where :func:`verbose_option` keeps how many times -v was given: the click context's ``meta``.
VERBOSITY = "tghost.verbosity"


def verbose_option(fn: F) -> F:
    """-v/--verbose, repeatable, kept in the click context for :func:`verbosity`; the command's
    arguments are unchanged."""
    @functools.wraps(fn)
    def with_verbosity(*args: Any, verbose: int, **kwargs: Any) -> Any:
        click.get_current_context().meta[VERBOSITY] = verbose
        return fn(*args, **kwargs)

    return cast(F, click.option(
        "-v", "--verbose", count=True,
        help="Say more on stderr: each reason announcements were ignored for (--trusted-key), with an example, "
             "instead of one line, and a failed plugin's traceback; -vv logs each one.")(with_verbosity))


def verbosity() -> int:
    """How many times the command running now was given -v (0 outside such a command)."""
    context = click.get_current_context(silent=True)
    return int(context.meta.get(VERBOSITY, 0)) if context is not None else 0


class TrustNote(logging.Filter):
    """The directory's summaries of announcements its trusted keys ignored (unsigned, signed by
    another key, a bad signature), said in one line for the whole command, the first time any
    is, from the counts in ``rejections`` (the directory's); without trusted keys nothing is
    ignored for these reasons. Other log lines pass unchanged."""

    def __init__(self, rejections: Mapping[str, int]) -> None:
        super().__init__()
        self.rejections = rejections
        self.said = False

    def filter(self, record: logging.LogRecord) -> bool:
        from tghost.protocol.trust import BAD_SIGNATURE, UNKNOWN_KEY, UNSIGNED

        reasons = (UNSIGNED, UNKNOWN_KEY, BAD_SIGNATURE)
        summary = record.args if isinstance(record.args, Mapping) else {}
        if summary.get("reason") not in reasons:
            return True
        if self.said:
            return False
        self.said = True
        counts = {reason: self.rejections.get(reason, 0) for reason in reasons if self.rejections.get(reason)}
        record.msg = ("--trusted-key ignored %d announcement(s) of hosts no trusted key signed (%s); "
                      "-v says more")
        record.args = (sum(counts.values()), ", ".join(f"{count} {reason}" for reason, count in counts.items()))
        return True


class DirectoryBounds(TypedDict, total=False):
    """The caps of :func:`bounds_options`, as ``ToolDirectory`` keyword arguments."""

    max_hosts: int
    max_instances: int
    max_total_entries: int


def bounds_options(fn: F) -> F:
    """--max-hosts, --max-instances and --max-total-entries (env TGHOST_MAX_HOSTS, ...): the caps
    on what the command's directory holds (docs/protocol.md §4.7), kept in the click context for
    :func:`open_directory` (:func:`directory_bounds`). The command's arguments are unchanged."""
    @functools.wraps(fn)
    def with_bounds(*args: Any, max_hosts: int, max_instances: int, max_total_entries: int, **kwargs: Any) -> Any:
        click.get_current_context().meta[BOUNDS] = DirectoryBounds(
            max_hosts=max_hosts, max_instances=max_instances, max_total_entries=max_total_entries)
        return fn(*args, **kwargs)

    caps = [("--max-hosts", MAX_HOSTS, "TGHOST_MAX_HOSTS", "Host ids the directory holds at once; announcements of "
             "further ones are dropped"),
            ("--max-instances", MAX_INSTANCES, "TGHOST_MAX_INSTANCES", "Instances (process starts) of one host id "
             "the directory holds at once; announcements of further ones are dropped"),
            ("--max-total-entries", MAX_TOTAL_ENTRIES, "TGHOST_MAX_TOTAL_ENTRIES", "Tools and tool services the "
             "directory holds in all; announcements of further ones are dropped")]
    wrapped: Any = with_bounds
    for flag, default, env, what in reversed(caps):
        wrapped = click.option(flag, type=click.IntRange(min=1), metavar="N", envvar=env, default=default,
                               show_default=True, help=f"{what}, each counted as 'over-limit' and the first one "
                                                       f"logged (env {env}).")(wrapped)
    return cast(F, wrapped)


def directory_bounds() -> DirectoryBounds:
    """The caps :func:`bounds_options` took for the command running now (none outside such a
    command: the directory's defaults)."""
    context = click.get_current_context(silent=True)
    bounds: DirectoryBounds = context.meta.get(BOUNDS, DirectoryBounds()) if context is not None else DirectoryBounds()
    return bounds


def identity_options(fn: F) -> F:
    """--identity (env TGHOST_IDENTITY): the caller key ('tghost keygen') a command signs its
    requests with; the command gets ``identity: Signer | None`` (``None``: anonymous)."""
    @functools.wraps(fn)
    def with_identity(*args: Any, identity_key: Path | None, **kwargs: Any) -> Any:
        from tghost.protocol.trust import KeyFileError, Signer, load_private_key

        try:
            identity = Signer(load_private_key(identity_key, "caller key")) if identity_key is not None else None
        except KeyFileError as exc:
            raise click.BadParameter(str(exc), param_hint="--identity / TGHOST_IDENTITY") from None
        return fn(*args, identity=identity, **kwargs)

    return cast(F, click.option(
        "--identity", "identity_key", type=click.Path(path_type=Path, dir_okay=False), envvar="TGHOST_IDENTITY",
        help="Caller key (.key from 'tghost keygen') to sign requests with (env TGHOST_IDENTITY): hosts with an "
             "[access] policy let it call the tools they grant it, and only those are listed "
             "[default: anonymous].")(with_identity))


def otel_option(fn: F) -> F:
    """--otel (env TGHOST_OTEL=1): trace the command's calls with OpenTelemetry, configured by
    the standard OTEL_* variables (:func:`tghost.system.tracing.setup`); the service name
    defaults to ``tghost-<command>``. The command's arguments are unchanged."""
    @functools.wraps(fn)
    def with_otel(*args: Any, otel: bool, **kwargs: Any) -> Any:
        if otel:
            from tghost.system import tracing

            try:
                tracing.setup(f"tghost-{click.get_current_context().info_name}")
            except tracing.TracingError as exc:
                raise click.UsageError(f"--otel (env TGHOST_OTEL): {exc}") from None
        return fn(*args, **kwargs)

    return cast(F, click.option(
        "--otel", is_flag=True, envvar="TGHOST_OTEL",
        help="Trace calls with OpenTelemetry (env TGHOST_OTEL=1), set up by the OTEL_* variables, e.g. "
             "OTEL_TRACES_EXPORTER=console or otlp with OTEL_EXPORTER_OTLP_ENDPOINT; needs "
             "pip install 'tghost[otel]'.")(with_otel))


def operations_options(fn: F) -> F:
    """--metrics-port/--metrics-host and --audit-log/--audit-arguments, given to the command as
    ``metrics_port``, ``metrics_host``, ``audit_log`` and ``audit_arguments``
    (:class:`tghost.operate.host.HostConfig`'s fields)."""
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
    wrapped: Any = fn
    for option in reversed(options):
        wrapped = option(wrapped)
    return cast(F, wrapped)


def filter_options(fn: F) -> F:
    """Seed 001 request groups and state."""
    fn = click.option("--state", default=None, help="The agent's current state [default: undefined].")(fn)
    return click.option("--group", "groups", multiple=True,
                        help="A group the request may use; repeatable; '*' for all [default: default].")(fn)


def parse_pairs(pairs: tuple[str, ...], what: str) -> dict[str, Any]:
    """``k=v`` gives the string ``v``; ``k:=v`` parses ``v`` as JSON (as httpie does).

    Raises:
        click.BadParameter: a pair is malformed, its JSON does not parse, or a key is given twice.
    """
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or key in ("", ":"):
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE (or KEY:=JSON)", param_hint=what)
        if key.endswith(":"):
            key, raw = key[:-1], json_value(raw, f"{pair!r}: the value after ':='", what)
        if key in values:
            raise click.BadParameter(f"{key!r} is given twice; give each key once", param_hint=what)
        values[key] = raw
    return values


def json_value(text: str, what: str, hint: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"{what} is not JSON ({exc})", param_hint=hint) from None


def require_broker(url: str) -> None:
    if not is_reachable(url):
        raise click.ClickException(f"no Pulsar broker answers at {url}: {START_A_BROKER}")


def open_directory(pulsar: PulsarSettings, topic: str, trusted: TrustedKeys | None,
                   wait: bool = False, identity: Signer | None = None,
                   installed: Installed | None = None) -> ToolDirectory:
    """A directory (not started yet), with the command's caps (:func:`directory_bounds`). A
    one-shot command fails at once when no broker answers; with ``wait`` (a follower: watch,
    mcp) starting it waits up to ``--connect-timeout``. ``installed``:
    :class:`~tghost.agent.directory.ToolDirectory`'s."""
    from tghost.agent.directory import ToolDirectory

    verbose = verbosity()
    logging.basicConfig(level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)],
                        format="%(levelname)s %(name)s: %(message)s")
    if not wait:
        require_broker(pulsar.url)
    directory = ToolDirectory(pulsar, topic, trusted=trusted, identity=identity, installed=installed,
                              **directory_bounds())
    ledger_log = logging.getLogger("tghost.agent.ledger")
    for old in [f for f in ledger_log.filters if isinstance(f, TrustNote)]:
        ledger_log.removeFilter(old)  # an earlier command's, in the same process (tests)
    if trusted is not None and not verbose:
        ledger_log.addFilter(TrustNote(directory.rejections))
    return directory
