"""trustgraph.sync: keep a TrustGraph workspace's ``tool-service/<id>`` and ``tool/<name>`` config
items in step with the live directory (``tghost trustgraph sync``). Level-triggered: every pass
reads the items, compares them with what the directory says and writes the difference.

Never writes or deletes an item it did not write (items carry the :data:`MARKER` key naming
their owner), and never leaves a tool item pointing at a tool-service item that is not there.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Literal

import pulsar.asyncio

from tghost.adapters.export import select_tools, trustgraph_config
from tghost.adapters.trustgraph.config_service import ConfigServiceClient, ConfigServiceError, ItemKey
from tghost.agent.directory import ToolDirectory
from tghost.system.tasks import cancel_and_wait

__all__ = ["MARKER", "TYPES", "ItemChange", "Plan", "TrustGraphSync", "desired_items", "plan", "summary"]

log = logging.getLogger(__name__)

#: The key in every item value the sync writes; its value is the sync's owner name. TrustGraph's
#: agent ignores keys it does not know, in tool-service and tool items alike.
MARKER = "tghost-sync"
#: The config types the sync manages, tool services first (a put writes them before their tools).
TYPES = ("tool-service", "tool")
#: Where TrustGraph 2.11 registers its workspaces: an item ``workspace/<name>`` in this reserved
#: workspace (written by its IAM service; its API gateway serves only the workspaces listed).
WORKSPACES = "__workspaces__"
#: Why a gone tool is deleted, by :class:`tghost.agent.directory.Change` kind.
_GONE = {"removed": "withdrawn", "expired": "expired"}


@dataclass(frozen=True)
class ItemChange:
    """One thing a pass did to an item: ``put`` (``reason`` ``added`` or ``updated``), ``delete``
    (``withdrawn``, ``expired``, ``no longer live``, ``not selected``, ``unused``) or ``skip``
    (``reason`` says why the item was left alone)."""

    action: Literal["put", "delete", "skip"]
    type: str
    key: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"action": self.action, "type": self.type, "key": self.key, "reason": self.reason}

    def __str__(self) -> str:
        return f"{self.action} {self.type}/{self.key} ({self.reason})"


@dataclass
class Plan:
    """What one pass writes: ``puts`` (item -> value), ``deletes``, and every change it makes or skips."""

    puts: dict[ItemKey, dict[str, Any]] = field(default_factory=dict)
    deletes: list[ItemKey] = field(default_factory=list)
    changes: list[ItemChange] = field(default_factory=list)


def desired_items(directory: ToolDirectory, owner: str, groups: Sequence[str] | None = None,
                  state: str | None = None) -> dict[ItemKey, dict[str, Any]]:
    """The items the live tools selected by ``groups``/``state`` (as ``tghost export`` selects
    them) should have: :func:`tghost.adapters.export.trustgraph_config`'s values, each marked with
    ``MARKER: owner``."""
    config = trustgraph_config(select_tools(directory, groups, state))
    return {(type, key): {**value, MARKER: owner} for type in TYPES for key, value in config[type].items()}


def _parse(value: str | None) -> dict[str, Any] | None:
    try:
        parsed = json.loads(value) if value is not None else None
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def plan(desired: Mapping[ItemKey, dict[str, Any]], current: Mapping[ItemKey, str | None], owner: str,
         gone_reason: Callable[[ItemKey], str] = lambda key: "no longer live") -> Plan:
    """The puts and deletes that bring ``current`` (item -> stored value string, as read) to
    ``desired`` without touching items ``owner`` does not own.

    - A desired item that is missing is put (``added``); one of ours that differs is put
      (``updated``); one that is not ours is skipped, and so are the tools over a skipped
      tool service, since theirs would name other queues.
    - A desired tool is skipped when its service lacks a required config param it needs
      (TrustGraph's agent would refuse its whole tool config, not just this tool).
    - An item of ours that is not desired is deleted (reason from ``gone_reason``), except a
      tool service that a tool we do not own still uses.
    """
    result = Plan()
    parsed = {key: _parse(value) for key, value in current.items() if value is not None}
    ours = {key for key, value in parsed.items() if value is not None and value.get(MARKER) == owner}
    blocked: set[str] = set()
    for key in sorted(desired, key=lambda k: TYPES.index(k[0])):
        value = desired[key]
        problem = _problem(key, value, desired, blocked)
        if key in parsed and key not in ours:
            problem = f"{key[0]}/{key[1]} exists and is not marked {MARKER}={owner!r}: left as it is"
        if problem is not None:
            if key[0] == "tool-service":
                blocked.add(key[1])
            result.changes.append(ItemChange("skip", *key, problem))
        elif key not in parsed or parsed[key] != value:
            result.puts[key] = value
            result.changes.append(ItemChange("put", *key, "added" if key not in parsed else "updated"))
    users = {v.get("service") for k, v in parsed.items() if k[0] == "tool" and k not in ours and v is not None}
    for key in sorted(ours - set(desired), key=lambda k: (-TYPES.index(k[0]), k[1])):
        if key[0] == "tool-service" and key[1] in users:
            result.changes.append(ItemChange("skip", *key, "unused by tghost, but a tool tghost does not own uses it"))
            continue
        result.deletes.append(key)
        result.changes.append(ItemChange("delete", *key, "unused" if key[0] == "tool-service" else gone_reason(key)))
    return result


def _problem(key: ItemKey, value: dict[str, Any], desired: Mapping[ItemKey, dict[str, Any]],
             blocked: set[str]) -> str | None:
    """Why a desired tool cannot be written as it is (see :func:`plan`), or ``None``."""
    if key[0] != "tool":
        return None
    service = value.get("service", "")
    if service in blocked:
        return f"its tool-service/{service} is not written by this sync"
    params = desired.get(("tool-service", service), {}).get("config-params", [])
    missing = [p["name"] for p in params if p.get("required") and p["name"] not in value]
    if missing:
        return f"lacks required config param(s) {missing} of service {service!r}"
    return None


@dataclass(eq=False)
class TrustGraphSync:
    """Keeps ``workspace``'s tool items in TrustGraph's config service in step with ``directory``.

    :meth:`sync_once` is one pass: read every ``tool-service`` and ``tool`` item (``list``,
    then ``get``), :func:`plan`, then ``put`` services before their tools and ``delete`` tools
    before their services, so that the agent never sees a tool whose service is missing (up to
    a few hundred items go in one request, so usually one push and one reload). Items carry
    ``MARKER: owner``; run one sync per owner name (two syncs with one owner and different
    directories undo each other).

    :meth:`run` passes again whenever the directory changes, a config push says a tool item
    of the workspace may have changed (an item deleted by hand is put back; a config service
    that restarted empty is filled again), and every ``resync_interval`` seconds. A pass that
    fails (the broker or the config service is away) is retried with back-off up to
    ``max_backoff`` seconds. ``on_change`` gets every :class:`ItemChange` a pass makes.
    """

    directory: ToolDirectory
    config: ConfigServiceClient
    workspace: str = "default"
    owner: str = "tghost"
    _: KW_ONLY
    groups: Sequence[str] | None = None
    state: str | None = None
    resync_interval: float = 60.0
    settle: float = 0.2
    max_backoff: float = 15.0
    on_change: Callable[[ItemChange], None] | None = None
    passes: int = field(default=0, init=False)
    """Passes that completed."""
    _gone: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    _skipped: set[ItemChange] = field(default_factory=set, init=False, repr=False)
    _workspace_checked: bool = field(default=False, init=False, repr=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)

    async def read(self) -> dict[ItemKey, str | None]:
        """Every ``tool-service`` and ``tool`` item of the workspace, item -> value string.

        Raises:
            TimeoutError, ConfigServiceError, pulsar.asyncio.PulsarException: see
                :meth:`ConfigServiceClient.request`.
        """
        keys = [(type, key) for type in TYPES for key in await self.config.list(self.workspace, type)]
        return await self.config.get(self.workspace, keys)

    async def sync_once(self) -> list[ItemChange]:
        """One pass; returns what it put and deleted, and every skip (a skip is logged only the
        first time it is seen). Raises as :meth:`read`."""
        if not self._workspace_checked:
            await self._check_workspace()
        desired = desired_items(self.directory, self.owner, self.groups, self.state)
        result = plan(desired, await self.read(), self.owner, self._gone_reason)
        await self.config.put(self.workspace, {key: json.dumps(value) for key, value in result.puts.items()})
        await self.config.delete(self.workspace, result.deletes)
        skipped = {c for c in result.changes if c.action == "skip"}
        for change in result.changes:
            if change.action == "skip" and change in self._skipped:
                continue
            (log.warning if change.action == "skip" else log.info)("%s in workspace %s", change, self.workspace)
            if self.on_change is not None:
                self.on_change(change)
        self._skipped = skipped
        for type, key in result.deletes:
            if type == "tool":
                self._gone.pop(key, None)
        self.passes += 1
        return result.changes

    async def _check_workspace(self) -> None:
        """Warn (once) when the workspace is not registered in TrustGraph: the items still reach
        its agents, which load every workspace's tools, but not its API gateway."""
        if self.workspace not in await self.config.list(WORKSPACES, "workspace"):
            log.warning("workspace %s is not registered in TrustGraph (no item workspace/%s in %s): its agents "
                        "load these items, but its API gateway and tg-* tools see registered workspaces only",
                        self.workspace, self.workspace, WORKSPACES)
        self._workspace_checked = True

    def _gone_reason(self, key: ItemKey) -> str:
        if key[1] in self.directory.tools:
            return "not selected by --group/--state"
        return self._gone.get(key[1], "no longer live")

    async def run(self, stop: asyncio.Event) -> None:
        """Pass now, then on every trigger (see the class docstring) until ``stop`` is set."""
        tasks = [asyncio.create_task(self._follow_directory(), name="sync: directory changes")]
        if self.config.push_topic is not None:
            tasks.append(asyncio.create_task(self._follow_pushes(), name="sync: config pushes"))
        failing: str | None = None
        backoff = 1.0
        self._wake.set()
        try:
            while not stop.is_set():
                if not await _wait_either(self._wake, stop, self.resync_interval):
                    self._wake.set()  # the periodic pass
                    continue
                await asyncio.sleep(self.settle)  # one pass for a burst (a plugin brings several tools)
                self._wake.clear()
                try:
                    await self.sync_once()
                except (TimeoutError, ConfigServiceError, pulsar.asyncio.PulsarException) as exc:
                    if str(exc) != failing:
                        log.warning("sync failed: %s; retrying (every %.0fs at most)", exc, self.max_backoff)
                        failing = str(exc)
                    await _wait_either(stop, stop, backoff)
                    backoff = min(backoff * 2, self.max_backoff)
                    self._wake.set()
                    continue
                if failing is not None:
                    log.info("TrustGraph's config service answers again: workspace %s is in step", self.workspace)
                    failing, backoff = None, 1.0
        finally:
            await cancel_and_wait(*tasks)

    async def _follow_directory(self) -> None:
        async for change in self.directory.changes():
            if change.kind in _GONE:
                self._gone[change.name] = _GONE[change.kind]
            else:
                self._gone.pop(change.name, None)
            self._wake.set()

    async def _follow_pushes(self) -> None:
        async for push in self.config.pushes():
            if push.touches(self.workspace, TYPES):
                self._wake.set()


async def _wait_either(event: asyncio.Event, stop: asyncio.Event, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``event`` or ``stop``; whether either is set."""
    waiters = [asyncio.ensure_future(e.wait()) for e in {event, stop}]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return event.is_set() or stop.is_set()


def summary(changes: Iterable[ItemChange]) -> dict[str, int]:
    """How many items ``changes`` put, deleted and skipped."""
    counts = {"put": 0, "delete": 0, "skip": 0}
    for change in changes:
        counts[change.action] += 1
    return counts
