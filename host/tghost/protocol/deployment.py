"""deployment: what an Apache Pulsar cluster must be told before tghost hosts announce and
serve on it (docs/protocol.md §4.10): the tenant, the announcement namespace with its retention,
compaction and inactive topic policies, the request and response namespaces, and who may produce
and consume on each.

Pulsar creates topics on first use but never tenants or namespaces (apache/pulsar#23696), so
they are created first, and only when missing: what :func:`admin_commands` prints is safe to run
twice. The figures and names come from the protocol's own constants, so the docs, this code
and a set-up job cannot drift apart.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from tghost.protocol.epochs import DEFAULT_TOPIC, EPOCH_SECONDS, RESTATEMENT_MARGIN

__all__ = ["DEFAULT_NAMESPACE", "GRANTS", "REQUEST_NAMESPACE", "RESPONSE_NAMESPACE", "Policies", "admin_commands",
           "check_role", "grants", "namespace_of", "rest_calls"]

#: The clock skew a directory allows by default (seconds; docs/protocol.md §4.6).
_DEFAULT_SKEW = 60.0
_NAMESPACE = re.compile(r"[A-Za-z0-9_.=:-]+/[A-Za-z0-9_.=:-]+")
_ROLE = re.compile(r"[A-Za-z0-9_.@=:-]+")


def namespace_of(topic: str) -> str:
    """The ``tenant/namespace`` of a full topic name, e.g. ``tg/config`` of
    ``persistent://tg/config/tool-descriptors``.

    Raises:
        ValueError: ``topic`` is not ``<scheme>://<tenant>/<namespace>/<name>``.
    """
    parts = topic.split("://", 1)[-1].split("/")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"{topic!r} is not a full topic name (persistent://tenant/namespace/name)")
    return f"{parts[0]}/{parts[1]}"


#: The namespace of the default announcement topic: ``tg/config``.
DEFAULT_NAMESPACE = namespace_of(DEFAULT_TOPIC)
#: The namespace of the services' request topics, their control and replay topics (seed 000), as
#: :func:`tghost.protocol.descriptors.request_queue` names them.
REQUEST_NAMESPACE = "tg/request"
#: The namespace of the services' response topics (seed 000), as
#: :func:`tghost.protocol.descriptors.response_queue` names them.
RESPONSE_NAMESPACE = "tg/response"

#: What each role needs on each namespace, by ``config``, ``request`` and ``response``: hosts
#: announce and read announcements, take requests, cancels and probes, mark replays, and answer;
#: agents read announcements, send requests, cancels and probes, and read answers.
GRANTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("config", "host", ("produce", "consume")), ("config", "agent", ("consume",)),
    ("request", "host", ("produce", "consume")), ("request", "agent", ("produce",)),
    ("response", "host", ("produce",)), ("response", "agent", ("consume",)),
)


@dataclass(frozen=True)
class Policies:
    """The namespace policies of docs/protocol.md §4.10.

    ``retention_minutes`` must cover an epoch, the clock skew and a restatement (``E + S + M``,
    7 minutes with the defaults); an hour leaves room. ``retention_mb`` bounds it by size,
    ``compaction_bytes`` is the backlog that triggers compaction, and ``inactive_seconds`` how
    long an old epoch's topic stays once nobody writes to it or reads it.
    """

    namespace: str = DEFAULT_NAMESPACE
    request_namespace: str = REQUEST_NAMESPACE
    response_namespace: str = RESPONSE_NAMESPACE
    cluster: str | None = None
    """The cluster a new tenant may use (``None``: pulsar-admin's default, every cluster)."""
    retention_minutes: int = 60
    retention_mb: int = 1024
    compaction_bytes: int = 1024 * 1024
    inactive_seconds: int = 2 * 3600

    def __post_init__(self) -> None:
        floor = (EPOCH_SECONDS + _DEFAULT_SKEW + RESTATEMENT_MARGIN) / 60
        if self.retention_minutes < floor:
            raise ValueError(f"retention of {self.retention_minutes} minutes is under the {floor:g} minutes a "
                             "directory may need to read back (docs/protocol.md §4.10)")
        for namespace in self.namespaces.values():
            if not _NAMESPACE.fullmatch(namespace):
                raise ValueError(f"{namespace!r} is not TENANT/NAMESPACE (e.g. {DEFAULT_NAMESPACE})")
        if self.cluster is not None:
            check_role(self.cluster)

    @property
    def namespaces(self) -> dict[str, str]:
        """``config``, ``request`` and ``response`` -> its ``tenant/namespace``."""
        return {"config": self.namespace, "request": self.request_namespace, "response": self.response_namespace}

    @property
    def tenants(self) -> list[str]:
        """The tenants of the namespaces, each once, in order."""
        return list(dict.fromkeys(namespace.split("/")[0] for namespace in self.namespaces.values()))


def grants(policies: Policies, host_role: str, agent_role: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """(namespace, role, actions) of :data:`GRANTS` for these namespaces and roles."""
    roles = {"host": host_role, "agent": agent_role}
    return [(policies.namespaces[kind], roles[role], actions) for kind, role, actions in GRANTS]


def check_role(role: str) -> str:
    """``role`` (or a cluster name), if it is a Pulsar role name that a shell line can carry as it is.

    Raises:
        ValueError: it has characters other than letters, digits and ``_ . @ = : -``.
    """
    if not _ROLE.fullmatch(role):
        raise ValueError(f"{role!r} is not a role name (letters, digits and _ . @ = : - only)")
    return role


def admin_commands(policies: Policies, host_role: str, agent_role: str) -> list[str]:
    """The ``pulsar-admin`` commands that set ``policies`` up, one shell line each, safe to run twice."""
    ns = policies.namespace
    clusters = f" --allowed-clusters {policies.cluster}" if policies.cluster else ""
    return [
        *(f"pulsar-admin tenants list | grep -qx {tenant} || pulsar-admin tenants create {tenant}{clusters}"
          for tenant in policies.tenants),
        *(f"pulsar-admin namespaces list {name.split('/')[0]} | grep -qx {name} || "
          f"pulsar-admin namespaces create {name}" for name in dict.fromkeys(policies.namespaces.values())),
        f"pulsar-admin namespaces set-retention {ns} --time {_minutes(policies.retention_minutes)} "
        f"--size {_megabytes(policies.retention_mb)}",
        f"pulsar-admin namespaces set-compaction-threshold {ns} --threshold {_bytes(policies.compaction_bytes)}",
        f"pulsar-admin namespaces set-inactive-topic-policies {ns} --enable-delete-while-inactive "
        f"--max-inactive-duration {_seconds(policies.inactive_seconds)} --delete-mode delete_when_no_subscriptions",
        *(f"pulsar-admin namespaces grant-permission {name} --role {role} --actions {','.join(actions)}"
          for name, role, actions in grants(policies, host_role, agent_role)),
    ]


def rest_calls(policies: Policies, host_role: str, agent_role: str) -> list[str]:
    """The same as admin REST calls (Pulsar's ``/admin/v2`` API), one ``METHOD PATH [JSON body]``
    each. Creating a tenant or namespace that exists answers 409, which a set-up job may ignore."""
    base = f"/admin/v2/namespaces/{policies.namespace}"
    tenant = json.dumps({"adminRoles": [], "allowedClusters": [policies.cluster or "<cluster>"]})
    inactive = {"inactiveTopicDeleteMode": "delete_when_no_subscriptions",
                "maxInactiveDurationSeconds": policies.inactive_seconds, "deleteWhileInactive": True}
    return [
        *(f"PUT /admin/v2/tenants/{name} {tenant}" for name in policies.tenants),
        *(f"PUT /admin/v2/namespaces/{name}" for name in dict.fromkeys(policies.namespaces.values())),
        f"POST {base}/retention " + json.dumps({"retentionTimeInMinutes": policies.retention_minutes,
                                                "retentionSizeInMB": policies.retention_mb}),
        f"PUT {base}/compactionThreshold {policies.compaction_bytes}",
        f"POST {base}/inactiveTopicPolicies {json.dumps(inactive)}",
        *(f"POST /admin/v2/namespaces/{name}/permissions/{role} {json.dumps(list(actions))}"
          for name, role, actions in grants(policies, host_role, agent_role)),
    ]


def _minutes(minutes: int) -> str:
    return f"{minutes // 60}h" if minutes % 60 == 0 else f"{minutes}m"


def _seconds(seconds: int) -> str:
    return f"{seconds // 3600}h" if seconds % 3600 == 0 else f"{seconds}s"


def _megabytes(mb: int) -> str:
    return f"{mb // 1024}G" if mb % 1024 == 0 else f"{mb}M"


def _bytes(size: int) -> str:
    return f"{size // 2**20}M" if size % 2**20 == 0 else str(size)
