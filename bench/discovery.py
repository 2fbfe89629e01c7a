"""Discovery: how soon an agent's ToolDirectory sees a tool, and what its view costs.

1. announce -> seen: from a host publishing an announcement to a following directory's event.
2. start -> visible: from launching ``tghost run`` (echo plugin) to its tool in a following directory.
3. catch-up: from directory start until caught up with 10, 1,000 and 10,000 announced tools.
4. filter: seed 001 filtering per request over 100 tools, cached (``directory.available``)
   and uncached (``tghost.protocol.groups.select`` on the list each time).
5. long history: ``tghost tools`` and a directory's catch-up after a simulated history of 10
   hosts at the default 30 s lease, each restarted 10 times a day, against the same 10 hosts
   on a fresh broker. Days of history: env ``TGHOST_BENCH_HISTORY_DAYS`` (default 30: about
   3.6 million messages to publish first; ``--quick``: a tenth of a day).
6. expiry: seconds from SIGKILL of a ``tghost run`` to its tool leaving a directory that was
   following it, one started just after the death, and one started after the lease.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import tghost
from tghost.agent.directory import ToolDirectory
from tghost.announcing.announcer import Announcer, HostIdentity
from tghost.discovery.catalog import Catalog
from tghost.discovery.discover import catalog_of
from tghost.protocol.announcement import current_topic
from tghost.protocol.groups import select
from tghost.pulsar.clients import PulsarSettings
from tghost.testing import Sent, publish_history, simulated_history

from .common import ECHO, broker, following, host_env, report, since_ms, summary, tghost_run, unique_topic, until

REQUEST = (["research", "knowledge"], "undefined")  # the filtered request's groups and state
#: The simulated deployment of the long-history run: hosts, lease (s), restarts per host per day.
HOSTS, LEASE, RESTARTS = 10, 30.0, 10


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


#: Tools one simulated host announces at most: a directory takes at most ``max_entries`` (1000)
#: tools and services from one host instance (docs/protocol.md §4.7), so more are spread over hosts.
PER_HOST = 900


def tools_catalog(count: int, first: int = 0) -> Catalog:
    """The ``ping`` service and tools over it: ``ping`` itself and ``tool-<i>`` for ``i`` from
    ``first`` up to ``count - 1``, in varied seed 001 groups and states."""
    groups = ["default", "research", "knowledge", "admin", "compute"]
    return catalog_of([ping], [ping.tool(f"tool-{i}", group=[groups[i % 5], groups[i % 3]],
                                         available_in_states=None if i % 4 else ["undefined", "analysis"])
                               for i in range(first, count - 1)])


def announced(count: int, topic: str) -> list[Sent]:
    """What hosts serving ``count`` tools send on start (each host message first), as real
    Announcers build them: ``PER_HOST`` tools a host, every host also announcing ``ping``."""
    sent: list[Sent] = []
    for n, first in enumerate(range(0, max(count - 1, 1), PER_HOST)):
        catalog = tools_catalog(min(first + PER_HOST, count - 1) + 1, first)
        announcer = Announcer(catalog, HostIdentity(f"bench-catch-up-{n}", "bench", os.getpid()), topic, lease=600.0)
        where, now = current_topic(topic), time.time()
        sent += [(now, where, key, json.dumps(value).encode()) for key, value in announcer._messages("available")]
    return sent


async def publish(url: str, messages: Iterable[Sent]) -> None:
    await publish_history(url, messages)


async def catch_up(url: str, count: int, runs: int) -> dict[str, Any]:
    """Median ms from directory start until caught up with ``count`` announced tools."""
    topic = unique_topic()
    await publish(url, announced(count, topic))
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
    topic = unique_topic()
    await publish(url, announced(100, topic))
    async with ToolDirectory(PulsarSettings(url), topic) as directory:
        tools = [tool.descriptor for tool in directory.tools.values()]
        offered = len(directory.available(groups, state))
        return [{"filter": "cached: directory.available", "tools": len(tools), "offered": offered,
                 "us_per_request": per_call_us(lambda: directory.available(groups, state), repeat)},
                {"filter": "uncached: select", "tools": len(tools), "offered": offered,
                 "us_per_request": per_call_us(lambda: select(tools, groups, state), repeat)}]


async def latency(url: str, runs: int) -> list[dict[str, Any]]:
    """Measures 1 and 2, ``runs`` each."""
    return [{"measure": "announce -> directory sees it", **summary(await announce_to_seen(url, runs))},
            {"measure": "tghost run start -> tools visible", **summary(await start_to_visible(url, runs))}]


# -- 5: long history ------------------------------------------------------------------------


def deployment() -> Catalog:
    """What each simulated host serves: one service and ten tools over it."""
    return catalog_of([ping], [ping.tool(f"ping-{i}") for i in range(9)])


def tools_cli(url: str, topic: str, runs: int) -> tuple[list[float], int]:
    """Seconds per run of ``tghost tools --json`` (a fresh process each time), and the tools it listed."""
    env = {**os.environ, "XDG_CONFIG_HOME": tempfile.mkdtemp(prefix="tghost-bench-")}
    samples, listed = [], 0
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "tghost", "tools", "--json", "--pulsar-url", url,
                               "--descriptors-topic", topic], env=env, capture_output=True, text=True, check=True)
        samples.append(time.perf_counter() - started)
        listed = len(json.loads(done.stdout))
    return samples, listed


async def keep_alive(url: str, topic: str, history: list[Sent]) -> None:
    """Keep the simulated hosts alive as live hosts would be: every lease/3 each host message
    again, restamped; on a new epoch, each host's last word on everything (a restatement)."""
    last = {key: json.loads(value) for _, _, key, value in history}
    epoch = ""
    while True:
        now, where = time.time(), current_topic(topic)
        keys = [key for key in last if key.startswith("host/") or where != epoch]
        await publish_history(url, [(now, where, key, json.dumps({**last[key], "lease": {
            **last[key]["lease"], "sent_at": now}}).encode()) for key in keys])
        epoch = where
        await asyncio.sleep(LEASE / 3)


async def history_case(url: str, days: float, runs: int) -> dict[str, Any]:
    """Publish ``days`` of simulated history for the deployment, keep its hosts alive, then time
    ``tghost tools`` and a directory's catch-up."""
    topic = unique_topic()
    # The simulated past is published all at once, so its messages reach the broker long after
    # their sent_at: each directory would warn, once per host, that the host's clock is behind.
    logging.getLogger("tghost.agent.ledger").setLevel(logging.ERROR)
    started = time.perf_counter()
    history = list(simulated_history(deployment(), HOSTS, days * 86_400 + 60, lease=LEASE,
                                     restarts_per_day=RESTARTS, topic=topic))
    await publish_history(url, history)
    published_s = time.perf_counter() - started
    alive = asyncio.create_task(keep_alive(url, topic, history))
    try:
        await asyncio.sleep(0.5)
        cli, listed = await asyncio.to_thread(tools_cli, url, topic, runs)
        catch_up_started = time.perf_counter()
        async with ToolDirectory(PulsarSettings(url), topic) as directory:
            catch_up_ms, read, tools = since_ms(catch_up_started), directory.caught_up, len(directory.tools)
    finally:
        alive.cancel()
    return {"history_days": days, "messages": len(history), "publish_s": round(published_s, 1),
            "tools_listed": listed, "tghost_tools_median_s": round(statistics.median(cli), 2),
            "tghost_tools_max_s": round(max(cli), 2), "catch_up_ms": round(catch_up_ms, 1),
            "catch_up_read": read, "directory_tools": tools}


def long_history(days: float, runs: int) -> list[dict[str, Any]]:
    """The long-history case and the same deployment just started, each on its own fresh broker."""
    rows = []
    for label, span in (("fresh broker", 0.0), ("after history", days)):
        with broker() as running:
            rows.append({"case": label, **asyncio.run(history_case(running.url, span, runs))})
    fresh = rows[0]["tghost_tools_median_s"]
    for row in rows:
        row["vs_fresh"] = round(row["tghost_tools_median_s"] / fresh, 2)
    return rows


# -- 6: expiry -------------------------------------------------------------------------------


async def expiry(url: str, lease: float) -> list[dict[str, Any]]:
    """SIGKILL a ``tghost run`` (``--lease``): seconds until its tool leaves each directory."""
    with host_env(url, {"echo": ECHO}) as env:
        topic = env["TGHOST_DESCRIPTORS_TOPIC"]
        following_directory = await ToolDirectory(PulsarSettings(url), topic).start()
        proc = subprocess.Popen([sys.executable, "-m", "tghost", "run", "--log-level", "warning", "--lease",
                                 str(lease)], env=env, stdout=subprocess.DEVNULL)
        try:
            await following_directory.wait_for("echo", timeout=120)
            await asyncio.sleep(lease / 2)  # mid-way between two heartbeats, on average
            proc.send_signal(signal.SIGKILL)
            killed = time.perf_counter()
            proc.wait()
            await asyncio.sleep(1.0)
            late = await ToolDirectory(PulsarSettings(url), topic).start()
            gone = {}

            async def until_gone(name: str, directory: ToolDirectory) -> None:
                await directory.wait_for("echo", present=False, timeout=lease + 30)
                gone[name] = round(time.perf_counter() - killed, 2)

            await asyncio.gather(until_gone("following since before", following_directory),
                                 until_gone("started 1 s after the kill", late))
            await asyncio.sleep(max(0.0, lease + 1 - (time.perf_counter() - killed)))
            after = await ToolDirectory(PulsarSettings(url), topic).start()
            gone["started after lease + 1 s"] = 0.0 if "echo" not in after.tools else float("nan")
            for directory in (following_directory, late, after):
                await directory.close()
        finally:
            if proc.poll() is None:
                proc.kill()
    return [{"directory": name, "lease_s": lease, "gone_after_kill_s": s, "within_lease_plus_1s": s <= lease + 1}
            for name, s in gone.items()]


def main(quick: bool = False) -> None:
    runs, sizes, catch_up_runs, repeat = (3, (10, 100, 500), 1, 1000) if quick else (20, (10, 1000, 10_000), 3, 10_000)
    days = 0.1 if quick else float(os.environ.get("TGHOST_BENCH_HISTORY_DAYS", "30"))
    with broker() as running:
        latencies = asyncio.run(latency(running.url, runs))
        catch_ups = [asyncio.run(catch_up(running.url, count, catch_up_runs)) for count in sizes]
        filters = asyncio.run(filtering(running.url, repeat))
        expiries = asyncio.run(expiry(running.url, 5.0 if quick else LEASE))
    histories = long_history(days, 3)
    report("discovery", f"Discovery latency ({runs} runs each)", latencies, {"runs": runs})
    report("discovery_catch_up", f"Directory catch-up: start until caught up ({catch_up_runs} run(s) each)",
           catch_ups, {"runs": catch_up_runs, "tools": list(sizes)})
    report("discovery_filter", f"Seed 001 filter per request over 100 tools: groups {REQUEST[0]}, "
           f"state {REQUEST[1]!r} ({repeat} requests)", filters, {"repeat": repeat})
    report("discovery_history", f"Long history: {HOSTS} hosts, lease {LEASE:g} s, {RESTARTS} restarts a day, "
           f"{days:g} days; 'tghost tools' median of 3 runs", histories,
           {"hosts": HOSTS, "lease": LEASE, "restarts_per_day": RESTARTS, "days": days})
    report("discovery_expiry", "Expiry: a SIGKILLed host's tool leaving each directory", expiries,
           {"lease": expiries[0]["lease_s"]})


if __name__ == "__main__":
    main("--quick" in sys.argv)
