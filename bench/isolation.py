"""Process isolation: what worker processes cost and what they give, on `tghost run`.

(1) IPC cost: a plain ``def`` echo served with ``--isolation thread`` and ``--isolation process``,
    called serially: p50/p99 and the extra p50 of process mode (goal: at most 0.3 ms); and the same
    echo through the two executors alone (no Pulsar), which isolates the cost from broker noise.
(2) CPU-bound scaling: a pure-Python CPU-bound tool in process mode with ``max_concurrency`` 1 and
    2, called at concurrency 2: calls/s and the ratio (goal: at least 1.6x on two free cores);
    thread mode with 2 threads for reference (the GIL holds it near 1x). Then the same through the
    executors alone, where the broker and the client do not take a core.
(3) Recovery: a call that ends its worker with ``os._exit``, then the time until the next call
    on that service succeeds (goal: under 1 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import tghost
from tghost.agent.client import ToolCallError
from tghost.serving.executors.base import WorkerLimits
from tghost.serving.executors.child import ObjectSource
from tghost.serving.executors.process import ProcessExecutor
from tghost.serving.executors.thread import ThreadExecutor

from .common import (
    CALL_TIMEOUT,
    broker,
    host_env,
    percentile,
    process,
    ready,
    report,
    serial_ms,
    service_client,
    since_ms,
    throughput,
)

#: The services under test: a plain echo that can also end its worker, and one CPU-bound tool
#: per concurrency limit (one worker process per slot in process mode).
PLUGIN = '''
import os
import tghost


@tghost.tool(service="plain-echo")
def plain_echo(text: str) -> str:
    """Echo the text back; 'crash' ends the worker process instead."""
    if text == "crash":
        os._exit(3)
    return text


def _burn(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


@tghost.tool(service="burn-1", max_concurrency=1)
def burn_1(n: int) -> int:
    """Pure-Python CPU work."""
    return _burn(n)


@tghost.tool(service="burn-2", max_concurrency=2)
def burn_2(n: int) -> int:
    """Pure-Python CPU work."""
    return _burn(n)


@tghost.hookimpl
def tghost_register_services(register):
    for service in (plain_echo, burn_1, burn_2):
        register(service)
'''


@dataclass(frozen=True)
class Sizes:
    serial: int  # timed serial echo calls per mode
    warmup: int  # untimed calls first
    burn_calls: int  # CPU-bound calls per run
    burn_n: int  # loop length of one CPU-bound call (about 40 ms of CPU at 500,000)
    crashes: int  # crash -> recovery measurements


FULL, QUICK = Sizes(1000, 100, 60, 500_000, 10), Sizes(100, 10, 10, 200_000, 3)


@tghost.tool(service="bench-echo")
def bench_echo(text: str) -> str:
    """Echo the text back (run by the executors directly)."""
    return text


@tghost.tool(service="bench-burn")
def bench_burn(n: int) -> int:
    """Pure-Python CPU work (run by the executors directly)."""
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


async def executor_rate(executor: ThreadExecutor | ProcessExecutor, sizes: Sizes) -> float:
    """CPU-bound calls/s through one executor alone, at concurrency 2."""
    await executor.start()
    call = ("bench", {}, {"n": sizes.burn_n})
    try:
        await asyncio.gather(executor.run(call), executor.run(call))  # start both workers
        started = time.perf_counter()

        async def caller() -> None:
            for _ in range(sizes.burn_calls // 2):
                await executor.run(call)

        await asyncio.gather(caller(), caller())
        return round(sizes.burn_calls / (time.perf_counter() - started), 1)
    finally:
        await executor.close()


async def executor_ms(isolation: str, sizes: Sizes) -> list[float]:
    """Serial ``invoke`` latency (ms) of one executor, no Pulsar in the way."""
    executor = (ThreadExecutor(bench_echo, "bench-echo", 1) if isolation == "thread"
                else ProcessExecutor("bench-echo", ObjectSource(bench_echo), 1, WorkerLimits()))
    await executor.start()
    call = ("bench", {}, {"text": "hello"})
    try:
        for _ in range(sizes.warmup):
            await executor.run(call)
        samples = []
        for _ in range(sizes.serial):
            started = time.perf_counter()
            await executor.run(call)
            samples.append(since_ms(started))
        return samples
    finally:
        await executor.close()


def tghost_run(env: dict[str, str], isolation: str) -> Any:
    return process([sys.executable, "-m", "tghost", "run", "--log-level", "error", "--isolation", isolation], env)


async def echo_latency(url: str, sizes: Sizes) -> dict[str, float]:
    async with service_client(url, "plain-echo") as svc:
        call = lambda: svc.call({}, {"text": "hello"}, timeout=CALL_TIMEOUT)  # noqa: E731
        await ready(call)
        samples = await serial_ms(call, sizes.serial, sizes.warmup)
    return {"p50_ms": round(statistics.median(samples), 3), "p99_ms": round(percentile(samples, 99), 3)}


async def burn_rate(url: str, service: str, sizes: Sizes) -> tuple[float, int]:
    async with service_client(url, service) as svc:
        call = lambda: svc.call({}, {"n": sizes.burn_n}, timeout=60)  # noqa: E731
        await ready(call)
        await throughput(call, 4, 2)  # start both workers
        return await throughput(call, sizes.burn_calls, 2)


async def recoveries(url: str, sizes: Sizes) -> list[float]:
    """Milliseconds from a crash reply to the first successful call after it, per crash."""
    async with service_client(url, "plain-echo") as svc:
        call = lambda: svc.call({}, {"text": "hello"}, timeout=CALL_TIMEOUT)  # noqa: E731
        await ready(call)
        samples = []
        for _ in range(sizes.crashes):
            with contextlib.suppress(ToolCallError):
                await svc.call({}, {"text": "crash"}, timeout=CALL_TIMEOUT)
            started = time.perf_counter()
            await call()
            samples.append(since_ms(started))
            await asyncio.sleep(0.2)
    return samples


def main(quick: bool = False) -> None:
    sizes = QUICK if quick else FULL
    rows: list[dict[str, Any]] = []
    with broker() as running, host_env(running.url, {"isolation": PLUGIN}) as env:
        latency, rates = {}, {}
        for isolation in ("thread", "process"):
            with tghost_run(env, isolation):
                latency[isolation] = asyncio.run(echo_latency(running.url, sizes))
                rates[isolation, 2] = asyncio.run(burn_rate(running.url, "burn-2", sizes))
                if isolation == "process":
                    rates[isolation, 1] = asyncio.run(burn_rate(running.url, "burn-1", sizes))
                    recovery = asyncio.run(recoveries(running.url, sizes))
    alone = {isolation: statistics.median(asyncio.run(executor_ms(isolation, sizes))) for isolation in latency}
    alone_rates = {
        "thread, 2 threads": asyncio.run(executor_rate(ThreadExecutor(bench_burn, "bench-burn", 2), sizes)),
        **{f"process, {n} worker(s)": asyncio.run(executor_rate(
            ProcessExecutor("bench-burn", ObjectSource(bench_burn), n, WorkerLimits()), sizes)) for n in (1, 2)}}
    extra = round(latency["process"]["p50_ms"] - latency["thread"]["p50_ms"], 3)
    rows.append({"figure": "echo serial p50 / p99, thread", "value": f"{latency['thread']['p50_ms']} / "
                 f"{latency['thread']['p99_ms']} ms", "goal": ""})
    rows.append({"figure": "echo serial p50 / p99, process", "value": f"{latency['process']['p50_ms']} / "
                 f"{latency['process']['p99_ms']} ms", "goal": ""})
    rows.append({"figure": "IPC cost: extra p50 of process mode", "value": f"{extra} ms", "goal": "<= 0.3 ms"})
    rows.append({"figure": "executor alone: invoke p50, thread / process", "value": f"{alone['thread']:.3f} / "
                 f"{alone['process']:.3f} ms", "goal": ""})
    rows.append({"figure": "IPC cost, executor alone: extra p50 of process", "value":
                 f"{alone['process'] - alone['thread']:.3f} ms", "goal": "<= 0.3 ms"})
    for (isolation, workers), (rate, errors) in sorted(rates.items()):
        rows.append({"figure": f"CPU-bound, concurrency 2, {isolation}, {workers} worker(s)",
                     "value": f"{rate} calls/s" + (f" ({errors} errors)" if errors else ""), "goal": ""})
    scaling = round(rates["process", 2][0] / rates["process", 1][0], 2)
    rows.append({"figure": "CPU-bound scaling, 2 worker processes vs 1", "value": f"{scaling}x", "goal": ">= 1.6x"})
    for label, rate in alone_rates.items():
        rows.append({"figure": f"executor alone: CPU-bound, concurrency 2, {label}", "value": f"{rate} calls/s",
                     "goal": ""})
    rows.append({"figure": "executor alone: CPU-bound scaling, 2 worker processes vs 1", "value":
                 f"{round(alone_rates['process, 2 worker(s)'] / alone_rates['process, 1 worker(s)'], 2)}x",
                 "goal": ">= 1.6x"})
    rows.append({"figure": "recovery: crash reply -> next success, median / max",
                 "value": f"{round(statistics.median(recovery))} / {round(max(recovery))} ms", "goal": "< 1000 ms"})
    report("isolation", f"Process isolation: {sizes.serial} serial echo calls per mode; {sizes.burn_calls} CPU-bound "
           f"calls ({sizes.burn_n:,} loop steps each) at concurrency 2; {sizes.crashes} crashes", rows, asdict(sizes))


if __name__ == "__main__":
    main("--quick" in sys.argv)
