"""contest: does another host claim a tool this host announces? A host reads its own
announcement topics with a :class:`tghost.agent.directory.ToolDirectory` and names every tool
of its own that is contested (docs/protocol.md §4.8): in open mode directories refuse to call
it, so its operator must know; every one a provider announces with another descriptor
(drift): directories apply only one of them; and every service of its own served under
different access policies (:mod:`tghost.operate.policies`). Never changes what the host serves
or announces: the same directory tells its fleet check what the other providers announce.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection

from tghost.agent.directory import ToolDirectory
from tghost.announcing.announcer import Announcer
from tghost.operate.policies import mismatch_problems
from tghost.protocol.trust import TrustedKeys
from tghost.pulsar.clients import BrokerError, PulsarSettings

__all__ = ["ContestWatch"]

log = logging.getLogger(__name__)


class ContestWatch:
    """Follows the announcement ``topic`` and reports the tools in ``names()`` (those the host
    ``host_id`` announces, asked at each :meth:`problems`) whose name or service another host
    claims differently, or announces with another descriptor.

    :meth:`start` it (or await :meth:`catch_up`), :meth:`close` it; :meth:`problems` is empty
    until it has caught up.
    """

    def __init__(self, settings: PulsarSettings, topic: str, host_id: str, names: Callable[[], Collection[str]],
                 trusted: TrustedKeys | None = None) -> None:
        self.directory = ToolDirectory(settings, topic, trusted=trusted)
        self.host_id = host_id
        self.names = names
        self._task: asyncio.Task[None] | None = None

    def start(self) -> ContestWatch:
        """Catch up on the topic and follow it, in the background (call on the event loop); a
        topic that cannot be read is logged once, as a warning."""
        self._task = asyncio.create_task(self._follow(), name="contest watch")
        return self

    async def catch_up(self) -> bool:
        """Catch up on the topic, then follow it in the background (call on the event loop);
        ``False`` (logged as a warning) when the topic cannot be read."""
        try:
            await self.directory.start()
        except BrokerError as exc:
            log.warning("cannot follow the announcement topics, so this host cannot tell which tools other hosts "
                        "contest nor apply their [access] policies to the services it shares with them: %s", exc)
            return False
        return True

    async def _follow(self) -> None:
        await self.catch_up()

    @classmethod
    def of(cls, announcer: Announcer, settings: PulsarSettings, names: Callable[[], Collection[str]]) -> ContestWatch:
        """A watch over what ``announcer`` announces: its topic and host id, in open mode (every
        host's word counts: another provider's access policy can only make this host refuse more,
        never admit more; docs/protocol.md §2.8)."""
        return cls(settings, announcer.topic, announcer.identity.id, names)

    async def close(self) -> None:
        """Stop following. Idempotent; never raises (errors are logged at debug level)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await self.directory.close()
        except Exception as exc:
            log.debug("could not close the contest watch's directory: %r", exc)

    def problems(self) -> list[str]:
        """One line per contested tool of this host, naming the other side, one per tool that a
        provider announces with another descriptor (drift), and one per service of this host
        served under different access policies: ``/health`` problems."""
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
        return found + mismatch_problems(self.directory, self.host_id)
