"""deployment: ``tghost pulsar policies`` prints exactly what docs/protocol.md §4.10 asks of an
Apache Pulsar cluster with authorization (tenant, the announcement, request and response
namespaces, each role's permissions), from the protocol's constants. (No Apache Pulsar runs here:
pulsar-lite has no namespaces policies, so the lines are checked, not run.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import tghost_cli
from tghost.protocol.announcement import DEFAULT_TOPIC, EPOCH_SECONDS, RESTATEMENT_MARGIN
from tghost.protocol.deployment import DEFAULT_NAMESPACE, Policies, admin_commands, namespace_of, rest_calls
from tghost.protocol.descriptors import request_queue, response_queue

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def documented() -> list[str]:
    section = PROTOCOL.read_text().split("### 4.10 Deployment", 1)[1]
    return re.search(r"```text\n(.*?)```", section, re.S).group(1).splitlines()  # type: ignore[union-attr]


def test_the_documented_lines_are_what_the_command_prints() -> None:
    printed = tghost_cli("pulsar", "policies")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines() == documented() == admin_commands(Policies(), "<host-role>", "<agent-role>")


def test_the_namespace_is_the_default_topics_and_created_only_when_missing() -> None:
    assert DEFAULT_NAMESPACE == namespace_of(DEFAULT_TOPIC) == "tg/config"
    [tenant, other, create, *_] = admin_commands(Policies(namespace="acme/tools"), "h", "a")
    assert (tenant, other) == ("pulsar-admin tenants list | grep -qx acme || pulsar-admin tenants create acme",
                               "pulsar-admin tenants list | grep -qx tg || pulsar-admin tenants create tg")
    assert create == ("pulsar-admin namespaces list acme | grep -qx acme/tools || "
                      "pulsar-admin namespaces create acme/tools")


def test_the_tenant_the_request_and_response_namespaces_and_each_roles_permissions_are_set_up() -> None:
    printed = tghost_cli("pulsar", "policies", "--host-role", "hosts", "--agent-role", "agents", "--json")
    assert printed.returncode == 0, printed.stderr
    shown = json.loads(printed.stdout)
    assert shown["tenants"] == ["tg"]
    assert shown["namespaces"] == {"config": "tg/config", "request": namespace_of(request_queue("x")),
                                   "response": namespace_of(response_queue("x"))}
    granted = {(p["namespace"], p["role"]): p["actions"] for p in shown["permissions"]}
    assert granted == {("tg/config", "hosts"): ["produce", "consume"], ("tg/config", "agents"): ["consume"],
                       ("tg/request", "hosts"): ["produce", "consume"], ("tg/request", "agents"): ["produce"],
                       ("tg/response", "hosts"): ["produce"], ("tg/response", "agents"): ["consume"]}
    lines = shown["lines"]
    assert lines[0] == "pulsar-admin tenants list | grep -qx tg || pulsar-admin tenants create tg"
    for (namespace, role), actions in granted.items():
        assert (f"pulsar-admin namespaces grant-permission {namespace} --role {role} --actions {','.join(actions)}"
                in lines)
    for namespace in shown["namespaces"].values():
        assert (f"pulsar-admin namespaces list tg | grep -qx {namespace} || pulsar-admin namespaces create "
                f"{namespace}") in lines
    rest = tghost_cli("pulsar", "policies", "--format", "rest", "--cluster", "standalone")
    tenant = 'PUT /admin/v2/tenants/tg {"adminRoles": [], "allowedClusters": ["standalone"]}'
    assert rest.stdout.splitlines()[0] == tenant
    assert "--allowed-clusters standalone" in tghost_cli("pulsar", "policies", "--cluster", "standalone").stdout


def test_retention_covers_what_a_directory_reads_back() -> None:
    floor_minutes = (EPOCH_SECONDS + 60 + RESTATEMENT_MARGIN) / 60  # E + S + M (§4.6)
    assert Policies().retention_minutes >= floor_minutes
    with pytest.raises(ValueError, match=r"under the 6\.5 minutes"):
        Policies(retention_minutes=6)


def test_rest_calls_carry_the_same_figures_and_json_is_for_programs() -> None:
    printed = tghost_cli("pulsar", "policies", "--format", "rest", "--host-role", "hosts", "--agent-role", "agents",
                         "--json")
    assert printed.returncode == 0, printed.stderr
    shown = json.loads(printed.stdout)
    assert shown["namespace"] == "tg/config" and shown["lines"] == rest_calls(Policies(), "hosts", "agents")
    config = [line for line in shown["lines"] if line.split(" ")[1].startswith("/admin/v2/namespaces/tg/config/")]
    bodies = {line.split(" ", 2)[1].rsplit("/", 1)[-1]: line.split(" ", 2)[2] for line in config}
    assert json.loads(bodies["retention"]) == {"retentionTimeInMinutes": 60, "retentionSizeInMB": 1024}
    assert bodies["compactionThreshold"] == str(2**20)
    assert json.loads(bodies["inactiveTopicPolicies"])["maxInactiveDurationSeconds"] == 7200
    assert json.loads(bodies["hosts"]) == ["produce", "consume"] and json.loads(bodies["agents"]) == ["consume"]


def test_the_retention_size_grows_with_the_fleet_as_docs_scale_advises() -> None:
    printed = tghost_cli("pulsar", "policies", "--retention-size", "4G")
    assert printed.returncode == 0, printed.stderr
    assert "pulsar-admin namespaces set-retention tg/config --time 1h --size 4G" in printed.stdout.splitlines()
    rest = tghost_cli("pulsar", "policies", "--retention-size", "1536M", "--format", "rest")
    assert '"retentionSizeInMB": 1536' in rest.stdout


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--namespace", "config", "is not TENANT/NAMESPACE"),
    ("--retention-size", "4 GB", "is not a size"),
    ("--host-role", "hosts; rm -rf /", "is not a role name"),
])
def test_a_namespace_or_role_a_shell_line_cannot_carry_is_a_usage_error(option: str, value: str, says: str) -> None:
    printed = tghost_cli("pulsar", "policies", option, value)
    assert printed.returncode == 2 and says in printed.stderr and printed.stdout == ""
