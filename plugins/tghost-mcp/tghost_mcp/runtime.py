"""runtime: the event loop a mounted MCP server's session lives on, in a daemon thread of its own.

The host loads a plugin before its own loop runs (and ``tghost plugins`` has none), and calls a
service on its loop; the MCP session must outlive both. So each server gets a loop of its own:
:meth:`Runtime.run` waits for a coroutine on it from a plain thread, :meth:`Runtime.call` awaits
one from another loop. Never imports tghost or the MCP SDK.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["Runtime"]

T = TypeVar("T")


class Runtime:
    """An asyncio loop run by a daemon thread named ``name`` (a daemon, so a host that never
    stops it still exits), started at once."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coroutine`` on the loop and wait, blocking this thread, for its result.

        Raises:
            TimeoutError: it did not finish within ``timeout`` seconds (it is cancelled).
            Exception: what the coroutine raised.
        """
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"did not finish within {timeout:g} s") from None

    async def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await ``coroutine`` run on this loop, from another loop; cancelling this cancels it."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self.loop))

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop and join the thread for up to ``timeout`` seconds, then close the loop
        (cancel its tasks first: see :meth:`run`). Safe to call twice."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()
