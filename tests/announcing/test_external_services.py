"""external_services: external tool services: a real TrustGraph ``DynamicToolService`` (trustgraph-base 2.11),
declared in ``tghost run``'s config file, is announced by the host (marked external, served by
nobody but itself) and called by tool name through ``ToolDirectory`` and through ``tghost mcp``."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tghost
from tests.adapters.test_mcp import mcp_client, text
from tests.conftest import HostProcess, LoopThread, PluginDir, tghost_cli
from tests.test_docs import block
from tghost.agent.directory import ToolDirectory
from tghost.broker import EmbeddedBroker
from tghost.discovery.catalog import Catalog
from tghost.discovery.config import load_config_tools
from tghost.discovery.discover import catalog_of
from tghost.pulsar.clients import PulsarSettings

dynamic_tool_service = pytest.importorskip(
    "trustgraph.base.dynamic_tool_service", reason="trustgraph-base 2.11 is not installed here")

#: The example config file of docs/integrations/trustgraph.md, run as written.
CONFIG = block("docs/integrations/trustgraph.md",
               "[external-services.tgpeer]            # a TrustGraph DynamicToolService run with --topic tgpeer")
TOPIC = "tgpeer"  # the page's DynamicToolService topic


@tghost.tool(service="kb")
def kb(question: str) -> str:
    """A service this host serves."""
    return question


class Shouter(dynamic_tool_service.DynamicToolService):  # type: ignore[misc,name-defined]
    """A TrustGraph tool service as TrustGraph users write them: ``invoke(config, arguments)``."""

    calls = 0

    async def invoke(self, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        Shouter.calls += 1
        return f"{arguments['text'].upper()} ({config['style']})"


@pytest.fixture
def shouter(pulsar_broker: EmbeddedBroker) -> Iterator[None]:
    """A ``Shouter`` serving the page's topic on this broker, in its own event loop."""
    thread = LoopThread("trustgraph")

    async def start() -> Any:
        service = Shouter(id="tgpeer", topic=TOPIC, pulsar_host=pulsar_broker.url)
        await service.start()
        return service

    service = thread.run(start())
    Shouter.calls = 0
    try:
        yield
    finally:
        thread.run(service.stop())
        thread.close()


@pytest.fixture
def env(pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, tmp_path: Path, shouter: None) -> dict[str, str]:
    """No plugin at all, and the page's config file declaring the Shouter and a tool over it."""
    config = tmp_path / "tools.toml"
    config.write_text(CONFIG)
    return {**plugin_dir.user_env(pulsar_broker.url, tmp_path / "config", "external"), "TGHOST_CONFIG": str(config)}


async def directory_call(env: dict[str, str]) -> tuple[bool, str]:
    async with ToolDirectory(PulsarSettings(env["TGHOST_PULSAR_URL"]), env["TGHOST_DESCRIPTORS_TOPIC"]) as directory:
        await directory.wait_for("peer-shout")
        tool = directory.tools["peer-shout"]
        return tool.service.providers[0].external, await directory.invoke("peer-shout", {"text": "hello"})


async def test_a_dynamic_tool_service_declared_in_the_config_is_called_by_tool_name(
    env: dict[str, str], host_process: Callable[..., HostProcess],
) -> None:
    host = host_process(env=env)
    host.wait_for(r"announcing external service tgpeer \(served elsewhere, on non-persistent://tg/request/tgpeer;")
    host.wait_for("announced")
    assert "serving tgpeer" not in host.log and "no tool services to serve" not in host.log

    external, observation = await directory_call(env)
    assert external and observation == "HELLO (loudly)"  # the tool's config value merged in

    async with mcp_client(env) as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        shouted = await session.call_tool("peer-shout", {"text": "over mcp"})
    assert listed["peer-shout"].input_schema["required"] == ["text"]
    assert (shouted.is_error, text(shouted)) == (False, "OVER MCP (loudly)")

    called = tghost_cli("call", "peer-shout", "text=hi", env=env)
    assert (called.returncode, called.stdout.strip()) == (0, "HI (loudly)")
    (row,) = json.loads(tghost_cli("tools", "--json", env=env).stdout)
    assert row["name"] == "peer-shout" and row["external"] is True and row["config"] == {"style": "loudly"}
    assert "tgpeer (external)" in tghost_cli("tools", env=env).stdout
    assert Shouter.calls == 3  # every call went to TrustGraph's service: the host serves none of it

    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0
    assert json.loads(tghost_cli("tools", "--json", env=env).stdout) == []  # withdrawn with the host


def test_an_external_service_needs_its_queues_and_no_param_named_as_a_tool_key_and_never_replaces_a_served_one(
    tmp_path: Path,
) -> None:
    config = tmp_path / "tools.toml"
    config.write_text("""
[external-services.no-queues]
description = "Lacks its queues"

[external-services.kb]
request-queue = "non-persistent://tg/request/kb"
response-queue = "non-persistent://tg/response/kb"

[external-services.titled]
request-queue = "non-persistent://tg/request/titled"
response-queue = "non-persistent://tg/response/titled"
config-params = [{name = "title"}]

[tools.orphan]
service = "no-queues"
description = "Over a service that was skipped"
""")
    catalog = catalog_of([kb])
    report = load_config_tools(catalog, config)
    errors = "\n".join(report.errors)
    assert f"{config}: [external-services.no-queues]: field 'request-queue': Field required" in errors
    assert f"{config}: [external-services.kb]: service id 'kb' is already served by plugin 'local'" in errors
    assert f"{config}: [tools.orphan]: service 'no-queues' is not served here" in errors
    assert (f"{config}: [external-services.titled]: config param 'title': a tool key of the protocol "
            "(annotations, output-schema, title), which a host drops from a request's config; give the param "
            "another name; service skipped") in errors
    assert catalog.external == {} and set(catalog.tools) == {"kb"}


def test_a_config_file_adds_external_services_and_tools_over_them_but_serves_nothing(tmp_path: Path) -> None:
    config = tmp_path / "tools.toml"
    config.write_text(CONFIG)
    catalog = Catalog()
    report = load_config_tools(catalog, config)
    assert report.services == ["tgpeer"] and report.tools == ["peer-shout"] and not report.errors
    assert catalog.external["tgpeer"].request_queue == "non-persistent://tg/request/tgpeer"
    assert catalog.external["tgpeer"].required_config == ("style",)
    assert catalog.services == {} and catalog.descriptors == {}  # nothing for the host to serve
    assert catalog.tools["peer-shout"].config == {"style": "loudly"}
