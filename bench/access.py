"""Access: what a host's ``[access]`` policy costs per call (docs/guides/security.md "Who may call what").

One ``tghost run`` serving the echo tool, in three set-ups, in turn, ``REPS`` times: no policy
and an anonymous caller (today's path); a policy with the caller's key, the caller signing
every request (the host verifies an Ed25519 signature per call, docs/protocol.md §2.8); and the
same policy with the caller in a session with the host, as a directory's calls are (one
signature per session, an HMAC per call, §2.9). The host also checks the replay window, the
tool and a rate too high to bite. Serial latency (median of ``SERIAL`` calls) and throughput at
concurrency ``CONCURRENCY``. Nothing here asserts anything about time.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tghost.agent.directory import ToolDirectory
from tghost.protocol.trust import Signer, write_key_pair
from tghost.pulsar.clients import PulsarSettings

from .common import (
    ECHO,
    ECHO_ARGS,
    broker,
    host_env,
    ready,
    report,
    serial_ms,
    service_client,
    summary,
    tghost_run,
    throughput,
)

CONCURRENCY = 64
POLICY = """
[access]
anonymous = []

[access.callers.bench]
public-key = "bench.pub"
tools = ["echo"]
rate = "1000000/second"
"""


@dataclass(frozen=True)
class Sizes:
    serial: int
    warmup: int
    total: int
    reps: int


FULL = Sizes(serial=2000, warmup=200, total=20000, reps=3)
QUICK = Sizes(serial=50, warmup=10, total=200, reps=1)


async def session_keys(url: str, topic: str, identity: Signer) -> list[str]:
    """The session keys the echo service's hosts announce on ``topic``."""
    async with ToolDirectory(PulsarSettings(url), topic, identity=identity) as directory:
        await directory.wait_for("echo", timeout=30)
        return directory.calls.session_keys(directory.tools["echo"].service.descriptor.id)


async def measure(url: str, env: dict[str, str], identity: Signer | None, sizes: Sizes,
                  in_session: bool = False) -> tuple[float, float]:
    """(serial median ms, calls/s at CONCURRENCY) of one host in ``env``."""
    with tghost_run(env):
        keys = await session_keys(url, env["TGHOST_DESCRIPTORS_TOPIC"], identity) if in_session and identity else []
        async with service_client(url, "echo", identity, keys) as svc:
            def call() -> Any:
                return svc.call({}, ECHO_ARGS, timeout=30)
            await ready(call)
            median = summary(await serial_ms(call, sizes.serial, sizes.warmup))["median_ms"]
            rate, errors = await throughput(call, sizes.total, CONCURRENCY)
            assert errors == 0, f"{errors} calls failed"
            return median, rate


async def run(url: str, sizes: Sizes) -> list[dict[str, Any]]:
    results: dict[str, list[tuple[float, float]]] = {
        "no policy, anonymous": [], "policy, caller signing each request": [], "policy, caller in a session": []}
    with tempfile.TemporaryDirectory(prefix="tghost-bench-access-") as tmp:
        pair = write_key_pair(Path(tmp) / "bench")
        config = Path(tmp) / "access.toml"
        config.write_text(POLICY)
        identity = Signer.from_file(pair.private)
        for _ in range(sizes.reps):
            with host_env(url, {"echo": ECHO}) as env:
                results["no policy, anonymous"].append(await measure(url, env, None, sizes))
            for name, in_session in (("policy, caller signing each request", False),
                                     ("policy, caller in a session", True)):
                with host_env(url, {"echo": ECHO}) as env:
                    guarded = {**env, "TGHOST_CONFIG": str(config)}
                    results[name].append(await measure(url, guarded, identity, sizes, in_session))
    base_ms = statistics.median(m for m, _ in results["no policy, anonymous"])
    base_rate = statistics.median(r for _, r in results["no policy, anonymous"])
    rows = []
    for name, samples in results.items():
        median_ms = statistics.median(m for m, _ in samples)
        rate = statistics.median(r for _, r in samples)
        rows.append({"set-up": name, "serial_p50_ms": round(median_ms, 3),
                     "extra_p50_ms": round(median_ms - base_ms, 3),
                     f"c{CONCURRENCY}_calls_per_s": round(rate), "throughput_ratio": round(rate / base_rate, 2)})
    return rows


def main(quick: bool = False) -> None:
    sizes = QUICK if quick else FULL
    with broker() as running:
        rows = asyncio.run(run(running.url, sizes))
    report("access", f"Access policy: serial p50 of {sizes.serial} calls and calls/s at c{CONCURRENCY} "
                     f"({sizes.total} calls), medians of {sizes.reps} interleaved repetitions", rows, asdict(sizes))


if __name__ == "__main__":
    main("--quick" in sys.argv)
