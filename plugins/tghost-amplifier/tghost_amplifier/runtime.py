"""runtime: the event loop one served Amplifier module lives on, in a thread of its own.

An Amplifier tool is ``async`` but often does blocking I/O inside (reading files, running
commands), and its ``mount()`` may bind objects to the loop it runs on. So each module's
``mount()``, every ``execute()`` and its cleanups run on the module's own loop: a module that
blocks stalls itself, never the host. Never imports tghost or amplifier-core.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["ModuleRuntime"]

T = TypeVar("T")


class ModuleRuntime:
    """An asyncio event loop running in a daemon thread named ``amplifier <name>``.

    :meth:`run` waits for a coroutine from any other thread; :meth:`call` awaits one from
    another event loop (cancelling the caller cancels the coroutine). :meth:`stop` cancels
    what still runs, closes the loop and joins the thread.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=f"amplifier {name}", daemon=True)

    def start(self) -> ModuleRuntime:
        """Start the thread; returns ``self``."""
        self._thread.start()
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coroutine`` on this loop and wait (blocking) for its result.

        Raises:
            TimeoutError: it did not finish within ``timeout`` seconds (it is cancelled then).
            Exception: whatever the coroutine raised.
        """
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"did not finish within {timeout}s") from None

    async def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await ``coroutine`` run on this loop, from another loop; cancelling this cancels it."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self.loop))

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop (tasks still running are cancelled), close it and join the thread for up
        to ``timeout`` seconds. Safe to call twice, or on a runtime never started."""
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        elif not self.loop.is_closed() and not self._thread.ident:
            self.loop.close()
