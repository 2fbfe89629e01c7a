"""The trial of issue 41 on the embedded broker: two ``tghost run`` hosts on this machine serve
one plugin at two versions of its code (its source edited between their starts). The second
names the first at start, ``tghost tools`` marks the tool SKEW, ``tghost status`` names both
versions and exits 1, both hosts' ``/health`` list the skew and the first host's log says so once
(docs/protocol.md §4.8)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import READY, HostProcess, PluginDir, live_tools, tghost_cli
from tghost.broker import EmbeddedBroker
from tghost.cli.status import read_health

PLUGIN = """
import tghost

@tghost.tool(service="count-svc")
def count(text: str) -> str:
    '''Count the words.'''
    return str(len(text.split()) + {offset})

@tghost.hookimpl
def tghost_register_services(register):
    register(count)
"""
SKEWED = r"tool service 'count-svc' is skewed"


def lists_skew(env: dict[str, str], host_id: str) -> bool:
    """Whether the ``/health`` of host ``host_id`` lists count-svc's skew among its problems."""
    result = tghost_cli("status", "--json", env=env)
    [host] = [h for h in json.loads(result.stdout)["hosts"] if h["id"] == host_id]
    return any(re.match(SKEWED, problem) for problem in read_health(host["health_url"], 5.0)["problems"])


def eventually(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not in {timeout}s: {what}"
        time.sleep(0.2)


def test_two_hosts_serving_two_versions_of_one_tool_are_reported_everywhere(
    pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, tmp_path: Path,
    host_process: Callable[..., HostProcess],
) -> None:
    plugin_dir.add("count", PLUGIN.format(offset=0))
    env = plugin_dir.user_env(pulsar_broker.url, tmp_path / "config", "skew")
    first = host_process("--metrics-port", "0", env=env, cwd=tmp_path)
    first.wait_for(READY)
    module = plugin_dir.root / "tghost_test_count.py"
    module.write_text(PLUGIN.format(offset=1000))  # the edit the README's flow makes: the old host serves on
    second = host_process("--metrics-port", "0", env=env)
    second.wait_for(READY)
    second.wait_for(SKEWED)  # once its own announcements are read

    [shared] = [line for line in second.log.splitlines() if "another host on this machine already serves" in line]
    assert "count-svc: host" in shared
    started = r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
    assert re.search(rf"\(pid {first.process.pid}, {started}, in {re.escape(str(tmp_path))}\)", shared), shared
    assert "shared between the two hosts" in shared
    first.wait_for(SKEWED)  # it follows (a /health host): told when the other appeared

    [row] = live_tools(env).values()
    assert len(row["skew"]) == 2 and sorted(len(v["hosts"]) for v in row["skew"]) == [1, 1]
    assert row["skew"][0]["distribution"] == "tghost-test-count" and row["skew"][0]["version"] == "1.0"
    assert row["skew"][0]["fingerprint"] != row["skew"][1]["fingerprint"]
    listed = tghost_cli("tools", env=env)
    assert "count SKEW" in listed.stdout and "1 service(s) skewed" in listed.stderr, listed

    status = tghost_cli("status", env=env)
    assert status.returncode == 1, status
    problem = [line for line in status.stderr.splitlines() if "tool service 'count-svc' is skewed" in line]
    hosts = [v["hosts"][0] for v in row["skew"]]
    assert problem and all(host in problem[0] for host in hosts), status.stderr
    assert all(f"(code {v['fingerprint'][:12]})" in problem[0] for v in row["skew"])
    report = json.loads(tghost_cli("status", "--json", env=env).stdout)
    assert report["skewed"] == {"count-svc": row["skew"]}
    assert all(host["skewed"] == ["count-svc"] for host in report["hosts"])

    eventually(lambda: all(lists_skew(env, host_id) for host_id in hosts), "each /health lists the skew")
    assert len(re.findall(SKEWED, first.log)) == 1, first.log  # once per skew appearing
