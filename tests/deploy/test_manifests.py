"""deploy: the Kubernetes manifests of ``deploy/kubernetes/`` and the ``Dockerfile``, read as
files. They validate against the Kubernetes 1.31 schemas (strictly, offline), and their wiring
matches what tghost does: probes on ``/health``, a termination grace longer than ``--grace``,
the host id from the pod name, the set-up Job running what ``tghost pulsar policies`` prints,
the hosts' network policy letting in Prometheus and out only to the Pulsar proxy and DNS.
Nothing here talks to a broker or a cluster; the ``tghost`` commands run are ``--help`` and
``pulsar policies``, which talk to nothing.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry

from tghost.operate.health import Health
from tghost.operate.metrics import MetricsServer

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
DOCKERFILE = ROOT / "Dockerfile"
KUBERNETES = "1.31"
WORKLOADS = ("StatefulSet", "Deployment", "Job")


def manifests() -> list[Path]:
    """The files kustomization.yaml lists, in its order."""
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    return [DEPLOY / name for name in kustomization["resources"]]


def resources() -> list[dict[str, Any]]:
    return [doc for path in manifests() for doc in yaml.safe_load_all(path.read_text()) if doc]


def the(kind: str, name: str) -> dict[str, Any]:
    found = [doc for doc in resources() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def pod(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """Every container of a workload's pod, init containers first."""
    spec = pod(workload)
    return [*spec.get("initContainers", []), *spec["containers"]]


def workloads() -> Iterator[dict[str, Any]]:
    return (doc for doc in resources() if doc["kind"] in WORKLOADS)


def tghost_containers() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every container running the tghost image's entry point."""
    return ((w, c) for w in workloads() for c in containers(w) if "/tghost:" in c["image"] and "command" not in c)


def env(container: dict[str, Any], name: str) -> dict[str, Any]:
    found = [var for var in container.get("env", []) if var["name"] == name]
    assert len(found) == 1, f"{container['name']}: env {name}: {len(found)} found"
    return found[0]


def option(args: list[str], name: str) -> str:
    assert args.count(name) == 1, f"{name} once in {args}"
    return args[args.index(name) + 1]


def mounted_from(workload: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume that holds ``path`` in ``container`` (by its longest mount path)."""
    mounts = [m for m in container.get("volumeMounts", []) if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mounts, f"{path} is on no volume of {container['name']}"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    return next(v for v in pod(workload)["volumes"] if v["name"] == mount["name"])


def _tghost(*args: str) -> subprocess.CompletedProcess[str]:
    """``tghost ARGS`` in a process of its own, as the image's entry point runs it."""
    return subprocess.run([sys.executable, "-m", "tghost", *args], capture_output=True, text=True, timeout=60)


def _python(source: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=30)


# -- the manifests are valid Kubernetes ------------------------------------------------------


def test_kustomization_lists_every_manifest_in_the_folder() -> None:
    assert sorted(path.name for path in manifests()) == sorted(
        path.name for path in DEPLOY.glob("*.yaml") if path.name != "kustomization.yaml")


@pytest.mark.parametrize("doc", resources(), ids=lambda doc: f"{doc['kind']}/{doc['metadata']['name']}")
def test_every_manifest_validates_against_kubernetes_1_31_strictly(doc: dict[str, Any]) -> None:
    # validate() answers the version whose bundled schemas it used: 1.31's own, not an older one.
    assert kubernetes_validate.validate(doc, KUBERNETES + ".0", strict=True) == KUBERNETES


def test_strict_validation_rejects_a_misspelt_field() -> None:
    host = the("StatefulSet", "tghost-host")
    pod(host)["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinessProbes"):
        kubernetes_validate.validate(host, KUBERNETES + ".0", strict=True)


# -- the host ----------------------------------------------------------------------------------


def host() -> tuple[dict[str, Any], dict[str, Any]]:
    workload = the("StatefulSet", "tghost-host")
    (container,) = pod(workload)["containers"]
    assert container["args"][0] == "run"
    return workload, container


def test_host_probes_ask_health_on_the_metrics_port_bound_for_the_kubelet() -> None:
    _, container = host()
    port = int(option(container["args"], "--metrics-port"))
    assert option(container["args"], "--metrics-host") == "0.0.0.0"
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    readiness = container["readinessProbe"]["httpGet"]
    assert readiness["path"] == "/health"
    assert named.get(readiness["port"], readiness["port"]) == port
    liveness = " ".join(container["livenessProbe"]["exec"]["command"])
    assert f"http://127.0.0.1:{port}/health" in liveness


@pytest.fixture
def health_server() -> Iterator[tuple[MetricsServer, list[bool | None]]]:
    """tghost's own /health on a free port; set ``connected[0]`` to change the host's state."""
    connected: list[bool | None] = [True]
    server = MetricsServer(CollectorRegistry(), Health(connected=lambda: connected[0])).start()
    try:
        yield server, connected
    finally:
        server.stop()


def status_of(server: MetricsServer) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code


def liveness_exit_code(server: MetricsServer) -> int:
    _, container = host()
    command = container["livenessProbe"]["exec"]["command"]
    assert command[:2] == ["python", "-c"]
    port = option(container["args"], "--metrics-port")
    return _python(command[2].replace(f":{port}/", f":{server.port}/")).returncode


def test_readiness_fails_while_the_host_is_degraded_or_starting(
        health_server: tuple[MetricsServer, list[bool | None]]) -> None:
    # An httpGet probe succeeds on 200-399 only.
    server, connected = health_server
    assert status_of(server) == 200
    connected[0] = False
    assert status_of(server) == 503
    connected[0] = None
    assert status_of(server) == 503


def test_liveness_passes_a_degraded_host_and_fails_when_nothing_answers(
        health_server: tuple[MetricsServer, list[bool | None]]) -> None:
    server, connected = health_server
    assert liveness_exit_code(server) == 0
    connected[0] = False
    assert liveness_exit_code(server) == 0
    server.stop()
    assert liveness_exit_code(server) != 0


def test_host_termination_grace_is_longer_than_its_grace() -> None:
    workload, container = host()
    assert pod(workload)["terminationGracePeriodSeconds"] > float(option(container["args"], "--grace"))


def test_host_id_is_the_stable_pod_name() -> None:
    workload, container = host()
    assert workload["kind"] == "StatefulSet"
    assert env(container, "TGHOST_HOST_ID")["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert "--host-id" not in container["args"]


def test_pulsar_url_comes_from_the_configmap_in_every_tghost_container() -> None:
    found = list(tghost_containers())
    assert {w["metadata"]["name"] for w, _ in found} >= {"tghost-host", "tghost-mcp", "tghost-trustgraph-sync"}
    for _, container in found:
        ref = env(container, "TGHOST_PULSAR_URL")["valueFrom"]["configMapKeyRef"]
        data = the("ConfigMap", ref["name"])["data"]
        assert data[ref["key"]].startswith(("pulsar://", "pulsar+ssl://"))


def test_pulsar_token_signing_key_and_mcp_token_are_files_from_secrets() -> None:
    for workload, container in tghost_containers():
        token = env(container, "TGHOST_PULSAR_TOKEN_FILE")["value"]
        assert "secret" in mounted_from(workload, container, token)
        assert all(var["name"] != "TGHOST_PULSAR_TOKEN" for var in container["env"])
    workload, container = host()
    key = option(container["args"], "--signing-key")
    assert Path(key).name in {i["path"] for i in mounted_from(workload, container, key)["secret"]["items"]}
    mcp = the("Deployment", "tghost-mcp")
    (bridge,) = pod(mcp)["containers"]
    assert bridge["args"][:3] == ["mcp", "--transport", "http"]
    assert option(bridge["args"], "--host") == "0.0.0.0"
    assert "secret" in mounted_from(mcp, bridge, option(bridge["args"], "--token-file"))


def test_every_tghost_container_uses_options_tghost_has() -> None:
    # --help ends the command once its options are parsed: a misspelt option fails (exit 2).
    for _, container in tghost_containers():
        result = _tghost(*container["args"], "--help")
        assert result.returncode == 0, (container["args"], result.stderr)


def test_pod_disruption_budget_covers_the_hosts() -> None:
    budget = the("PodDisruptionBudget", "tghost-host")["spec"]
    labels = the("StatefulSet", "tghost-host")["spec"]["template"]["metadata"]["labels"]
    assert budget["maxUnavailable"] == 1
    assert budget["selector"]["matchLabels"].items() <= labels.items()


# -- the hosts' network policy -------------------------------------------------------------------


def network_policy() -> dict[str, Any]:
    spec: dict[str, Any] = the("NetworkPolicy", "tghost-host")["spec"]
    return spec


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert selector.keys() == {"matchLabels"}
    return bool(selector["matchLabels"].items() <= labels.items())


def test_network_policy_isolates_the_hosts_both_ways_and_no_other_workload() -> None:
    policy = network_policy()
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    selected = [w["metadata"]["name"] for w in workloads()
                if selects(policy["podSelector"], w["spec"]["template"]["metadata"]["labels"])]
    assert selected == ["tghost-host"]


def test_network_policy_admits_prometheus_of_one_namespace_to_the_metrics_port_only() -> None:
    workload, container = host()
    (rule,) = network_policy()["ingress"]
    (peer,) = rule["from"]
    # Both selectors in one peer: Prometheus pods of that namespace (two peers would be either).
    assert peer.keys() == {"namespaceSelector", "podSelector"}
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    (port,) = rule["ports"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    metrics = int(option(container["args"], "--metrics-port"))
    assert port["protocol"] == "TCP" and named.get(port["port"], port["port"]) == metrics
    assert workload["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(metrics)


def test_network_policy_lets_the_hosts_reach_the_pulsar_proxy_of_the_configmap_and_dns_only() -> None:
    _, container = host()
    ref = env(container, "TGHOST_PULSAR_URL")["valueFrom"]["configMapKeyRef"]
    url = re.match(r"pulsar://([^.:/]+)\.([^.:/]+)\.svc[^:/]*:(\d+)", the("ConfigMap", ref["name"])["data"][ref["key"]])
    assert url is not None
    service, namespace, port = url.group(1), url.group(2), int(url.group(3))
    pulsar, dns = network_policy()["egress"]
    (peer,) = pulsar["to"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": namespace}
    assert service == "pulsar-proxy" and peer["podSelector"]["matchLabels"] == {"component": "proxy"}
    assert {(p["protocol"], p["port"]) for p in pulsar["ports"]} == {("TCP", port), ("TCP", 6651)}
    (peer,) = dns["to"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kube-system"}
    assert peer["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    assert {(p["protocol"], p["port"]) for p in dns["ports"]} == {("UDP", 53), ("TCP", 53)}


def test_the_kustomization_s_commented_patch_for_another_prometheus_applies_and_validates() -> None:
    lines = (DEPLOY / "kustomization.yaml").read_text().splitlines()
    start = lines.index("# patches:")
    commented = [line[2:] for line in lines[start:] if line.startswith("# ") or line == "#"]
    (patch,) = yaml.safe_load("\n".join(commented))["patches"]
    policy = the(patch["target"]["kind"], patch["target"]["name"])
    for operation in yaml.safe_load(patch["patch"]):
        assert operation["op"] == "replace"
        *parents, last = [part.replace("~1", "/").replace("~0", "~") for part in operation["path"].split("/")[1:]]
        node: Any = policy
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        assert last in node, operation["path"]  # "replace" needs the field to exist
        node[last] = operation["value"]
    assert kubernetes_validate.validate(policy, KUBERNETES + ".0", strict=True) == KUBERNETES
    (peer,) = policy["spec"]["ingress"][0]["from"]
    assert peer == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
                    "podSelector": {"matchLabels": {"app": "prometheus"}}}


# -- every workload ------------------------------------------------------------------------------


def test_every_container_runs_as_non_root_on_a_read_only_root_filesystem() -> None:
    for workload in workloads():
        pod_context = pod(workload).get("securityContext", {})
        for container in containers(workload):
            context = {**pod_context, **container.get("securityContext", {})}
            where = f"{workload['metadata']['name']}/{container['name']}"
            assert context.get("runAsNonRoot") is True, where
            assert context.get("runAsUser", 1) != 0, where
            assert container["securityContext"].get("readOnlyRootFilesystem") is True, where
            assert container["securityContext"].get("allowPrivilegeEscalation") is False, where


def test_every_container_has_resource_requests_and_limits() -> None:
    for workload in workloads():
        for container in containers(workload):
            resources = container["resources"]
            assert {"cpu", "memory"} <= resources["requests"].keys() & resources["limits"].keys(), container["name"]


def test_no_workload_gets_service_link_variables() -> None:
    # A Service named tghost-metrics would otherwise set TGHOST_METRICS_PORT=tcp://... in every pod.
    assert [w["metadata"]["name"] for w in workloads() if pod(w).get("enableServiceLinks") is not False] == []


# -- the set-up Job ----------------------------------------------------------------------------------


def test_setup_job_runs_what_tghost_pulsar_policies_prints() -> None:
    job = the("Job", "tghost-setup")
    (policies,) = pod(job)["initContainers"]
    (admin,) = pod(job)["containers"]
    assert policies["command"][:2] == ["sh", "-ec"]
    line, target = policies["command"][2].split(" > ")
    words = shlex.split(line)
    assert words[:3] == ["tghost", "pulsar", "policies"]
    assert words[3:] == ["--host-role", "$HOST_ROLE", "--agent-role", "$AGENT_ROLE"]
    roles = {}
    for name in ("HOST_ROLE", "AGENT_ROLE"):
        ref = env(policies, name)["valueFrom"]["configMapKeyRef"]
        roles[name] = the("ConfigMap", ref["name"])["data"][ref["key"]]
    printed = _tghost("pulsar", "policies", "--host-role", roles["HOST_ROLE"], "--agent-role", roles["AGENT_ROLE"])
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout and all(line.startswith("pulsar-admin ") for line in printed.stdout.splitlines())
    assert admin["image"].startswith("apachepulsar/pulsar:")
    script = admin["command"][2].splitlines()
    assert admin["command"][:2] == ["sh", "-ec"]
    assert script[0] == "export PATH=/pulsar/bin:$PATH" and script[-1] == f"sh -e {target.strip()}"


def test_setup_job_points_pulsar_admin_at_the_cluster_of_the_hosts() -> None:
    job = the("Job", "tghost-setup")
    (admin,) = pod(job)["containers"]
    conf = env(admin, "PULSAR_CLIENT_CONF")["value"]
    volume = mounted_from(job, admin, conf)["configMap"]
    data = the("ConfigMap", volume["name"])["data"]
    settings = dict(line.split("=", 1) for line in data[Path(conf).name].splitlines() if line)
    admin_host = re.match(r"https?://([^:/]+)", settings["webServiceUrl"])
    service_host = re.match(r"pulsar(?:\+ssl)?://([^:/]+)", data["TGHOST_PULSAR_URL"])
    assert admin_host and service_host and admin_host.group(1) == service_host.group(1)
    token = settings["authParams"].removeprefix("file://")
    assert "secret" in mounted_from(job, admin, token)


# -- the image --------------------------------------------------------------------------------------


def instruction(name: str) -> str:
    """The argument of the Dockerfile's last ``name`` instruction."""
    lines = [line.split(None, 1)[1] for line in DOCKERFILE.read_text().splitlines() if line.startswith(name + " ")]
    assert lines, f"no {name} in the Dockerfile"
    return lines[-1]


def test_image_entry_point_is_tghost_and_its_command_is_a_tghost_command() -> None:
    assert json.loads(instruction("ENTRYPOINT")) == ["tghost"]
    command = json.loads(instruction("CMD"))
    result = _tghost(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert instruction("USER") == "10001"


def test_image_installs_the_plugins_the_readme_sets_up() -> None:
    readme = (ROOT / "README.md").read_text()
    setup = re.search(r"pip install ((?:-e \S+ ?)+)", readme)
    assert setup is not None
    installed = re.findall(r"-e (\S+)", setup.group(1))
    default = re.search(r'^ARG PLUGINS="([^"]*)"', DOCKERFILE.read_text(), re.M)
    wheels = re.search(r"^RUN pip wheel .* (\S+) \$\{PLUGINS\}$", DOCKERFILE.read_text(), re.M)
    assert default is not None and wheels is not None
    assert installed == ["'.[mcp]'", *default.group(1).split()]  # tghost with its extras, as the README's
    assert wheels.group(1) == installed[0]
