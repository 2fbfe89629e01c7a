"""tasks: :func:`cancel_and_wait` stops a task and waits for it, and never takes a cancel of its
caller for the task's own (the ``suppress(CancelledError)`` idiom does, and a loop that stops a
helper each round then outlives its own cancel)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import pytest

from tghost.system.tasks import cancel_and_wait


async def slow_to_stop() -> None:
    """A helper that takes a moment to clean up once cancelled (a reader's close, a last send)."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        await asyncio.sleep(0.05)
        raise


async def stops_a_helper_each_round(stop: Callable[[asyncio.Task[None]], Awaitable[None]],
                                    waiting: asyncio.Event, over: asyncio.Event) -> None:
    """A loop that starts a helper and stops it again, round after round (a window's epochs),
    until cancelled (or ``over``, for the test to end a loop that outlived its cancel)."""
    while not over.is_set():
        helper = asyncio.create_task(slow_to_stop())
        await asyncio.sleep(0)
        waiting.set()
        await stop(helper)
        waiting.clear()


async def suppressing(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def loop_cancelled_while_it_stops_a_helper(stop: Callable[[asyncio.Task[None]], Awaitable[None]]) -> bool:
    """Cancel the loop while it waits on a helper it cancelled; whether the cancel ended it."""
    waiting, over = asyncio.Event(), asyncio.Event()
    loop = asyncio.create_task(stops_a_helper_each_round(stop, waiting, over))
    await waiting.wait()
    loop.cancel()
    done, _ = await asyncio.wait({loop}, timeout=1.0)
    over.set()
    await asyncio.wait({loop})
    return bool(done)


async def test_a_loop_cancelled_while_it_stops_a_helper_ends_with_cancel_and_wait() -> None:
    assert await loop_cancelled_while_it_stops_a_helper(cancel_and_wait)


async def test_the_suppress_idiom_it_replaces_swallows_that_cancel() -> None:
    # why the helper exists: the loop's cancel came back as the helper's and was dropped
    assert not await loop_cancelled_while_it_stops_a_helper(suppressing)


async def test_cancel_and_wait_raises_what_ended_the_task_when_that_was_not_the_cancel() -> None:
    async def fails_while_stopping() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("broke while cleaning up") from None

    task = asyncio.create_task(fails_while_stopping())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="broke while cleaning up"):
        await cancel_and_wait(task)


async def test_cancel_and_wait_of_a_finished_task_or_none_returns() -> None:
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    await cancel_and_wait(done)
    await cancel_and_wait(None)
    slow = asyncio.create_task(slow_to_stop())
    await asyncio.sleep(0)
    await cancel_and_wait(slow)
    assert slow.cancelled()


async def test_every_task_is_cancelled_before_the_wait_so_a_cancel_of_the_caller_leaves_none_running() -> None:
    helpers = [asyncio.create_task(slow_to_stop()) for _ in range(3)]
    await asyncio.sleep(0)
    stopping = asyncio.create_task(cancel_and_wait(*helpers))
    await asyncio.sleep(0.01)  # it waits on the helpers' clean-up
    stopping.cancel()
    await asyncio.wait({stopping})
    assert stopping.cancelled()  # its own cancel was not taken for a helper's
    _, running = await asyncio.wait(helpers, timeout=1.0)
    for helper in running:  # (a helper left running fails the test; end it all the same)
        helper.cancel()
    assert not running and all(helper.cancelled() for helper in helpers)
