"""locks: ``flock``-held lock files, released by the kernel when their process dies, so a crash
never leaves one stale. Used for a host's identity slot (:mod:`tghost.announcing.announcer`), a
client's consumer-id slot (:mod:`tghost.pulsar.clients`) and an embedded broker's data dir
(:mod:`tghost.broker.status`).

POSIX only (``fcntl``), as pulsar-lite is.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["first_free_slot", "held", "try_lock"]


def try_lock(path: Path) -> IO[bytes] | None:
    """Take an exclusive ``flock`` on ``path`` (created if missing) without waiting.

    Returns the open handle (read and append, at offset 0) that holds the lock until it is
    closed, or ``None`` when another process holds it.
    """
    handle = path.open("a+b")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    handle.seek(0)
    return handle


def first_free_slot(folder: Path, limit: int | None = None) -> tuple[int, IO[bytes]]:
    """Lock the first free slot ``folder/<k>.lock``, ``k`` counting from 0.

    Returns ``k`` and the handle holding it (see :func:`try_lock`).

    Raises:
        RuntimeError: the first ``limit`` slots are all held.
    """
    for index in itertools.count() if limit is None else range(limit):
        handle = try_lock(folder / f"{index}.lock")
        if handle is not None:
            return index, handle
    raise RuntimeError(f"no free slot among the {limit} in {folder}")


@contextlib.contextmanager
def held(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (waiting for it) for the ``with`` block."""
    with path.open("ab") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
