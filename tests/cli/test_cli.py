"""cli: ``tghost`` as a user runs it, in subprocesses, against the embedded broker. What each command
parses and says before it reaches a broker is tested in process beside it (``test_<module>.py``)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import HostProcess, PluginDir, live_tools, tghost_cli
from tghost.broker import EmbeddedBroker
from tghost.serving.settings import ServeSettings
from tghost.system.net import free_port

ECHO = """
import asyncio
import tghost

@tghost.tool
async def echo(text: str) -> str:
    '''Echo the text back.'''
    return text

@tghost.tool
async def unhurried(seconds: float) -> str:
    '''Sleep for seconds, then say so.'''
    await asyncio.sleep(seconds)
    return f"slept {seconds}s"

@tghost.tool
def failing() -> str:
    '''Always raises.'''
    raise RuntimeError("out of coffee")

@tghost.tool(service="kb", config=["collection"], timeout=5)
def lookup(question: str, collection: str) -> str:
    '''Look a question up in a collection.'''
    return f"{collection} says: {question}"

@tghost.hookimpl
def tghost_register_services(register):
    for service in (echo, unhurried, failing, lookup):
        register(service)

@tghost.hookimpl
def tghost_register_tools(register):
    register(lookup.tool("ask-staff", collection="staff", group=["hr"], state="answered"))
"""

SHOUT = """
import tghost

@tghost.tool
async def shout(text: str) -> str:
    '''Shout the text back.'''
    return text.upper()

@tghost.hookimpl
def tghost_register_services(register):
    register(shout)
"""

@pytest.fixture
def env(pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, tmp_path: Path) -> dict[str, str]:
    """A user's environment: the ECHO plugin installed, this broker, a fresh descriptors topic,
    and a private config dir (host slots, tools.toml)."""
    plugin_dir.add("echo", ECHO)
    return plugin_dir.user_env(pulsar_broker.url, tmp_path / "config", "cli")


def test_run_serves_plugins_and_call_prints_the_observation(
    pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, host_process: Callable[..., HostProcess]
) -> None:
    plugin_dir.add("echo", ECHO)
    env = plugin_dir.env(TGHOST_PULSAR_URL=pulsar_broker.url)
    host = host_process(env=env)
    assert "echo" in host.wait_for(r"serving echo on non-persistent://tg/request/echo")
    host.wait_for("announced")  # a caller finds it in the directory
    ok = tghost_cli("call", "--service", "echo", "text=hello there", env=env)
    assert (ok.returncode, ok.stdout) == (0, "hello there\n")
    as_json = tghost_cli("call", "--service", "echo", "--json", '{"text": "from json"}', env=env)
    assert as_json.stdout == "from json\n"
    failed = tghost_cli("call", "--service", "failing", env=env)
    assert failed.returncode == 1
    assert "Error: tool-service-error: RuntimeError: out of coffee" in failed.stderr
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0
    assert "no call in flight" in host.log and "waiting up to" not in host.log


def test_sigterm_lets_in_flight_calls_finish_then_exits_0(
    pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, host_process: Callable[..., HostProcess]
) -> None:
    plugin_dir.add("echo", ECHO)
    env = plugin_dir.env(TGHOST_PULSAR_URL=pulsar_broker.url)
    port = free_port()
    host = host_process("--grace", "10", "--metrics-port", str(port), env=env)
    host.wait_for("announced")  # a caller finds it in the directory
    result: dict[str, subprocess.CompletedProcess[str]] = {}
    caller = threading.Thread(target=lambda: result.update(
        call=tghost_cli("call", "--service", "unhurried", "seconds:=1.5", env=env)))
    caller.start()
    wait_for_in_flight(port, "unhurried")
    host.process.send_signal(signal.SIGTERM)
    caller.join(30)
    assert result["call"].returncode == 0 and result["call"].stdout == "slept 1.5s\n"
    assert host.finish() == 0
    assert "waiting up to 10.0s for 1 in-flight call(s)" in host.log


def wait_for_in_flight(port: int, service: str, timeout: float = 20) -> None:
    """Wait until the host's metrics show a call of ``service`` in flight."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), \
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            families = text_string_to_metric_families(response.read().decode())
            if any(s.name == "tghost_in_flight" and s.labels == {"service": service} and s.value >= 1
                   for family in families for s in family.samples):
                return
        time.sleep(0.02)
    raise AssertionError(f"no call of {service} in flight after {timeout}s")


def test_joke_service_tells_a_pun_about_cats(
    pulsar_broker: EmbeddedBroker, host_process: Callable[..., HostProcess]
) -> None:
    env = {**os.environ, "TGHOST_PULSAR_URL": pulsar_broker.url}
    host = host_process(env=env)
    host.wait_for("announced")  # a caller finds it in the directory
    result = tghost_cli("call", "--service", "joke-service", "--config", "style=pun", "topic=cats", env=env)
    assert result.returncode == 0, result.stderr
    assert "pun" in result.stdout and "cat" in result.stdout.lower()
    host.process.send_signal(signal.SIGTERM)
    assert host.finish() == 0


def test_call_of_a_service_neither_announced_nor_installed_fails_at_once_unless_a_topic_is_given(
    env: dict[str, str]
) -> None:
    typo = tghost_cli("call", "--service", "no-such-svc", "text=hi", env=env)
    assert typo.returncode == 1 and typo.stdout == ""
    assert "Error: tool service 'no-such-svc' is neither announced nor installed here" in typo.stderr
    assert "--topic T" in typo.stderr
    anyway = tghost_cli("call", "--service", "no-such-svc", "--topic", f"nobody-{uuid.uuid4().hex[:8]}",
                    "--timeout", "0.5", "text=hi", env=env)  # sent: nobody answers
    assert anyway.returncode == 1
    assert "Error: timeout: tool service 'no-such-svc' gave no complete answer" in anyway.stderr


def test_a_call_that_no_live_host_serves_fails_at_once_saying_how_to_start_one(env: dict[str, str]) -> None:
    started = time.monotonic()
    service = tghost_cli("call", "--service", "unhurried", "seconds:=1", env=env)  # installed, not running
    tool = tghost_cli("call", "echo", "text=hi", env=env)
    typo = tghost_cli("call", "ecoh", "text=hi", env=env)
    assert time.monotonic() - started < 25  # the service alone used to wait out its 30 s timeout
    assert service.returncode == 1 and service.stdout == ""
    assert ("Error: no-provider: no live host serves tool service 'unhurried': its plugin is installed here, but "
            "no host runs it. Start one ('tghost run'") in service.stderr
    assert tool.returncode == 1 and "Error: no-provider: no live host serves tool 'echo'" in tool.stderr
    assert typo.returncode == 1 and ("Error: unknown-tool: no live tool named 'ecoh'; did you mean 'echo' (no live "
                                     "host serves it)? see 'tghost tools'") in typo.stderr
    waited = tghost_cli("call", "--wait", "0.5", "echo", "text=hi", env=env)
    assert waited.returncode == 1 and waited.stderr.startswith(
        "waiting up to 0.5s for a live host to serve tool 'echo' (Ctrl-C stops)\n"
        "waited 0.5s: no live host serves tool 'echo' yet\n")
    interrupted = subprocess.Popen([sys.executable, "-m", "tghost", "call", "--wait", "60", "echo", "text=hi"],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert interrupted.stderr is not None
    assert interrupted.stderr.readline().startswith("waiting up to 60s")  # it waits for a host: no call went out
    interrupted.send_signal(signal.SIGINT)
    assert interrupted.wait(30) == 130 and interrupted.communicate()[1].endswith("cancelled before a call was sent\n")


def test_a_plugin_that_fails_to_load_is_one_line_where_a_call_names_what_it_may_serve(
    env: dict[str, str], plugin_dir: PluginDir
) -> None:
    plugin_dir.add("broken", "import tghost\n\n\ndef word_count(:\n    pass\n")
    called = tghost_cli("call", "broken-word-count", "text=hi", env=env)
    assert called.returncode == 1 and called.stdout == ""
    (line,) = called.stderr.splitlines()  # no traceback, no log line
    assert line.startswith("Error: unknown-tool: no live tool named 'broken-word-count': plugin 'broken' failed to "
                           "load (SyntaxError: "), line
    assert "tghost_test_broken.py:4), and it may serve it. Fix the plugin; 'tghost plugins' says what loaded " \
           "(-v: the traceback)" in line
    verbose = tghost_cli("call", "-v", "broken-word-count", "text=hi", env=env)
    assert verbose.stderr.startswith("Traceback (most recent call last):") and verbose.stderr.count("Traceback") == 1
    assert verbose.stderr.splitlines()[-1].startswith("Error: unknown-tool: no live tool named 'broken-word-count'")
    unrelated = tghost_cli("call", "echo", "text=hi", env=env)  # installed, no host runs it
    assert unrelated.stderr.splitlines() == [unrelated.stderr.strip()] and "Traceback" not in unrelated.stderr
    assert unrelated.stderr.startswith("Error: no-provider: no live host serves tool 'echo': its plugin is installed")
    typo = tghost_cli("call", "ecoh", "text=hi", env=env)
    assert typo.stderr.strip().endswith("did you mean 'echo' (no live host serves it)? see 'tghost tools' (1 installed "
                                        "plugin(s) failed to load: 'broken'; 'tghost plugins' says why)")


def test_call_with_wait_waits_for_a_host_that_is_starting(env: dict[str, str],
                                                           host_process: Callable[..., HostProcess]) -> None:
    caller = subprocess.Popen([sys.executable, "-m", "tghost", "call", "--wait", "60", "--service", "echo",
                               "text=worth the wait"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    host = host_process(env=env)
    host.wait_for("announced")
    out, err = caller.communicate(timeout=60)
    assert (caller.returncode, out) == (0, "worth the wait\n"), err
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


def test_call_waits_as_long_as_the_service_says_else_as_long_as_a_host_does(
    env: dict[str, str], tmp_path: Path, host_process: Callable[..., HostProcess]
) -> None:
    config = tmp_path / "silent.toml"  # an external service that nobody serves, announcing a 0.5 s timeout
    config.write_text('[external-services.silent]\nrequest-queue = "non-persistent://tg/request/silent-x"\n'
                      'response-queue = "non-persistent://tg/response/silent-x"\ntimeout = 0.5\n'
                      '[tools.hush]\nservice = "silent"\ndescription = "Never answers."\n')
    host = host_process("--config", str(config), "--load-plugins", "", env=env)
    host.wait_for("announced")
    result = tghost_cli("call", "hush", env=env)
    assert result.returncode == 1 and ("tool 'hush' (tool service 'silent') gave no complete answer within 0.5s "
                                       "(request topic non-persistent://tg/request/silent-x)") in result.stderr
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0
    unannounced = tghost_cli("call", "--help", env=env).stdout
    assert f"else {ServeSettings.timeout:g}, a host's default" in " ".join(unannounced.split())
    assert ServeSettings.timeout == ServeSettings().timeout  # the default the host serves with


def test_tools_json_lists_what_a_running_host_announced(env: dict[str, str],
                                                        host_process: Callable[..., HostProcess]) -> None:
    host = host_process("--host-id", "alpha", env=env)
    host.wait_for("announced")
    tools = live_tools(env)
    assert set(tools) == {"echo", "unhurried", "failing", "ask-staff"}
    assert tools["ask-staff"]["service"] == "kb" and tools["ask-staff"]["providers"] == ["alpha"]
    assert tools["ask-staff"]["config"] == {"collection": "staff"} and tools["ask-staff"]["group"] == ["hr"]
    assert "collection" not in tools["ask-staff"]  # config values only under "config"
    assert tools["ask-staff"]["state"] == "answered" and "state" not in tools["echo"]  # unset: left out, never null
    assert not [(name, key) for name, row in tools.items() for key, value in row.items() if value is None]
    assert tools["ask-staff"]["input-schema"] == {
        "type": "object", "title": "lookupArguments", "additionalProperties": False, "required": ["question"],
        "properties": {"question": {"type": "string", "title": "Question"}}}
    assert [row["name"] for row in json.loads(tghost_cli("tools", "--json", "--group", "hr", env=env).stdout)] == [
        "ask-staff"]
    table = tghost_cli("tools", env=env).stdout
    assert table.splitlines()[0].split() == ["TOOL", "SERVICE", "PROVIDERS", "GROUPS", "STATES", "->", "STATE"]
    assert any(line.split()[:4] == ["ask-staff", "kb", "alpha", "hr"] for line in table.splitlines())
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


def test_call_by_tool_name_merges_config_and_checks_groups(env: dict[str, str],
                                                           host_process: Callable[..., HostProcess]) -> None:
    host = host_process(env=env)
    host.wait_for("announced")
    refused = tghost_cli("call", "ask-staff", "question=holidays?", env=env)
    assert refused.returncode == 1
    assert "not-allowed: tool 'ask-staff' is in groups ['hr']" in refused.stderr
    allowed = tghost_cli("call", "ask-staff", "question=holidays?", "--group", "hr", env=env)
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout == "staff says: holidays?\n"
    assert "state: undefined -> answered" in allowed.stderr
    again = tghost_cli("call", "ask-staff", "question=holidays?", "--group", "hr", "--state", "answered", env=env)
    assert again.returncode == 0 and "state:" not in again.stderr  # it did not move: nothing to say
    nothing = tghost_cli("tools", "--group", "nosuch", env=env)
    assert nothing.returncode == 0 and nothing.stdout.startswith("none of the ") and (
        "is for groups ['nosuch']: 'tghost tools' without --group/--state lists every one") in nothing.stdout
    unknown = tghost_cli("call", "no-such-tool", env=env)
    assert unknown.returncode == 1 and "unknown-tool" in unknown.stderr
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


def test_a_config_declared_tool_is_announced_and_callable(env: dict[str, str], tmp_path: Path,
                                                          host_process: Callable[..., HostProcess]) -> None:
    config = tmp_path / "tools.toml"
    config.write_text('[tools.query-orders]\nservice = "kb"\ndescription = "Orders"\ncollection = "orders"\n'
                      '[tools.broken]\nservice = "nowhere"\ndescription = "x"\n')
    host = host_process("--config", str(config), env=env)
    assert "added tools query-orders" in host.wait_for("config .*: added tools")
    assert "[tools.broken]: service 'nowhere' is not served here" in host.log
    host.wait_for("announced")
    assert live_tools(env)["query-orders"]["config"] == {"collection": "orders"}
    result = tghost_cli("call", "query-orders", "question=late?", env=env)
    assert (result.returncode, result.stdout) == (0, "orders says: late?\n")
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


def test_a_killed_host_expires_after_its_lease(env: dict[str, str], host_process: Callable[..., HostProcess]) -> None:
    host = host_process("--lease", "1", env=env)
    host.wait_for("announced")
    assert "echo" in live_tools(env)
    host.process.kill()  # SIGKILL: no withdraw
    host.process.wait()
    deadline = time.monotonic() + 15
    while live_tools(env) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert live_tools(env) == {}


def test_watch_shows_a_second_host_arriving_and_leaving(env: dict[str, str], plugin_dir: PluginDir,
                                                        host_process: Callable[..., HostProcess]) -> None:
    watcher = subprocess.Popen([sys.executable, "-m", "tghost", "watch", "--json"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in watcher.stdout], daemon=True).start()  # type: ignore[union-attr]

    def rows(n: int) -> list[dict[str, object]]:
        return [json.loads(lines.get(timeout=20)) for _ in range(n)]

    def changes(n: int) -> list[tuple[object, object]]:
        return [(c["change"], c["name"]) for c in rows(n)]

    try:
        first = host_process("--host-id", "first", env=env)
        first.wait_for("announced")
        added = {row.pop("name"): row for row in rows(4)}
        assert {name: row.pop("change") for name, row in added.items()} == dict.fromkeys(
            ("echo", "unhurried", "failing", "ask-staff"), "added")
        seen = [datetime.datetime.fromisoformat(str(row.pop("time"))) for row in added.values()]
        assert all(when.tzinfo is not None for when in seen)  # local time, with its UTC offset
        listed = live_tools(env)  # one shape for a tool: watch adds only "change" and "time"
        assert added == {name: {k: v for k, v in row.items() if k != "name"} for name, row in listed.items()}
        plugin_dir.add("shout", SHOUT)  # "pip install" a plugin, then start a second host
        second = host_process("--host-id", "second", env=env)
        second.wait_for("announced")
        shared = {("updated", t) for t in ("echo", "unhurried", "failing", "ask-staff")}  # a provider more
        assert set(changes(5)) == shared | {("added", "shout")}
        second.process.send_signal(signal.SIGINT)  # Ctrl-C
        assert second.finish() == 0
        assert set(changes(5)) == shared | {("removed", "shout")}
        first.process.send_signal(signal.SIGINT)
        assert first.finish() == 0
    finally:
        watcher.send_signal(signal.SIGINT)
        watcher.wait(10)


def test_run_and_call_with_a_pulsar_token(env: dict[str, str], host_process: Callable[..., HostProcess]) -> None:
    """The token passes through ``tghost run`` and ``tghost call`` to the broker without breaking
    anything. pulsar-lite 0.2.0 does not enforce auth: it accepts any token, so this cannot show
    that a wrong token is refused."""
    host = host_process("--pulsar-token", "x", env=env)
    host.wait_for("announced")  # a caller finds it in the directory
    result = tghost_cli("call", "--pulsar-token", "x", "--service", "echo", "text=with a token", env=env)
    assert (result.returncode, result.stdout) == (0, "with a token\n"), result.stderr
    by_env = tghost_cli("call", "--service", "echo", "text=token from env", env={**env, "TGHOST_PULSAR_TOKEN": "x"})
    assert (by_env.returncode, by_env.stdout) == (0, "token from env\n"), by_env.stderr
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


def test_run_and_call_with_a_pulsar_token_file(env: dict[str, str], tmp_path: Path,
                                               host_process: Callable[..., HostProcess]) -> None:
    """As with --pulsar-token: pulsar-lite accepts any token, so this shows the file is read and
    nothing breaks, not that the broker checks it."""
    token = tmp_path / "pulsar-token"
    token.write_text("x\n")
    host = host_process("--pulsar-token-file", str(token), env=env)
    host.wait_for("announced")  # a caller finds it in the directory
    result = tghost_cli("call", "--pulsar-token-file", str(token), "--service", "echo", "text=token file", env=env)
    assert (result.returncode, result.stdout) == (0, "token file\n"), result.stderr
    by_env = tghost_cli("call", "--service", "echo", "text=token file from env",
                        env={**env, "TGHOST_PULSAR_TOKEN_FILE": str(token)})
    assert (by_env.returncode, by_env.stdout) == (0, "token file from env\n"), by_env.stderr
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


def test_status_reports_a_running_host_and_exits_1_once_it_stops(
    env: dict[str, str], tmp_path: Path, host_process: Callable[..., HostProcess]
) -> None:
    port = free_port()
    audit = tmp_path / "audit.jsonl"
    host = host_process("--audit-log", str(audit), env={**env, "TGHOST_METRICS_PORT": str(port)})
    host.wait_for("announced")
    url = f"http://127.0.0.1:{port}/health"
    deadline = time.monotonic() + 15
    while (status := tghost_cli("status", "--json", "--url", url, env=env)).returncode and time.monotonic() < deadline:
        time.sleep(0.1)  # "starting" until the host watches its connection, just after announcing
    health = json.loads(status.stdout)
    assert (status.returncode, health["status"], health["connected"]) == (0, "ok", True), status.stderr
    assert sorted(health["services"]) == ["echo", "failing", "kb", "unhurried"]
    human = tghost_cli("status", env={**env, "TGHOST_METRICS_PORT": str(port)})
    assert human.returncode == 0 and "connected:  yes" in human.stdout
    pathless = tghost_cli("status", "--url", f"http://127.0.0.1:{port}", env=env)
    assert pathless.returncode == 1 and "(a host's health is at its /health path)" in pathless.stderr
    secret = uuid.uuid4().hex
    assert tghost_cli("call", "--service", "echo", f"text={secret}", env=env).stdout == f"{secret}\n"
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0
    [line] = audit.read_text().splitlines()
    entry = json.loads(line)
    assert (entry["service"], entry["status"], entry["argument_names"]) == ("echo", "ok", ["text"])
    assert secret not in line
    gone = tghost_cli("status", "--url", url, env=env)
    assert gone.returncode == 1 and f"no tghost host answers at {url}" in gone.stderr


def test_status_shows_every_live_host_and_the_health_its_host_message_names(
    env: dict[str, str], host_process: Callable[..., HostProcess]
) -> None:
    """No flag needed: a default host (no metrics port) is listed from its announcements, and one
    with --metrics-port also with the health its host message points to."""
    port = free_port()
    watched = host_process("--host-id", "alpha", "--metrics-port", str(port), env=env)
    plain = host_process("--host-id", "beta", env=env)
    watched.wait_for("announced")
    plain.wait_for("announced")
    deadline = time.monotonic() + 15
    while (status := tghost_cli("status", "--json", env=env)).returncode and time.monotonic() < deadline:
        time.sleep(0.1)  # alpha's health is "starting" until it watches its connection, just after announcing
    assert status.returncode == 0, status.stderr
    hosts = {host["id"]: host for host in json.loads(status.stdout)["hosts"]}
    alpha, beta = hosts["alpha"], hosts["beta"]
    assert alpha["health_url"] == f"http://127.0.0.1:{port}/health" and alpha["health"]["status"] == "ok"
    assert "health" not in beta and "health_url" not in beta and "signed_by" not in beta  # no nulls
    assert (beta["services"], beta["external"], beta["tools"], beta["signed"], beta["conflicts"]) == (
        ["echo", "failing", "kb", "unhurried"], [], 4, False, [])
    assert 0 < beta["lease_remaining"] <= beta["lease_seconds"] == 30.0
    table = tghost_cli("status", env=env)
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()[1:] if not line.startswith(" ")}
    assert table.stdout.split()[:7] == ["HOST", "SERVICES", "TOOLS", "LEASE", "SIGNED", "CONFLICTS", "HEALTH"]
    assert rows["alpha"][-1] == "ok" and rows["beta"][-1] == "-" and rows["beta"][1:3] == [
        "echo,failing,kb,unhurried", "4"]
    for host in (watched, plain):
        host.process.send_signal(signal.SIGINT)
        assert host.finish() == 0


def test_status_asks_a_health_url_off_this_machines_loopback_only_when_a_trusted_key_signed_it(
    env: dict[str, str], host_process: Callable[..., HostProcess], tmp_path: Path,
) -> None:
    """Anyone on the broker may announce a URL: unsigned, one on another address is shown, not asked."""
    assert tghost_cli("keygen", "--out", str(tmp_path / "host"), env=env).returncode == 0
    hosts = [host_process("--host-id", host_id, "--metrics-host", "0.0.0.0", "--metrics-port", str(free_port()),
                          *extra, env=env)
             for host_id, extra in (("open", ()), ("signed", ("--signing-key", str(tmp_path / "host.key"))))]
    for host in hosts:
        host.wait_for("announced")
    deadline = time.monotonic() + 15
    while True:
        status = tghost_cli("status", "--json", "--trusted-key", str(tmp_path / "host.pub"), env=env)
        signed = {host["id"]: host for host in json.loads(status.stdout)["hosts"]}.get("signed", {})
        if signed.get("health", {}).get("status") == "ok" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert signed["verified"] is True and signed["health"]["status"] == "ok", status.stdout
    opened = json.loads(tghost_cli("status", "--json", env=env).stdout)["hosts"]
    unsigned = next(host for host in opened if host["id"] == "open")
    assert not unsigned["health_url"].startswith("http://127.") and unsigned["health"] == {"status": "unverified"}
    assert "not asked (unsigned)" in tghost_cli("status", env=env).stdout
    for host in hosts:
        host.process.send_signal(signal.SIGINT)
        assert host.finish() == 0


def test_status_and_tools_with_no_live_host_exit_3_and_without_a_broker_1(env: dict[str, str]) -> None:
    none = tghost_cli("status", "--json", env=env)
    assert none.returncode == 3 and json.loads(none.stdout)["hosts"] == [] and "no live host" in none.stderr
    no_tools = tghost_cli("tools", env=env)
    assert no_tools.returncode == 3 and no_tools.stdout.startswith("no live tools (is a 'tghost run' up")
    no_rows = tghost_cli("tools", "--json", env=env)
    assert no_rows.returncode == 3 and json.loads(no_rows.stdout) == []
    unset = {k: v for k, v in os.environ.items() if not k.startswith("TGHOST_")}
    nowhere = tghost_cli("status", "--pulsar-url", f"pulsar://127.0.0.1:{free_port()}", env=unset)
    assert nowhere.returncode == 1 and "no Pulsar broker answers" in nowhere.stderr


def test_watch_started_before_the_broker_waits_for_it(plugin_dir: PluginDir, tmp_path: Path,
                                                      host_process: Callable[..., HostProcess]) -> None:
    """'tghost watch' follows like an agent: started with no broker, it waits (one line per
    retry interval) and reports the tools once a broker and a host come."""
    plugin_dir.add("echo", ECHO)
    port = free_port()
    env = plugin_dir.user_env(f"pulsar://127.0.0.1:{port}", tmp_path / "config", "late")
    watch = subprocess.Popen([sys.executable, "-m", "tghost", "watch", "--json", "--connect-timeout", "120"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert watch.stderr is not None and watch.stdout is not None
        assert "waiting for a Pulsar broker" in watch.stderr.readline()
        with EmbeddedBroker(tmp_path / "broker", port):
            host = host_process(env=env)
            host.wait_for("announced")
            assert {json.loads(watch.stdout.readline())["name"] for _ in range(4)} == {
                "echo", "unhurried", "failing", "ask-staff"}
            host.process.send_signal(signal.SIGINT)
            assert host.finish() == 0
    finally:
        watch.terminate()
        watch.wait(10)


def test_a_host_stopped_while_its_broker_is_down_withdraws_nothing_and_exits(
        plugin_dir: PluginDir, tmp_path: Path, host_process: Callable[..., HostProcess]) -> None:
    """With no broker connection a withdraw could only wait out the client's 30 s operation
    timeout: the host sends nothing (its entries expire with its lease) and exits 0."""
    plugin_dir.add("echo", ECHO)
    port = free_port()
    env = plugin_dir.user_env(f"pulsar://127.0.0.1:{port}", tmp_path / "config", "down")
    with EmbeddedBroker(tmp_path / "broker", port):
        host = host_process("--grace", "0", env=env)
        host.wait_for("announced")
    host.wait_for("lost the broker connection")
    host.process.send_signal(signal.SIGTERM)
    assert host.finish() == 0
    assert "not connected to the broker: withdrawing nothing; entries expire after the 30.0s lease" in host.log
    assert "could not withdraw" not in host.log
