"""beside langchain-mcp-adapters: tghost installs and runs where another package pins ``mcp<2``
(``tox -e frameworks``, whose fresh venv also passes ``pip check``): the core never needs the
MCP SDK, and ``tghost mcp`` says in one line which SDK it needs. Skipped where
langchain-mcp-adapters is not installed."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from tests.conftest import tghost_cli
from tghost.cli.directory import MCP_SDK

pytest.importorskip("langchain_mcp_adapters", reason="langchain-mcp-adapters is not installed (tox -e frameworks)")


def test_langchain_mcp_adapters_has_its_mcp_below_2() -> None:
    from langchain_mcp_adapters.tools import load_mcp_tools

    assert callable(load_mcp_tools)
    assert int(importlib.metadata.version("mcp").split(".")[0]) < 2


@pytest.mark.parametrize("argv", [("--help",), ("mcp", "--help"), ("inspect", "--help")])
def test_tghost_and_its_help_work(argv: tuple[str, ...]) -> None:
    shown = tghost_cli(*argv)
    assert (shown.returncode, shown.stderr) == (0, "") and "Usage: tghost" in shown.stdout


def test_tghost_mcp_names_the_sdk_it_needs_in_one_line_exit_2() -> None:
    bridge = tghost_cli("mcp", "--pulsar-url", "pulsar://127.0.0.1:1")
    assert (bridge.returncode, bridge.stdout, bridge.stderr.count("\n")) == (2, "", 1), bridge.stderr
    installed = importlib.metadata.version("mcp")
    assert bridge.stderr.startswith(f"Error: tghost mcp needs the MCP SDK ({MCP_SDK}), and this environment has "
                                    f"mcp {installed}: pip install \"tghost[mcp]\", or, where another package")


def test_the_inspector_and_the_public_line_load_no_mcp() -> None:
    probe = "import sys, tghost, tghost.testing, tghost.adapters.inspector; print('mcp' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout == "False\n", loaded.stderr
