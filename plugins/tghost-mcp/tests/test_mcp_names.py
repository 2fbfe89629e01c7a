"""names: an MCP tool's name as a tghost tool name, by the documented rule, and the claims that
keep two servers from serving one name."""

from __future__ import annotations

import re

import pytest
from tghost_mcp.names import Claims, tool_name

#: docs/protocol.md's tool name: what the host accepts.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@pytest.mark.parametrize(("prefix", "name", "mapped"), [
    ("", "read_file", "read_file"),
    ("", "get.weather-now", "get.weather-now"),
    ("tickets-", "create", "tickets-create"),
    ("", "get weather", "get-weather"),
    ("", "café/menu?", "caf--menu"),
    ("", "_private", "private"),
    ("", "--x--", "x"),
    ("fs.", "read file", "fs.read-file"),
    ("", "x" * 200, "x" * 128),
    ("", "日本", None),
    ("", "", None),
])
def test_an_mcp_name_maps_to_a_tghost_name_or_to_none(prefix: str, name: str, mapped: str | None) -> None:
    assert tool_name(prefix, name) == mapped
    assert mapped is None or NAME.match(mapped)


def test_the_first_server_to_claim_a_name_keeps_it_until_it_lets_it_go() -> None:
    claims = Claims()
    assert claims.claim("a", ["echo", "read"]) == {}
    assert claims.claim("b", ["echo", "write"]) == {"echo": "a"}
    assert claims.claim("a", ["read"]) == {}  # a no longer lists echo: it is free
    assert claims.claim("b", ["echo", "write"]) == {}
    assert claims.claim("a", ["echo", "read"]) == {"echo": "b"}
    claims.release("b")
    assert claims.claim("c", ["echo", "write"]) == {}
