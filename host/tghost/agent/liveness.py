"""liveness: whether a call that is slow to answer still has a live host (docs/protocol.md §2.15).

A call that hears nothing of its request for :data:`PROBE_AFTER` seconds sends a liveness
probe on its service's control topic, and every live host of the service answers it on the
response topic. While some host answers, the call waits on, probing less and less often; when
:data:`PROBE_TRIES` probes in a row go unanswered, the call ends (:class:`Silent`) long before
its timeout: its hosts stopped without withdrawing (killed, or cut off from the broker). A call
that hears from its request (a chunk, a progress update, the answer) sends no probe at all.
When live hosts answer and none holds the request, the client may find it was lost at a
draining host's unsubscribe and send it again (``orphaned``).

Never talks to Pulsar: the client sends the probes a :class:`Watch` asks for and hands it the
answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping

from tghost.protocol import wire

__all__ = ["NO_PROVIDER", "PROBE_AFTER", "PROBE_EVERY", "PROBE_TRIES", "PROBE_WAIT", "Silent", "Watch"]

#: The error type of a call whose hosts are gone: no live host serves it (also a refusal before
#: sending, :class:`tghost.agent.calls.NoProvider`).
NO_PROVIDER = "no-provider"
#: Seconds a call hears nothing of its request before it probes its hosts.
PROBE_AFTER = 1.0
#: Seconds a probe waits for any host's answer.
PROBE_WAIT = 1.0
#: Probes in a row that no host answers before the call ends: one lost probe is not a dead host.
PROBE_TRIES = 2
#: Most seconds between two probes while hosts answer (the wait doubles from :data:`PROBE_AFTER`).
PROBE_EVERY = 15.0


class Silent(Exception):
    """No host of the service answered :data:`PROBE_TRIES` liveness probes in a row; ``waited``
    is the seconds the last probes waited in all."""

    def __init__(self, waited: float) -> None:
        super().__init__(f"no host of the service answered {PROBE_TRIES} liveness probes within {waited:g}s")
        self.waited = waited


class Watch:
    """The liveness probes of one call. ``send(probe_id)`` sends a probe with that ``id``.

    The client calls :meth:`heard` when the call gets a message, :meth:`silent` when it heard
    nothing for the seconds the last call returned, and :meth:`answer` for each answer to one of
    :attr:`probes`. ``orphaned(serving)``, when given, is asked once a probe was answered and
    no host holds the request, with how many of the hosts that answered it are not stopping
    (:data:`~tghost.protocol.wire.DRAINING`): it sends the request again and says so, or says
    not; once it did, it is not asked again."""

    def __init__(self, send: Callable[[str], None], orphaned: Callable[[int], bool] | None = None) -> None:
        self._send = send
        self._orphaned = orphaned
        self.probes: list[str] = []
        """The ids of every probe sent for the call."""
        self.answers = 0
        """Answers to the call's probes, from any host."""
        self.held = False
        """Whether a host answered that it holds the request (waiting or running)."""
        self.resent = False
        """Whether ``orphaned`` sent the request again."""
        self._out = False  # a probe is out, waiting for answers
        self._answered = False  # a host answered since the last probe went out
        self._serving = 0  # answers to the last probe from hosts that are not stopping
        self._holding = False  # a host answered the last probe that it holds the request
        self._misses = 0
        self._interval = PROBE_AFTER

    def heard(self) -> float:
        """The call heard from its request: its hosts live. Seconds to wait before a probe."""
        self._out, self._misses, self._interval = False, 0, PROBE_AFTER
        return PROBE_AFTER

    def answer(self, properties: Mapping[str, str]) -> None:
        """A host answered one of the call's probes (its properties: :data:`~tghost.protocol.wire.HOLDS`)."""
        self.answers += 1
        holds = properties.get(wire.HOLDS) == "1"
        self.held = self.held or holds
        self._answered = True
        if self.probes and properties.get("id") == self.probes[-1]:
            self._holding = self._holding or holds
            self._serving += properties.get(wire.DRAINING) != "1"

    def silent(self) -> float:
        """The call heard nothing for the last wait: probe if due. Seconds to wait next.

        Raises:
            Silent: the last :data:`PROBE_TRIES` probes went unanswered.
        """
        if self._out and self._answered:  # a host lives: rest longer each time, then probe again
            self._out, self._misses = False, 0
            if not self._holding and self._orphaned is not None and self._orphaned(self._serving):
                self._orphaned, self.resent = None, True
                return self.heard()  # sent again: wait for it as for a new call
            self._interval = min(2 * self._interval, PROBE_EVERY)
            return self._interval
        if self._out:
            self._misses += 1
            if self._misses >= PROBE_TRIES:
                raise Silent(PROBE_TRIES * PROBE_WAIT)
        self.probes.append(probe := uuid.uuid4().hex)
        self._out, self._answered, self._serving, self._holding = True, False, 0, False
        self._send(probe)
        return PROBE_WAIT

    def told(self) -> str:
        """What the probes found, for a timeout's message ("" when none was sent)."""
        if not self.probes:
            return ""
        if self.held:
            return "; a host answered a liveness probe holding the call: the tool is slow, give it a longer timeout"
        if self.answers:
            return ("; its hosts answered liveness probes, but none holds the call: the host that took it may have "
                    "stopped with it")
        return ""
