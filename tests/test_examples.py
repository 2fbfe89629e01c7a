"""examples: the example agent runs against a real ``tghost run`` serving the example plugins, and
the example tools file adds its tool over a plugin's service."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

from tests.test_docs import block, commands
from tghost.broker import EmbeddedBroker
from tghost.discovery.config import load_config_tools
from tghost.discovery.discover import discover
from tghost.testing import LocalHost

from .conftest import HostProcess

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


#: The commands for the example agent (docs/guides/agents.md, "An example agent").
AGENT = ".venv/bin/tghost run --config examples/tools.toml &   # plus a config-declared tool"


def test_the_example_agent_follows_the_seed_001_workflow(
    pulsar_broker: EmbeddedBroker, tmp_path: Path, host_process: Callable[..., HostProcess]
) -> None:
    (run, _), (agent_argv, _) = commands("docs/guides/agents.md", AGENT)
    assert run[:4] == [sys.executable, "-m", "tghost", "run"] and agent_argv == [sys.executable, "examples/agent.py"]
    env = {**os.environ, "TGHOST_PULSAR_URL": pulsar_broker.url, "XDG_CONFIG_HOME": str(tmp_path),
           "TGHOST_DESCRIPTORS_TOPIC": f"persistent://tg/config/agent-{uuid.uuid4().hex[:8]}"}
    host = host_process(*run[4:], env=env, cwd=EXAMPLES.parent)
    host.wait_for("announced")
    agent = subprocess.run(agent_argv, env=env, capture_output=True, text=True, timeout=60, cwd=EXAMPLES.parent)
    assert agent.returncode == 0, agent.stderr
    out = agent.stdout
    assert "query-orders" in out.splitlines()[0]  # the config-declared tool was discovered too
    assert "called query-customers(" in out and "state 'undefined' -> 'analysis'" in out
    assert "called calculate(" in out and "-> '15960'" in out and "state 'analysis' -> 'results'" in out
    assert "in state 'results': stopping" in out  # knowledge tools are not offered in "results"
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


def test_the_readme_tools_file_adds_a_tool_over_a_plugins_service(
    pulsar_broker: EmbeddedBroker, tmp_path: Path, host_process: Callable[..., HostProcess]
) -> None:
    config = tmp_path / "tools.toml"
    config.write_text(block("docs/guides/writing-plugins.md", "# tools.toml"))
    env = {**os.environ, "TGHOST_PULSAR_URL": pulsar_broker.url, "XDG_CONFIG_HOME": str(tmp_path),
           "TGHOST_LOAD_PLUGINS": "knowledge",
           "TGHOST_DESCRIPTORS_TOPIC": f"persistent://tg/config/tools-{uuid.uuid4().hex[:8]}"}
    host = host_process("--config", str(config), env=env)
    host.wait_for("config .*: added tools query-orders")
    host.wait_for("announced")
    called = subprocess.run([sys.executable, "-m", "tghost", "call", "query-orders", "question=late delivery",
                             "--group", "knowledge"], env=env, capture_output=True, text=True, timeout=60)
    assert called.returncode == 0 and "[1] " in called.stdout, called.stdout + called.stderr
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


async def test_the_example_tools_file_adds_query_orders_over_the_knowledge_plugins_service(
    pulsar_broker: EmbeddedBroker,
) -> None:
    """examples/tools.toml declares ``query-orders`` over tghost-knowledge's ``custom-rag`` with
    the orders collection, taking that service's workflow keys and arguments."""
    catalog = discover(strict=False)
    try:
        report = load_config_tools(catalog, EXAMPLES / "tools.toml")
        assert report.errors == [] and report.tools == ["query-orders"]
        tool = catalog.tools["query-orders"]
        assert tool.service == "custom-rag" and tool.config == {"collection": "orders"}
        assert tool.description == "Query the order knowledge base"
        assert (tool.group, tool.state, tool.available_in_states) == (
            ("default", "read-only", "knowledge"), "analysis", ("undefined", "research"))
        assert [a.name for a in tool.arguments] == ["question", "limit"]  # taken from the plugin's tools
        async with LocalHost(pulsar_broker.url, [catalog.services["custom-rag"]]) as host:
            answer = await host.call(tool.service, {"question": "Which order was cancelled?"}, config=tool.config)
    finally:
        catalog.shutdown()
    assert answer.startswith("[1] Order ORD-2212 for Redwood Catering (score "), answer
