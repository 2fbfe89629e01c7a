"""Flood: forged hosts in open mode against what a directory holds (docs/protocol.md
§4.7, its caps), measured where a user meets it: ``tghost tools --json`` on the embedded broker.

Each case publishes, on a fresh announcement topic, ``GENUINE`` real hosts of
``TOOLS_PER_HOST`` tools (built by the Announcer, :mod:`bench.scale`), then a flood of forged
host messages, each with a manifest of ``NAMES`` tool names and no descriptor behind them (what
an attacker with publish rights sends cheaply: 13 KB a message):

- ``none``: the genuine hosts alone;
- ``hosts``: ``F`` forged host ids, one instance each;
- ``instances``: one forged host id, ``I`` instances of it (each a new process start).

Then ``tghost tools --json`` runs ``RUNS`` times, each in a process of its own: its wall time,
its peak resident memory (``ru_maxrss`` of that child), whether every genuine tool is listed,
and how many lines it wrote on stderr. Nothing here asserts anything about time.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from tghost.protocol.announcement import EPOCH_SECONDS, announcement_key, announcement_value, epoch_of, epoch_topic
from tghost.testing import Sent, publish_history

from .common import REPO, broker, report, unique_topic
from .scale import host_catalog, instance, sent

#: Genuine hosts and the tools each serves (over one service of its own).
GENUINE, TOOLS_PER_HOST = 5, 100
#: Tool names each forged host message lists (a host instance may list at most 1,000).
NAMES = 1000
#: Lease (seconds) of every message: the longest a directory honours, so nothing expires mid-run.
LEASE = 600.0
#: ``tghost tools`` runs per case.
RUNS = 3
#: Seconds a case may need (publish and runs) on this epoch's topic: a case that would cross
#: into the next epoch's read window waits for the next epoch to begin first.
CASE_SECONDS = 200.0
#: The cases at full size: (name, forged host ids, instances of each, runs).
CASES = [("none", 0, 0, RUNS), ("hosts", 2000, 1, RUNS), ("hosts", 10_000, 1, RUNS), ("instances", 1, 10_000, 1)]
QUICK = [("none", 0, 0, 1), ("hosts", 50, 1, 1), ("instances", 1, 50, 1)]


def genuine(topic: str, now: float) -> Iterator[Sent]:
    """Everything ``GENUINE`` real hosts send on start, as their Announcers build it."""
    for h in range(GENUINE):
        yield from sent(instance(host_catalog(h), h, now, topic, lease=LEASE), "available", now, True)


def forged(topic: str, now: float, hosts: int, instances: int) -> Iterator[Sent]:
    """``hosts`` forged host ids, ``instances`` of each, each one host message listing ``NAMES`` names."""
    where = epoch_topic(topic, epoch_of(now))
    for h in range(hosts):
        host_id = f"forged-{h:05d}"
        names = [f"x{h:05d}-{i:03d}" for i in range(NAMES)]
        for i in range(instances):
            value = announcement_value("host", host_id, "available", lease=LEASE, sent_at=now, since=now,
                                       host={"id": host_id, "hostname": "forged", "pid": 1, "version": "0",
                                             "instance": f"{i:016x}"},
                                       entries={"tool-service": [], "tool": names})
            yield now, where, announcement_key("host", host_id, host_id), json.dumps(value).encode()


def tools_run(url: str, topic: str) -> dict[str, Any]:
    """One ``tghost tools --json`` in a process of its own: seconds, peak RSS (MiB), tools listed, stderr lines."""
    env = {**os.environ, "TGHOST_PULSAR_URL": url, "TGHOST_DESCRIPTORS_TOPIC": topic}
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "tghost", "tools", "--json"], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    listed = {row["name"] for row in json.loads(out)} if proc.returncode == 0 else set()
    return {"seconds": seconds, "rss_mib": usage.ru_maxrss / 1024, "listed": listed,
            "stderr_lines": len(err.decode().splitlines()), "exit": proc.returncode,
            "stderr_first": err.decode().splitlines()[:1]}


def wait_for_room(seconds: float) -> None:
    """Sleep until the current epoch's topic stays in a fresh directory's read window for ``seconds``
    more (docs/protocol.md §4.6: until 90 s into the next epoch)."""
    left = EPOCH_SECONDS - time.time() % EPOCH_SECONDS + 90.0
    if left < seconds:
        time.sleep(EPOCH_SECONDS - time.time() % EPOCH_SECONDS + 1.0)


def case(url: str, name: str, hosts: int, instances: int, runs: int) -> dict[str, Any]:
    """Publish one case on a fresh topic and measure ``runs`` of ``tghost tools`` on it."""
    wait_for_room(CASE_SECONDS)
    topic, now = unique_topic(), time.time()
    wanted = {tool for h in range(GENUINE) for tool in host_catalog(h).tools}
    started = time.perf_counter()
    published = asyncio.run(publish_history(url, [*genuine(topic, now), *forged(topic, now, hosts, instances)]))
    publish_s = time.perf_counter() - started
    measured = [tools_run(url, topic) for _ in range(runs)]
    return {"case": name, "forged_hosts": hosts, "instances_each": instances, "names_each": NAMES if hosts else 0,
            "messages": published, "publish_s": round(publish_s, 1),
            "tools_s_median": round(statistics.median(m["seconds"] for m in measured), 2),
            "tools_s_max": round(max(m["seconds"] for m in measured), 2),
            "rss_mib_max": round(max(m["rss_mib"] for m in measured)),
            "genuine_listed": min(len(m["listed"] & wanted) for m in measured), "genuine": len(wanted),
            "exit": max(m["exit"] for m in measured), "stderr_lines": max(m["stderr_lines"] for m in measured),
            "stderr_first": measured[-1]["stderr_first"][0][:120] if measured[-1]["stderr_first"] else ""}


def main(quick: bool = False) -> None:
    cases = QUICK if quick else CASES
    with broker() as running:
        rows = [case(running.url, *spec) for spec in cases]
    report("flood", f"tghost tools --json under a flood of forged hosts ({GENUINE} genuine hosts x {TOOLS_PER_HOST} "
           f"tools; each forged message lists {NAMES} names)", rows,
           {"cases": cases, "genuine": GENUINE, "tools_per_host": TOOLS_PER_HOST, "names": NAMES, "lease": LEASE})


if __name__ == "__main__":
    main("--quick" in sys.argv)
