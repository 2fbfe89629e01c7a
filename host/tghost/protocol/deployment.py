"""deployment: what an Apache Pulsar cluster must be told before tghost hosts announce on it
(docs/protocol.md §4.10): the announcement namespace, its retention, compaction and inactive
topic policies, and who may produce and consume there.

Pulsar creates topics on first use but never namespaces (apache/pulsar#23696), so the namespace
is created first, and only when it is missing: what :func:`admin_commands` prints is safe to run
twice. The figures come from the announcement protocol's own constants, so the docs, this code
and a set-up job cannot drift apart.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from tghost.protocol.epochs import DEFAULT_TOPIC, EPOCH_SECONDS, RESTATEMENT_MARGIN

__all__ = ["DEFAULT_NAMESPACE", "Policies", "admin_commands", "check_role", "namespace_of", "rest_calls"]

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


@dataclass(frozen=True)
class Policies:
    """The namespace policies of docs/protocol.md §4.10.

    ``retention_minutes`` must cover an epoch, the clock skew and a restatement (``E + S + M``,
    7 minutes with the defaults); an hour leaves room. ``retention_mb`` bounds it by size,
    ``compaction_bytes`` is the backlog that triggers compaction, and ``inactive_seconds`` how
    long an old epoch's topic stays once nobody writes to it or reads it.
    """

    namespace: str = DEFAULT_NAMESPACE
    retention_minutes: int = 60
    retention_mb: int = 1024
    compaction_bytes: int = 1024 * 1024
    inactive_seconds: int = 2 * 3600

    def __post_init__(self) -> None:
        floor = (EPOCH_SECONDS + _DEFAULT_SKEW + RESTATEMENT_MARGIN) / 60
        if self.retention_minutes < floor:
            raise ValueError(f"retention of {self.retention_minutes} minutes is under the {floor:g} minutes a "
                             "directory may need to read back (docs/protocol.md §4.10)")
        if not _NAMESPACE.fullmatch(self.namespace):
            raise ValueError(f"{self.namespace!r} is not TENANT/NAMESPACE (e.g. {DEFAULT_NAMESPACE})")


def check_role(role: str) -> str:
    """``role``, if it is a Pulsar role name that a shell line can carry as it is.

    Raises:
        ValueError: it has characters other than letters, digits and ``_ . @ = : -``.
    """
    if not _ROLE.fullmatch(role):
        raise ValueError(f"{role!r} is not a role name (letters, digits and _ . @ = : - only)")
    return role


def admin_commands(policies: Policies, host_role: str, agent_role: str) -> list[str]:
    """The ``pulsar-admin`` commands that set ``policies`` up, one shell line each, safe to run twice."""
    ns, tenant = policies.namespace, policies.namespace.split("/")[0]
    return [
        f"pulsar-admin namespaces list {tenant} | grep -qx {ns} || pulsar-admin namespaces create {ns}",
        f"pulsar-admin namespaces set-retention {ns} --time {_minutes(policies.retention_minutes)} "
        f"--size {_megabytes(policies.retention_mb)}",
        f"pulsar-admin namespaces set-compaction-threshold {ns} --threshold {_bytes(policies.compaction_bytes)}",
        f"pulsar-admin namespaces set-inactive-topic-policies {ns} --enable-delete-while-inactive "
        f"--max-inactive-duration {_seconds(policies.inactive_seconds)} --delete-mode delete_when_no_subscriptions",
        f"pulsar-admin namespaces grant-permission {ns} --role {host_role} --actions produce,consume",
        f"pulsar-admin namespaces grant-permission {ns} --role {agent_role} --actions consume",
    ]


def rest_calls(policies: Policies, host_role: str, agent_role: str) -> list[str]:
    """The same as admin REST calls (Pulsar's ``/admin/v2`` API), one ``METHOD PATH [JSON body]``
    each. Creating a namespace that exists answers 409, which a set-up job may ignore."""
    base = f"/admin/v2/namespaces/{policies.namespace}"
    inactive = {"inactiveTopicDeleteMode": "delete_when_no_subscriptions",
                "maxInactiveDurationSeconds": policies.inactive_seconds, "deleteWhileInactive": True}
    return [
        f"PUT {base}",
        f"POST {base}/retention " + json.dumps({"retentionTimeInMinutes": policies.retention_minutes,
                                                "retentionSizeInMB": policies.retention_mb}),
        f"PUT {base}/compactionThreshold {policies.compaction_bytes}",
        f"POST {base}/inactiveTopicPolicies {json.dumps(inactive)}",
        f"POST {base}/permissions/{host_role} " + json.dumps(["produce", "consume"]),
        f"POST {base}/permissions/{agent_role} " + json.dumps(["consume"]),
    ]


def _minutes(minutes: int) -> str:
    return f"{minutes // 60}h" if minutes % 60 == 0 else f"{minutes}m"


def _seconds(seconds: int) -> str:
    return f"{seconds // 3600}h" if seconds % 3600 == 0 else f"{seconds}s"


def _megabytes(mb: int) -> str:
    return f"{mb // 1024}G" if mb % 1024 == 0 else f"{mb}M"


def _bytes(size: int) -> str:
    return f"{size // 2**20}M" if size % 2**20 == 0 else str(size)
