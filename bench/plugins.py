"""Scale of plugins: ``tghost run`` with 1, 10, 100 and 500 generated plugin distributions,
each its own module, dist-info and entry point registering one ``@tghost.tool`` service.

Per size: start-up from process launch to the first tool, and to all tools, seen by a
ToolDirectory; the host's resident memory once all are announced; and the marginal cost per
added plugin against the size before, so growth faster than linear shows.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import sys
import time
from typing import Any

from tghost.agent.directory import ToolDirectory
from tghost.pulsar.clients import PulsarSettings

from .common import broker, following, host_env, report, rss_mib, since_ms, tghost_run, unique_topic, until

PLUGIN = '''
import tghost

@tghost.tool(name="tool-{i}")
async def echo_{i}(text: str) -> str:
    """Echo the text back."""
    return text

@tghost.hookimpl
def tghost_register_services(register):
    register(echo_{i})
'''


async def start_up(url: str, env: dict[str, str], count: int) -> tuple[float, float, float]:
    """One launch: (ms to the first tool seen, ms to all ``count`` seen, host RSS MiB then)."""
    topic = unique_topic()
    async with ToolDirectory(PulsarSettings(url), topic) as directory, following(directory) as changes:
        started = time.perf_counter()
        with tghost_run({**env, "TGHOST_DESCRIPTORS_TOPIC": topic}) as host:
            await until(changes, lambda: bool(directory.tools))
            first = since_ms(started)
            await until(changes, lambda: len(directory.tools) >= count)
            result = first, since_ms(started), rss_mib(host.pid)
    return result


async def size(url: str, count: int, runs: int) -> dict[str, Any]:
    """Medians over ``runs`` launches of a host with ``count`` plugins."""
    with host_env(url, {f"p{i}": PLUGIN.format(i=i) for i in range(count)}) as env:
        results = [await start_up(url, env, count) for _ in range(runs)]
    first, every, rss = (statistics.median(values) for values in zip(*results, strict=True))
    return {"plugins": count, "first_tool_ms": round(first), "all_tools_ms": round(every), "rss_mib": rss}


def with_marginal(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ms and KiB per plugin added since the previous size (none on the first row: its base cost)."""
    marked = rows[:1]
    for before, row in itertools.pairwise(rows):
        added = row["plugins"] - before["plugins"]
        marked.append({**row, "ms_per_added_plugin": round((row["all_tools_ms"] - before["all_tools_ms"]) / added, 2),
                       "kib_per_added_plugin": round((row["rss_mib"] - before["rss_mib"]) * 1024 / added)})
    return marked


def main(quick: bool = False) -> None:
    sizes, runs = ((1, 10, 50), 1) if quick else ((1, 10, 100, 500), 3)
    with broker() as running:
        rows = [asyncio.run(size(running.url, count, runs)) for count in sizes]
    report("plugins", f"Scale of plugins: tghost run start-up and memory (median of {runs} launch(es))",
           with_marginal(rows), {"plugins": list(sizes), "runs": runs})


if __name__ == "__main__":
    main("--quick" in sys.argv)
