"""embedded: the local pulsar-lite broker's life. Starts it in the foreground or detached (its own
session, shared by every process on its URL, outliving whoever started it), finds it by the record
in its data directory, and stops it (README.md, "The broker").

Never opens a Pulsar client: it knows ports, processes and files.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import json
import logging
import logging.handlers
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any

from tghost.pulsar.clients import BrokerError, endpoints, is_loopback, is_reachable
from tghost.system.locks import held, try_lock
from tghost.system.paths import app_dir
from tghost.system.processes import die_with_parent

__all__ = [
    "DEFAULT_PORT",
    "LOG_BACKUPS",
    "LOG_LEVELS",
    "LOG_MAX_BYTES",
    "BrokerRecord",
    "BrokerStatus",
    "EmbeddedBroker",
    "broker_status",
    "default_data_dir",
    "ensure_broker",
    "run_until_stopped",
    "start_detached",
    "stop_broker",
]

DEFAULT_PORT = 6650
#: pulsar-lite's log levels (``--log-level``); tghost starts it at ``warn``.
LOG_LEVELS = ("error", "warn", "info", "debug", "trace")
#: Bytes of ``broker.log`` before it is rotated to ``broker.log.1``.
LOG_MAX_BYTES = 10 * 1024 * 1024
#: Rotated logs kept (``broker.log.1`` .. ``.2``): at most 30 MiB of log per broker.
LOG_BACKUPS = 2

log = logging.getLogger(__name__)


def default_data_dir(port: int = DEFAULT_PORT) -> Path:
    """Where the embedded broker on ``port`` keeps its data, record and log:
    ``<tghost app dir>/brokers/<port>`` (e.g. ``~/.config/tghost/brokers/6650``). One per port,
    so two embedded brokers never share a RocksDB directory."""
    return app_dir() / "brokers" / str(port)


@dataclasses.dataclass(frozen=True)
class BrokerRecord:
    """What a running ``tghost broker`` writes to ``<data dir>/broker.json`` (its pidfile), and
    removes when it stops."""

    pid: int
    """The ``tghost broker`` process, which owns pulsar-lite: SIGTERM it to stop both."""
    broker_pid: int
    """The pulsar-lite process."""
    url: str
    data_dir: str
    log: str
    started_at: float
    """Unix seconds."""
    detached: bool

    @classmethod
    def read(cls, data_dir: Path) -> BrokerRecord | None:
        """The record in ``data_dir``, or ``None`` when there is none (or it is unreadable)."""
        try:
            return cls(**json.loads((data_dir / RECORD).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def write(self) -> None:
        path = Path(self.data_dir) / RECORD
        partial = path.with_suffix(".json.partial")
        partial.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")
        partial.replace(path)


RECORD = "broker.json"
_LOCK = "broker.lock"
_START_LOCK = "start.lock"


class _Place:
    """Where an embedded broker lives: ``port`` on loopback, and ``data_dir``."""

    port: int
    data_dir: Path

    @property
    def url(self) -> str:
        """The broker's service URL, ``pulsar://127.0.0.1:<port>``."""
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """The broker's log file (older ones: ``broker.log.1``, ``broker.log.2``)."""
        return self.data_dir / "broker.log"


@dataclasses.dataclass(frozen=True)
class BrokerStatus(_Place):
    """What is known about the embedded broker on ``port`` with ``data_dir``."""

    port: int
    data_dir: Path
    running: bool
    """A ``tghost broker`` (or an in-process :class:`EmbeddedBroker`) holds ``data_dir`` now."""
    answering: bool
    """Something accepts TCP connections at ``url``."""
    record: BrokerRecord | None
    """The running broker's record (``None`` when not running, or run in-process)."""
    started: bool = False
    """Whether the call that returned this status started the broker."""

    def stop_command(self) -> str:
        """The ``tghost broker stop`` command line that stops this broker."""
        return "tghost broker stop" + _where_args(self.port, self.data_dir)

    def to_json(self) -> dict[str, Any]:
        """``{"url", "port", "data_dir", "log", "running", "answering", "pid", "broker_pid",
        "started_at", "detached", "started", "stop"}``; the pids, ``started_at`` and ``detached`` are
        ``null`` without a record."""
        record = self.record
        return {"url": self.url, "port": self.port, "data_dir": str(self.data_dir), "log": str(self.log_path),
                "running": self.running, "answering": self.answering,
                "pid": record.pid if record else None, "broker_pid": record.broker_pid if record else None,
                "started_at": record.started_at if record else None,
                "detached": record.detached if record else None, "started": self.started,
                "stop": self.stop_command()}


def _where_args(port: int, data_dir: Path) -> str:
    args = "" if port == DEFAULT_PORT else f" --port {port}"
    if Path(data_dir) != default_data_dir(port):
        args += f" --data-dir {data_dir}"
    return args


def broker_status(port: int = DEFAULT_PORT, data_dir: Path | None = None) -> BrokerStatus:
    """The embedded broker on ``port`` whose data is in ``data_dir`` (default: :func:`default_data_dir`)."""
    data_dir = Path(data_dir or default_data_dir(port))
    running = _DataDirLock.is_held(data_dir)
    return BrokerStatus(port, data_dir, running, is_reachable(f"pulsar://127.0.0.1:{port}", timeout=0.5),
                        BrokerRecord.read(data_dir) if running else None)


def ensure_broker(url: str, data_dir: Path | None = None, *, log_level: str = "warn") -> BrokerStatus | None:
    """The embedded broker for a loopback ``url``, started detached (:func:`start_detached`) when
    nothing answers there. ``None`` for a URL that is not loopback: a cluster is never replaced
    by a local broker. A broker that already answers is returned as it is (``record`` is
    ``None`` if tghost did not start it with ``data_dir``).

    Raises:
        BrokerError: the embedded broker cannot start (the message says why and what to do).
    """
    found = endpoints(url)
    if len(found) != 1 or not is_loopback(found[0][0]):
        return None
    port = found[0][1]
    data_dir = Path(data_dir or default_data_dir(port))
    status = broker_status(port, data_dir)
    if status.answering:
        return status
    return start_detached(port, data_dir, log_level=log_level)


def start_detached(port: int = DEFAULT_PORT, data_dir: Path | None = None, *, log_level: str = "warn",
                   metrics_port: int | None = None, ready_timeout: float = 20.0) -> BrokerStatus:
    """Start ``tghost broker`` detached: in its own session, so it is not stopped with the
    process that started it (signals, a closed terminal). Every process on its URL shares it;
    ``tghost broker stop`` (or :func:`stop_broker`) stops it. Its record (``broker.json``) and
    log are in ``data_dir``. Starters on one data dir take turns, so two never both start one.

    Returns the status of the running broker: the one started (``started`` True), or one another
    process started meanwhile.

    Raises:
        BrokerError: it did not start within ``ready_timeout`` seconds, or the port is taken, or
            the data dir is locked; the message is the broker's own, with the fix.
    """
    data_dir = Path(data_dir or default_data_dir(port))
    data_dir.mkdir(parents=True, exist_ok=True)
    with held(data_dir / _START_LOCK):
        status = broker_status(port, data_dir)
        if status.running and status.answering:
            return status
        command = [sys.executable, "-m", "tghost", "broker", "--port", str(port), "--data-dir", str(data_dir),
                   "--log-level", log_level, "--ready-timeout", str(ready_timeout), "--detached"]
        if metrics_port is not None:
            command += ["--metrics-port", str(metrics_port)]
        # cwd: off the user's directory (which may be unmounted, or hold a "tghost" package).
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=data_dir)
        # The child writes its outcome to stderr, then closes it (ready) or exits (failed).
        deadline = threading.Timer(ready_timeout + 15, child.kill)
        deadline.start()
        try:
            assert child.stderr is not None
            told = child.stderr.read().strip()
            child.stderr.close()
        finally:
            deadline.cancel()
        status = broker_status(port, data_dir)
        if status.record is not None and status.record.pid == child.pid:
            return dataclasses.replace(status, started=True)
        code = child.wait()
        raise BrokerError(told.removeprefix("Error: ") or f"the embedded broker exited with code {code}; "
                          f"see {status.log_path}")


def stop_broker(port: int = DEFAULT_PORT, data_dir: Path | None = None, timeout: float = 10.0) -> BrokerStatus:
    """Stop the embedded broker on ``port`` with ``data_dir``: SIGTERM its ``tghost broker``
    process, which stops pulsar-lite and removes its record; after ``timeout`` seconds, SIGKILL
    both. Returns the status before the stop (``running`` False: there was nothing to stop).

    Raises:
        BrokerError: it holds the data dir but left no record (an in-process broker), or it
            did not stop.
    """
    status = broker_status(port, data_dir)
    if not status.running:
        return status
    record = status.record
    if record is None:
        raise BrokerError(f"the data dir {status.data_dir} is in use by a broker that left no {RECORD} "
                          "(one run inside another program): stop it there")
    _signal(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _DataDirLock.is_held(status.data_dir):
        if time.monotonic() > deadline:
            _signal(record.pid, signal.SIGKILL)
            _signal(record.broker_pid, signal.SIGKILL)
            time.sleep(0.5)
            if _DataDirLock.is_held(status.data_dir):
                raise BrokerError(f"the embedded broker (pid {record.pid}) did not stop; see {status.log_path}")
            break
        time.sleep(0.05)
    with contextlib.suppress(FileNotFoundError):
        if BrokerRecord.read(status.data_dir) == record:
            (status.data_dir / RECORD).unlink()  # it was killed before it could remove it
    return status


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


class _Stop(Exception):
    """SIGTERM or SIGHUP reached ``tghost broker``: stop as on Ctrl-C."""


def run_until_stopped(broker: EmbeddedBroker, *, detached: bool, on_ready: Callable[[BrokerRecord], None],
                      ready_timeout: float = 15.0) -> int:
    """Start ``broker``, write its record, call ``on_ready`` with it, and serve until Ctrl-C,
    SIGTERM or SIGHUP (exit code 0) or until pulsar-lite dies (1). pulsar-lite is stopped and the
    record removed on every way out, and pulsar-lite also dies if this process is killed (Linux).

    Raises:
        BrokerError: the broker did not start.
    """
    handlers = {sig: signal.signal(sig, _raise_stop) for sig in _STOP_SIGNALS}
    record: BrokerRecord | None = None
    try:
        broker.start(ready_timeout)
        assert broker.process is not None
        record = BrokerRecord(os.getpid(), broker.process.pid, broker.url, str(broker.data_dir),
                              str(broker.log_path), time.time(), detached)
        record.write()
        on_ready(record)
        code = broker.process.wait()
        broker.note(f"pulsar-lite exited by itself with code {code}")
        log.error("pulsar-lite exited by itself with code %s; see %s", code, broker.log_path)
        return 1
    except (KeyboardInterrupt, _Stop):
        broker.note("stopping on a signal")
        return 0
    finally:
        for sig in (signal.SIGINT, *_STOP_SIGNALS):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the clean-up short
        broker.stop()
        if record is not None and BrokerRecord.read(broker.data_dir) == record:
            (broker.data_dir / RECORD).unlink()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)


#: Signals that stop ``tghost broker`` as Ctrl-C does (SIGHUP: its terminal closed).
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


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


class EmbeddedBroker(_Place):
    """A pulsar-lite process on ``127.0.0.1:port`` with its data in ``data_dir``, a child of this
    process (the test fixture's, and ``tghost broker``'s in the foreground).

    Use as a context manager, or call :meth:`start` and :meth:`stop`. In ``data_dir``:
    ``db.rocksdb/`` (messages; they survive a restart on the same ``data_dir``), ``broker.log``
    (pulsar-lite's output at ``log_level``, rotated at :data:`LOG_MAX_BYTES` with
    :data:`LOG_BACKUPS` old files kept), ``pulsar-lite.toml`` (its config, written at each start)
    and ``broker.lock`` (held while it runs, so no second broker opens the same data).
    Its metrics endpoint is off, or on ``127.0.0.1:metrics_port``. With ``echo`` (a text
    stream), its output is copied there too. With ``die_with_parent`` (Linux), pulsar-lite gets
    SIGTERM when the thread that started it ends, even by SIGKILL: start it from the main thread.
    """

    def __init__(self, data_dir: Path, port: int = DEFAULT_PORT, *, log_level: str = "warn",
                 metrics_port: int | None = None, echo: IO[str] | None = None,
                 die_with_parent: bool = False) -> None:
        if log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {LOG_LEVELS}, not {log_level!r}")
        self.data_dir = Path(data_dir)
        self.port = port
        self.log_level = log_level
        self.metrics_port = metrics_port
        self.echo = echo
        self.die_with_parent = die_with_parent
        self.process: subprocess.Popen[bytes] | None = None
        self._lock: _DataDirLock | None = None
        self._pump: _LogPump | None = None

    @property
    def config_path(self) -> Path:
        """pulsar-lite's config file, written at each start."""
        return self.data_dir / "pulsar-lite.toml"

    def start(self, ready_timeout: float = 15.0) -> EmbeddedBroker:
        """Start the process and wait (seconds) until it accepts connections.

        Raises:
            BrokerError: pulsar-lite is missing; the port is taken; the data dir is in use by
                another broker; it exited; or it was not ready in time. The message says which,
                and what to do.
        """
        binary = _binary()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock = _DataDirLock.acquire(self.data_dir)
        try:
            if not _port_is_free(self.port):
                raise BrokerError(self._port_taken())
            self.config_path.write_text(self._config())
            command = [binary, "--config", str(self.config_path), "--addr", f"127.0.0.1:{self.port}",
                       "--db-path", str(self.data_dir / "db"), "--log-level", self.log_level]
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                cwd=self.data_dir, preexec_fn=self._preexec())
            assert self.process.stdout is not None
            self._pump = _LogPump(self.process.stdout, self.log_path, self.echo)
            self.note(f"started pulsar-lite pid {self.process.pid} at {self.url} (log level {self.log_level})")
            self._wait_ready(ready_timeout)
        except BaseException:
            self.stop()
            raise
        log.info("embedded broker pid %s at %s, data in %s", self.process.pid, self.url, self.data_dir)
        return self

    def _preexec(self) -> Callable[[], None] | None:
        """With ``die_with_parent``: the broker process is sent SIGTERM when this process ends."""
        if not self.die_with_parent:
            return None
        return functools.partial(die_with_parent, signal.SIGTERM, os.getpid())

    def _config(self) -> str:
        metrics = ('enabled = false' if self.metrics_port is None
                   else f'enabled = true\naddr = "127.0.0.1:{self.metrics_port}"')
        return f"# Written by tghost at each start of the embedded broker; edits are lost.\n[metrics]\n{metrics}\n"

    def _wait_ready(self, timeout: float) -> None:
        assert self.process is not None and self._pump is not None
        deadline = time.monotonic() + timeout
        while not is_reachable(self.url, timeout=0.2):
            if self.process.poll() is not None:
                self._pump.join(2.0)
                raise BrokerError(self._exit_cause(self.process.returncode, self._pump.last_lines()))
            if time.monotonic() > deadline:
                raise BrokerError(f"the embedded broker was not ready after {timeout:g}s; see {self.log_path}")
            time.sleep(0.05)

    def _exit_cause(self, code: int, lines: list[str]) -> str:
        text = "\n".join(lines)
        if "AddrInUse" in text or "Address already in use" in text:
            return self._port_taken()
        if "lock file" in text or "LOCK" in text:
            return (f"the data dir {self.data_dir} is locked by another pulsar-lite (not one tghost started): "
                    "stop it, or pass another --data-dir")
        errors = [line for line in lines if line.startswith("Error")] or lines[-1:]
        detail = f": {errors[0]}" if errors else ""
        return f"the embedded broker exited with code {code}{detail}; see {self.log_path}"

    def _port_taken(self) -> str:
        return (f"port {self.port} on 127.0.0.1 is already in use: is a broker running there "
                f"('tghost broker status{_where_args(self.port, default_data_dir(self.port))}')? "
                "Stop what listens there, or pass another --port (tghost run: --pulsar-url)")

    def note(self, message: str) -> None:
        """Add a line from tghost (not pulsar-lite) to the broker's log."""
        if self._pump is not None:
            self._pump.write(f"[{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} tghost] {message}")

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the process (then kill it after ``timeout`` seconds) and release the data
        dir. Idempotent."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._pump is not None:
            self._pump.close()
            self._pump = None
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()  # read to its end by the pump; unclosed, it warns (ResourceWarning)
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()


#: pulsar-lite 0.2.0 warnings that are routine, not a problem: kept in ``broker.log``, never
#: echoed to a terminal. It warns once per message published to a topic whose reader has gone
#: (every directory's readers: each ``tghost tools`` or ``tghost call`` leaves two, and each
#: heartbeat after it then warns).
ROUTINE_WARNINGS = ("No dispatcher found for subscription 'reader-",)


class _LogPump:
    """Copies pulsar-lite's output into ``broker.log`` (rotated by ``RotatingFileHandler``) in a
    daemon thread, keeping the last lines for error messages; echoes every line but the
    :data:`ROUTINE_WARNINGS`."""

    def __init__(self, source: IO[bytes], path: Path, echo: IO[str] | None) -> None:
        self._handler = logging.handlers.RotatingFileHandler(path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS)
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        self._echo = echo
        self._last: collections.deque[str] = collections.deque(maxlen=20)
        self._source = source
        self._thread = threading.Thread(target=self._run, name="pulsar-lite log", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for raw in self._source:
            line = raw.decode(errors="replace").rstrip()
            self._last.append(line)
            self.write(line)

    def write(self, line: str) -> None:
        self._handler.handle(logging.makeLogRecord({"msg": line, "levelno": logging.INFO}))
        if self._echo is not None and not any(routine in line for routine in ROUTINE_WARNINGS):
            with contextlib.suppress(OSError, ValueError):
                print(line, file=self._echo, flush=True)

    def last_lines(self) -> list[str]:
        return list(self._last)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def close(self) -> None:
        self._thread.join(2.0)
        self._handler.close()


class _DataDirLock:
    """``<data dir>/broker.lock``, ``flock``-ed by the process whose broker uses the data dir;
    the kernel releases it when that process dies, so a crash never leaves it stale."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle

    @classmethod
    def acquire(cls, data_dir: Path) -> _DataDirLock:
        """Raises BrokerError (naming the other broker's pid) when the data dir is in use."""
        handle = try_lock(data_dir / _LOCK)
        if handle is None:
            record = BrokerRecord.read(data_dir)
            owner = (f"the embedded broker pid {record.pid} at {record.url}" if record
                     else "another embedded broker")
            stop = (" ('tghost broker stop" + _where_args(_port_of(record.url), data_dir) + "')") if record else ""
            raise BrokerError(f"the data dir {data_dir} is in use by {owner}: stop it{stop}, or pass another "
                              "--data-dir") from None
        return cls(handle)

    def release(self) -> None:
        self._handle.close()

    @classmethod
    def is_held(cls, data_dir: Path) -> bool:
        """Whether a broker holds ``data_dir`` now."""
        if not (data_dir / _LOCK).exists():
            return False
        try:
            lock = cls.acquire(data_dir)
        except BrokerError:
            return True
        lock.release()
        return False


def _port_of(url: str) -> int:
    return endpoints(url)[0][1]


def _port_is_free(port: int) -> bool:
    """Whether pulsar-lite can listen on ``127.0.0.1:port`` (it binds with SO_REUSEADDR, as here)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
