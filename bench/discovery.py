"""Discovery latency: how soon an agent's ToolDirectory sees a tool.

1. announce -> seen: from a host publishing an announcement to a following directory's event.
2. start -> visible: from launching ``tghost run`` to its tools in a following directory.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid

import tghost
from tghost.announce import Announcer, HostIdentity
from tghost.broker import PulsarSettings
from tghost.directory import ToolDirectory
from tghost.discover import catalog_of

from .common import broker, report, summary

RUNS = 20


@tghost.tool
def ping() -> str:
    """Answer pong."""
    return "pong"


async def announce_to_seen(url: str) -> list[float]:
    """Per run: a fresh host id announces ``ping``; time until the directory's 'added' event."""
    topic = f"persistent://tg/config/bench-{uuid.uuid4().hex[:8]}"
    settings = PulsarSettings(url)
    client = await settings.connect()
    samples = []
    async with ToolDirectory(settings, topic) as directory:
        changes = directory.changes()
        for run in range(RUNS):
            announcer = Announcer(catalog_of([ping]), HostIdentity(f"bench-{run}", "bench", os.getpid()), topic)
            started = time.perf_counter()
            await announcer.start(client)
            while (await anext(changes)).kind != "added":
                pass
            samples.append((time.perf_counter() - started) * 1000)
            await announcer.withdraw()
            while (await anext(changes)).kind != "removed":
                pass
        await changes.aclose()
    await client.close()
    return samples


async def start_to_visible(url: str) -> list[float]:
    """Per run: launch ``tghost run`` (example plugins installed) and time until its tools show."""
    topic = f"persistent://tg/config/bench-{uuid.uuid4().hex[:8]}"
    samples = []
    with tempfile.TemporaryDirectory() as config:
        env = {**os.environ, "TGHOST_PULSAR_URL": url, "TGHOST_DESCRIPTORS_TOPIC": topic,
               "XDG_CONFIG_HOME": config}
        async with ToolDirectory(PulsarSettings(url), topic) as directory:
            changes = directory.changes()
            for _ in range(RUNS):
                started = time.perf_counter()
                host = subprocess.Popen([sys.executable, "-m", "tghost", "run", "--log-level", "warning"], env=env)
                while (await anext(changes)).kind != "added":
                    pass
                samples.append((time.perf_counter() - started) * 1000)
                host.terminate()
                host.wait()
                async with asyncio.timeout(30):
                    while directory.tools:
                        await anext(changes)
            await changes.aclose()
    return samples


def main() -> None:
    with broker() as running:
        rows = [{"measure": "announce -> directory sees it", **summary(asyncio.run(announce_to_seen(running.url)))},
                {"measure": "tghost run start -> tools visible",
                 **summary(asyncio.run(start_to_visible(running.url)))}]
    report("discovery", f"Discovery latency ({RUNS} runs each)", rows)


if __name__ == "__main__":
    main()
