"""broker: reach Pulsar. Clients for the cluster named by ``--pulsar-url``, or an embedded
pulsar-lite broker for local use and tests (its limits: docs/protocol.md §4.10).

Never knows about plugins, services or tools.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import click
import pulsar
import pulsar.asyncio

__all__ = [
    "DEFAULT_URL",
    "BrokerError",
    "EmbeddedBroker",
    "PulsarSettings",
    "default_data_dir",
    "ensure_broker",
    "free_port",
    "is_reachable",
]

DEFAULT_URL = "pulsar://localhost:6650"
_LOOPBACK = {"localhost", "127.0.0.1", "::1"}
log = logging.getLogger(__name__)


class BrokerError(RuntimeError):
    """The broker could not be reached or started; the message says what to do next."""


@dataclass(frozen=True)
class PulsarSettings:
    """How to reach Pulsar: the service URL (``pulsar://host:port`` or ``pulsar+ssl://``), token
    auth and TLS. Every client the host and the directory create comes from :meth:`connect`.

    The embedded broker (pulsar-lite 0.2.0) accepts any token and enforces no auth; the
    options matter against an Apache Pulsar cluster. The token is kept out of ``repr``.
    """

    url: str = DEFAULT_URL
    operation_timeout: float = 30.0
    """Seconds the client waits for broker operations (subscribe, create producer)."""
    token: str | None = field(default=None, repr=False)
    """A Pulsar JWT sent with ``AuthenticationToken``; ``None`` for no auth."""
    tls_trust_certs: str | None = None
    """Path of a PEM file of CA certificates to trust for ``pulsar+ssl://`` URLs."""
    tls_allow_insecure: bool = False
    """Accept any TLS certificate the broker shows (testing only)."""
    tls_validate_hostname: bool = False
    """Check that the broker's certificate names the host in the URL."""

    def client_kwargs(self) -> dict[str, Any]:
        """The auth and TLS keyword arguments for ``pulsar.asyncio.Client`` (and ``pulsar.Client``):
        ``authentication`` (only with a token), ``tls_trust_certs_file_path`` (only with a path),
        ``tls_allow_insecure_connection`` and ``tls_validate_hostname``.
        """
        kwargs: dict[str, Any] = {
            "tls_allow_insecure_connection": self.tls_allow_insecure,
            "tls_validate_hostname": self.tls_validate_hostname,
        }
        if self.token:
            kwargs["authentication"] = pulsar.AuthenticationToken(self.token)
        if self.tls_trust_certs:
            kwargs["tls_trust_certs_file_path"] = self.tls_trust_certs
        return kwargs

    async def connect(self) -> pulsar.asyncio.Client:
        """A new ``pulsar.asyncio`` client with :meth:`client_kwargs`; its C++ log goes to the
        ``pulsar`` Python logger.

        On a loopback URL (where pulsar-lite runs) the client first spreads its consumer ids:
        see :func:`_spread_consumer_ids`.

        Raises:
            pulsar.asyncio.PulsarException: the broker did not answer.
        """
        pulsar_log = logging.getLogger("pulsar")
        if pulsar_log.level == logging.NOTSET:
            pulsar_log.setLevel(logging.WARNING)
        client = _Client(
            self.url,
            operation_timeout_seconds=int(self.operation_timeout),
            logger=pulsar_log,
            **self.client_kwargs(),
        )
        if _host_port(self.url)[0] in _LOOPBACK:
            await _spread_consumer_ids(client)
        return client


class _Client(pulsar.asyncio.Client):  # type: ignore[misc]
    """``pulsar.asyncio.Client`` whose ``close`` also lets the C++ client's last callbacks land.

    Closing fails the pending receives of its consumers and readers from a C++ thread; when
    such a callback reaches an event loop that ``asyncio.run`` has already closed, the process
    can abort or segfault at exit (apache/pulsar-client-python#153, #203; seen here in about
    1 of 4 short-lived processes under load, and in none of 60 with this pause).
    """

    #: Seconds to keep the loop alive after ``close`` for those callbacks.
    CLOSE_DRAIN = 0.05

    async def close(self) -> None:
        await super().close()
        await asyncio.sleep(self.CLOSE_DRAIN)


_clients_made = itertools.count()


async def _spread_consumer_ids(client: pulsar.asyncio.Client) -> None:
    """Work around pulsar-lite 0.2.0, which keys a subscription's consumers by the id the
    *client* chose: every client numbers its consumers from 0, so two hosts sharing a
    subscription collide ("Consumer 0 already exists") and the broker drops the connection.
    Apache Pulsar keys consumers by connection and needs none of this.

    Before any real consumer, use up an offset of 0-127 ids (by pid and a per-process
    count, so hosts started side by side differ) in one multi-topic subscribe, about 1 ms
    per id on loopback.
    """
    offset = (os.getpid() * 37 + next(_clients_made) * 11) % 128
    if offset:
        topics = [f"non-persistent://tg/tghost/consumer-id-{i}" for i in range(offset)]
        spacer = await client.subscribe(topics, "tghost-consumer-id-spacer")
        await spacer.close()


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url.split(",")[0])
    return parts.hostname or "localhost", parts.port or 6650


def is_reachable(url: str, timeout: float = 1.0) -> bool:
    """True when something accepts TCP connections at the URL's host and port (seconds)."""
    try:
        with socket.create_connection(_host_port(url), timeout=timeout):
            return True
    except OSError:
        return False


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def default_data_dir() -> Path:
    """Where the embedded broker keeps its data: the platform's app dir for tghost."""
    return Path(click.get_app_dir("tghost")) / "broker"


def _binary() -> str:
    try:
        from pulsar_lite.binary_finder import find_pulsar_lite_binary
    except ImportError:
        raise BrokerError(
            "the embedded broker (pulsar-lite) is not installed: it ships for Linux x86_64 and "
            "macOS arm64 only. Start Apache Pulsar yourself and pass --pulsar-url "
            "(or set TGHOST_PULSAR_URL)."
        ) from None
    found: str = find_pulsar_lite_binary()
    return shutil.which(found) or found


def ensure_broker(url: str, data_dir: Path | None = None) -> EmbeddedBroker | None:
    """Start an embedded broker at a loopback ``url`` when nothing answers there.

    Returns the started broker (stop it when done), or ``None`` when one already answers
    or the URL is not a loopback one (a cluster is never replaced by a local broker).

    Raises:
        BrokerError: the embedded broker cannot start.
    """
    host, port = _host_port(url)
    if host not in _LOOPBACK or is_reachable(url):
        return None
    return EmbeddedBroker(data_dir or default_data_dir(), port).start()


class EmbeddedBroker:
    """A pulsar-lite broker process on ``127.0.0.1:port`` storing its data in ``data_dir``.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. Its log is
    ``data_dir/broker.log``. Data survives a restart on the same ``data_dir``.
    """

    def __init__(self, data_dir: Path, port: int = 6650) -> None:
        self.data_dir = Path(data_dir)
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The broker's service URL, ``pulsar://127.0.0.1:<port>``."""
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """The broker process's log file."""
        return self.data_dir / "broker.log"

    def start(self, ready_timeout: float = 15.0) -> EmbeddedBroker:
        """Start the process and wait (seconds) until it accepts connections.

        Raises:
            BrokerError: pulsar-lite is missing, exited, or did not become ready in time.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [_binary(), "--addr", f"127.0.0.1:{self.port}", "--db-path", str(self.data_dir / "db")]
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + ready_timeout
        while not is_reachable(self.url, timeout=0.2):
            if self.process.poll() is not None:
                raise BrokerError(f"embedded broker exited with code {self.process.returncode}; "
                                  f"see {self.log_path} (is port {self.port} in use?)")
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"embedded broker not ready after {ready_timeout}s; see {self.log_path}")
            time.sleep(0.05)
        log.info("embedded broker pid %s at %s, data in %s", self.process.pid, self.url, self.data_dir)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the process (then kill it after ``timeout`` seconds). Idempotent."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()
