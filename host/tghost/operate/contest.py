"""contest: does another host claim a tool this host announces? A host reads its own
announcement topics with a :class:`tghost.agent.directory.ToolDirectory` and names every tool
of its own that is contested (docs/protocol.md §4.8): in open mode directories refuse to call
it, so its operator must know; every one a provider announces with another descriptor
(drift): directories apply only one of them; and every service of its own served under
different access policies (:mod:`tghost.operate.policies`) or from other code (skew). Once
caught up, it says whether another host on this machine already serves some of the same
services. Never changes what the host serves or announces: the same directory tells its fleet
check what the other providers announce.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from datetime import datetime

from tghost.agent.directory import ToolDirectory
from tghost.agent.entries import describe_skew
from tghost.agent.ledger import InstanceView
from tghost.announcing.announcer import Announcer, HostIdentity
from tghost.operate.policies import mismatch_problems
from tghost.protocol.trust import TrustedKeys
from tghost.pulsar.clients import BrokerError, PulsarSettings
from tghost.system.tasks import cancel_and_wait

__all__ = ["ContestWatch"]

log = logging.getLogger(__name__)


class ContestWatch:
    """Follows the announcement ``topic`` and reports the tools in ``names()`` (those the host
    ``host_id`` announces, asked at each :meth:`problems`) whose name or service another host
    claims differently, or announces with another descriptor.

    With ``identity`` (this host's) and ``services`` (the ids it serves), once caught up it logs
    every other live host on this machine (the same ``hostname``) that serves some of them
    (:meth:`neighbours`). :meth:`start` it (or await :meth:`catch_up`), :meth:`close` it;
    :meth:`problems` is empty until it has caught up.
    """

    def __init__(self, settings: PulsarSettings, topic: str, host_id: str, names: Callable[[], Collection[str]],
                 trusted: TrustedKeys | None = None, *, identity: HostIdentity | None = None,
                 services: Callable[[], Collection[str]] = tuple) -> None:
        self.directory = ToolDirectory(settings, topic, trusted=trusted)
        self.host_id = host_id
        self.names = names
        self.identity = identity
        self.services = services
        self._task: asyncio.Task[None] | None = None

    def start(self) -> ContestWatch:
        """Catch up on the topic and follow it, in the background (call on the event loop); a
        topic that cannot be read is logged once, as a warning."""
        self._task = asyncio.create_task(self._follow(), name="contest watch")
        return self

    async def catch_up(self) -> bool:
        """Catch up on the topic, then follow it in the background (call on the event loop), and
        log :meth:`neighbours`; ``False`` (logged as a warning) when the topic cannot be read."""
        try:
            await self.directory.start()
        except BrokerError as exc:
            log.warning("cannot follow the announcement topics, so this host cannot tell which tools other hosts "
                        "contest nor apply their [access] policies to the services it shares with them: %s", exc)
            return False
        for line in self.neighbours():
            log.warning("%s", line)
        return True

    async def _follow(self) -> None:
        await self.catch_up()

    @classmethod
    def of(cls, announcer: Announcer, settings: PulsarSettings, names: Callable[[], Collection[str]],
           trusted: TrustedKeys | None = None) -> ContestWatch:
        """A watch over what ``announcer`` announces: its topic and host id, believing the hosts
        that ``trusted`` keys signed for (``None``: open mode, every host's word counts, and
        whoever may publish on the topics can also forge a peer's policy away: docs/protocol.md
        §2.8; give the keys of every host of the fleet, this one's own included)."""
        return cls(settings, announcer.topic, announcer.identity.id, names, trusted, identity=announcer.identity,
                   services=lambda: announcer.catalog.descriptors.keys())

    async def close(self) -> None:
        """Stop following. Idempotent; never raises (errors are logged at debug level)."""
        await cancel_and_wait(self._task)
        try:
            await self.directory.close()
        except Exception as exc:
            log.debug("could not close the contest watch's directory: %r", exc)

    def neighbours(self) -> list[str]:
        """One line per other live host on this machine (the ``hostname`` of :attr:`identity`)
        that announces some of :attr:`services`: its host id, pid, start time and working
        directory, and that calls to those services are shared between the two hosts."""
        if self.identity is None:
            return []
        mine = set(self.services())
        found = []
        for view in self.directory.ledger.instances():
            host = view.host
            if (view.state != "active" or host.get("hostname") != self.identity.hostname
                    or host.get("instance") == self.identity.instance):
                continue
            shared = sorted(mine & {name for kind, name, live in view.entries if kind == "tool-service" and live})
            if shared:
                found.append(f"another host on this machine already serves {', '.join(shared)}: {_who(view)}. Calls "
                             "to them are shared between the two hosts (each goes to one of them); stop one of them "
                             "unless that is what you want")
        return found

    def problems(self) -> list[str]:
        """One line per contested tool of this host, naming the other side, one per tool that a
        provider announces with another descriptor (drift), one per service of this host
        served under different access policies, and one per service of this host whose hosts
        serve other code (skew): ``/health`` problems."""
        return self._contests() + mismatch_problems(self.directory, self.host_id) + self._skews()

    def _skews(self) -> list[str]:
        """One line per service this host provides whose providers serve different code."""
        return [describe_skew(sid, entry.skew) for sid, entry in sorted(self.directory.services.items())
                if entry.skew and any(p.host.get("id") == self.host_id for p in entry.providers)]

    def _contests(self) -> list[str]:
        found = []
        for name in sorted(self.names()):
            tool = self.directory.tools.get(name)
            if tool is None:
                continue
            if tool.contested:
                others = "; ".join(side.describe() for side in tool.sides() if self.host_id not in side.host.split(","))
                found.append(f"tool {name!r} is contested by {others}: directories without trusted keys refuse to "
                             "call it until that host stops announcing it; sign announcements on a shared broker")
            if tool.drifted:
                sides = "; ".join(side.describe() for side in (*tool.drift, *tool.service.drift))
                found.append(f"tool {name!r} has drifted: {sides}. Directories apply the descriptor they saw first "
                             "while its host is live; expected during a rolling upgrade, otherwise stop that host "
                             "(or sign announcements on a shared broker)")
        return found


def _who(view: InstanceView) -> str:
    """``host h (pid 4242, started 2026-02-13 10:12:05, in /home/me/work)``: what it announces of these."""
    host, facts = view.host, []
    if host.get("pid"):
        facts.append(f"pid {host['pid']}")
    if view.since is not None:
        facts.append(f"started {datetime.fromtimestamp(view.since).isoformat(sep=' ', timespec='seconds')}")
    if host.get("cwd"):
        facts.append(f"in {host['cwd']}")
    return f"host {host.get('id')}" + (f" ({', '.join(facts)})" if facts else "")
