"""Round trip: one client process, one embedded broker, every server running at once.

Servers (each called by the same raw sync caller, so only the server differs):

- (a) the floor: a raw sync ``pulsar.Client`` echo (bench/echo_server.py ``sync``): receive,
  acknowledge, send; the reference every ratio is taken to;
- (a2) a raw ``pulsar.asyncio`` echo (``asyncio``), for context;
- (a3) a raw listener echo answering on the client's listener thread (``listener``), and (a4) the
  same after one hop into an asyncio loop (``listener-loop``): what one hand-off between threads
  costs, which any host that runs plugin code away from the client's threads pays;
- (b) ``tghost run`` serving a generated echo plugin, an ``async def`` (``--isolation thread``,
  the default), as TrustGraph's and the joke plugin's ``invoke`` are;
- (b1) the same echo as a plain ``def``: the inline driver, which runs it on the thread that
  received it once its calls are measured short (tghost/serving/inline.py);
- (b2) the ``async def`` echo under ``tghost run --isolation process``.

Callers of (b) (the caller side): (r) the raw sync caller, (t) ``tghost.agent.client.ToolServiceClient``,
(d) ``ToolDirectory.invoke`` (catalog lookup, seed 001 check).

The raw sync caller is a ``pulsar.Client`` (no tghost): ``producer.send`` (it waits for the
broker's receipt), then the reply, routed by its ``id`` property by a message listener, is
awaited on a ``concurrent.futures.Future``; concurrency N is N threads.

Start-up: whole processes against their yardsticks, A and B in turn, with fresh
bytecode (a private ``PYTHONPYCACHEPREFIX``, warmed by one run of each): ``tghost --help`` against
``python -c "import click, pulsar"``; ``tghost tools`` and ``tghost call echo`` against
bench/raw_tools.py, which reads the same announcements with pulsar-client alone.

Each row is measured ``reps`` times, the rows interleaved (a to a4, b to b2, t, d, then again),
every repetition against servers started for it alone, and the table gives the median of each
column: serial p50/p99 latency, throughput at concurrency 1/16/64, the server process's CPU
time per call over the throughput runs, and the ratios to (a) (server rows) or to (r) (caller
rows).
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pulsar

from tghost.agent.directory import ToolDirectory
from tghost.protocol import wire
from tghost.protocol.descriptors import request_queue, response_queue
from tghost.pulsar.clients import PulsarSettings

from .common import (
    CALL_TIMEOUT,
    ECHO,
    ECHO_ARGS,
    READY_TIMEOUT,
    REPO,
    Call,
    broker,
    cpu_seconds,
    echo_call,
    host_env,
    percentile,
    process,
    ratio,
    ready,
    report,
    serial_ms,
    service_client,
    since_ms,
    throughput,
)

LEVELS = (1, 16, 64)
#: The raw echo rows (bench/echo_server.py): (label, mode).
FLOORS = (
    ("a raw sync pulsar.Client echo", "sync"),
    ("a2 raw pulsar.asyncio echo", "asyncio"),
    ("a3 raw listener echo, no hand-off", "listener"),
    ("a4 raw listener echo, one hop to a loop", "listener-loop"),
)
#: The ``tghost run`` rows: (label, isolation, the echo a plain ``def``). ``async def`` runs on the
#: event loop; a plain ``def`` on the inline driver (tghost/serving/inline.py).
HOSTS = (
    ("b tghost run", "thread", False),
    ("b1 tghost run, plain def", "thread", True),
    ("b2 tghost run --isolation process", "process", False),
)
ECHO_PAYLOAD = wire.encode_request("bench", {}, ECHO_ARGS)


@dataclass(frozen=True)
class Sizes:
    serial: int  # timed serial calls
    warmup: int  # untimed calls first
    per_level: int  # calls per concurrency level
    reps: int  # times each row is measured (interleaved); the table has the medians


FULL, QUICK = Sizes(1000, 100, 2000, 3), Sizes(50, 5, 100, 1)


class RawCaller:
    """The raw sync caller: a ``pulsar.Client`` producer on the request topic and a listener on
    the response topic that completes the waiting call's future by ``id``."""

    def __init__(self, url: str, topic: str) -> None:
        self._pending: dict[str, Future[bytes]] = {}
        self._client = pulsar.Client(url, **PulsarSettings(url).client_kwargs())
        self._consumer = self._client.subscribe(response_queue(topic), f"raw-caller-{uuid.uuid4().hex}",
                                                message_listener=self._route)
        self._producer = self._client.create_producer(request_queue(topic), batching_enabled=False)

    def _route(self, consumer: pulsar.Consumer, message: pulsar.Message) -> None:
        future = self._pending.pop(message.properties().get("id", ""), None)
        consumer.acknowledge(message)
        if future is not None:
            future.set_result(message.data())

    def call(self) -> None:
        """One echo call; raises on an error reply or a timeout (``CALL_TIMEOUT`` seconds)."""
        request_id, future = uuid.uuid4().hex, Future[bytes]()
        self._pending[request_id] = future
        self._producer.send(ECHO_PAYLOAD, properties={"id": request_id})
        response = wire.decode_response(future.result(CALL_TIMEOUT))
        if response.error:
            raise RuntimeError(response.error)

    def close(self) -> None:
        self._client.close()


def sync_serial_ms(call: Callable[[], None], n: int, warmup: int) -> list[float]:
    """Latency (ms) of ``n`` sync calls one after another, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        samples.append(since_ms(started))
    return samples


def sync_throughput(call: Callable[[], None], total: int, concurrency: int) -> tuple[float, int]:
    """(calls/s, errors) for ``total`` sync calls made by ``concurrency`` threads at once."""
    todo, lock, errors = iter(range(total)), threading.Lock(), [0]

    def caller() -> None:
        while True:
            with lock:
                if next(todo, None) is None:
                    return
            try:
                call()
            except Exception:
                errors[0] += 1

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        for done in [pool.submit(caller) for _ in range(concurrency)]:
            done.result()
    return round(total / (time.perf_counter() - started)), errors[0]


async def measure_async(call: Call, pid: int, sizes: Sizes) -> dict[str, Any]:
    """Serial latency, then throughput per level and server CPU per call, for an async caller."""
    latencies = await serial_ms(call, sizes.serial, sizes.warmup)
    row: dict[str, Any] = {"p50_ms": statistics.median(latencies), "p99_ms": percentile(latencies, 99)}
    (cpu,), errors = cpu_seconds([pid]), 0
    for level in LEVELS:
        row[f"c{level}_calls_s"], failed = await throughput(call, sizes.per_level, level)
        errors += failed
    row["server_cpu_us_call"] = (cpu_seconds([pid])[0] - cpu) / (len(LEVELS) * sizes.per_level) * 1e6
    return {**row, "errors": errors}


def measure_sync(call: Callable[[], None], pid: int, sizes: Sizes) -> dict[str, Any]:
    """:func:`measure_async` for the raw sync caller."""
    latencies = sync_serial_ms(call, sizes.serial, sizes.warmup)
    row: dict[str, Any] = {"p50_ms": statistics.median(latencies), "p99_ms": percentile(latencies, 99)}
    (cpu,), errors = cpu_seconds([pid]), 0
    for level in LEVELS:
        row[f"c{level}_calls_s"], failed = sync_throughput(call, sizes.per_level, level)
        errors += failed
    row["server_cpu_us_call"] = (cpu_seconds([pid])[0] - cpu) / (len(LEVELS) * sizes.per_level) * 1e6
    return {**row, "errors": errors}


def sync_ready(call: Callable[[], None]) -> None:
    """Call until a call answers (a request sent before the server subscribed is dropped)."""
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        try:
            call()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise


@contextmanager
def servers(url: str) -> Iterator[dict[str, tuple[int, str]]]:
    """Every server, running: label -> (pid, topic)."""
    with ExitStack() as stack:
        found = {}
        for label, mode in FLOORS:
            topic = f"bench-{mode}-echo"
            proc = stack.enter_context(process([sys.executable, "-m", "bench.echo_server", url, topic, mode]))
            found[label] = (proc.pid, topic)
        for label, isolation, plain in HOSTS:
            topic = f"echo-{isolation}{'-def' if plain else ''}"
            source = ECHO.replace("@tghost.tool\n", f'@tghost.tool(service="{topic}")\n')
            if plain:
                source = source.replace("async def echo", "def echo")
            env = stack.enter_context(host_env(url, {"echo": source}))
            env["TGHOST_ISOLATION"] = isolation
            proc = stack.enter_context(process([sys.executable, "-m", "tghost", "run", "--log-level", "warning"], env))
            found[label] = (proc.pid, topic)
            found[label + " env"] = (0, env["TGHOST_DESCRIPTORS_TOPIC"])
        yield found


def medians(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per column, the median over repetitions (latencies to 0.001 ms, the rest whole)."""
    row: dict[str, Any] = {}
    for key in samples[0]:
        value = statistics.median(s[key] for s in samples)
        row[key] = round(value, 3) if key.endswith("_ms") else round(value)
    return row


async def repetition(url: str, sizes: Sizes) -> dict[str, dict[str, Any]]:
    """One measurement of every row, label -> row, against servers started for it alone (so a
    process's placement on the cores, which stays for its life, varies between repetitions)."""
    with servers(url) as found:
        raw = {label: RawCaller(url, topic) for label, (_, topic) in found.items() if not label.endswith(" env")}
        host_pid, host_topic = found["b tghost run"]
        try:
            for caller in raw.values():
                await asyncio.to_thread(sync_ready, caller.call)
            async with service_client(url, host_topic) as svc, ToolDirectory(
                    PulsarSettings(url), found["b tghost run env"][1]) as directory:
                await ready(echo_call(svc))
                await directory.wait_for("echo", READY_TIMEOUT)
                invoke: Call = lambda: directory.invoke("echo", ECHO_ARGS, timeout=CALL_TIMEOUT)  # noqa: E731
                rows = {label: await asyncio.to_thread(measure_sync, caller.call, found[label][0], sizes)
                        for label, caller in raw.items()}
                rows["t tghost.agent.client"] = await measure_async(echo_call(svc), host_pid, sizes)
                rows["d ToolDirectory.invoke"] = await measure_async(invoke, host_pid, sizes)
                return rows
        finally:
            for caller in raw.values():
                caller.close()


async def run(url: str, sizes: Sizes) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(server rows, caller rows), each the medians over ``sizes.reps`` repetitions."""
    samples: dict[str, list[dict[str, Any]]] = {}
    for _ in range(sizes.reps):
        for label, row in (await repetition(url, sizes)).items():
            samples.setdefault(label, []).append(row)
    rows = {label: medians(s) for label, s in samples.items()}
    floor = rows["a raw sync pulsar.Client echo"]
    server_rows = [{"server (raw sync caller)": label, **row, "p50_vs_a": ratio(row["p50_ms"], floor["p50_ms"]),
                    "c64_vs_a": ratio(row["c64_calls_s"], floor["c64_calls_s"])}
                   for label, row in rows.items() if label[0] in "ab"]
    reference = rows["b tghost run"]
    caller_rows = [{"caller (of b tghost run)": label, **row, "p50_vs_r": ratio(row["p50_ms"], reference["p50_ms"]),
                    "c64_vs_r": ratio(row["c64_calls_s"], reference["c64_calls_s"])}
                   for label, row in [("r raw sync caller", reference), *rows.items()] if label[0] in "rtd"]
    return server_rows, caller_rows


#: Start-up rows: (label, the tghost command's arguments, the yardstick's label).
STARTUP = (
    ("tghost --help", ["--help"], "python -c 'import click, pulsar'"),
    ("tghost tools", ["tools"], "bench/raw_tools.py"),
    ("tghost call echo", ["call", "echo", "text=hi"], "bench/raw_tools.py"),
)


def startup(url: str, runs: int) -> list[dict[str, Any]]:
    """Wall ms of each start-up row and of its yardstick, median of ``runs`` pairs run in turn,
    against one ``tghost run`` serving the echo (docs/internals/performance.md §14)."""
    with ExitStack() as stack:
        env = stack.enter_context(host_env(url, {"echo": ECHO}))
        stack.enter_context(process([sys.executable, "-m", "tghost", "run", "--log-level", "warning"], env))
        pyc = stack.enter_context(tempfile.TemporaryDirectory(prefix="tghost-pyc-"))
        env = {key: value for key, value in env.items() if key != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = pyc
        tghost = [str(Path(sys.executable).with_name("tghost"))]
        yardsticks = {"python -c 'import click, pulsar'": [sys.executable, "-c", "import click, pulsar"],
                      "bench/raw_tools.py": [sys.executable, "bench/raw_tools.py", url,
                                             env["TGHOST_DESCRIPTORS_TOPIC"]]}
        asyncio.run(_until_listed(url, env["TGHOST_DESCRIPTORS_TOPIC"]))
        rows = []
        for label, args, yardstick in STARTUP:
            commands = (tghost + args, yardsticks[yardstick])
            for command in commands:  # warm: compile the bytecode once
                _wall_ms(command, env)
            pairs = [(_wall_ms(commands[0], env), _wall_ms(commands[1], env)) for _ in range(runs)]
            mine, theirs = statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs)
            rows.append({"command": label, "wall_ms": round(mine), "yardstick": yardstick,
                         "yardstick_ms": round(theirs), "ratio": ratio(mine, theirs)})
        return rows


async def _until_listed(url: str, topic: str) -> None:
    async with ToolDirectory(PulsarSettings(url), topic) as directory:
        await directory.wait_for("echo", READY_TIMEOUT)


def _wall_ms(command: list[str], env: dict[str, str]) -> float:
    """Milliseconds from starting ``command`` to its exit (it must exit 0)."""
    started = time.perf_counter()
    subprocess.run(command, env=env, cwd=REPO, check=True, capture_output=True, timeout=60)
    return since_ms(started)


def main(quick: bool = False) -> None:
    sizes = QUICK if quick else FULL
    with broker() as running:
        server_rows, caller_rows = asyncio.run(run(running.url, sizes))
        startup_rows = startup(running.url, 3 if quick else 15)
    what = (f"{sizes.serial} serial calls, {sizes.per_level} calls per concurrency level {', '.join(map(str, LEVELS))} "
            f"(calls/s), server CPU µs per call; medians of {sizes.reps} interleaved repetitions, "
            "servers started anew for each")
    report("roundtrip", f"Round trip, servers: {what}", server_rows, asdict(sizes))
    report("roundtrip-callers", f"Round trip, callers of tghost run: {what}", caller_rows, asdict(sizes))
    report("roundtrip-startup", "Start-up: whole commands against their yardsticks, wall ms, medians of "
                                f"{3 if quick else 15} pairs run in turn, fresh bytecode", startup_rows)


if __name__ == "__main__":
    main("--quick" in sys.argv)
