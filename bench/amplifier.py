"""Amplifier: what serving an Amplifier tool module through tghost-amplifier costs.

One ``tghost run`` host serves (a) a ``@tghost.tool`` echo plugin and (b) an Amplifier echo tool
module, mounted unchanged on amplifier-core's coordinator: each call hops to the module's own
event loop, runs ``execute()`` and maps its ``ToolResult``. Both are called with the same
``ToolServiceClient`` code. Columns as in the round trip; ratios are to (a).
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .common import ECHO, broker, echo_call, host_env, ratio, report, service_client, tghost_run
from .roundtrip import FULL, QUICK, Sizes, measure

#: The Amplifier tool module (seed 002): tool ``amplifier_echo`` with an input schema.
MODULE = '''
from amplifier_core import ToolResult

class Echo:
    name = "amplifier_echo"
    description = "Echo the text back."
    input_schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    async def execute(self, input):
        return ToolResult(success=True, output=input["text"])

async def mount(coordinator, config):
    await coordinator.mount("tools", Echo(), name="amplifier_echo")
'''


def write_module(site: Path) -> None:
    """Fake-install the module: ``amplifier_bench_echo.py`` plus a dist-info whose
    ``amplifier.modules`` entry point ``tool-bench-echo`` names its ``mount``."""
    (site / "amplifier_bench_echo.py").write_text(MODULE)
    info = site / "amplifier_bench_echo-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: amplifier-bench-echo\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[amplifier.modules]\ntool-bench-echo = amplifier_bench_echo:mount\n")


async def both(url: str, sizes: Sizes) -> list[dict[str, Any]]:
    with host_env(url, {"echo": ECHO}) as env:
        write_module(Path(env["PYTHONPATH"].split(os.pathsep)[0]))
        disabled = env["TGHOST_DISABLE_PLUGINS"].split(",")
        env["TGHOST_DISABLE_PLUGINS"] = ",".join(name for name in disabled if name != "amplifier")
        with tghost_run(env) as host:
            rows = []
            for label, topic in (("a @tghost.tool echo", "echo"), ("b Amplifier echo module", "amplifier_echo")):
                async with service_client(url, topic) as svc:
                    rows.append(await measure(label, echo_call(svc), host.pid, sizes))
            return rows


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    floor = rows[0]
    return [{**row, "p50_vs_a": ratio(row["p50_ms"], floor["p50_ms"]),
             "c64_vs_a": ratio(row["c64_calls_s"], floor["c64_calls_s"])} for row in rows]


def main(quick: bool = False) -> None:
    sizes = QUICK if quick else FULL
    with broker() as running:
        rows = asyncio.run(both(running.url, sizes))
    report("amplifier", f"Amplifier module vs @tghost.tool: {sizes.serial} serial calls, {sizes.per_level} calls "
           "per concurrency level (calls/s); server CPU µs per call", with_ratios(rows), asdict(sizes))


if __name__ == "__main__":
    main("--quick" in sys.argv)
