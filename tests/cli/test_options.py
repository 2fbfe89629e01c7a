"""cli.options: the options every command shares, from flags and the environment (the Pulsar
connection and its token, log levels, KEY=VALUE pairs, trusted keys), and the usage errors
(exit 2) they give. In process, with no broker."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from tghost.cli.app import cli
from tghost.cli.options import LogLevel, parse_pairs, pulsar_options
from tghost.pulsar.clients import PulsarSettings
from tghost.system.net import free_port


def _settings_seen(args: list[str], env: dict[str, str]) -> PulsarSettings:
    """Run a command decorated with ``pulsar_options`` and return the PulsarSettings it was handed."""
    seen: list[PulsarSettings] = []

    @click.command()
    @pulsar_options
    def probe(pulsar: PulsarSettings, descriptors_topic: str) -> None:
        seen.append(pulsar)

    result = CliRunner().invoke(probe, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return seen[0]


def _without_tghost_env() -> dict[str, str | None]:
    """CliRunner's ``env`` that unsets every TGHOST_* variable of this process."""
    return {k: None for k in os.environ if k.startswith("TGHOST_")}


def _call(*args: str, env: Mapping[str, str | None] | None = None) -> Result:
    """``tghost call ARGS`` in process, with none of this process's TGHOST_* variables."""
    return CliRunner().invoke(cli, ["call", *args], env={**_without_tghost_env(), **(env or {})})


def _help(*command: str) -> str:
    result = CliRunner().invoke(cli, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def test_pulsar_options_come_from_the_environment(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked here")
    settings = _settings_seen([], {"TGHOST_PULSAR_URL": "pulsar+ssl://broker:6651", "TGHOST_PULSAR_TOKEN": "env-jwt",
                                   "TGHOST_TLS_TRUST_CERTS": str(ca), "TGHOST_TLS_ALLOW_INSECURE": "1",
                                   "TGHOST_TLS_VALIDATE_HOSTNAME": "true"})
    assert settings == PulsarSettings("pulsar+ssl://broker:6651", token="env-jwt", tls_trust_certs=str(ca),
                                      tls_allow_insecure=True, tls_validate_hostname=True)


def test_pulsar_option_flags_override_the_environment() -> None:
    settings = _settings_seen(["--pulsar-url", "pulsar://other:6650", "--pulsar-token", "flag-jwt"],
                              {"TGHOST_PULSAR_URL": "pulsar://env:6650", "TGHOST_PULSAR_TOKEN": "env-jwt"})
    assert (settings.url, settings.token, settings.tls_trust_certs) == ("pulsar://other:6650", "flag-jwt", None)
    assert not settings.tls_allow_insecure


def test_connect_timeout_comes_from_the_flag_or_the_environment() -> None:
    assert _settings_seen([], {}).connect_timeout == PulsarSettings.connect_timeout
    assert _settings_seen([], {"TGHOST_CONNECT_TIMEOUT": "120"}).connect_timeout == 120
    assert _settings_seen(["--connect-timeout", "0"], {"TGHOST_CONNECT_TIMEOUT": "120"}).connect_timeout == 0


def test_a_missing_trust_certs_file_is_a_usage_error() -> None:
    result = _call("--service", "echo", "--tls-trust-certs", "/nonexistent/ca.pem")
    assert result.exit_code == 2 and "/nonexistent/ca.pem" in result.stderr


def test_a_pulsar_token_file_gives_its_contents_without_surrounding_whitespace(tmp_path: Path) -> None:
    token = tmp_path / "pulsar-token"
    token.write_text("  eyJ.jwt.sig \n\n")
    assert _settings_seen(["--pulsar-token-file", str(token)], {}).token == "eyJ.jwt.sig"
    assert _settings_seen([], {"TGHOST_PULSAR_TOKEN_FILE": str(token)}).token == "eyJ.jwt.sig"


@pytest.mark.parametrize("contents", [None, "", " \n\t\n"], ids=["missing", "empty", "whitespace"])
def test_a_missing_or_empty_pulsar_token_file_is_a_usage_error_naming_the_option(
        tmp_path: Path, contents: str | None) -> None:
    token = tmp_path / "pulsar-token"
    if contents is not None:
        token.write_text(contents)
    result = _call("--pulsar-token-file", str(token), "--service", "echo")
    assert result.exit_code == 2, result.stderr
    assert "--pulsar-token-file / TGHOST_PULSAR_TOKEN_FILE" in result.stderr and str(token) in result.stderr


def test_a_pulsar_token_and_a_pulsar_token_file_together_are_a_usage_error(tmp_path: Path) -> None:
    token = tmp_path / "pulsar-token"
    token.write_text("x")
    by_flags = _call("--pulsar-token", "x", "--pulsar-token-file", str(token), "--service", "echo")
    by_env = _call("--pulsar-token-file", str(token), "--service", "echo", env={"TGHOST_PULSAR_TOKEN": "x"})
    for result in (by_flags, by_env):
        assert result.exit_code == 2, result.stderr
        assert "--pulsar-token (env TGHOST_PULSAR_TOKEN) or --pulsar-token-file" in result.stderr


def test_connect_timeout_is_in_the_help_of_the_commands_that_wait_only() -> None:
    for command in ("tools", "call", "export"):
        assert "--connect-timeout" not in _help(command), command
    for command in ("run", "watch", "mcp"):
        assert "--connect-timeout" in _help(command), command


def test_log_levels_are_spelt_warning_everywhere_and_described() -> None:
    assert re.search(r"--log-level \[debug\|info\|warning\|error\]\s+Least severe log line", _help("run"))
    assert "--log-level [debug|info|warning|error]" in _help("mcp")
    assert "--log-level [error|warning|info|debug|trace]" in _help("broker")
    assert LogLevel().convert("warn", None, None) == "warning"
    port = str(free_port())
    result = CliRunner().invoke(cli, ["broker", "--log-level", "warn", "status", "--port", port])
    assert result.exit_code == 3, result.output  # accepted: not running there


@pytest.mark.parametrize(("pairs", "values"), [
    ((), {}),
    (("text=hello there", "empty="), {"text": "hello there", "empty": ""}),
    (("n:=3", "ok:=true", "tags:=[\"a\"]", "quoted:=\"3\""), {"n": 3, "ok": True, "tags": ["a"], "quoted": "3"}),
    (("expr=a=b",), {"expr": "a=b"}),  # the first '=' splits
], ids=["none", "strings", "json", "equals-in-value"])
def test_pairs_are_strings_or_after_colon_equals_json(pairs: tuple[str, ...], values: dict[str, Any]) -> None:
    assert parse_pairs(pairs, "ARGUMENTS") == values


@pytest.mark.parametrize(("pair", "error"), [
    ("novalue", "'novalue' is not KEY=VALUE (or KEY:=JSON)"),
    ("=value", "'=value' is not KEY=VALUE"),
    (":=3", "':=3' is not KEY=VALUE"),
    ("n:=three", "'n:=three': the value after ':=' is not JSON"),
])
def test_a_malformed_pair_is_a_bad_parameter_naming_it(pair: str, error: str) -> None:
    with pytest.raises(click.BadParameter, match=re.escape(error)) as raised:
        parse_pairs((pair,), "--config")
    assert raised.value.param_hint == "--config"


def test_a_key_given_twice_is_refused_whatever_its_form() -> None:
    with pytest.raises(click.BadParameter, match="'topic' is given twice; give each key once"):
        parse_pairs(("topic=cats", 'topic:="dogs"'), "ARGUMENTS")


def test_an_unreadable_trusted_key_is_a_usage_error_naming_the_option_and_its_variable(tmp_path: Path) -> None:
    bad = tmp_path / "host.pub"
    bad.write_text("not a key\n")
    for args, env in ((["--trusted-key", str(bad)], {}), ([], {"TGHOST_TRUSTED_KEYS": str(bad)})):
        result = _call("--service", "echo", *args, env=env)
        assert result.exit_code == 2, result.output
        assert "--trusted-key / TGHOST_TRUSTED_KEYS" in result.stderr and str(bad) in result.stderr
