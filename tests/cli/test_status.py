"""cli.status: ``tghost status --url`` (one host's /health, as a person and as JSON, and its exit
codes), where the URL comes from, which announced health URLs ``tghost status`` asks, and how a
host's workers read. In process, against a local HTTP server, with no broker."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tghost.agent.hosts import LiveHost
from tghost.cli.app import cli
from tghost.cli.status import _announced_health, default_status_url, describe_workers
from tghost.system.net import free_port

#: A healthy host's /health, as ``tghost run --metrics-port`` serves it.
OK = {"status": "ok", "connected": True, "services": ["echo", "kb"], "uptime_seconds": 12.5, "last_error": None,
      "workers": {"kb": {"isolation": "process", "workers": 2, "max_workers": 4, "busy": 1,
                         "restarts": {"crash": 1, "timeout": 0}}}}


class Answer:
    """What the local server answers to a GET: ``code``, ``body`` and headers; the paths asked."""

    def __init__(self) -> None:
        self.code, self.body, self.headers = 200, json.dumps(OK).encode(), {"Content-Type": "application/json"}
        self.asked: list[str] = []

    def set(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self.code, self.headers = code, headers or {"Content-Type": "application/json"}
        self.body = body if isinstance(body, bytes) else json.dumps(body).encode()


@pytest.fixture
def server() -> Iterator[tuple[str, Answer]]:
    """A local HTTP server's base URL (``http://127.0.0.1:PORT``) and the :class:`Answer` it gives."""
    answer = Answer()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            answer.asked.append(self.path)
            self.send_response(answer.code)
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True).start()  # poll: a quick shutdown
    yield f"http://127.0.0.1:{httpd.server_address[1]}", answer
    httpd.shutdown()
    httpd.server_close()


def _status(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(cli, ["status", *args], env={"TGHOST_STATUS_URL": None, "TGHOST_METRICS_PORT": None,
                                                           "TGHOST_METRICS_HOST": None, **(env or {})})


def test_status_url_of_a_healthy_host_prints_its_health_and_exits_0(server: tuple[str, Answer]) -> None:
    base, answer = server
    result = _status("--url", f"{base}/health")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "status:     ok", "connected:  yes", "services:   echo, kb",
        "  kb: process, 2 of 4 worker processes, 1 busy; restarts: crash 1", "uptime:     12.5 s", "last error: -"]
    assert answer.asked == ["/health"]


def test_status_url_json_is_the_health_as_the_host_serves_it(server: tuple[str, Answer]) -> None:
    base, _ = server
    result = _status("--url", f"{base}/health", "--json")
    assert (result.exit_code, json.loads(result.stdout)) == (0, OK)


@pytest.mark.parametrize(("health", "errors"), [
    ({"status": "degraded", "problems": ["not connected to Pulsar", "kb: 2 stuck threads"]},
     ["Error: not connected to Pulsar", "Error: kb: 2 stuck threads"]),
    ({"status": "degraded"}, ["Error: the host is not connected to Pulsar; check that the broker at its --pulsar-url "
                              "is up (the host reconnects and announces again by itself)"]),
    ({"status": "starting"}, ["Error: the host is still starting (not serving yet); try again in a moment, and see "
                              "its log if it stays so"]),
    ({"status": "odd"}, ["Error: unknown status 'odd'"]),
], ids=["degraded-with-problems", "degraded", "starting", "unknown"])
def test_status_url_of_a_host_that_is_not_ok_exits_1_saying_why(
        server: tuple[str, Answer], health: dict[str, Any], errors: list[str]) -> None:
    base, answer = server
    answer.set(503, health)  # a host that is not ok answers 503, with its health
    result = _status("--url", f"{base}/health")
    assert result.exit_code == 1 and result.stdout.startswith(f"status:     {health['status']}\n")
    assert result.stderr.splitlines() == errors


def test_status_url_where_nothing_answers_exits_1_and_says_what_to_check() -> None:
    url = f"http://127.0.0.1:{free_port()}/health"
    human, as_json = _status("--url", url), _status("--url", url, "--json")
    assert human.exit_code == 1 and human.stdout == ""
    assert human.stderr.startswith(f"Error: no tghost host answers at {url} (")
    assert "Check --url (env TGHOST_STATUS_URL or TGHOST_METRICS_PORT)" in human.stderr
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["status"] == "unreachable"
    assert json.loads(as_json.stdout)["url"] == url


@pytest.mark.parametrize(("path", "hint"), [("/health", ""), ("", " (a host's health is at its /health path)")])
def test_status_url_that_is_not_health_json_exits_1(server: tuple[str, Answer], path: str, hint: str) -> None:
    base, answer = server
    answer.set(200, b"<html>hello</html>", {"Content-Type": "text/html"})
    result = _status("--url", base + path)
    assert result.exit_code == 1
    assert f"Error: {base + path} did not answer health JSON: is it a tghost metrics port?{hint}\n" == result.stderr


def test_status_url_never_follows_a_redirect(server: tuple[str, Answer]) -> None:
    base, answer = server
    answer.set(302, b"", {"Location": "http://127.0.0.1:1/elsewhere"})
    result = _status("--url", f"{base}/health")
    assert result.exit_code == 1 and "it redirects (302); give the health URL itself" in result.stderr
    assert answer.asked == ["/health"]


def test_status_asks_the_host_the_environment_names(server: tuple[str, Answer]) -> None:
    base, answer = server
    port = base.rsplit(":", 1)[1]
    assert _status(env={"TGHOST_STATUS_URL": f"{base}/health"}).exit_code == 0
    assert _status(env={"TGHOST_METRICS_PORT": port}).exit_code == 0
    assert _status(env={"TGHOST_METRICS_PORT": port, "TGHOST_METRICS_HOST": "0.0.0.0"}).exit_code == 0
    assert answer.asked == ["/health"] * 3


@pytest.mark.parametrize(("env", "url"), [
    ({}, None),
    ({"TGHOST_METRICS_PORT": "9464"}, "http://127.0.0.1:9464/health"),
    ({"TGHOST_METRICS_PORT": "9464", "TGHOST_METRICS_HOST": "0.0.0.0"}, "http://127.0.0.1:9464/health"),
    ({"TGHOST_METRICS_PORT": "9464", "TGHOST_METRICS_HOST": "10.0.0.7"}, "http://10.0.0.7:9464/health"),
    ({"TGHOST_METRICS_PORT": "9464", "TGHOST_STATUS_URL": "http://h:1/health"}, "http://h:1/health"),
], ids=["none", "port", "every-interface", "host", "status-url-wins"])
def test_the_default_status_url_comes_from_the_environment(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], url: str | None) -> None:
    for name in ("TGHOST_STATUS_URL", "TGHOST_METRICS_PORT", "TGHOST_METRICS_HOST"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert default_status_url() == url


@pytest.mark.parametrize(("stats", "text"), [
    ({"isolation": "process", "workers": 2, "max_workers": 4, "busy": 1, "restarts": {"crash": 1, "timeout": 3}},
     "process, 2 of 4 worker processes, 1 busy; restarts: crash 1, timeout 3"),
    ({"isolation": "thread", "workers": 3, "max_workers": 2, "busy": 1, "stuck": 0, "restarts": {}},
     "thread, 3 worker threads for 2 calls at once, 1 busy"),
    ({"isolation": "thread", "workers": 1, "max_workers": 8, "busy": 0, "stuck": 0, "restarts": {}},
     "thread, 1 worker thread for 8 calls at once, 0 busy"),
], ids=["process", "thread", "one-thread"])
def test_workers_read_as_one_line(stats: dict[str, Any], text: str) -> None:
    assert describe_workers(stats) == text


def test_stuck_worker_threads_are_named() -> None:
    text = describe_workers({"isolation": "thread", "workers": 3, "max_workers": 2, "busy": 3, "stuck": 2})
    assert "3 busy" in text and "2 stuck" in text


def test_status_asks_an_unsigned_host_only_for_the_plain_health_url_on_this_machine(
        server: tuple[str, Answer]) -> None:
    """A host message's hostname and URL are claims: unsigned, a URL with a path, query or user of
    its choosing is never asked, nor is a redirect followed."""
    base, answer = server
    answer.set(302, b"", {"Location": "http://127.0.0.1:1/elsewhere"})
    port = base.rsplit(":", 1)[1]

    def asked(url: str) -> dict[str, Any] | None:
        return _announced_health(_live_host(url), 2.0)

    for forged in (f"{base}/admin/delete", f"{base}/health?drop=1", f"http://user@127.0.0.1:{port}/health",
                   f"http://{socket.gethostname()}:{port}/health"):
        assert asked(forged) == {"status": "unverified"}, forged
    assert answer.asked == []
    followed = asked(f"{base}/health")  # the plain form is asked: a redirect is refused
    assert followed is not None and followed["status"] == "unreachable" and "redirects" in followed["error"]
    assert answer.asked == ["/health"]


def _live_host(health_url: str) -> LiveHost:
    """An unsigned live host of this machine whose host message names ``health_url``."""
    return LiveHost(id="h", instances=("i",), host={"hostname": socket.gethostname()}, lease_end=0.0,
                    lease_seconds=30.0, signed_by=None, verified=False, services=(), external=(), tools=(),
                    conflicts=(), health=health_url)
