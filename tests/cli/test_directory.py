"""cli.directory: ``tghost tools``, ``watch``, ``export``, ``mcp`` and ``inspect`` before they
reach a broker: their usage errors (exit 2), the message when no broker answers (exit 1), the
web commands' token rule and Host names, ``tghost mcp`` without the MCP SDK, and ``watch``'s
columns. In process, with no broker (and in a fresh interpreter without the SDK)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Literal

import click
import pytest
from click.testing import CliRunner, Result

from tghost.agent.entries import Change, DirectoryTool, ServiceEntry
from tghost.cli.app import cli
from tghost.cli.directory import MCP_SDK, WATCH_WIDTHS, _print_change, described
from tghost.protocol.descriptors import ToolDescriptor, ToolServiceDescriptor
from tghost.system.net import free_port


def _tghost(*args: str, env: dict[str, str | None] | None = None) -> Result:
    """``tghost ARGS`` in process, on a port where no broker runs."""
    return CliRunner().invoke(cli, [*args, "--pulsar-url", f"pulsar://127.0.0.1:{free_port()}"], env=env)


def test_a_wide_terminal_gets_each_description_cut_to_fit_and_a_narrow_one_none() -> None:
    table = [("TOOL", "SERVICE"), ("tell-joke", "joke-service")]
    joke = "Tell a joke on a given topic, as a pun, a one-liner or a knock-knock joke.\nMore lines."
    assert described(table, [joke], 200) == [("TOOL", "SERVICE", "DESCRIPTION"), ("tell-joke", "joke-service",
                                                                                   joke.splitlines()[0])]
    assert described(table, [joke], 50) == [("TOOL", "SERVICE", "DESCRIPTION"),
                                            ("tell-joke", "joke-service", "Tell a joke on a given…")]
    assert described(table, [joke], 40) == table  # under 20 characters left: no column
    assert described(table, [""], 200)[1][2] == ""


@pytest.mark.parametrize(("args", "error"), [
    (("--limit", "3"), "--limit goes with --search, e.g. --search 'weather forecast' --limit 3"),
    (("--search", "  "), "Invalid value for --search: the query has no words to search for"),
    (("--search", "?!"), "Invalid value for --search: the query has no words to search for"),
    (("--search", "weather", "--limit", "0"), "Invalid value for --limit: limit must be a whole number from 1 to"),
    (("--search", "weather", "--limit", "1001"), "Invalid value for --limit: limit must be a whole number from 1"),
], ids=["limit-alone", "blank-query", "no-words", "limit-0", "limit-1001"])
def test_tools_search_and_limit_usage_errors_come_before_the_broker(args: tuple[str, ...], error: str) -> None:
    result = _tghost("tools", *args)
    assert result.exit_code == 2 and error in result.stderr, result.stderr


@pytest.mark.parametrize("command", [("tools",), ("tools", "--search", "weather", "--limit", "3"),
                                     ("export", "--format", "openai")], ids=["tools", "tools-search", "export"])
def test_one_shot_commands_without_a_broker_exit_1_saying_how_to_start_one(command: tuple[str, ...]) -> None:
    result = _tghost(*command)
    assert result.exit_code == 1 and result.stdout == ""
    assert "Error: no Pulsar broker answers at pulsar://127.0.0.1:" in result.stderr
    assert "start one ('tghost run' or 'tghost broker start'" in result.stderr


def test_export_needs_a_format() -> None:
    result = _tghost("export")
    assert result.exit_code == 2 and "Missing option '--format'" in result.stderr


@pytest.mark.parametrize(("command", "env"), [("mcp", "TGHOST_MCP_TOKEN_FILE"),
                                              ("inspect", "TGHOST_INSPECT_TOKEN_FILE")])
def test_web_commands_off_loopback_need_a_token_file(command: str, env: str) -> None:
    args = ("--transport", "http") if command == "mcp" else ()
    result = _tghost(command, *args, "--host", "0.0.0.0", env={env: None})
    assert result.exit_code == 2
    assert f"--host 0.0.0.0 makes the {'MCP bridge' if command == 'mcp' else 'inspector'} reachable" in result.stderr
    assert f"give --token-file FILE (env {env})" in result.stderr


@pytest.mark.parametrize("command", ["mcp", "inspect"])
def test_an_empty_token_file_is_a_usage_error_naming_the_option(command: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(" \n")
    args = ("--transport", "http") if command == "mcp" else ()
    result = _tghost(command, *args, "--host", "0.0.0.0", "--token-file", str(token))
    assert result.exit_code == 2 and "Invalid value for --token-file /" in result.stderr
    assert f"the token file {str(token)!r} is empty (or only whitespace)" in result.stderr


@pytest.mark.parametrize(("command", "env"), [("mcp", "TGHOST_MCP_ALLOWED_HOSTS"),
                                              ("inspect", "TGHOST_INSPECT_ALLOWED_HOSTS")])
def test_an_allowed_host_that_is_a_url_is_a_usage_error_naming_the_option(command: str, env: str) -> None:
    result = _tghost(command, "--allowed-host", "tools.example.com", "--allowed-host", "https://tools.example.com")
    assert result.exit_code == 2
    assert f"Invalid value for --allowed-host / {env}: 'https://tools.example.com' is not a Host header value" \
        in result.stderr


def test_the_inspector_and_the_mcp_bridge_default_to_different_ports() -> None:
    """Both run on one machine with no flags."""
    ctx = click.Context(cli)
    ports = {name: next(p.default for p in cli.get_command(ctx, name).params if p.name == "http_port")  # type: ignore[union-attr]
             for name in ("inspect", "mcp")}
    assert ports == {"inspect": 8766, "mcp": 8765}


def test_watch_lines_keep_their_columns_whatever_the_names(capsys: pytest.CaptureFixture[str]) -> None:
    def change(kind: Literal["added", "expired"], name: str, service: str) -> Change:
        descriptor = ToolDescriptor.model_validate({"name": name, "description": "d", "service": service})
        entry = ServiceEntry(ToolServiceDescriptor.model_validate(
            {"id": service, "request-queue": f"non-persistent://tg/request/{service}",
             "response-queue": f"non-persistent://tg/response/{service}"}), ())
        return Change(kind, name, DirectoryTool(descriptor, entry, ()))

    changes: list[tuple[Literal["added", "expired"], str, str]] = [
        ("added", "x", "s"), ("expired", "tell-joke", "joke-service"),
        ("added", "summarise-a-long-document", "summaries")]
    for kind, name, service in changes:
        _print_change(change(kind, name, service), as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert {line.index(service) for line, service in zip(lines, ("s", "joke-service", "summaries"), strict=True)} \
        == {sum(WATCH_WIDTHS[:3]) + 6}  # after the time, the change and the tool, two spaces apart


#: ``tghost ARGV`` (``sys.argv[2]``, JSON) in a fresh interpreter where ``import mcp`` fails, as
#: where the SDK is not installed, and whose installed mcp is ``sys.argv[1]`` (JSON: a version,
#: or null for none).
WITHOUT_SDK = textwrap.dedent("""
    import importlib.metadata, json, sys
    sys.modules["mcp"] = None
    installed, argv = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    found = importlib.metadata.version

    def version(name):
        if name != "mcp":
            return found(name)
        if installed is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed

    importlib.metadata.version = version
    from tghost.cli import main
    sys.argv = ["tghost", *argv]
    main()
""")


def _without_sdk(installed: str | None, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_SDK, json.dumps(installed), json.dumps(argv)],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("installed", "found"), [(None, "which is not installed"),
                                                  ("1.26.0", "and this environment has mcp 1.26.0")])
def test_mcp_without_the_sdk_is_one_line_exit_2_naming_the_extra(installed: str | None, found: str) -> None:
    bridge = _without_sdk(installed, "mcp", "--transport", "http", "--host", "0.0.0.0")  # before the token rule
    assert (bridge.returncode, bridge.stdout, bridge.stderr.count("\n")) == (2, "", 1), bridge.stderr
    assert bridge.stderr.startswith(f"Error: tghost mcp needs the MCP SDK ({MCP_SDK}), {found}")
    assert 'pip install "tghost[mcp]"' in bridge.stderr


@pytest.mark.parametrize("argv", [("--help",), ("mcp", "--help"), ("inspect", "--help")])
def test_help_works_without_the_sdk(argv: tuple[str, ...]) -> None:
    shown = _without_sdk(None, *argv)
    assert (shown.returncode, shown.stderr) == (0, "") and "Usage: tghost" in shown.stdout


def test_the_mcp_extra_is_the_sdk_tghost_mcp_asks_for() -> None:
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["mcp"] == [MCP_SDK]
    assert not [need for need in project["dependencies"] if need.startswith("mcp")]  # the core install has none
