"""tasks: stopping an asyncio task that its owner started (a follower, a heartbeat, a loop).

``task.cancel()`` and then ``with suppress(CancelledError): await task`` swallows a cancel of the
*owner* too. While the owner waits on the cancelled task, asyncio passes a cancel of the owner on
to that task, and it comes back as the task's own ``CancelledError``, which the ``suppress``
drops. The owner runs on, cancelled in name only: a loop that stops a helper each round then
never ends, and whoever stops that loop waits for ever. (Seen: a directory whose expiry loop was
closing an old epoch's reader when the directory was closed; its close never returned.)
:func:`cancel_and_wait` waits without taking the task's outcome as its own.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["cancel_and_wait"]


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel each of ``tasks`` (a ``None`` is skipped), then wait until every one is done: all
    are cancelled before the first wait, so a cancel of the caller meanwhile leaves none running on.

    Raises:
        Exception: what ended a task when that was not the cancel (an error raised before the
            cancel reached it, or while it cleaned up), as awaiting it would; the first such
            task's, in the order given.
        asyncio.CancelledError: only when the caller itself is cancelled meanwhile (then the
            tasks go on ending without being waited for).
    """
    given = [task for task in tasks if task is not None]
    if not given:
        return
    for task in given:
        task.cancel()
    await asyncio.wait(given)
    for task in given:
        if not task.cancelled():
            task.result()
