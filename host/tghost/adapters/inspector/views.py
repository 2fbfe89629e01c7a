"""views: the live directory as the JSON the inspector's page draws. Pure functions of a started
:class:`~tghost.agent.directory.ToolDirectory`: never talks to Pulsar.
"""

from __future__ import annotations

from typing import Any

from tghost.agent.directory import DirectoryTool, ToolDirectory
from tghost.agent.hosts import late_hosts

__all__ = ["hosts_view", "snapshot", "tool_view"]


def tool_view(tool: DirectoryTool, admitted: bool) -> dict[str, Any]:
    """One tool: its JSON (:meth:`tghost.agent.entries.DirectoryTool.to_json`, as ``tghost tools
    --json`` gives it; the form is drawn from its ``input-schema``), plus ``plugins`` (each
    provider's host id and plugin name and version) and ``admitted`` (whether the directory's
    identity may call it)."""
    return {**tool.to_json(), "admitted": admitted,
            "plugins": [{"host": p.host.get("id"), "plugin": (p.plugin or {}).get("name"),
                         "version": (p.plugin or {}).get("version")} for p in tool.providers]}


def hosts_view(directory: ToolDirectory, now: float) -> dict[str, Any]:
    """What changes without an announcement changing a tool: ``now`` (the server's unix time,
    seconds, so the page counts leases down on its own clock), ``hosts`` (every host instance the
    directory remembers: :meth:`tghost.agent.ledger.InstanceView.to_json`), ``conflicts`` (tool
    name or ``tool-service/<id>`` -> the losing claims), ``clashes`` (host id -> the instances that
    share it), ``rejections`` (announcements not applied, by reason), ``refusals`` (calls
    refused before sending, by reason) and ``late`` (host id -> when it was last heard, for each
    late host: :func:`tghost.agent.hosts.late_hosts`)."""
    return {
        "now": now,
        "hosts": [instance.to_json() for instance in directory.ledger.instances()],
        "conflicts": {name: list(losers) for name, losers in directory.conflicts.items()},
        "clashes": {host: list(instances) for host, instances in directory.ledger.clashes.items()},
        "rejections": dict(directory.rejections),
        "refusals": dict(directory.calls.refusals),
        "late": late_hosts(directory, now),
    }


def snapshot(directory: ToolDirectory, now: float) -> dict[str, Any]:
    """Everything the page shows, as JSON: :func:`hosts_view`, plus ``topic``, ``trusted``
    (announcements are checked against trusted keys), ``identity`` (the caller key id calls are
    made with, or ``null``) and ``tools`` (:func:`tool_view`, by name)."""
    return {
        **hosts_view(directory, now),
        "topic": directory.topic,
        "trusted": directory.trusted is not None,
        "identity": directory.identity.key_id if directory.identity else None,
        "tools": [tool_view(tool, directory.calls.admits(tool)) for _, tool in sorted(directory.tools.items())],
    }
