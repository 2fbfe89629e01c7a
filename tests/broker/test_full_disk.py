"""full_disk: the embedded broker's disk fills up under a serving host, for real (a small tmpfs
mounted on the broker's data dir; skipped where mounting is refused, e.g. not root).

What a user sees, in order: the broker warns of low space before the disk is full; on a full disk
the host says once, in its log and in /health, that announcements cannot be published, and calls
go on; the broker's log file fails quietly; when a little space comes back pulsar-lite writes
again behind a torn record, so `tghost tools` fails within its connect timeout naming the cause;
when there is room again the broker moves the damaged store aside, restarts, and discovery is back.
A directory starting on the full disk (pulsar-lite creates no reader) fails within its connect
timeout, naming the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulsar
import pulsar.asyncio
import pytest

from tests.broker.test_embedded import ECHO, Output, until
from tests.conftest import HostProcess, LoopThread, OwnBrokers, PluginDir, live_tools, tghost_cli
from tghost.agent.client import ToolCallError, ToolServiceClient
from tghost.broker import default_data_dir, log, stop_broker
from tghost.broker.store import MIB, StoreDamage, find_damage
from tghost.protocol.descriptors import request_queue, response_queue
from tghost.pulsar.clients import PulsarSettings
from tghost.system.net import free_port

DISK_MIB = 20
#: ``tghost broker --low-space``: warn below this many MiB free.
LOW_SPACE_MIB = 4
#: ``tghost tools --connect-timeout``: seconds it may wait for a message the broker does not deliver.
CONNECT_TIMEOUT = 3.0
UNPUBLISHED = "announcements cannot be published"


@dataclass
class SmallDisk:
    """A user whose embedded broker on ``port`` keeps its data on a tmpfs of :data:`DISK_MIB` MiB."""

    port: int
    env: dict[str, str]
    data_dir: Path
    filler: Path = field(init=False)

    def __post_init__(self) -> None:
        self.filler = self.data_dir / "filler"

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def fill(self, leave: int = 0) -> None:
        """Write the filler until ``leave`` bytes are free (0: until the disk refuses a write)."""
        with self.filler.open("ab") as out:
            while (room := self._free() - leave) > 0:
                try:
                    out.write(b"\0" * min(256 * 1024, room))
                    out.flush()
                except OSError:  # full
                    return

    def _free(self) -> int:
        found = os.statvfs(self.data_dir)
        return found.f_bavail * found.f_frsize

    def free(self, size: int | None = None) -> None:
        """Give ``size`` bytes of the filler back (all of it when ``None``)."""
        if size is None:
            self.filler.unlink()
        else:
            os.truncate(self.filler, max(0, self.filler.stat().st_size - size))


def _mount(where: Path, mib: int) -> None:
    where.mkdir(parents=True, exist_ok=True)
    try:
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(where)],
                                capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        result = subprocess.CompletedProcess([], 1, "", "no mount command")
    if result.returncode != 0:
        why = result.stderr.strip() or "refused"
        reason = f"cannot mount a {mib} MiB tmpfs ({why}): run as root to test a full disk"
        print(reason)
        pytest.skip(reason)


def _unmount(where: Path) -> None:
    if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)  # still busy: detach it anyway


@pytest.fixture
def small_disk(tmp_path: Path, plugin_dir: PluginDir, monkeypatch: pytest.MonkeyPatch) -> Iterator[SmallDisk]:
    plugin_dir.add("echo", ECHO)
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    port = free_port()
    env = {**plugin_dir.user_env(f"pulsar://127.0.0.1:{port}", home / ".config", "full-disk"), "HOME": str(home)}
    data_dir = default_data_dir(port)  # where the host looks for its broker's disk
    _mount(data_dir, DISK_MIB)
    try:
        yield SmallDisk(port, env, data_dir)
    finally:
        with contextlib.suppress(Exception):
            stop_broker(port, data_dir)
        _unmount(data_dir)


class Calls:
    """Calls echo over Pulsar every 0.1 s from a loop thread, each tried again until answered;
    every try is recorded with the phase of the test it started in."""

    def __init__(self, url: str) -> None:
        self.phase = "before"
        self.tries: list[tuple[str, int, str]] = []
        """(phase, call number, "answered" or why the try was lost)."""
        self._thread = LoopThread("calls")
        self._stop = asyncio.Event()
        self._task = asyncio.run_coroutine_threadsafe(self._run(url), self._thread.loop)

    async def _run(self, url: str) -> None:
        client = await PulsarSettings(url).connect()
        try:
            async with ToolServiceClient(client, request_queue("echo"), response_queue("echo")) as echo:
                number = 0
                while not self._stop.is_set():
                    number += 1
                    await self._answered(echo, number)
                    await asyncio.sleep(0.1)
        finally:
            await client.close()

    async def _answered(self, echo: ToolServiceClient, number: int) -> None:
        while True:
            phase = self.phase
            try:
                answer = await echo.call({}, {"text": f"call {number}"}, timeout=5)
            except (ToolCallError, pulsar.asyncio.PulsarException) as exc:
                self.tries.append((phase, number, f"lost: {exc}"))
                continue
            self.tries.append((phase, number, "answered" if answer == f"call {number}" else f"wrong: {answer}"))
            return

    def stop(self) -> None:
        """Stop calling, once the call under way is answered (raises what the calls raised). Idempotent."""
        if not self._task.done():
            self._thread.loop.call_soon_threadsafe(self._stop.set)
        try:
            self._task.result(30)
        finally:
            self._thread.close()

    def answered(self) -> set[int]:
        return {number for _, number, outcome in self.tries if outcome == "answered"}

    def lost(self, *phases: str) -> list[tuple[str, int, str]]:
        return [t for t in self.tries if t[2] != "answered" and t[0] in phases]


def health(port: int) -> dict[str, Any]:
    """The host's ``GET /health`` JSON, whatever its HTTP status."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            body: dict[str, Any] = json.loads(response.read())
    except urllib.error.HTTPError as error:  # 503: degraded
        body = json.loads(error.read())
    return body


def wait_for_health(port: int, check: Callable[[dict[str, Any]], bool], timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not check(found := health(port)):
        assert time.monotonic() < deadline, f"/health never got there: {found}"
        time.sleep(0.2)
    return found


@dataclass
class Scene:
    """The foreground broker on the small disk (its terminal), a host on it with /health on
    ``metrics_port``, and calls to the host's echo service going on meanwhile."""

    disk: SmallDisk
    terminal: Output
    host: HostProcess
    host_id: str
    metrics_port: int
    calls: Calls


def test_a_full_disk_is_reported_survived_and_repaired(
    small_disk: SmallDisk, host_process: Callable[..., HostProcess]
) -> None:
    broker = subprocess.Popen([sys.executable, "-m", "tghost", "broker", "--port", str(small_disk.port),
                               "--low-space", str(LOW_SPACE_MIB)], env=small_disk.env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    scene: Scene | None = None
    try:
        scene = _serving(small_disk, broker, host_process)
        _low_on_space(scene)
        _full(scene)
        damage = _a_little_room(scene)
        lost = _room_again(scene, damage)
        scene.calls.stop()
        _count_what_was_lost(scene.calls, lost)
        _stop(scene, broker)
    finally:
        if scene is not None:
            with contextlib.suppress(Exception):  # the test's own failure, if any, is the one to see
                scene.calls.stop()
            if scene.host.process.poll() is None:
                scene.host.process.kill()
                scene.host.process.wait(10)
        if broker.poll() is None:
            broker.kill()
            broker.wait(10)


def _serving(disk: SmallDisk, broker: subprocess.Popen[str], host_process: Callable[..., HostProcess]) -> Scene:
    """The broker runs, a host serves echo on it and announces it, and calls begin."""
    assert broker.stderr is not None
    terminal = Output(broker.stderr)
    terminal.wait_for(lambda line: "embedded broker at" in line)
    metrics_port = free_port()
    host = host_process("--lease", "2", "--metrics-port", str(metrics_port), env=disk.env)
    host_id = host.wait_for("announced").split(" as host ")[1].split(",")[0]
    assert live_tools(disk.env)["echo"]["providers"] == [host_id]
    return Scene(disk, terminal, host, host_id, metrics_port, Calls(disk.url))


def _low_on_space(scene: Scene) -> None:
    """Low on space, not yet full: the broker warns, and nothing has failed yet."""
    scene.calls.phase = "low"
    scene.disk.fill(leave=2 * MIB)
    scene.terminal.wait_for(lambda line: "low disk space for the broker's data" in line)
    assert "No space left" not in scene.terminal.text


def _full(scene: Scene) -> None:
    """Full: announcements cannot be published; the host says why in its log and in /health."""
    scene.calls.phase = "full"
    scene.disk.fill()
    problem = scene.host.wait_for(UNPUBLISHED, timeout=30)
    assert "disk of the embedded broker's data dir is full" in problem, problem
    report = wait_for_health(scene.metrics_port, lambda h: any(UNPUBLISHED in p for p in h["problems"]))
    assert report["status"] == "degraded" and UNPUBLISHED in report["last_error"]["message"]
    scene.terminal.wait_for(lambda line: "pulsar-lite cannot write its store: its disk is full" in line)


def _a_little_room(scene: Scene) -> StoreDamage:
    """A little room (still low): pulsar-lite writes again, but behind a record a failed write
    tore, so a new directory cannot read the topic: `tghost tools` and `tghost call` fail
    within their connect timeout, naming the cause. Returns the damage."""
    scene.calls.phase = "damaged"
    scene.disk.free(MIB)
    scene.host.wait_for("announcements are being published again", timeout=30)
    # pulsar-lite writes its entry log in batches: wait for the records behind the tear.
    assert until(lambda: _damage_behind(scene.disk.data_dir) > 0, timeout=30), "the full disk tore no record"
    started = time.monotonic()
    tools = tghost_cli("tools", "--connect-timeout", f"{CONNECT_TIMEOUT:g}", env=scene.disk.env)
    took = time.monotonic() - started
    assert tools.returncode == 1, tools
    assert "has more messages but delivered none" in tools.stderr and "tghost broker" in tools.stderr
    assert took < CONNECT_TIMEOUT + 15, f"took {took:.1f}s"  # generous: two Python processes start meanwhile
    call = tghost_cli("call", "echo", "text=hi", "--connect-timeout", f"{CONNECT_TIMEOUT:g}", env=scene.disk.env)
    assert call.returncode == 1 and "has more messages but delivered none" in call.stderr, call
    damage = find_damage(scene.disk.data_dir)
    assert damage is not None
    return damage


def _room_again(scene: Scene, damage: StoreDamage) -> StoreDamage:
    """Room again: the broker moves the damaged store aside and restarts pulsar-lite, the host
    announces again, discovery is back. Returns the damage of the store moved aside."""
    scene.calls.phase = "restart"
    scene.disk.free()
    scene.terminal.wait_for(lambda line: "disk space for the broker's data is back" in line)
    moved = scene.terminal.wait_for(lambda line: "moved the damaged store aside" in line)
    scene.terminal.wait_for(lambda line: "started pulsar-lite" in line)
    aside = sorted(scene.disk.data_dir.glob("store.corrupt-*"))
    assert len(aside) == 1 and str(aside[0]) in moved
    lost = find_damage(aside[0])
    assert lost is not None and lost.after >= damage.after  # what was written behind the tear is gone
    assert until(lambda: "echo" in _tools_or_nothing(scene.disk.env), timeout=30), "discovery did not come back"
    assert live_tools(scene.disk.env)["echo"]["providers"] == [scene.host_id]
    scene.calls.phase = "after"
    wait_for_health(scene.metrics_port, lambda h: h["status"] == "ok")
    return lost


def _count_what_was_lost(calls: Calls, lost: StoreDamage) -> None:
    """No call: each was answered, tried again only across the restart. The announcements behind
    the tear went with the store moved aside (the host restated them on the new one)."""
    made = max(number for _, number, _ in calls.tries)
    assert made > 0 and calls.answered() == set(range(1, made + 1))
    elsewhere = calls.lost("before", "low", "full", "damaged", "after")
    assert elsewhere == [], elsewhere
    print(f"{made} calls, all answered; {len(calls.lost('restart'))} tried again across the restart; "
          f"{lost.after} announcement(s) behind the tear moved aside")


def _stop(scene: Scene, broker: subprocess.Popen[str]) -> None:
    """Both stop cleanly; the host said the cause once, the broker's terminal has no traceback."""
    scene.host.process.send_signal(signal.SIGINT)
    assert scene.host.finish() == 0
    assert scene.host.log.count(UNPUBLISHED) == 1, scene.host.log  # once, not at each reconnect
    broker.send_signal(signal.SIGTERM)
    assert broker.wait(30) == 0
    said = scene.terminal.rest()
    assert "Logging error" not in said and "Traceback" not in said, said
    assert said.count("cannot write its log") <= 1, said


def _damage_behind(data_dir: Path) -> int:
    """How many records pulsar-lite wrote behind a torn one (0: none torn, or none behind it yet)."""
    damage = find_damage(data_dir)
    return 0 if damage is None else damage.after


def _tools_or_nothing(env: dict[str, str]) -> dict[str, object]:
    result = tghost_cli("tools", "--json", "--connect-timeout", f"{CONNECT_TIMEOUT:g}", env=env)
    return {row["name"]: row for row in json.loads(result.stdout)} if result.returncode == 0 else {}


def test_a_directory_on_a_full_disk_fails_within_its_connect_timeout_naming_the_disk(small_disk: SmallDisk) -> None:
    """Once pulsar-lite's store refuses writes, it creates no reader (each is a cursor it stores)
    and drops the connection at each try: `tghost tools` and `tghost call` said `failed: 3
    Timeout` after pulsar-client's 30 s operation timeout. Now they fail after the connect
    timeout, saying which reader the broker did not create and that its disk is full."""
    started = tghost_cli("broker", "start", "--port", str(small_disk.port), env=small_disk.env)
    assert started.returncode == 0, started.stderr
    small_disk.fill()
    assert _exhaust_the_store(small_disk.url) < 500
    topic = small_disk.env["TGHOST_DESCRIPTORS_TOPIC"]
    for command in (["tools"], ["call", "echo", "text=hi"]):
        # a process timeout below the 30 s operation timeout: only the connect timeout's bound fits
        failed = tghost_cli(*command, "--connect-timeout", f"{CONNECT_TIMEOUT:g}", env=small_disk.env, timeout=25)
        assert failed.returncode == 1, failed
        assert f"did not create a reader of {topic}-epoch-" in failed.stderr, failed.stderr
        assert f"within {CONNECT_TIMEOUT:g}s" in failed.stderr, failed.stderr
        assert "the disk of the embedded broker's data dir is full" in failed.stderr, failed.stderr


def _exhaust_the_store(url: str) -> int:
    """Create readers, each a cursor pulsar-lite writes to its store, until the full disk refuses
    one (a write may still fit in the last page of a file); returns how many were made."""
    client = pulsar.Client(url, operation_timeout_seconds=1, logger=pulsar.FileLogger(pulsar.LoggerLevel.Error,
                                                                                     os.devnull))
    topic = f"persistent://tg/test/cursors-{uuid.uuid4().hex[:8]}"
    try:
        for made in range(500):
            try:
                client.create_reader(topic, pulsar.MessageId.earliest)
            except pulsar.Timeout:
                return made
    finally:
        client.close()
    return 500


# -- a damaged store at start, and the log file on a full disk (no tmpfs needed) -------------


def _store_with_messages(brokers: OwnBrokers, data_dir: Path, count: int) -> str:
    """Publish ``count`` persistent messages through a broker on ``data_dir``, then stop it; returns the topic."""
    topic = f"persistent://tg/test/store-{uuid.uuid4().hex[:8]}"
    broker = brokers.start(data_dir)
    client = pulsar.Client(broker.url, logger=pulsar.FileLogger(pulsar.LoggerLevel.Error, os.devnull))
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for number in range(count):
            producer.send(f"message {number}".encode())
    finally:
        client.close()
        broker.stop()
    return topic


def _tear(data_dir: Path, at_record: int) -> None:
    """Put 100 bytes that are no record in front of record ``at_record`` of the first entry log,
    as a write cut short by a full disk leaves them (pulsar-lite's index then misses every
    record behind them)."""
    entry_log = data_dir / "db.rocksdb" / "entrylog" / "0.log"
    data = entry_log.read_bytes()
    starts = [i for i in range(len(data)) if data.startswith(b"GELP", i)]
    entry_log.write_bytes(data[:starts[at_record]] + b"\0" * 100 + data[starts[at_record]:])


def test_broker_start_moves_a_torn_store_aside_and_says_so(own_brokers: OwnBrokers, tmp_path: Path) -> None:
    data_dir, port = tmp_path / "broker", free_port()
    _store_with_messages(own_brokers, data_dir, 5)
    _tear(data_dir, 2)
    damage = find_damage(data_dir)
    assert damage is not None and damage.after == 3
    own_brokers.detached(port, data_dir)
    started = tghost_cli("broker", "start", "--port", str(port), "--data-dir", str(data_dir), "--json")
    assert started.returncode == 0, started.stderr
    notes = json.loads(started.stdout)["notes"]
    assert len(notes) == 1 and "moved the damaged store aside" in notes[0] and "3 message(s)" in notes[0]
    assert "the embedded broker moved the damaged store aside" in started.stderr
    aside = [path.name for path in data_dir.glob("store.corrupt-*/*")]
    assert sorted(aside) == ["db.metadata.json", "db.rocksdb"] and find_damage(data_dir) is None
    assert "moved the damaged store aside" in (data_dir / "broker.log").read_text()


def test_a_store_pulsar_lite_refuses_is_moved_aside_and_it_starts(own_brokers: OwnBrokers, tmp_path: Path) -> None:
    data_dir = tmp_path / "broker"
    _store_with_messages(own_brokers, data_dir, 1)
    (data_dir / "db.rocksdb" / "CURRENT").write_text("garbage\n")  # RocksDB: "Corruption: CURRENT file corrupted"
    broker = own_brokers.start(data_dir)
    assert len(broker.notes) == 1 and "pulsar-lite refused to open it" in broker.notes[0]
    assert "Corruption" in broker.notes[0]
    assert len(list(data_dir.glob("store.corrupt-*"))) == 1


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full, a file whose every write fails (ENOSPC)")
def test_a_log_file_that_cannot_be_written_says_so_once_and_no_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    complaints = io.StringIO()
    handler = log._QuietFileHandler(Path("/dev/full"), complaints)  # every write: ENOSPC
    try:
        for number in range(50):
            handler.handle(logging.makeLogRecord({"msg": f"line {number}"}))
    finally:
        handler.close()
    assert complaints.getvalue().count("\n") == 1
    assert "cannot write its log /dev/full" in complaints.getvalue() and "No space left" in complaints.getvalue()
    assert handler.dropped == 50 and "Logging error" not in capsys.readouterr().err

    (tmp_path / "broker.log").write_text("a line the full disk cut sho")
    later = log._QuietFileHandler(tmp_path / "broker.log", complaints)
    later.failed, later.dropped = "[Errno 28] No space left on device", 7  # as after writes failed
    later.handle(logging.makeLogRecord({"msg": "back"}))
    later.close()
    lines = (tmp_path / "broker.log").read_text().splitlines()
    assert lines[0] == "a line the full disk cut sho" and lines[1].endswith("7 line(s) were dropped meanwhile")
    assert lines[2:] == ["back"] and later.failed is None
