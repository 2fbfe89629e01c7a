"""Streaming: ``tghost run`` serves a generated plugin whose tool is an async generator of
N one-character chunks; a ToolServiceClient in this process reads each stream.

Per run: time to first chunk (ms) and chunks per second over the whole stream.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

from tghost.agent.client import ToolServiceClient

from .common import (
    CALL_TIMEOUT,
    broker,
    host_env,
    percentile,
    ready,
    report,
    service_client,
    since_ms,
    tghost_run,
)

STREAM = '''
from collections.abc import AsyncIterator
import tghost

@tghost.tool
async def chunks(count: int) -> AsyncIterator[str]:
    """Stream count chunks of one character."""
    for _ in range(count):
        yield "x"

@tghost.hookimpl
def tghost_register_services(register):
    register(chunks)
'''


async def one_stream(svc: ToolServiceClient, count: int) -> tuple[float, float, int]:
    """(ms to the first chunk, chunks/s over the stream, chunks received) for one call."""
    started, first, received = time.perf_counter(), 0.0, 0
    async for _ in svc.stream({}, {"count": count}, timeout=CALL_TIMEOUT):
        first = first or since_ms(started)
        received += 1
    return first, received / (time.perf_counter() - started), received


async def streams(url: str, count: int, runs: int) -> dict[str, Any]:
    """``runs`` streams of ``count`` chunks, one after another, once the host answers."""
    with host_env(url, {"chunks": STREAM}) as env, tghost_run(env):
        async with service_client(url, "chunks") as svc:
            await ready(lambda: svc.call({}, {"count": 1}, timeout=CALL_TIMEOUT))
            results = [await one_stream(svc, count) for _ in range(runs)]
    firsts, rates, received = zip(*results, strict=True)
    return {"chunks": count, "runs": runs, "first_chunk_median_ms": round(statistics.median(firsts), 2),
            "first_chunk_p99_ms": round(percentile(firsts, 99), 2),
            "chunks_per_s_median": round(statistics.median(rates)), "fewest_received": min(received)}


def main(quick: bool = False) -> None:
    count, runs = (100, 3) if quick else (1000, 20)
    with broker() as running:
        row = asyncio.run(streams(running.url, count, runs))
    report("streaming", f"Streaming: {count}-chunk stream through tghost run, {runs} runs", [row],
           {"chunks": count, "runs": runs})


if __name__ == "__main__":
    main("--quick" in sys.argv)
