"""epochs: the topics announcements travel on (docs/protocol.md §4.1, §4.6): the base topic,
its epoch topics, the window of epochs a directory reads, the lease limit and the caps on what a
directory holds (§4.7). Constants and
arithmetic only, with no model and no third-party import, so a command that only names a topic
(``tghost pulsar policies``, the CLI's options) loads nothing else.
"""

from __future__ import annotations

import math
import time

__all__ = [
    "DEFAULT_TOPIC",
    "EPOCH_SECONDS",
    "MAX_ENTRIES",
    "MAX_HOSTS",
    "MAX_INSTANCES",
    "MAX_LEASE",
    "MAX_TOTAL_ENTRIES",
    "RESTATEMENT_MARGIN",
    "current_topic",
    "epoch_of",
    "epoch_topic",
    "read_window",
]

#: The base name of the announcement topics (docs/protocol.md §4.1); messages go to its epoch topics.
DEFAULT_TOPIC = "persistent://tg/config/tool-descriptors"
#: Seconds per epoch: every host restates everything it announces on each new epoch's topic
#: (docs/protocol.md §4.1). Every host and directory on one base topic must use the same value.
EPOCH_SECONDS = 300.0
#: Seconds a host may take, after its epoch begins, to finish restating on the new topic.
RESTATEMENT_MARGIN = 30.0
#: Seconds: the longest lease a directory honours by default (docs/protocol.md §4.7); a longer
#: ``lease.seconds`` counts as this, so a flood of fake entries is gone this long after its
#: last message. A host's lease must not be longer.
MAX_LEASE = 600.0

# The caps on what a directory holds, by default (docs/protocol.md §4.7): a message past one is
# refused ``over-limit``. Sized on docs/internals/scale.md: one directory follows about 2,000 hosts of 100
# tools, at 8 to 9 KiB per tool.
#: Tools plus tool services one host instance may announce (a 100-tool host uses 101).
MAX_ENTRIES = 1000
#: Host ids a directory remembers at once.
MAX_HOSTS = 10_000
#: Instances (process starts) of one host id a directory remembers at once, each for its lease
#: plus twice the clock skew it allows after its last message: a host that restarts every 10 s
#: has about 15.
MAX_INSTANCES = 16
#: Tools plus tool services a directory holds in all (withdrawn ones it keeps included): 2,000
#: hosts of 100 tools twice over, as while all of them restart at once.
MAX_TOTAL_ENTRIES = 500_000


def check_lease(lease: float) -> None:
    """Raises:
        ValueError: ``lease`` (seconds) is not above 0 and at most :data:`MAX_LEASE` (directories honour no more).
    """
    if not 0 < lease <= MAX_LEASE:
        raise ValueError(f"a lease of {lease}s: give more than 0 and at most {MAX_LEASE:.0f}s, the longest a "
                         "directory honours (docs/protocol.md §4.7)")


def epoch_of(t: float, epoch_seconds: float = EPOCH_SECONDS) -> int:
    """The epoch of unix time ``t`` (seconds): ``floor(t / epoch_seconds)``."""
    return math.floor(t / epoch_seconds)


def epoch_topic(base: str, epoch: int) -> str:
    """The topic of one epoch: ``<base>-epoch-<epoch>``, for example
    ``persistent://tg/config/tool-descriptors-epoch-5904321``."""
    return f"{base}-epoch-{epoch}"


def current_topic(base: str, epoch_seconds: float = EPOCH_SECONDS, now: float | None = None) -> str:
    """The topic a host sends to at unix time ``now`` (seconds; default: the time now)."""
    return epoch_topic(base, epoch_of(time.time() if now is None else now, epoch_seconds))


def read_window(now: float, max_clock_skew: float, epoch_seconds: float = EPOCH_SECONDS) -> range:
    """The epochs a directory reads at unix time ``now`` (seconds), oldest first: those of
    ``now - max_clock_skew - RESTATEMENT_MARGIN`` up to ``now + max_clock_skew`` (docs/protocol.md §4.6).

    Every live host whose clock is within ``max_clock_skew`` of ours has restated all it
    announces on one of them.
    """
    first = epoch_of(now - max_clock_skew - RESTATEMENT_MARGIN, epoch_seconds)
    return range(first, epoch_of(now + max_clock_skew, epoch_seconds) + 1)
