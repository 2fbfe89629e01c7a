"""testing: the pytest plugin a plugin author gets. ``LocalHost`` calls tools by name with their
config values merged (as the directory does), serves a plugin module as the host loads it, and an
``async def`` test that uses ``pulsar_broker`` runs in a project that configured nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

import tghost
from tghost.agent.client import ToolCallError
from tghost.broker import EmbeddedBroker
from tghost.testing import LocalHost


class Search(tghost.ToolService):
    """One service behind two tools that differ in a config value."""

    id = "local-search"
    description = "Search a collection."
    config_params = (tghost.ConfigParam(name="collection", required=True),)
    arguments = (tghost.Argument(name="question", type="string", description="The question"),)

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        return f"{config['collection']}: {arguments['question']}"


def plugin_module() -> types.ModuleType:
    """A plugin module built in memory, with both registration hooks, as a plugin author writes it."""
    module = types.ModuleType("tghost_local_search")
    search = Search()

    @tghost.hookimpl
    def tghost_register_services(register: Any) -> None:
        register(search)

    @tghost.hookimpl
    def tghost_register_tools(register: Any) -> None:
        register(search.tool("query-customers", collection="customers"))
        register({"name": "query-products", "description": "Products", "service": "local-search",
                  "collection": "products"})

    module.tghost_register_services = tghost_register_services  # type: ignore[attr-defined]
    module.tghost_register_tools = tghost_register_tools  # type: ignore[attr-defined]
    return module


async def test_a_tool_is_called_by_name_with_its_config_merged(pulsar_broker: EmbeddedBroker) -> None:
    search = Search()
    async with LocalHost(pulsar_broker.url, [search], tools=[search.tool("query-orders", collection="orders")]) as host:
        assert await host.call("query-orders", {"question": "late?"}) == "orders: late?"
        assert await host.call("query-orders", {"question": "late?"}, config={"collection": "x"}) == "x: late?"
        assert await host.call("local-search", {"question": "hi"}, config={"collection": "c"}) == "c: hi"
        with pytest.raises(ToolCallError) as info:  # a service id alone brings no config
            await host.call("local-search", {"question": "hi"})
        assert info.value.error_type == "missing-config"
        with pytest.raises(KeyError, match="no tool or service named 'nothing'"):
            await host.call("nothing")


async def test_a_plugin_module_is_served_as_the_host_loads_it(pulsar_broker: EmbeddedBroker) -> None:
    async with LocalHost(pulsar_broker.url, plugin=plugin_module()) as host:
        assert sorted(host.catalog.tools) == ["query-customers", "query-products"]
        assert await host.call("query-customers", {"question": "who?"}) == "customers: who?"
        assert await host.call("query-products", {"question": "what?"}) == "products: what?"


def test_a_plugin_module_that_fails_to_register_is_a_clear_error() -> None:
    module = plugin_module()
    module.tghost_register_tools = tghost.hookimpl(  # type: ignore[attr-defined]
        lambda register: register({"name": "bad name", "description": "x", "service": "local-search"}))
    with pytest.raises(ValueError, match="tool 'bad name': field 'name'"):
        LocalHost("pulsar://127.0.0.1:1", plugin=module)


def test_an_async_test_runs_in_a_project_with_no_pytest_configuration(
    tmp_path: Path, pulsar_broker: EmbeddedBroker,
) -> None:
    """No pytest.ini, no [tool.pytest], no conftest, no pytest-asyncio (``-p no:asyncio``: a plugin
    project that installed tghost and pytest only), every warning an error."""
    (tmp_path / "tghost_nap.py").write_text(textwrap.dedent('''
        import asyncio
        import tghost

        @tghost.tool
        async def nap(seconds: float) -> str:
            """Sleep, then say so."""
            await asyncio.sleep(seconds)
            return f"slept {seconds}s"
    '''))
    (tmp_path / "test_nap.py").write_text(textwrap.dedent('''
        from tghost.testing import LocalHost
        from tghost_nap import nap

        async def test_nap(pulsar_broker):
            async with LocalHost(pulsar_broker.url, [nap]) as host:
                assert await host.call("nap", {"seconds": "0.01"}) == "slept 0.01s"

        def test_sync_tests_still_run():
            assert nap.fn.__name__ == "nap"
    '''))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:asyncio", "-p", "no:cacheprovider",
                             "-W", "error", "-q", "test_nap.py"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout and "warning" not in result.stdout.lower()
