"""Search: how well and how fast the directory ranks tools for a request.

- **Quality.** The realistic tools of :mod:`bench.search_set` (as plugin authors describe them)
  among generated distractors; each plain-language request, none naming its tool, is searched
  and scored top-1 and top-3.
- **Speed.** One search over 10,000 live tools, in process (p50/p99), after the index is built.
- **Catch-up.** A directory catching up on 10,000 announced tools, then its first search
  (which builds the index); against the catch-up alone, the cost today's directory pays.
- **Memory.** Resident memory the index adds per tool (built, writer dropped).

Nothing here asserts anything about time.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import sys
import time
from typing import Any

import psutil

from tghost.agent.directory import ToolDirectory
from tghost.agent.search import ToolIndex
from tghost.protocol.descriptors import ToolDescriptor
from tghost.pulsar.clients import PulsarSettings

from .common import broker, report, unique_topic
from .discovery import announced, publish
from .search_set import REQUESTS, TOOLS, distractors


def descriptor(name: str, description: str, arguments: dict[str, str]) -> ToolDescriptor:
    return ToolDescriptor.model_validate({
        "name": name, "description": description, "service": name,
        "arguments": [{"name": a, "type": "string", "description": d} for a, d in arguments.items()]})


def quality(distractor_count: int) -> dict[str, Any]:
    """Top-1 and top-3 accuracy of :data:`REQUESTS` over :data:`TOOLS` plus distractors."""
    index = ToolIndex()
    for tool in [*TOOLS, *distractors(distractor_count)]:
        index.put(tool[0], descriptor(*tool))
    top1 = top3 = 0
    for request, wanted in REQUESTS:
        names = [name for name, _ in index.ranked(request, lambda _: True, 3)]
        top1 += names[:1] == [wanted]
        top3 += wanted in names
    return {"case": f"quality: {len(TOOLS)} tools + {distractor_count} distractors, {len(REQUESTS)} requests",
            "top1": round(top1 / len(REQUESTS), 2), "top3": round(top3 / len(REQUESTS), 2)}


def speed(count: int, repeat: int) -> dict[str, Any]:
    """p50/p99 µs of one search over ``count`` tools (realistic ones among distractors)."""
    index = ToolIndex()
    for tool in [*TOOLS, *distractors(count - len(TOOLS))]:
        index.put(tool[0], descriptor(*tool))
    started = time.perf_counter()
    list(index.ranked("warm up", lambda _: True, 10))
    build_ms = (time.perf_counter() - started) * 1000
    samples = []
    for i in range(repeat):
        request = REQUESTS[i % len(REQUESTS)][0]
        started = time.perf_counter()
        list(index.ranked(request, lambda _: True, 10))
        samples.append((time.perf_counter() - started) * 1e6)
    samples.sort()
    return {"case": f"speed: one search over {count} tools, limit 10", "build_ms": round(build_ms, 1),
            "p50_us": round(statistics.median(samples)), "p99_us": round(samples[int(len(samples) * 0.99) - 1])}


def memory(count: int) -> dict[str, Any]:
    """Resident memory the built index adds, per tool (KB)."""
    tools = [descriptor(*tool) for tool in [*TOOLS, *distractors(count - len(TOOLS))]]
    gc.collect()
    before = psutil.Process().memory_info().rss
    index = ToolIndex()
    for d in tools:
        index.put(d.name, d)
    list(index.ranked("warm up", lambda _: True, 10))
    gc.collect()
    grown = psutil.Process().memory_info().rss - before
    return {"case": f"memory: index of {count} tools", "kb_per_tool": round(grown / count / 1024, 2)}


async def catch_up(url: str, count: int, runs: int) -> dict[str, Any]:
    """Median ms of a directory's catch-up on ``count`` tools, and of its first search after it."""
    topic = unique_topic()
    await publish(url, announced(count, topic))
    caught, first = [], []
    for _ in range(runs):
        started = time.perf_counter()
        async with ToolDirectory(PulsarSettings(url), topic) as directory:
            caught.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            directory.search("ping the host", groups=["*"])
            first.append((time.perf_counter() - started) * 1000)
    return {"case": f"catch-up of {count} tools, then the first search",
            "catch_up_ms": round(statistics.median(caught)),
            "first_search_ms": round(statistics.median(first)),
            "search_share": round(statistics.median(first) / statistics.median(caught), 2)}


def main(quick: bool = False) -> None:
    count, repeat, runs = (1000, 200, 1) if quick else (10_000, 2000, 3)
    rows = [quality(50 if quick else 400), speed(count, repeat), memory(count)]
    with broker() as running:
        rows.append(asyncio.run(catch_up(running.url, count, runs)))
    report("search", "Search: quality, speed over many tools, catch-up and memory", rows,
           {"count": count, "repeat": repeat, "runs": runs})


if __name__ == "__main__":
    main("--quick" in sys.argv)
