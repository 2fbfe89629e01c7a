"""Round trip: one client process, three servers, one embedded broker.

(a) a raw ``pulsar.asyncio`` echo server (bench/echo_server.py): the physical floor;
(b) ``tghost run`` serving a generated echo plugin; (a) and (b) are called with the same
    ``ToolServiceClient`` code, so only the server differs;
(c) the same host, called through ``ToolDirectory.invoke`` (catalog lookup, seed 001 check).
Per server: serial p50/p99 latency, throughput at concurrency 1/16/64, the server process's
CPU time per call over the throughput runs, and the ratios to (a).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from dataclasses import asdict, dataclass
from typing import Any

from tghost.broker import PulsarSettings
from tghost.directory import ToolDirectory

from .common import (
    CALL_TIMEOUT,
    ECHO,
    ECHO_ARGS,
    READY_TIMEOUT,
    Call,
    broker,
    cpu_seconds,
    echo_call,
    host_env,
    percentile,
    process,
    ratio,
    ready,
    report,
    serial_ms,
    service_client,
    tghost_run,
    throughput,
)

RAW_TOPIC = "bench-raw-echo"
LEVELS = (1, 16, 64)


@dataclass(frozen=True)
class Sizes:
    serial: int  # timed serial calls
    warmup: int  # untimed calls first
    per_level: int  # calls per concurrency level


FULL, QUICK = Sizes(1000, 100, 2000), Sizes(50, 5, 100)


async def measure(server: str, call: Call, pid: int, sizes: Sizes) -> dict[str, Any]:
    """Once the server answers: serial latency, then throughput per level and CPU per call."""
    await ready(call)
    latencies = await serial_ms(call, sizes.serial, sizes.warmup)
    row: dict[str, Any] = {"server": server, "p50_ms": round(statistics.median(latencies), 3),
                           "p99_ms": round(percentile(latencies, 99), 3)}
    (cpu,), errors = cpu_seconds([pid]), 0
    for level in LEVELS:
        row[f"c{level}_calls_s"], failed = await throughput(call, sizes.per_level, level)
        errors += failed
    row["server_cpu_us_call"] = round((cpu_seconds([pid])[0] - cpu) / (len(LEVELS) * sizes.per_level) * 1e6)
    return {**row, "errors": errors}


async def raw(url: str, sizes: Sizes) -> dict[str, Any]:
    """(a) the raw echo server."""
    with process([sys.executable, "-m", "bench.echo_server", url, RAW_TOPIC]) as server:
        async with service_client(url, RAW_TOPIC) as svc:
            return await measure("a raw pulsar.asyncio", echo_call(svc), server.pid, sizes)


async def hosted(url: str, sizes: Sizes) -> list[dict[str, Any]]:
    """(b) ``tghost run`` through ToolServiceClient, then (c) the same host through the directory."""
    with host_env(url, {"echo": ECHO}) as env, tghost_run(env) as host:
        async with service_client(url, "echo") as svc:
            direct = await measure("b tghost run", echo_call(svc), host.pid, sizes)
        async with ToolDirectory(PulsarSettings(url), env["TGHOST_DESCRIPTORS_TOPIC"]) as directory:
            await directory.wait_for("echo", READY_TIMEOUT)
            call = lambda: directory.invoke("echo", ECHO_ARGS, timeout=CALL_TIMEOUT)  # noqa: E731
            return [direct, await measure("c ToolDirectory.invoke", call, host.pid, sizes)]


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add p50 and concurrency-64 throughput relative to the first row (the raw floor)."""
    floor = rows[0]
    return [{**row, "p50_vs_a": ratio(row["p50_ms"], floor["p50_ms"]),
             "c64_vs_a": ratio(row["c64_calls_s"], floor["c64_calls_s"])} for row in rows]


def main(quick: bool = False) -> None:
    sizes = QUICK if quick else FULL
    with broker() as running:
        rows = [asyncio.run(raw(running.url, sizes)), *asyncio.run(hosted(running.url, sizes))]
    report("roundtrip", f"Round trip: {sizes.serial} serial calls, {sizes.per_level} calls per concurrency level "
           f"{', '.join(map(str, LEVELS))} (calls/s); server CPU µs per call", with_ratios(rows), asdict(sizes))


if __name__ == "__main__":
    main("--quick" in sys.argv)
