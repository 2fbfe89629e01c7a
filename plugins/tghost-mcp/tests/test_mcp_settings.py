"""settings: a [mcp-servers.<name>] table is a stdio server or a streamable-HTTP one, with its
defaults; a bad table is refused in one line naming the table and each key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tghost_mcp.settings import ServerSettings, server_tables


def test_a_stdio_table_with_its_defaults() -> None:
    settings = ServerSettings.of("memory", {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"],
                                            "env": {"MEMORY_FILE_PATH": "/tmp/m.jsonl"}})
    assert settings.stdio and settings.origin == "npx -y @modelcontextprotocol/server-memory"
    assert (settings.cwd, settings.prefix, settings.group, settings.timeout, settings.max_concurrency,
            settings.start_timeout) == (None, "", None, None, None, 30.0)


def test_an_http_table_with_every_setting_spelled_with_dashes() -> None:
    settings = ServerSettings.of("tickets", {
        "url": "https://tickets.example.com/mcp", "token-file": "/run/secrets/tickets-token", "prefix": "tickets-",
        "group": "support", "timeout": 5, "max-concurrency": 4, "start-timeout": 60})
    assert not settings.stdio and settings.origin == "https://tickets.example.com/mcp"
    assert (settings.token_file, settings.prefix, settings.group, settings.timeout, settings.max_concurrency,
            settings.start_timeout) == (Path("/run/secrets/tickets-token"), "tickets-", ["support"], 5, 4, 60)


@pytest.mark.parametrize(("table", "problem"), [
    ({}, "give either 'command' (a stdio server) or 'url' (a streamable-HTTP server)"),
    ({"command": "x", "url": "http://h/mcp"}, "give either 'command' (a stdio server) or 'url' (a streamable-HTTP "
                                                "server), not both"),
    ({"comand": "npx"}, "key 'comand' is not a setting of an MCP server (they are: command, args, env, cwd, url, "
                        "token-file, prefix, group, timeout, max-concurrency, start-timeout)"),
    ({"command": "x", "args": "-y"}, "key 'args': Input should be a valid list"),
    ({"command": "x", "token-file": "/t"}, "'token-file' belongs to a streamable-HTTP server ('url')"),
    ({"url": "http://h/mcp", "env": {"A": "b"}, "cwd": "/"}, "'env', 'cwd' belong to a stdio server ('command')"),
    ({"url": "ftp://h/mcp"}, "key 'url': String should match pattern"),
    ({"command": "x", "prefix": "-x"}, "key 'prefix': String should match pattern"),
    ({"command": "x", "timeout": 0}, "key 'timeout': Input should be greater than 0"),
    ({"command": "x", "max-concurrency": 0}, "key 'max-concurrency': Input should be greater than or equal to 1"),
    ("npx", "Input should be a valid dictionary"),
])
def test_a_bad_table_is_refused_in_one_line_naming_the_table_and_the_key(table: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=r"^\[mcp-servers\.memory\] in the config file: ") as refused:
        ServerSettings.of("memory", table)
    assert problem in str(refused.value) and "\n" not in str(refused.value)


def test_the_tables_are_read_from_the_config_file_in_order() -> None:
    config = {"tools": {}, "mcp-servers": {"b": {"command": "x"}, "a": {"url": "http://h/mcp"}}}
    assert list(server_tables(config)) == ["b", "a"]
    assert server_tables({}) == {}
    with pytest.raises(ValueError, match=r"'mcp-servers' in the config file is not a table: write \[mcp-servers"):
        server_tables({"mcp-servers": ["npx"]})
