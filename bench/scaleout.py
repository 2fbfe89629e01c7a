"""Scale-out: one versus two ``tghost run`` processes serving the same echo service, which
share its requests on one Shared subscription (docs/protocol.md §2.4).

Throughput at concurrency 64 with one host, then again once a second host has announced
itself as a provider; the hosts' CPU time per call and each host's share of it (does the
second host get work?); and the ratio two/one.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from tghost.agent.directory import ToolDirectory
from tghost.pulsar.clients import PulsarSettings

from .common import (
    ECHO,
    Call,
    broker,
    cpu_seconds,
    echo_call,
    following,
    host_env,
    ratio,
    ready,
    report,
    service_client,
    tghost_run,
    throughput,
    until,
    warm_up,
)

CONCURRENCY = 64


async def load(call: Call, total: int, pids: list[int]) -> dict[str, Any]:
    """Throughput at :data:`CONCURRENCY` after a short warm-up, and the hosts' CPU µs per call."""
    await warm_up(call, 20)
    before = cpu_seconds(pids)
    rate, errors = await throughput(call, total, CONCURRENCY)
    used = [after - start for after, start in zip(cpu_seconds(pids), before, strict=True)]
    return {"hosts": len(pids), f"c{CONCURRENCY}_calls_s": rate, "errors": errors,
            "hosts_cpu_us_call": round(sum(used) / total * 1e6),
            "cpu_share_pct": "/".join(str(round(100 * u / sum(used))) for u in used)}


async def one_then_two(url: str, total: int) -> list[dict[str, Any]]:
    """Load one host, start a second on the same service, wait until it is a provider, load both."""
    with host_env(url, {"echo": ECHO}) as env, tghost_run(env) as first:
        async with (ToolDirectory(PulsarSettings(url), env["TGHOST_DESCRIPTORS_TOPIC"]) as directory,
                    following(directory) as changes, service_client(url, "echo") as svc):
            await ready(echo_call(svc))
            await until(changes, lambda: "echo" in directory.tools)
            one = await load(echo_call(svc), total, [first.pid])
            with tghost_run(env) as second:
                await until(changes, lambda: len(directory.tools["echo"].providers) > 1)
                two = await load(echo_call(svc), total, [first.pid, second.pid])
    return [one, {**two, "vs_one_host": ratio(two[f"c{CONCURRENCY}_calls_s"], one[f"c{CONCURRENCY}_calls_s"])}]


def main(quick: bool = False) -> None:
    total = 200 if quick else 5000
    with broker() as running:
        rows = asyncio.run(one_then_two(running.url, total))
    report("scaleout", f"Scale-out: {total} echo calls at concurrency {CONCURRENCY}, one vs two tghost run hosts",
           rows, {"calls": total, "concurrency": CONCURRENCY})


if __name__ == "__main__":
    main("--quick" in sys.argv)
