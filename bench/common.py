"""Shared benchmark plumbing: a private broker, generated plugin distributions, `tghost run`
subprocesses, the load generator, percentiles, and the table + JSON report.

Benchmarks print a table and write JSON to bench/results/; they assert nothing about time.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from importlib.metadata import PackageNotFoundError, entry_points, version
from pathlib import Path
from typing import Any

import psutil

from tghost.agent.client import ToolCallError, ToolServiceClient
from tghost.agent.directory import Change, ToolDirectory
from tghost.broker import EmbeddedBroker
from tghost.discovery.discover import ENTRY_POINT_GROUP
from tghost.protocol.descriptors import request_queue, response_queue
from tghost.protocol.trust import Signer
from tghost.pulsar.clients import PulsarSettings
from tghost.system.net import free_port

RESULTS = Path(__file__).parent / "results"
REPO = Path(__file__).resolve().parent.parent
#: Seconds one benchmark call may take before it counts as an error.
CALL_TIMEOUT = 10.0
#: Seconds a server may take to answer its first call, or a host to announce its tools.
READY_TIMEOUT = 120.0

#: One call of the service under test; raises ToolCallError on an error reply or a timeout.
Call = Callable[[], Awaitable[object]]

#: The echo tool plugin (one service ``echo`` on topic ``echo``, one tool ``echo``).
ECHO = '''
import tghost

@tghost.tool
async def echo(text: str) -> str:
    """Echo the text back."""
    return text

@tghost.hookimpl
def tghost_register_services(register):
    register(echo)
'''
ECHO_ARGS = {"text": "hello"}


# -- machine and report ---------------------------------------------------------------------


def _version(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    models = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return models[0] if models else platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """What the numbers were measured on: CPU model, cores, memory (GiB), OS and versions."""
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "system": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "pulsar-client": _version("pulsar-client"), "pulsar-lite": _version("pulsar-lite"),
            "tghost": _version("tghost")}


def print_header(quick: bool) -> None:
    """Print the machine description (and a warning on ``--quick`` runs)."""
    print("# tghost benchmarks" + (" (--quick: tiny sizes, the numbers are noise)" if quick else ""))
    for key, value in machine().items():
        print(f"- {key}: {value}")


def report(name: str, title: str, rows: list[dict[str, Any]], params: dict[str, Any] | None = None) -> None:
    """Print rows as an aligned table under ``title`` and write them (with ``params``, the sizes
    used, and the machine) to results/<name>.json."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    cells = [columns] + [[str(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    print(f"\n## {title}\n")
    for i, row in enumerate(cells):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    RESULTS.mkdir(exist_ok=True)
    document = {"title": title, "machine": machine(), "params": params or {}, "rows": rows}
    (RESULTS / f"{name}.json").write_text(json.dumps(document, indent=2))


# -- statistics ------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def summary(samples_ms: Sequence[float]) -> dict[str, float]:
    """Median, p99, min and max of samples in milliseconds, rounded to 0.01 ms."""
    return {"n": len(samples_ms), "median_ms": round(statistics.median(samples_ms), 2),
            "p99_ms": round(percentile(samples_ms, 99), 2), "min_ms": round(min(samples_ms), 2),
            "max_ms": round(max(samples_ms), 2)}


def ratio(value: float, floor: float) -> float:
    """``value / floor`` rounded to 0.01."""
    return round(value / floor, 2)


def since_ms(started: float) -> float:
    """Milliseconds since ``started`` (a ``time.perf_counter()`` value)."""
    return (time.perf_counter() - started) * 1000


# -- broker, plugins and processes -----------------------------------------------------------


@contextmanager
def broker() -> Iterator[EmbeddedBroker]:
    """A fresh embedded broker on a free port with a temporary data dir."""
    with tempfile.TemporaryDirectory() as data, EmbeddedBroker(Path(data), free_port()) as running:
        yield running


def unique_topic() -> str:
    """A fresh descriptors topic, so runs never see each other's announcements."""
    return f"persistent://tg/config/bench-{uuid.uuid4().hex[:8]}"


def write_plugin(root: Path, name: str, source: str) -> None:
    """Fake-install a plugin distribution in ``root``: ``tghost_bench_<name>.py`` plus a
    ``*.dist-info`` with METADATA and an entry point ``name`` in group ``tghost.plugins``."""
    module = "tghost_bench_" + re.sub(r"\W", "_", name)
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tghost-bench-{name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{name} = {module}\n")


@contextmanager
def host_env(url: str, plugins: dict[str, str]) -> Iterator[dict[str, str]]:
    """Environment for ``tghost run`` serving only ``plugins`` (entry point name -> module source).

    The plugins are written to a temporary site dir put on PYTHONPATH; every plugin installed
    in this environment (the examples) is disabled; the config dir (host id slots, tools.toml)
    is private; the descriptors topic is fresh. Hosts started with one env share all that but
    get distinct host ids.
    """
    with tempfile.TemporaryDirectory(prefix="tghost-bench-") as tmp:
        site, config = Path(tmp, "site"), Path(tmp, "config")
        site.mkdir()
        for name, source in plugins.items():
            write_plugin(site, name, source)
        installed = ",".join(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
        path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
        yield {**os.environ, "PYTHONPATH": path, "XDG_CONFIG_HOME": str(config), "TGHOST_PULSAR_URL": url,
               "TGHOST_DESCRIPTORS_TOPIC": unique_topic(), "TGHOST_DISABLE_PLUGINS": installed}


@contextmanager
def process(args: list[str], env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``args`` (cwd: the repository); always terminated, then killed after 15 s, at the end."""
    proc = subprocess.Popen(args, env=env, cwd=REPO, stdout=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def tghost_run(env: dict[str, str]) -> AbstractContextManager[subprocess.Popen[bytes]]:
    """``python -m tghost run --log-level warning`` in ``env`` (a :func:`process` context)."""
    return process([sys.executable, "-m", "tghost", "run", "--log-level", "warning"], env)


def cpu_seconds(pids: Sequence[int]) -> list[float]:
    """User + system CPU seconds used so far by each of these processes and their live children
    (a host's worker processes under process isolation)."""
    return [sum(sum(p.cpu_times()[:2]) for p in _with_children(psutil.Process(pid))) for pid in pids]


def _with_children(proc: psutil.Process) -> list[psutil.Process]:
    return [proc, *proc.children(recursive=True)]


def rss_mib(pid: int) -> float:
    """Resident memory of a process, MiB (0.1)."""
    return round(float(psutil.Process(pid).memory_info().rss) / 2**20, 1)


# -- calling, waiting and load ---------------------------------------------------------------


@asynccontextmanager
async def service_client(url: str, topic: str, identity: Signer | None = None,
                         host_keys: Sequence[str] = ()) -> AsyncIterator[ToolServiceClient]:
    """A started ToolServiceClient for the service on short ``topic`` (own Pulsar client),
    signing its requests with ``identity`` if given, in a session with the hosts whose session
    ``host_keys`` are given (docs/protocol.md §2.9)."""
    client = await PulsarSettings(url).connect()
    try:
        async with ToolServiceClient(client, request_queue(topic), response_queue(topic), identity,
                                     (lambda: host_keys) if host_keys else None) as svc:
            yield svc
    finally:
        await client.close()


def echo_call(svc: ToolServiceClient) -> Call:
    """One echo call through ``svc``."""
    return lambda: svc.call({}, ECHO_ARGS, timeout=CALL_TIMEOUT)


async def ready(call: Call, timeout: float = READY_TIMEOUT) -> None:
    """Call until a call answers: a request sent before the server subscribed is dropped
    (non-persistent topic), so this is how a server is known to serve.

    Raises:
        TimeoutError: no answer within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            await asyncio.wait_for(call(), 1.0)
            return
        except (ToolCallError, TimeoutError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not answer within {timeout}s") from None


@asynccontextmanager
async def following(directory: ToolDirectory) -> AsyncIterator[AsyncIterator[Change]]:
    """The directory's ``changes()`` stream, closed when the block ends."""
    changes = directory.changes()
    try:
        yield changes
    finally:
        await changes.aclose()


async def until(changes: AsyncIterator[Change], done: Callable[[], bool], timeout: float = READY_TIMEOUT) -> None:
    """Read a directory's ``changes()`` until ``done()`` holds (checked first).

    Raises:
        TimeoutError: not within ``timeout`` seconds.
    """
    async with asyncio.timeout(timeout):
        while not done():
            await anext(changes)


async def warm_up(call: Call, n: int) -> None:
    """``n`` untimed calls, one after another."""
    for _ in range(n):
        await call()


async def serial_ms(call: Call, n: int, warmup: int) -> list[float]:
    """Latency (ms) of ``n`` calls one after another, after ``warmup`` untimed calls."""
    await warm_up(call, warmup)
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        samples.append(since_ms(started))
    return samples


async def throughput(call: Call, total: int, concurrency: int) -> tuple[float, int]:
    """(calls/s, errors) for ``total`` calls made by ``concurrency`` callers at once."""
    todo = iter(range(total))
    errors = 0

    async def caller() -> None:
        nonlocal errors
        for _ in todo:
            try:
                await call()
            except ToolCallError:
                errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return round(total / (time.perf_counter() - started)), errors
