"""Liveness: how soon a caller learns that its tool's only host was killed, and what the liveness
probes cost (docs/protocol.md §2.15).

One ``tghost run`` serving a tool that sleeps, SIGKILLed ``REPS`` times (a fresh host each time):

- *call after the kill*: a directory still lists the host (its lease runs); a call is sent
  and ends ``no-provider``: seconds from the call to its end.
- *call in flight*: a call is running on the host when it is killed: seconds from the kill to
  the call's end.

Then the cost on a live host: ``SILENT`` calls in flight at once, each silent for
``SILENT_SECONDS`` (the tool sleeps), and a reader on the service's control topic counts the
probes: each reaches every host of the service, which answers it (one message in, one out).
Nothing here asserts anything about time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import pulsar

from tghost.agent.calls import NoProvider
from tghost.agent.directory import ToolDirectory
from tghost.protocol import wire
from tghost.pulsar import hop
from tghost.pulsar.clients import PulsarSettings

from .common import broker, host_env, percentile, report, tghost_run

SLEEPY = '''
import asyncio

import tghost


@tghost.tool(max_concurrency=1000)
async def doze(seconds: float) -> str:
    """Sleep, then say so."""
    await asyncio.sleep(seconds)
    return "rested"


@tghost.hookimpl
def tghost_register_services(register):
    register(doze)
'''

#: Seconds a call may take: far past when the probes end it.
CALL_TIMEOUT = 60.0


@dataclass(frozen=True)
class Sizes:
    reps: int
    silent: int
    silent_seconds: float


FULL = Sizes(reps=10, silent=100, silent_seconds=25.0)
QUICK = Sizes(reps=2, silent=10, silent_seconds=10.0)


async def ended_in(call: asyncio.Task[Any], since: float) -> float:
    """Seconds from ``since`` (perf counter) until ``call`` ends ``no-provider``."""
    with contextlib.suppress(NoProvider):
        await call
        raise AssertionError("the call was answered: the host was not killed?")
    return time.perf_counter() - since


async def one_kill(url: str, env: dict[str, str], in_flight: bool) -> float:
    """Kill a fresh host; seconds until its caller's call ends (from the kill with ``in_flight``,
    else from the call sent after it)."""
    with tghost_run(env) as host:
        async with ToolDirectory(PulsarSettings(url), env["TGHOST_DESCRIPTORS_TOPIC"]) as directory:
            await directory.wait_for("doze", 60)
            assert await directory.invoke("doze", {"seconds": 0}) == "rested"
            call = asyncio.create_task(directory.invoke("doze", {"seconds": 50}, timeout=CALL_TIMEOUT)) \
                if in_flight else None
            await asyncio.sleep(0.5)  # the call reaches the host and runs
            os.kill(host.pid, signal.SIGKILL)
            killed = time.perf_counter()
            host.wait()
            if call is not None:
                return await ended_in(call, killed)
            sent = time.perf_counter()
            return await ended_in(asyncio.create_task(
                directory.invoke("doze", {"seconds": 0}, timeout=CALL_TIMEOUT)), sent)


async def probe_rate(url: str, env: dict[str, str], sizes: Sizes) -> dict[str, Any]:
    """Probes per second on the control topic while ``sizes.silent`` calls are silent."""
    with tghost_run(env):
        async with ToolDirectory(PulsarSettings(url), env["TGHOST_DESCRIPTORS_TOPIC"]) as directory:
            await directory.wait_for("doze", 60)
            descriptor = directory.tools["doze"].service.descriptor
            client = directory.calls.client
            assert client is not None
            probes = 0

            def counted(consumer: Any, message: Any) -> None:
                nonlocal probes
                hop.acknowledge(consumer, message)
                probes += wire.PROBE in message.properties()
            reader = await hop.subscribe_listening(client, wire.control_topic(descriptor.request_queue),
                                                   f"bench-{uuid.uuid4().hex}", pulsar.ConsumerType.Exclusive, counted)
            try:
                calls = [directory.invoke("doze", {"seconds": sizes.silent_seconds}, timeout=CALL_TIMEOUT)
                         for _ in range(sizes.silent)]
                answers = await asyncio.gather(*calls)
            finally:
                await reader.close()
    assert answers == ["rested"] * sizes.silent
    return {"silent calls": sizes.silent, "seconds": sizes.silent_seconds, "probes": probes,
            "per_host_msgs_per_s_each_way": round(probes / sizes.silent_seconds, 2),
            "per_call_probes_per_s": round(probes / sizes.silent_seconds / sizes.silent, 3)}


async def kills(url: str, sizes: Sizes) -> list[dict[str, Any]]:
    """Seconds until the caller's call ends, after each of ``sizes.reps`` kills, per case."""
    rows = []
    for name, in_flight in (("call after the kill (from the call)", False), ("call in flight (from the kill)", True)):
        seconds = []
        for _ in range(sizes.reps):
            with host_env(url, {"sleepy": SLEEPY}) as env:
                seconds.append(await one_kill(url, env, in_flight))
        rows.append({"case": name, "p50_s": round(statistics.median(seconds), 2),
                     "p90_s": round(percentile(seconds, 90), 2), "max_s": round(max(seconds), 2), "n": len(seconds)})
    return rows


async def cost(url: str, sizes: Sizes) -> dict[str, Any]:
    with host_env(url, {"sleepy": SLEEPY}) as env:
        return await probe_rate(url, env, sizes)


def main(quick: bool = False) -> None:
    sizes = QUICK if quick else FULL
    with broker() as running:
        report("liveness", f"Liveness: seconds until a SIGKILLed host's caller gets no-provider ({sizes.reps} kills "
                           f"each, call timeout {CALL_TIMEOUT:g}s)", asyncio.run(kills(running.url, sizes)),
               asdict(sizes))
        report("liveness-cost", f"Liveness probes on a live host: {sizes.silent} calls silent for "
                                f"{sizes.silent_seconds:g}s", [asyncio.run(cost(running.url, sizes))], asdict(sizes))


if __name__ == "__main__":
    main("--quick" in sys.argv)
