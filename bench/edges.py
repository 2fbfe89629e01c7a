"""Edges: how long tghost takes to fail, or to get going, where the broker is wrong or missing.

(a) a URL whose port holds an HTTP server: ``PulsarSettings.connect()`` in process, and
    ``tghost tools`` / ``tghost run`` as a user runs them (wall seconds, exit code, and raw
    ``ERROR``/``WARNING pulsar:`` lines on stderr);
(b) no broker at all: ``ToolDirectory.start()`` with ``connect_timeout`` 5 s (seconds, log lines);
(c) the embedded broker: ``tghost broker start`` (detached) and ``tghost broker stop``.
Each case runs ``repeats`` times; the table gives the median seconds.
"""

from __future__ import annotations

import asyncio
import http.server
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tghost.agent.directory import ToolDirectory
from tghost.pulsar.clients import BrokerError, PulsarSettings
from tghost.system.net import free_port

from .common import report

RAW_CLIENT_LINE = re.compile(r"(ERROR|WARNING) +pulsar:")


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def http_url() -> Iterator[str]:
    """A local port holding an HTTP server, where --pulsar-url might point by mistake."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"pulsar://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def command(env: dict[str, str], *args: str) -> dict[str, Any]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "tghost", *args], env=env, capture_output=True, text=True,
                            timeout=300)
    return {"seconds": time.monotonic() - started, "exit": result.returncode,
            "raw client lines": len(RAW_CLIENT_LINE.findall(result.stderr))}


def in_process(coroutine: Callable[[], Any]) -> dict[str, Any]:
    lines: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = lines.append  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    started = time.monotonic()
    try:
        asyncio.run(coroutine())
        outcome = "ok"
    except BrokerError as exc:
        outcome = type(exc).__name__
    finally:
        logging.getLogger().removeHandler(handler)
    return {"seconds": time.monotonic() - started, "exit": outcome,
            "log lines": sum(r.levelno >= logging.WARNING for r in lines)}


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    row = dict(runs[-1])
    row["seconds"] = round(statistics.median(r["seconds"] for r in runs), 2)
    return row


def main(quick: bool = False) -> None:
    repeats = 1 if quick else 3
    rows = []
    with tempfile.TemporaryDirectory() as config, http_url() as wrong:
        env = {**os.environ, "XDG_CONFIG_HOME": config, "HOME": config, "TGHOST_PULSAR_URL": wrong}
        cases: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("HTTP port: PulsarSettings.connect()",
             lambda: in_process(lambda: PulsarSettings(wrong).connect())),
            ("HTTP port: tghost tools", lambda: command(env, "tools")),
            ("HTTP port: tghost run", lambda: command(env, "run", "--load-plugins", "")),
            ("no broker: ToolDirectory.start(), connect_timeout 5 s",
             lambda: in_process(lambda: ToolDirectory(PulsarSettings(f"pulsar://127.0.0.1:{free_port()}",
                                                                     connect_timeout=5)).start())),
        ]
        for name, case in cases:
            rows.append({"case": name, **median_of([case() for _ in range(repeats)])})
        starts, stops = [], []
        for _ in range(repeats):
            port = str(free_port())
            starts.append(command(env, "broker", "start", "--port", port))
            stops.append(command(env, "broker", "stop", "--port", port))
        rows.append({"case": "tghost broker start (detached)", **median_of(starts)})
        rows.append({"case": "tghost broker stop", **median_of(stops)})
    report("edges", "Edges: time to fail on a wrong or missing broker; the embedded broker's start and stop",
           rows, {"repeats": repeats})


if __name__ == "__main__":
    main("--quick" in sys.argv)
