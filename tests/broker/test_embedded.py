"""embedded: the local pulsar-lite broker's life, as a user drives it (``tghost run``, ``tghost
broker``, ``tghost broker start|status|stop``) and as the test fixture uses it. Every broker
started here is stopped at the end of its test, and none uses the default port or config dir.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pulsar
import pytest
from click.testing import CliRunner

from tests.conftest import HostProcess, Output, OwnBrokers, PluginDir, tghost_cli
from tghost.broker import default_data_dir, log, process
from tghost.broker.status import ELSEWHERE, make_data_dir
from tghost.cli.app import cli
from tghost.pulsar.clients import BrokerError, is_reachable
from tghost.system.net import free_port

ECHO = """
import tghost

@tghost.tool
async def echo(text: str) -> str:
    '''Echo the text back.'''
    return text

@tghost.hookimpl
def tghost_register_services(register):
    register(echo)
"""

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG")


@dataclass
class Local:
    """A user of this machine with a private config (and home) dir, the echo plugin installed,
    and a free local URL where nothing runs yet; the brokers started there are stopped at the end."""

    port: int
    env: dict[str, str]
    brokers: OwnBrokers

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def data_dir(self, port: int | None = None) -> Path:
        """The default data dir of the broker on ``port`` (this user's)."""
        return default_data_dir(port or self.port)

    def tghost(self, *args: str, timeout: float = 90, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return tghost_cli(*args, env=self.env, timeout=timeout, cwd=cwd)

    def broker(self, *args: str) -> subprocess.Popen[str]:
        """A foreground ``tghost broker`` in its own session (as from another terminal)."""
        return subprocess.Popen([sys.executable, "-m", "tghost", "broker", *args], env=self.env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)

    def cleanup(self, port: int, data_dir: Path | None = None) -> None:
        """Stop the detached broker on ``port`` at the end of the test."""
        self.brokers.detached(port, data_dir or self.data_dir(port))


@pytest.fixture
def local(tmp_path: Path, plugin_dir: PluginDir, monkeypatch: pytest.MonkeyPatch, own_brokers: OwnBrokers) -> Local:
    plugin_dir.add("echo", ECHO)
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    port = free_port()
    env = plugin_dir.user_env(f"pulsar://127.0.0.1:{port}", home / ".config", "embedded")
    user = Local(port, {**env, "HOME": str(home)}, own_brokers)
    user.cleanup(port)
    return user


def record(data_dir: Path) -> dict[str, object]:
    return json.loads((data_dir / "broker.json").read_text())


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def until(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def listening(pid: int) -> set[tuple[str, int]]:
    """The (IPv4 address, port) pairs process ``pid`` listens on (Linux /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for row in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        cols = row.split()
        if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
            address, port = cols[1].split(":")
            found.add((socket.inet_ntoa(bytes.fromhex(address)[::-1]), int(port, 16)))
    return found


# -- the broker tghost run starts ------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_the_broker_outlives_the_host_that_started_it(
    local: Local, host_process: Callable[..., HostProcess], sig: signal.Signals
) -> None:
    first = host_process("--lease", "2", env=local.env)
    started = first.wait_for("started the embedded broker there", timeout=60)
    assert f"'tghost broker stop --port {local.port}' stops it" in started
    first_id = first.wait_for("announced").split(" as host ")[1].split()[0].rstrip(",")
    broker_pid = record(local.data_dir())["pid"]
    second = host_process("--host-id", "second", env=local.env)
    assert f"(pid {broker_pid}," in second.wait_for("using the embedded broker at")
    second.wait_for("announced")
    watch = subprocess.Popen([sys.executable, "-m", "tghost", "watch", "--json"], env=local.env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert watch.stdout is not None
        changes = Output(watch.stdout)
        changes.wait_for(lambda line: sorted(json.loads(line)["providers"]) == sorted([first_id, "second"]))

        first.process.send_signal(sig)
        first.process.wait(30)

        # The watcher sees the first host go (withdrawn, or its lease expired) on the same broker...
        changes.wait_for(lambda line: json.loads(line)["providers"] == ["second"])
        # ...the second host still serves on it, and the broker is the one the first host started.
        result = local.tghost("call", "--service", "echo", "text=still here")
        assert (result.returncode, result.stdout) == (0, "still here\n"), result.stderr
        status = json.loads(local.tghost("broker", "status", "--port", str(local.port), "--json").stdout)
        assert status["running"] and status["answering"] and status["pid"] == broker_pid
    finally:
        watch.terminate()
        watch.wait(10)
    second.process.send_signal(signal.SIGINT)
    assert second.finish() == 0
    assert is_reachable(local.url), "the broker stops only when asked"


def test_two_hosts_starting_at_once_share_one_broker(local: Local, host_process: Callable[..., HostProcess]) -> None:
    hosts = [host_process("--host-id", f"h{i}", env=local.env) for i in range(2)]
    lines = [host.wait_for("the embedded broker", timeout=60) for host in hosts]
    assert sorted("started the embedded broker" in line for line in lines) == [False, True], lines
    for host in hosts:
        host.wait_for("announced")
        host.process.send_signal(signal.SIGINT)
        assert host.finish() == 0


# -- tghost broker start | status | stop -----------------------------------------------------


def test_broker_start_status_stop_with_json_and_exit_codes(local: Local) -> None:
    port = str(local.port)
    before = local.tghost("broker", "status", "--port", port, "--json")
    assert before.returncode == 3 and json.loads(before.stdout)["running"] is False

    started = local.tghost("broker", "start", "--port", port, "--json")
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    assert info["started"] and info["running"] and info["answering"] and info["detached"]
    assert info["data_dir"] == str(local.data_dir()) and info["stop"] == f"tghost broker stop --port {port}"
    assert alive(info["pid"]) and alive(info["broker_pid"])

    again = local.tghost("broker", "start", "--port", port)
    assert again.returncode == 0 and again.stdout.startswith("already running: ")
    status = local.tghost("broker", "status", "--port", port)
    assert status.returncode == 0 and f"(pid {info['pid']}, pulsar-lite pid {info['broker_pid']}" in status.stdout

    stopped = local.tghost("broker", "stop", "--port", port, "--json")
    assert stopped.returncode == 0 and json.loads(stopped.stdout)["stopped"] is True
    assert not alive(info["pid"]) and not alive(info["broker_pid"]) and not is_reachable(local.url)
    assert not (local.data_dir() / "broker.json").exists()
    after = local.tghost("broker", "status", "--port", port)
    assert after.returncode == 3 and "no embedded broker runs" in after.stdout
    nothing = local.tghost("broker", "stop", "--port", port, "--json")
    assert nothing.returncode == 3 and json.loads(nothing.stdout)["stopped"] is False


def test_broker_status_and_stop_follow_tghost_pulsar_url(local: Local) -> None:
    """The user's env names the broker (TGHOST_PULSAR_URL, as for every other command): status
    and stop act there, and 'nothing to stop' at a URL the user named is exit 3, not success."""
    started = local.tghost("broker", "start", "--port", str(local.port), "--json")
    assert started.returncode == 0, started.stderr
    assert local.env["TGHOST_PULSAR_URL"] == local.url
    status = local.tghost("broker", "status")
    assert status.returncode == 0 and f"the embedded broker at {local.url} runs" in status.stdout
    stopped = local.tghost("broker", "stop")
    assert stopped.returncode == 0 and f"stopped the embedded broker at {local.url}" in stopped.stdout
    assert not is_reachable(local.url)
    again = local.tghost("broker", "stop")
    assert again.returncode == 3 and again.stdout == ""
    assert f"Error: nothing stopped (TGHOST_PULSAR_URL={local.url}): no embedded broker runs at {local.url}" \
        in again.stderr
    unnamed = local.tghost("broker", "stop", "--port", str(free_port()))
    assert unnamed.returncode == 3, "an explicit --port names the broker too"


def test_a_broker_started_with_a_data_dir_is_found_from_its_port(local: Local, tmp_path: Path) -> None:
    data_dir = tmp_path / "elsewhere"
    local.cleanup(local.port, data_dir)
    started = local.tghost("broker", "start", "--port", str(local.port), "--data-dir", str(data_dir), "--json")
    assert started.returncode == 0, started.stderr
    status = local.tghost("broker", "status", "--port", str(local.port), "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["data_dir"] == str(data_dir)
    stopped = local.tghost("broker", "stop", "--port", str(local.port))
    assert stopped.returncode == 0 and f"stopped the embedded broker at {local.url}" in stopped.stdout
    assert not is_reachable(local.url) and not (local.data_dir() / ELSEWHERE).exists()


def test_a_relative_data_dir_is_this_directorys_and_found_from_the_port(local: Local, tmp_path: Path) -> None:
    """``--data-dir rel`` once ran the broker in rel/rel and hung; the start's hint needs no --data-dir."""
    local.cleanup(local.port, tmp_path / "rel")
    started = local.tghost("broker", "start", "--port", str(local.port), "--data-dir", "rel", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    assert "--data-dir" not in started.stdout + started.stderr  # its stop hint: found from the port
    status = local.tghost("broker", "status", "--port", str(local.port), "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["data_dir"] == str(tmp_path / "rel")
    other = local.tghost("broker", "start", "--port", str(local.port), "--data-dir", str(tmp_path / "other"))
    assert other.returncode == 1 and (f"the embedded broker at {local.url} already runs, with data dir "
                                      f"{tmp_path / 'rel'}: stop it first") in other.stderr
    assert local.tghost("broker", "stop", "--port", str(local.port)).returncode == 0
    assert not (tmp_path / "rel" / "rel").exists()


@pytest.mark.parametrize(("args", "env", "error"), [
    (["--pulsar-url", "pulsar://localhost:abc"], {},
     "--pulsar-url pulsar://localhost:abc is not a local pulsar:// URL"),
    (["--pulsar-url", "pulsar+ssl://broker.example:6651"], {},
     "--pulsar-url pulsar+ssl://broker.example:6651 is not a local pulsar:// URL"),
    ([], {"TGHOST_PULSAR_URL": "pulsar://broker.example:6650"},
     "TGHOST_PULSAR_URL=pulsar://broker.example:6650 is not a local pulsar:// URL"),
    (["--port", "6651", "--pulsar-url", "pulsar://localhost:6652"], {},
     "--port 6651 and --pulsar-url pulsar://localhost:6652 name two brokers"),
], ids=["bad-port", "cluster-flag", "cluster-env", "two-ports"])
def test_broker_commands_refuse_a_url_they_cannot_act_on(args: list[str], env: dict[str, str], error: str) -> None:
    for command in (["broker", "stop", *args], ["broker", *args, "status"], ["broker", *args]):
        result = CliRunner().invoke(cli, command, env=env)
        assert result.exit_code == 2 and error in result.output, (command, result.output)


def test_an_explicit_port_wins_over_tghost_pulsar_url(local: Local) -> None:
    """A cluster in the env does not stop 'tghost broker stop --port P' (exit 3: nothing runs there)."""
    result = CliRunner().invoke(cli, ["broker", "stop", "--port", str(local.port)],
                                env={"TGHOST_PULSAR_URL": "pulsar+ssl://broker.example:6651"})
    assert result.exit_code == 3 and f"(--port {local.port}): no embedded broker runs at {local.url}" in result.output


def test_two_brokers_on_two_ports_get_their_own_data_dirs(local: Local) -> None:
    other = free_port()
    local.cleanup(other)
    for port in (local.port, other):
        result = local.tghost("broker", "start", "--port", str(port), "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["data_dir"] == str(local.data_dir(port))
    assert local.data_dir(local.port) != local.data_dir(other)
    assert all(is_reachable(f"pulsar://127.0.0.1:{port}") for port in (local.port, other))


def test_concurrent_starts_start_one_broker(local: Local) -> None:
    command = [sys.executable, "-m", "tghost", "broker", "start", "--port", str(local.port), "--json"]
    starters = [subprocess.Popen(command, env=local.env, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    results = [json.loads(starter.communicate(timeout=90)[0]) for starter in starters]
    assert [r["started"] for r in results].count(True) == 1
    assert len({r["pid"] for r in results}) == 1


# -- the foreground broker -------------------------------------------------------------------


@linux_only
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_stops_the_foreground_broker_and_its_pulsar_lite(local: Local, sig: signal.Signals) -> None:
    broker = local.broker("--port", str(local.port))
    assert broker.stderr is not None
    out = Output(broker.stderr)
    assert "Ctrl-C to stop" in out.wait_for(lambda line: "embedded broker at" in line)
    pids = record(local.data_dir())
    assert pids["detached"] is False
    broker.send_signal(sig)
    assert broker.wait(30) == 0, out.rest()
    assert not alive(int(pids["broker_pid"])) and not is_reachable(local.url)
    assert not (local.data_dir() / "broker.json").exists()


@linux_only
def test_a_killed_foreground_broker_leaves_no_pulsar_lite_behind(local: Local) -> None:
    broker = local.broker("--port", str(local.port))
    assert broker.stderr is not None
    Output(broker.stderr).wait_for(lambda line: "embedded broker at" in line)
    pulsar_lite = int(record(local.data_dir())["broker_pid"])
    broker.kill()
    broker.wait(10)
    # Its main thread can show as a zombie while its other threads still close its socket: wait for both.
    assert until(lambda: not alive(pulsar_lite) and not is_reachable(local.url)), \
        "pulsar-lite outlived its killed 'tghost broker'"


def test_the_broker_exits_1_naming_the_port_when_it_is_taken(local: Local) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", local.port))
        taken.listen()
        result = local.tghost("broker", "--port", str(local.port))
    assert result.returncode == 1
    assert f"port {local.port} on 127.0.0.1 is already in use" in result.stderr
    assert "pass another --port" in result.stderr and "embedded broker at" not in result.stderr


def test_the_broker_exits_1_naming_the_broker_that_holds_its_data_dir(local: Local) -> None:
    started = local.tghost("broker", "start", "--port", str(local.port), "--json")
    owner = json.loads(started.stdout)["pid"]
    result = local.tghost("broker", "--port", str(free_port()), "--data-dir", str(local.data_dir()))
    assert result.returncode == 1
    assert f"is in use by the embedded broker pid {owner} at {local.url}" in result.stderr
    assert "pass another --data-dir" in result.stderr and f"tghost broker stop --port {local.port}" in result.stderr


def test_the_broker_exits_1_when_another_pulsar_lite_locked_its_data(local: Local, tmp_path: Path) -> None:
    data_dir = tmp_path / "shared"
    data_dir.mkdir()
    other = subprocess.Popen([process._binary(), "--addr", f"127.0.0.1:{local.port}", "--db-path",
                              str(data_dir / "db"), "--log-level", "error"], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert until(lambda: is_reachable(local.url))
        result = local.tghost("broker", "--port", str(free_port()), "--data-dir", str(data_dir))
    finally:
        other.terminate()
        other.wait(10)
    assert result.returncode == 1
    assert f"the data dir {data_dir} is locked by another pulsar-lite" in result.stderr


def test_the_broker_exits_1_when_pulsar_lite_dies(local: Local) -> None:
    broker = local.broker("--port", str(local.port))
    assert broker.stderr is not None
    out = Output(broker.stderr)
    out.wait_for(lambda line: "embedded broker at" in line)
    os.kill(int(record(local.data_dir())["broker_pid"]), signal.SIGKILL)
    assert broker.wait(30) == 1
    assert "pulsar-lite exited by itself" in out.rest()


# -- EmbeddedBroker: log, config, metrics ----------------------------------------------------


@linux_only
def test_pulsar_lite_listens_only_on_its_port_by_default_and_logs_at_warn(own_brokers: OwnBrokers) -> None:
    broker = own_brokers.start()
    assert broker.process is not None
    assert listening(broker.process.pid) == {("127.0.0.1", broker.port)}  # no metrics endpoint
    broker.stop()
    log_lines = broker.log_path.read_text().splitlines()
    assert log_lines and all(" tghost] " in line for line in log_lines), log_lines  # no INFO from pulsar-lite


@linux_only
def test_pulsar_lite_metrics_when_asked_are_on_loopback_only(own_brokers: OwnBrokers) -> None:
    metrics = free_port()
    broker = own_brokers.start(metrics_port=metrics)
    assert broker.process is not None
    assert until(lambda: ("127.0.0.1", metrics) in listening(broker.process.pid))  # type: ignore[union-attr]
    assert listening(broker.process.pid) == {("127.0.0.1", broker.port), ("127.0.0.1", metrics)}
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10) as response:
        assert response.status == 200


def test_the_broker_log_is_rotated_and_capped(own_brokers: OwnBrokers, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log, "LOG_MAX_BYTES", 400)
    own_brokers.start(tmp_path, log_level="info").stop()
    logs = sorted(tmp_path.glob("broker.log*"))
    assert [p.name for p in logs] == ["broker.log", "broker.log.1", "broker.log.2"]
    longest_line = max(len(line) + 1 for p in logs for line in p.read_text().splitlines())
    assert all(p.stat().st_size <= 400 + longest_line for p in logs)


def test_routine_pulsar_lite_warnings_stay_in_its_log_and_off_the_terminal(own_brokers: OwnBrokers) -> None:
    """pulsar-lite warns 'No dispatcher found for subscription' for each message published after a
    reader went (every 'tghost tools' or 'tghost call' leaves two, and each heartbeat then warns):
    the foreground broker keeps them out of its terminal, and in its log once a minute."""
    terminal = io.StringIO()
    broker = own_brokers.start(echo=terminal)
    client = pulsar.Client(broker.url, logger=logging.getLogger("test.pulsar"))
    try:
        topic = f"persistent://tg/test/readers-{uuid.uuid4().hex[:8]}"
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"one")
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert reader.read_next(10_000).data() == b"one"
        reader.close()
        for payload in (b"two", b"three", b"four"):
            producer.send(payload)  # pulsar-lite still looks for the closed reader's dispatcher
    finally:
        client.close()
    assert until(lambda: "No dispatcher found for subscription" in broker.log_path.read_text())
    broker.stop()
    assert broker.log_path.read_text().count("No dispatcher found") == 1
    assert "started pulsar-lite pid" in terminal.getvalue()  # what is not routine still shows
    assert "No dispatcher found" not in terminal.getvalue(), terminal.getvalue()


def test_routine_warnings_are_logged_once_a_minute_with_the_count_held_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(log.time, "monotonic", lambda: clock[0])
    sink = log.BrokerLog(tmp_path / "broker.log", echo=None)
    warning = "[2026-11-27T00:00:00Z WARN broker] No dispatcher found for subscription 'reader-{}'"
    for n in range(5):
        sink.pulsar_lite(warning.format(f"a{n}f"))
    sink.pulsar_lite("[2026-11-27T00:00:01Z INFO broker] a line that is not routine")
    clock[0] += log.REPEAT_WINDOW
    sink.pulsar_lite(warning.format("b7"))
    sink.close()
    assert (tmp_path / "broker.log").read_text().splitlines() == [
        warning.format("a0f"), "[2026-11-27T00:00:01Z INFO broker] a line that is not routine",
        warning.format("b7") + " (4 more like it held back)"]


def test_a_data_dir_that_cannot_be_made_is_a_broker_error_that_says_so(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(BrokerError, match=r"cannot use .*a-file/broker as the broker's data dir \(Not a directory\): "
                                          r"choose a directory this user can write"):
        make_data_dir(blocked / "broker")
