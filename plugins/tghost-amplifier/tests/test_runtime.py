"""runtime: a module's loop in its own thread: waited on from a thread, awaited from another loop,
cancelled with its caller, and stopped with whatever still runs on it cancelled."""

from __future__ import annotations

import asyncio
import threading

import pytest
from tghost_amplifier.runtime import ModuleRuntime


async def where() -> str:
    return threading.current_thread().name


async def raises() -> None:
    raise LookupError("nothing here")


def test_run_waits_for_a_coroutine_on_the_modules_own_thread_and_raises_what_it_raised() -> None:
    runtime = ModuleRuntime("probe").start()
    try:
        assert runtime.run(where(), timeout=5) == "amplifier probe"
        with pytest.raises(LookupError, match="nothing here"):
            runtime.run(raises(), timeout=5)
    finally:
        runtime.stop()


def test_run_gives_up_after_the_timeout_and_cancels_the_coroutine() -> None:
    runtime = ModuleRuntime("slow").start()
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    try:
        with pytest.raises(TimeoutError, match=r"did not finish within 0.2s"):
            runtime.run(forever(), timeout=0.2)
        assert cancelled.wait(5)
    finally:
        runtime.stop()


async def test_call_awaits_from_another_loop_and_cancelling_the_caller_cancels_the_coroutine() -> None:
    runtime = ModuleRuntime("called").start()
    started, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    try:
        assert await runtime.call(where()) == "amplifier called"
        task = asyncio.create_task(runtime.call(forever()))
        await asyncio.to_thread(started.wait, 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(cancelled.wait, 5)
    finally:
        runtime.stop()


def test_stop_cancels_what_still_runs_closes_the_loop_and_ends_the_thread() -> None:
    runtime = ModuleRuntime("stopped").start()
    started, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    asyncio.run_coroutine_threadsafe(forever(), runtime.loop)
    assert started.wait(5)
    runtime.stop()
    assert cancelled.is_set() and runtime.loop.is_closed()
    assert "amplifier stopped" not in {t.name for t in threading.enumerate()}
    runtime.stop()  # twice is harmless
    never_started = ModuleRuntime("idle")
    never_started.stop()
    assert never_started.loop.is_closed()
