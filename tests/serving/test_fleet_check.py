"""fleet check: the cost of one access policy per service on every request (serving/access.py
``Fleet``). A host whose service has other live providers compares their announced
``access-policy`` with its own on every request: its own is computed once per change of its
tools, not per request (a 50-tool service took 28 ms a request), and the fingerprint is the
definition of docs/protocol.md §4.3 whatever the tools' config values."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from tghost.protocol.access import AccessPolicy, policy_fingerprint, tools_for
from tghost.protocol.descriptors import ToolDescriptor
from tghost.protocol.trust import canonical_json, write_key_pair
from tghost.serving import access


def tool(name: str, **config: Any) -> ToolDescriptor:
    return ToolDescriptor.model_validate({"name": name, "description": "d", "service": "svc", **config})


class SamePolicy:
    """Other providers that announce what this host does, and forbid nothing."""

    def __init__(self, fleet: access.Fleet) -> None:
        self.fleet = fleet

    def policies(self, service: str) -> set[str | None]:
        return {self.fleet.own(service)}

    def forbidding(self, tool: str, key_id: str | None) -> str | None:
        return None


@pytest.fixture
def policy(tmp_path: Path) -> AccessPolicy:
    callers = {}
    for name in ("alice", "bob"):
        write_key_pair(tmp_path / name)
        callers[name] = {"public-key": f"{name}.pub", "tools": ["*"] if name == "alice" else ["t1", "t2"]}
    return AccessPolicy.from_table({"anonymous": ["t0", "plain"], "callers": callers}, tmp_path)


def test_a_hosts_own_policy_is_computed_once_per_change_of_its_tools_not_per_request(
    policy: AccessPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    computed: list[str] = []

    def counted(*args: Any) -> str:
        computed.append(args[2])
        return policy_fingerprint(*args)

    monkeypatch.setattr(access, "policy_fingerprint", counted)
    tools = {f"t{i}": tool(f"t{i}", which=f"t{i}") for i in range(3)}
    fleet = access.Fleet(policy, tools)
    fleet.peers = SamePolicy(fleet)
    for _ in range(100):
        fleet.check("svc", {"which": "t0"}, None)
    assert len(computed) == 1
    before = fleet.own("svc")
    tools["t3"] = tool("t3", which="t3")  # a toolset's change, made in place
    assert fleet.own("svc") != before and len(computed) == 2


def by_definition(policy: AccessPolicy, tools: dict[str, ToolDescriptor], service: str) -> str:
    """docs/protocol.md §4.3's access-policy, computed as it is written."""
    rules = {name: policy.access_of(tools_for(tools, service, t.config)).rules()
             for name, t in tools.items() if t.service == service}
    return hashlib.sha256(canonical_json({"tools": rules})).hexdigest()[:16]


@pytest.mark.parametrize("tools", [
    {"plain": tool("plain")},
    {"plain": tool("plain"), "t0": tool("t0", which="a")},
    {"t0": tool("t0", which="a"), "t1": tool("t1", which="a"), "t2": tool("t2", which="b")},
    {"t0": tool("t0", which="a", mode="x"), "t1": tool("t1", which="a"), "t2": tool("t2", mode="x"),
     "plain": tool("plain")},
    {"t0": tool("t0", n=1), "t1": tool("t1", n=True), "t2": tool("t2", n=1.0)},
    {**{f"t{i}": tool(f"t{i}", which=str(i % 4)) for i in range(40)}, "other": ToolDescriptor.model_validate(
        {"name": "other", "description": "d", "service": "elsewhere"})},
])
def test_the_fingerprint_is_the_protocols_definition(policy: AccessPolicy, tools: dict[str, ToolDescriptor]) -> None:
    assert policy_fingerprint(policy, tools, "svc") == by_definition(policy, tools, "svc")
