"""Reload: ``tghost run --reload``, from a save of a plugin's source to the new code answering.

One ``tghost run --reload`` serves one plugin; callers keep calling its tool through a
``ToolDirectory`` while the plugin's source is saved ``SAVES`` times, each save changing what the
tool answers. Per save: the seconds from the save until the first answer of the new code, and
how every call during the whole run ended (answered by the old or new code, an error by type, or
no answer within the caller's ``timeout``). Nothing here asserts anything about time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import tghost

from .common import broker, host_env, process, report

#: The plugin; ``{mark}`` is what each save changes.
SOURCE = '''
import tghost

@tghost.tool
def loud(text: str) -> str:
    """Say it louder."""
    return text.upper() + "{mark}"

@tghost.hookimpl
def tghost_register_services(register):
    register(loud)
'''
CALLERS = 4
VERBOSE = bool(os.environ.get("BENCH_VERBOSE"))
#: Seconds between two saves: long enough for the old process to drain and exit.
PAUSE = 6.0


async def _call(directory: tghost.ToolDirectory, ended: Counter[str], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            ended[str(await directory.invoke("loud", {"text": "hi"}, timeout=20))] += 1
        except tghost.ToolCallError as exc:
            ended[f"error {exc.error_type}"] += 1
            if VERBOSE:
                print(exc, file=sys.stderr)
            await asyncio.sleep(0.01)


async def _first(ended: Counter[str], answer: str) -> None:
    while not ended[answer]:
        await asyncio.sleep(0.005)


async def _measure(url: str, topic: str, source: Path, saves: int) -> tuple[list[float], Counter[str]]:
    ended: Counter[str] = Counter()
    stop, seconds = asyncio.Event(), []
    async with tghost.ToolDirectory(tghost.PulsarSettings(url), topic) as directory:
        await directory.wait_for("loud", 60)
        callers = [asyncio.create_task(_call(directory, ended, stop)) for _ in range(CALLERS)]
        await asyncio.sleep(PAUSE)  # the watches are set up
        for save in range(1, saves + 1):
            source.write_text(SOURCE.replace("{mark}", "!" * (save + 1)))
            saved = time.monotonic()
            await asyncio.wait_for(_first(ended, "HI" + "!" * (save + 1)), 60)
            seconds.append(round(time.monotonic() - saved, 2))
            await asyncio.sleep(PAUSE)
        stop.set()
        await asyncio.gather(*callers)
    return seconds, ended


def main(quick: bool = False) -> None:
    saves = 2 if quick else 5
    with broker() as running, host_env(running.url, {"loud": SOURCE.replace("{mark}", "!")}) as env:
        source = Path(env["PYTHONPATH"].split(":")[0]) / "tghost_bench_loud.py"
        with process([sys.executable, "-m", "tghost", "run", "--reload", "--log-level", "warning"], env) as host:
            seconds, ended = asyncio.run(_measure(running.url, env["TGHOST_DESCRIPTORS_TOPIC"], source, saves))
            host.send_signal(signal.SIGINT)
            host.wait(30)
    rows: list[dict[str, Any]] = [{"save": i, "seconds_to_new_code": s} for i, s in enumerate(seconds, 1)]
    rows.append({"save": "all", "calls": sum(ended.values()),
                 "answered": sum(n for k, n in ended.items() if k.startswith("HI")),
                 **{k: n for k, n in sorted(ended.items()) if k.startswith("error")}})
    report("reload", "tghost run --reload: save to new code answering, and calls lost", rows,
           {"saves": saves, "callers": CALLERS, "pause_s": PAUSE})
