"""ledger: expiring from the heap of lease ends does exactly what walking every host instance
did. Random sequences of announcements (heartbeats, restatements, withdrawals; late, early and
replayed), clock advances, expiries at any time (also earlier than the last one) and resumed
leases go to two ledgers: the real one and one whose ``expire`` is the old walk. After every
step their results, claims, instances, clashes and logged expiries are the same."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any
from unittest import mock

from hypothesis import example, given, settings
from hypothesis import strategies as st

import tghost
import tghost.agent.ledger as ledger_module
from tghost.agent.ledger import Key, Ledger, log
from tghost.announcing.announcer import Announcer, HostIdentity
from tghost.discovery.discover import catalog_of

START = 1_700_000_000.0
SKEW = 10.0


@tghost.tool
async def count(text: str) -> int:
    """Count characters."""
    return len(text)


@tghost.tool
async def shout(text: str) -> str:
    """Shout the text."""
    return text.upper()


class WalkingLedger(Ledger):
    """The reference: ``expire`` as it was before the heap, a walk over every instance."""

    def expire(self, now: float) -> set[Key]:
        dirty: set[Key] = set()
        for ref, state in list(self._instances.items()):
            if state.lease_end >= now:
                continue
            if not state.expired:
                if state.active:
                    log.info("host %s (instance %s): lease expired", *ref)
                state.expired = True
                dirty |= self._sync(ref, state, set(state.entries))
            if state.lease_end < now - 2 * self.max_clock_skew:
                dirty |= set(state.entries)
                self._forget(ref)
        self._settle_clashes()
        return dirty


class Logged(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def take(self) -> list[str]:
        lines, self.lines = sorted(self.lines), []
        return lines


@contextmanager
def logged() -> Iterator[Logged]:
    handler, level = Logged(), log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def snapshot(ledger: Ledger) -> dict[str, Any]:
    """Everything a ledger's readers can see, and what its indexes give. The hosts index of
    each entry is a superset that ``remembered`` cleans as it goes, so only what it gives is
    compared; that it holds every host holding the entry is checked."""
    held = {(key, host_id) for (host_id, _), state in ledger._instances.items() for key, entry in state.entries.items()
            if entry.descriptor is not None}
    assert all(host_id in ledger._holders.get(key, ()) for key, host_id in held)
    return {"claims": ledger.claims, "instances": ledger.instances(), "clashes": ledger.clashes,
            "hosts": ledger.hosts, "host_instances": dict(ledger._host_instances), "seen": dict(ledger._seen),
            "remembered": {key: ledger.remembered(key) for key, _ in held}}


HOSTS, INSTANCES = 2, 3
#: Seconds before (or after) the clock that a message was sent or published: mostly just now.
offsets = st.sampled_from([0.0, 0.0, -0.5, -2.0, -8.0, -25.0]) | st.floats(-80, 5)
sends = st.tuples(st.just("send"), st.integers(0, HOSTS - 1), st.integers(0, INSTANCES - 1),
                  st.sampled_from(["heartbeat", "heartbeat", "everything", "withdraw", "tool"]),
                  offsets, st.one_of(st.just(None), offsets))
steps = st.one_of(
    sends,
    st.tuples(st.just("advance"), st.sampled_from([1.0, 4.0, 10.0, 30.0]) | st.floats(0, 60)),
    st.tuples(st.just("expire"), st.sampled_from([0.0, 0.0, 3.0, -10.0]) | st.floats(-40, 5)),  # may go back
    st.tuples(st.just("resume"), st.floats(0, 60)),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(steps, max_size=40), st.sampled_from([3.0, 30.0]))
@example([("send", 0, 0, "everything", 0.0, None), ("advance", 5.0), ("expire", 0.0),  # expired, then heard
          ("send", 0, 0, "heartbeat", 0.0, None), ("advance", 5.0), ("expire", 0.0)], 3.0)  # again in time
@example([("send", 0, 0, "everything", 0.0, None), ("advance", 2.0), ("send", 0, 0, "heartbeat", 0.0, None),
          ("advance", 2.5), ("expire", 0.0), ("advance", 1.0), ("expire", 0.0)], 3.0)  # renewed: just not expired
@example([("send", 0, 0, "everything", 0.0, None), ("send", 0, 1, "heartbeat", 0.0, None), ("advance", 1.0),
          ("send", 0, 0, "heartbeat", 0.0, None), ("advance", 2.5), ("expire", 0.0)], 3.0)  # a clash ends
def test_expiring_from_the_heap_matches_walking_every_instance(script: list[tuple[Any, ...]], lease: float) -> None:
    clock = [START]
    hosts = [[Announcer(catalog_of([count, shout]), HostIdentity(f"h{h}", "localhost", os.getpid(),
                                                                  instance=f"i{i}"), lease=lease)
              for i in range(INSTANCES)] for h in range(HOSTS)]
    heap, walk = Ledger("t", max_clock_skew=SKEW), WalkingLedger("t", max_clock_skew=SKEW)
    with mock.patch.object(ledger_module, "time", SimpleNamespace(time=lambda: clock[0])), logged() as lines:
        for step in script:
            if step[0] == "advance":
                clock[0] += step[1]
                continue
            results = []
            for ledger in (heap, walk):
                if step[0] == "send":
                    _, h, i, what, sent, published = step
                    host, at = hosts[h][i], clock[0] + sent
                    if what == "heartbeat":
                        messages = [host._message("host", host.identity.id, None, None, "available", at)]
                    elif what == "tool":
                        messages = list(host._messages("available", [("tool", "count")], at))
                    else:
                        messages = list(host._messages("available" if what == "everything" else "withdrawn",
                                                       None, at))
                    publish_time = 0.0 if published is None else clock[0] + published
                    results.append([ledger.apply(json.dumps(value).encode(), publish_time, key)
                                    for key, value in messages])
                elif step[0] == "expire":
                    results.append(ledger.expire(clock[0] + step[1]))
                else:
                    ledger.resume(clock[0], step[1])
                    results.append(None)
                results.append(lines.take())
            assert results[0::2][0] == results[0::2][1], step
            assert results[1::2][0] == results[1::2][1], step
            assert snapshot(heap) == snapshot(walk), step
            assert len(heap._due) <= 2 * len(heap._instances) + len(script)


def test_a_renewed_lease_is_not_expired_and_the_heap_keeps_one_entry_per_instance() -> None:
    clock = [START]
    host = Announcer(catalog_of([count]), HostIdentity("h", "localhost", os.getpid(), instance="i"), lease=30.0)
    ledger = Ledger("t", max_clock_skew=SKEW)
    with mock.patch.object(ledger_module, "time", SimpleNamespace(time=lambda: clock[0])):
        for _ in range(100):  # a heartbeat every 10 s for 1,000 s
            key, value = host._message("host", "h", None, None, "available", clock[0])
            ledger.apply(json.dumps(value).encode(), clock[0], key)
            assert ledger.expire(clock[0]) == set()
            clock[0] += 10.0
        assert len(ledger._due) == 1 and "h" in ledger.hosts
        ledger.expire(clock[0] + 30.0)
        assert ledger.hosts == {} and len(ledger._due) == 1  # expired: due again when it is to be forgotten
        ledger.expire(clock[0] + 30.0 + 2 * SKEW)
        assert ledger.instances() == [] and ledger._due == []
