"""Tracing and cancelling: what ``--otel`` costs per call, and how soon a cancel
frees a slot.

- **Cost.** One ``tghost run`` serving the echo tool, in turn: tracing off, and tracing on with
  every span made but exported nowhere (``OTEL_TRACES_EXPORTER=none``, the SDK's span
  processing without an exporter's I/O); the caller traces too when the host does. Serial p50
  and c64 calls/s, medians of ``reps`` runs.
- **Cancel.** A one-slot service whose call runs 60 s: the time from the caller cancelling its
  task to the next call's answer (the slot free again), in thread (async and plain def) and
  process isolation. A plain def that ignores the cancel keeps its thread (counted stuck) but
  frees its slot; it is released after each sample, so stuck threads never pile up.

Nothing here asserts anything about time.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from tghost.system import tracing

from .common import ECHO, ECHO_ARGS, broker, host_env, ready, report, serial_ms, service_client, summary, tghost_run
from .common import throughput as calls_per_second

CONCURRENCY = 64
SLOW = '''
import asyncio
import pathlib
import time

import tghost


@tghost.tool(max_concurrency=1)
async def nap(seconds: float, mark: str) -> str:
    """Sleep."""
    pathlib.Path(mark).touch()
    await asyncio.sleep(seconds)
    return "rested"


@tghost.tool(max_concurrency=1)
def grind(seconds: float, mark: str, ctx: tghost.Context) -> str:
    """Work in steps, stopping when cancelled (as docs/reference/plugin-api.md asks of a long plain def)."""
    pathlib.Path(mark).touch()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not ctx.cancelled.is_set():
        time.sleep(0.01)
    return "ground"


@tghost.tool(max_concurrency=1)
def block(seconds: float, mark: str) -> str:
    """Block, ignoring any cancel, until released (a file beside ``mark``) or ``seconds`` pass."""
    pathlib.Path(mark).touch()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not pathlib.Path(mark + ".release").exists():
        time.sleep(0.01)
    return "blocked"


@tghost.hookimpl
def tghost_register_services(register):
    register(nap)
    register(grind)
    register(block)
'''


async def cost(url: str, traced: bool, serial: int, total: int) -> tuple[float, float]:
    with host_env(url, {"echo": ECHO}) as env:
        if traced:
            env = {**env, "TGHOST_OTEL": "1", "OTEL_TRACES_EXPORTER": "none"}
        tracing.use(TracerProvider() if traced else None)
        try:
            with tghost_run(env):
                async with service_client(url, "echo") as svc:
                    def call() -> Any:
                        return svc.call({}, ECHO_ARGS, timeout=30)
                    await ready(call)
                    median = summary(await serial_ms(call, serial, 100))["median_ms"]
                    rate, errors = await calls_per_second(call, total, CONCURRENCY)
                    assert errors == 0
                    return median, rate
        finally:
            tracing.use(None)


async def cancel_to_free(url: str, tool: str, isolation: str, runs: int) -> list[float]:
    """ms from cancelling a running 60 s call to the answer of the next call on its one slot."""
    samples = []
    with host_env(url, {"slow": SLOW}) as env, tempfile.TemporaryDirectory() as tmp, \
            tghost_run({**env, "TGHOST_ISOLATION": isolation}):
        async with service_client(url, tool) as svc:
            await ready(lambda: svc.call({}, {"seconds": 0, "mark": f"{tmp}/warm"}, timeout=30))
            for i in range(runs):
                mark = Path(tmp, f"run-{i}")
                running = asyncio.create_task(svc.call({}, {"seconds": 60, "mark": str(mark)}, timeout=90))
                while not mark.exists():
                    await asyncio.sleep(0.005)
                started = time.perf_counter()
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
                await svc.call({}, {"seconds": 0, "mark": f"{tmp}/next"}, timeout=90)
                samples.append((time.perf_counter() - started) * 1000)
                Path(f"{mark}.release").touch()
    return samples


async def run(url: str, quick: bool) -> list[dict[str, Any]]:
    serial, total, reps, runs = (100, 500, 1, 3) if quick else (2000, 10_000, 3, 10)
    measured: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for _ in range(reps):
        for traced in (False, True):
            measured[traced].append(await cost(url, traced, serial, total))
    base_ms, base_rate = (statistics.median(x[i] for x in measured[False]) for i in (0, 1))
    rows = [{"case": "tracing " + ("on (spans made, not exported)" if traced else "off"),
             "serial_p50_ms": round(statistics.median(m for m, _ in samples), 3),
             "extra_p50_ms": round(statistics.median(m for m, _ in samples) - base_ms, 3),
             f"c{CONCURRENCY}_calls_per_s": round(statistics.median(r for _, r in samples)),
             "throughput_ratio": round(statistics.median(r for _, r in samples) / base_rate, 2)}
            for traced, samples in measured.items()]
    for tool, isolation, label in (("nap", "thread", "async def, loop"),
                                   ("grind", "thread", "plain def watching ctx.cancelled, thread lane"),
                                   ("block", "thread", "plain def ignoring the cancel, thread lane"),
                                   ("nap", "process", "process isolation")):
        samples = await cancel_to_free(url, tool, isolation, runs)
        rows.append({"case": f"cancel to a free slot: {label}",
                     "p50_ms": round(statistics.median(samples), 1) if samples else "-",
                     "max_ms": round(max(samples), 1) if samples else "-"})
    return rows


def main(quick: bool = False) -> None:
    with broker() as running:
        rows = asyncio.run(run(running.url, quick))
    report("tracing", "Tracing cost per call, and cancel to a free slot", rows, {"quick": quick})


if __name__ == "__main__":
    main("--quick" in sys.argv)
