"""answers: what one call accepts as its answers (docs/protocol.md §2.13). A caller that can
check its hosts' proofs takes a response, chunk, progress update or error only when a host of
the service proved it for this request and caller, and each proven message once; anything
else is dropped and counted. A message proven by a host the caller does not know yet (its
directory has not read that host's announcement) is held and checked again as it learns hosts.

Never talks to Pulsar: the client hands it each message that carries the call's ``id``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Collection, Mapping

from tghost.protocol import wire
from tghost.protocol.answers import HOST

__all__ = ["HELD_RECHECK", "MAX_HELD", "Answers", "Check"]

#: Seconds between checks of the messages held for hosts the caller does not know yet.
HELD_RECHECK = 0.25
#: Messages a call holds at most for hosts it does not know yet; more are dropped.
MAX_HELD = 16

#: Who proved a message (the host's fingerprint or signer key id), to which sending of the
#: request (its ``tghost-signed-at``) and its ``tghost-seq``; ``None``: nobody the caller trusts.
Check = Callable[[Mapping[str, str], bytes], "tuple[str, str, int] | None"]

#: A message as it arrived: its properties and payload, or what failed on the way.
Arrived = tuple[Mapping[str, str], bytes] | Exception


class Answers:
    """The messages that arrive for one call, in ``queue``, and which of them it accepts:
    all, without a ``check``; else the proven ones, each (prover, seq) once. ``known`` gives
    the fingerprints of the hosts the caller knows now: a message naming another is held (the
    newest :data:`MAX_HELD`), one naming a known host that does not verify is dropped."""

    def __init__(self, check: Check | None, known: Callable[[], Collection[str]] = frozenset) -> None:
        self.queue: asyncio.Queue[Arrived] = asyncio.Queue()
        self.check = check
        self.known = known
        self.sent: set[str] = set()
        """The ``tghost-signed-at`` of each sending of the request ("" when it is anonymous)."""
        self.dropped = 0
        self._seen: set[tuple[str, str, int]] = set()
        self._held: deque[tuple[Mapping[str, str], bytes]] = deque(maxlen=MAX_HELD)

    async def next(self) -> wire.Response | Exception:
        """The next accepted answer, decoded (one that does not decode is a ``bad-request``
        error), or the exception that ended the wait for one."""
        while True:
            for index, (properties, payload) in enumerate(self._held):
                if self._admits(properties, payload, holding=False):
                    del self._held[index]
                    return _decoded(payload)
            try:
                arrived = await (asyncio.wait_for(self.queue.get(), HELD_RECHECK) if self._held
                                 else self.queue.get())
            except TimeoutError:
                continue
            if isinstance(arrived, Exception):
                return arrived
            if self._admits(*arrived):
                return _decoded(arrived[1])

    def _admits(self, properties: Mapping[str, str], payload: bytes, holding: bool = True) -> bool:
        if self.check is None:
            return True
        proven = self.check(properties, payload)
        if proven is not None and proven not in self._seen:
            self._seen.add(proven)
            return True
        host = properties.get(HOST)
        if holding and proven is None and host and host not in self.known():
            if len(self._held) == MAX_HELD:
                self.dropped += 1  # the oldest goes
            self._held.append((properties, payload))  # perhaps a host the caller does not know yet
        elif holding:
            self.dropped += 1
        return False

    def close(self) -> int:
        """The call is over: how many messages it dropped (those still held included)."""
        self.dropped += len(self._held)
        self._held.clear()
        return self.dropped


def _decoded(payload: bytes) -> wire.Response:
    try:
        return wire.decode_response(payload)
    except wire.BadRequest as exc:
        return wire.Response("", True, {"type": wire.BAD_REQUEST, "message": str(exc)})
