"""examples: the example agent runs against a real ``tghost run`` serving the example plugins."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

from tghost.broker import EmbeddedBroker

from .conftest import HostProcess

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_the_example_agent_follows_the_seed_001_workflow(
    pulsar_broker: EmbeddedBroker, tmp_path: Path, host_process: Callable[..., HostProcess]
) -> None:
    env = {**os.environ, "TGHOST_PULSAR_URL": pulsar_broker.url, "XDG_CONFIG_HOME": str(tmp_path),
           "TGHOST_DESCRIPTORS_TOPIC": f"persistent://tg/config/agent-{uuid.uuid4().hex[:8]}"}
    host = host_process("--config", str(EXAMPLES / "tools.toml"), env=env)
    host.wait_for("announced")
    agent = subprocess.run([sys.executable, str(EXAMPLES / "agent.py")], env=env, capture_output=True,
                           text=True, timeout=60)
    assert agent.returncode == 0, agent.stderr
    out = agent.stdout
    assert "query-orders" in out.splitlines()[0]  # the config-declared tool was discovered too
    assert "called query-customers(" in out and "state 'undefined' -> 'analysis'" in out
    assert "called calculate(" in out and "-> '15960'" in out and "state 'analysis' -> 'results'" in out
    assert "in state 'results': stopping" in out  # knowledge tools are not offered in "results"
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0
