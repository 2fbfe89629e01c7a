"""Drain: calls lost when a host is sent SIGTERM under load.

(a) two ``tghost run`` hosts serve one service; the first gets SIGTERM while it holds a long
    call; (b) one host gets SIGTERM while it holds a long call. In both, callers keep sending
    short calls at ``RATE`` per second from just before the signal until the grace period is
    over and the host has exited, each with a ``CALL_TIMEOUT`` of its own. The table counts how each short call ended:
    answered (``ok``), answered with an error (by type), or never answered (the caller's own
    timeout). The long calls are not counted. Nothing here asserts anything about time.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from tghost.agent.client import ToolCallError, ToolServiceClient
from tghost.protocol import wire
from tghost.system.net import free_port

from .common import broker, host_env, process, ready, report, service_client

#: One service ``work``: sleeps ``seconds`` (a long call holds a host), else answers at once.
WORK = '''
import asyncio
import tghost

@tghost.tool(timeout=120)
async def work(seconds: float = 0.0) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "done"

@tghost.hookimpl
def tghost_register_services(register):
    register(work)
'''
#: Short calls per second sent while a host drains.
RATE = 100
#: Seconds a short call waits for its answer before it counts as never answered.
CALL_TIMEOUT = 15.0
#: Seconds a long call sleeps: longer than any grace, so the host is still draining it.
LONG = 60.0
UNANSWERED = "never answered"


def host(env: dict[str, str], grace: float, metrics_port: int) -> AbstractContextManager[subprocess.Popen[bytes]]:
    return process([sys.executable, "-m", "tghost", "run", "--log-level", "warning", "--grace", str(grace),
                    "--metrics-port", str(metrics_port)], env)


def metric(port: int, sample: str) -> float:
    """One sample of the host's metrics on ``port``, e.g. ``tghost_in_flight{service="work"}``
    (0 when the host or the sample is not there)."""
    with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(sample + " "):
                return float(line.split()[-1])
    return 0.0


def in_flight(port: int) -> float:
    return metric(port, 'tghost_in_flight{service="work"}')


async def every_host_answers(svc: ToolServiceClient, ports: list[int]) -> None:
    """Call until each host has answered a call (so each has subscribed)."""
    answered = 'tghost_invocations_total{service="work",status="ok"}'
    await ready(lambda: svc.call({}, {}, timeout=5))
    while not all([await asyncio.to_thread(metric, port, answered) for port in ports]):
        await svc.call({}, {}, timeout=5)


async def hold_a_long_call(svc: ToolServiceClient, port: int, held: list[asyncio.Task[str]]) -> None:
    """Send long calls until the host on metrics ``port`` is running one."""
    while await asyncio.to_thread(in_flight, port) < 1:
        held.append(asyncio.create_task(svc.call({}, {"seconds": LONG}, timeout=LONG + 30)))
        await asyncio.sleep(0.3)


async def outcome(svc: ToolServiceClient) -> str:
    try:
        await svc.call({}, {}, timeout=CALL_TIMEOUT)
    except ToolCallError as exc:
        # the caller's own timeout: the tool's (120 s) is far past CALL_TIMEOUT
        return UNANSWERED if exc.error_type == wire.TIMEOUT else exc.error_type
    return "ok"


async def load_through_sigterm(svc: ToolServiceClient, victim: subprocess.Popen[bytes], grace: float) -> Counter[str]:
    """Short calls at :data:`RATE`/s, from 1 s before ``victim`` gets SIGTERM until it exits
    (at the end of its grace): each was sent while the host was still there to answer it."""
    calls: list[asyncio.Task[str]] = []
    started = time.monotonic()
    signalled = False
    while (elapsed := time.monotonic() - started) < grace + 5 and victim.poll() is None:
        if not signalled and elapsed >= 1:
            victim.send_signal(signal.SIGTERM)
            signalled = True
        calls.append(asyncio.create_task(outcome(svc)))
        await asyncio.sleep(1 / RATE)
    return Counter(await asyncio.gather(*calls))


async def scenario(url: str, env: dict[str, str], hosts: int, grace: float) -> dict[str, Any]:
    ports = [free_port() for _ in range(hosts)]
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(host(env, grace, port)) for port in ports]
        async with service_client(url, "work") as svc:
            await every_host_answers(svc, ports)
            held: list[asyncio.Task[str]] = []
            await hold_a_long_call(svc, ports[0], held)
            counts = await load_through_sigterm(svc, procs[0], grace)
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
    sent = sum(counts.values())
    errors = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()) if kind not in ("ok", UNANSWERED))
    return {"hosts": hosts, "grace_s": grace, "short_calls": sent, "ok": counts["ok"], "errors": errors or "0",
            "never_answered": counts[UNANSWERED],
            "never_answered_pct": round(100 * counts[UNANSWERED] / sent, 1) if sent else 0.0}


def run(grace: float) -> Iterator[dict[str, Any]]:
    for hosts in (2, 1):
        with broker() as running, host_env(running.url, {"work": WORK}) as env:
            yield asyncio.run(scenario(running.url, env, hosts, grace))


def main(quick: bool = False) -> None:
    grace = 3.0 if quick else 10.0
    rows = list(run(grace))
    report("drain", f"Drain: short calls at {RATE}/s while the first host drains after SIGTERM "
           f"(holding a {LONG:g} s call; grace {grace:g} s)", rows,
           {"rate": RATE, "call_timeout_s": CALL_TIMEOUT, "grace_s": grace, "long_call_s": LONG})


if __name__ == "__main__":
    main("--quick" in sys.argv)
