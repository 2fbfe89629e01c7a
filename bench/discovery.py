"""Discovery: how soon an agent's ToolDirectory sees a tool, and what its view costs.

1. announce -> seen: from a host publishing an announcement to a following directory's event.
2. start -> visible: from launching ``tghost run`` (echo plugin) to its tool in a following directory.
3. catch-up: from directory start until caught up with 10, 1,000 and 10,000 announced tools.
4. filter: seed 001 filtering per request over 100 tools, cached (``directory.available``)
   and uncached (``tghost.groups.select`` on the list each time).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import pulsar.asyncio

import tghost
from tghost import groups as seed001
from tghost.announce import Announcer, HostIdentity, announcement_key
from tghost.broker import PulsarSettings
from tghost.directory import ToolDirectory
from tghost.discover import catalog_of

from .common import ECHO, broker, following, host_env, report, since_ms, summary, tghost_run, unique_topic, until

#: In-flight sends while publishing announcements for the catch-up runs.
WINDOW = 500
HOST = HostIdentity("bench-catch-up", "bench", os.getpid()).to_json()
REQUEST = (["research", "knowledge"], "undefined")  # the filtered request's groups and state


@tghost.tool
def ping() -> str:
    """Answer pong."""
    return "pong"


# -- 1 and 2: latency ------------------------------------------------------------------------


async def announce_to_seen(url: str, runs: int) -> list[float]:
    """Per run: a fresh host id announces ``ping``; time until the directory shows it."""
    topic = unique_topic()
    settings = PulsarSettings(url)
    client = await settings.connect()
    samples = []
    async with ToolDirectory(settings, topic) as directory, following(directory) as changes:
        for run in range(runs):
            announcer = Announcer(catalog_of([ping]), HostIdentity(f"bench-{run}", "bench", os.getpid()), topic)
            started = time.perf_counter()
            await announcer.start(client)
            await until(changes, lambda: "ping" in directory.tools)
            samples.append(since_ms(started))
            await announcer.withdraw()
            await until(changes, lambda: not directory.tools)
    await client.close()
    return samples


async def start_to_visible(url: str, runs: int) -> list[float]:
    """Per run: launch ``tghost run`` with the echo plugin and time until its tool shows."""
    samples = []
    with host_env(url, {"echo": ECHO}) as env:
        async with (ToolDirectory(PulsarSettings(url), env["TGHOST_DESCRIPTORS_TOPIC"]) as directory,
                    following(directory) as changes):
            for _ in range(runs):
                started = time.perf_counter()
                with tghost_run(env):
                    await until(changes, lambda: "echo" in directory.tools)
                    samples.append(since_ms(started))
                await until(changes, lambda: not directory.tools)
    return samples


# -- 3 and 4: catch-up and filtering ---------------------------------------------------------


def announcement(kind: str, name: str, descriptor: dict[str, Any] | None) -> tuple[str, bytes]:
    """(key, value) of an ``available`` announcement in the format of tghost.announce, long lease."""
    value = {"kind": kind, "name": name, "status": "available", "descriptor": descriptor, "host": HOST,
             "plugin": {"entry_point": "bench", "distribution": "bench", "version": "0"},
             "lease": {"seconds": 3600.0, "sent_at": time.time()}}
    return announcement_key(kind, name, HOST["id"]), json.dumps(value).encode()


def announcements(count: int) -> list[tuple[str, bytes]]:
    """The host, the ``ping`` service and ``count`` tools over it, in varied seed 001 groups and states."""
    groups = ["default", "research", "knowledge", "admin", "compute"]
    tools = (ping.tool(f"tool-{i}", group=[groups[i % 5], groups[i % 3]],
                       available_in_states=None if i % 4 else ["undefined", "analysis"]) for i in range(count))
    return [announcement("host", HOST["id"], None),
            announcement("tool-service", ping.id, ping.descriptor.to_json_dict()),
            *(announcement("tool", tool.name, tool.to_json_dict()) for tool in tools)]


async def publish(url: str, messages: list[tuple[str, bytes]]) -> str:
    """Publish keyed messages on a fresh topic, ``WINDOW`` sends in flight at once; returns the topic."""
    topic = unique_topic()
    client = pulsar.asyncio.Client(url)
    producer = await client.create_producer(topic, batching_enabled=False, max_pending_messages=WINDOW,
                                            block_if_queue_full=True)
    for start in range(0, len(messages), WINDOW):
        window = messages[start:start + WINDOW]
        await asyncio.gather(*(producer.send(value, partition_key=key) for key, value in window))
    await client.close()
    return topic


async def catch_up(url: str, count: int, runs: int) -> dict[str, Any]:
    """Median ms from directory start until caught up with ``count`` announced tools."""
    topic = await publish(url, announcements(count))
    samples, seen = [], 0
    for _ in range(runs):
        started = time.perf_counter()
        async with ToolDirectory(PulsarSettings(url), topic) as directory:
            samples.append(since_ms(started))
            seen = len(directory.tools)
    return {"tools": count, "seen": seen, "runs": runs, "median_ms": round(statistics.median(samples), 1),
            "max_ms": round(max(samples), 1)}


def per_call_us(fn: Callable[[], object], repeat: int) -> float:
    """Mean µs of ``fn()`` over ``repeat`` calls."""
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return round((time.perf_counter() - started) / repeat * 1e6, 2)


async def filtering(url: str, repeat: int) -> list[dict[str, Any]]:
    """µs per request to filter 100 tools by seed 001 groups and state, cached and uncached."""
    groups, state = REQUEST
    async with ToolDirectory(PulsarSettings(url), await publish(url, announcements(100))) as directory:
        tools = [tool.descriptor for tool in directory.tools.values()]
        offered = len(directory.available(groups, state))
        return [{"filter": "cached: directory.available", "tools": len(tools), "offered": offered,
                 "us_per_request": per_call_us(lambda: directory.available(groups, state), repeat)},
                {"filter": "uncached: groups.select", "tools": len(tools), "offered": offered,
                 "us_per_request": per_call_us(lambda: seed001.select(tools, groups, state), repeat)}]


async def latency(url: str, runs: int) -> list[dict[str, Any]]:
    """Measures 1 and 2, ``runs`` each."""
    return [{"measure": "announce -> directory sees it", **summary(await announce_to_seen(url, runs))},
            {"measure": "tghost run start -> tools visible", **summary(await start_to_visible(url, runs))}]


def main(quick: bool = False) -> None:
    runs, sizes, catch_up_runs, repeat = (3, (10, 100, 500), 1, 1000) if quick else (20, (10, 1000, 10_000), 3, 10_000)
    with broker() as running:
        latencies = asyncio.run(latency(running.url, runs))
        catch_ups = [asyncio.run(catch_up(running.url, count, catch_up_runs)) for count in sizes]
        filters = asyncio.run(filtering(running.url, repeat))
    report("discovery", f"Discovery latency ({runs} runs each)", latencies, {"runs": runs})
    report("discovery_catch_up", f"Directory catch-up: start until caught up ({catch_up_runs} run(s) each)",
           catch_ups, {"runs": catch_up_runs, "tools": list(sizes)})
    report("discovery_filter", f"Seed 001 filter per request over 100 tools: groups {REQUEST[0]}, "
           f"state {REQUEST[1]!r} ({repeat} requests)", filters, {"repeat": repeat})


if __name__ == "__main__":
    main("--quick" in sys.argv)
