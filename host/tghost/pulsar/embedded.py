"""embedded: the local pulsar-lite broker's life. Starts it in the foreground or detached (its own
session, shared by every process on its URL, outliving whoever started it), finds it by the record
in its data directory, and stops it (README.md, "The broker").

Its data dir's free space and store are :mod:`tghost.pulsar.store`'s, pulsar-lite's log
:mod:`tghost.pulsar.broker_log`'s.

Never opens a Pulsar client: it knows ports, processes and files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
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

from tghost.pulsar.broker_log import DISK_FULL, STORE_DAMAGED, BrokerLog, LogPump, words
from tghost.pulsar.clients import BrokerError, endpoints, is_reachable
from tghost.pulsar.store import (
    MIB,
    STORE,
    DiskSpace,
    StoreDamage,
    disk_space,
    find_damage,
    low_space_threshold,
    move_store_aside,
    size,
)
from tghost.system.locks import held, try_lock
from tghost.system.net import is_loopback
from tghost.system.paths import app_dir
from tghost.system.processes import die_with_parent

__all__ = [
    "DEFAULT_PORT",
    "LOG_LEVELS",
    "NOTE",
    "WATCH_INTERVAL",
    "BrokerRecord",
    "BrokerStatus",
    "EmbeddedBroker",
    "broker_status",
    "default_data_dir",
    "ensure_broker",
    "local_disk_trouble",
    "run_until_stopped",
    "running_data_dir",
    "start_detached",
    "stop_broker",
]

DEFAULT_PORT = 6650
#: pulsar-lite's log levels (``--log-level``); tghost starts it at ``warn``.
LOG_LEVELS = ("error", "warn", "info", "debug", "trace")
#: Seconds between two looks of ``tghost broker`` at its free space and at pulsar-lite's store.
WATCH_INTERVAL = 1.0
#: Seconds pulsar-lite stays stopped when ``tghost broker`` restarts it on an empty store, so that
#: every client sees its connection drop (and a host restates what it announces).
RESTART_PAUSE = 0.5

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
#: In the port's default data dir, while a broker on that port runs with another data dir: that
#: data dir, so ``tghost broker status|stop --port P`` finds it without ``--data-dir``.
ELSEWHERE = "elsewhere"
#: How the detached ``tghost broker`` marks a note for its starter on stderr (:attr:`BrokerStatus.notes`).
NOTE = "note: "
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
    notes: tuple[str, ...] = ()
    """What the broker it started did to its store (:attr:`EmbeddedBroker.notes`)."""

    def stop_command(self) -> str:
        """The ``tghost broker stop`` command line that stops this broker."""
        return "tghost broker stop" + _where_args(self.port, self.data_dir)

    def disk(self) -> DiskSpace | None:
        """The free space of the data dir's file system now (``None``: no data dir yet)."""
        return disk_space(self.data_dir)

    def to_json(self) -> dict[str, Any]:
        """``{"url", "port", "data_dir", "log", "running", "answering", "pid", "broker_pid",
        "started_at", "detached", "started", "stop", "disk", "notes"}``; the pids, ``started_at`` and
        ``detached`` are ``null`` without a record, ``disk``
        (:meth:`tghost.pulsar.store.DiskSpace.to_json`) without a data dir."""
        record, disk = self.record, self.disk()
        return {"url": self.url, "port": self.port, "data_dir": str(self.data_dir), "log": str(self.log_path),
                "running": self.running, "answering": self.answering,
                "pid": record.pid if record else None, "broker_pid": record.broker_pid if record else None,
                "started_at": record.started_at if record else None,
                "detached": record.detached if record else None, "started": self.started,
                "stop": self.stop_command(), "disk": disk.to_json() if disk else None, "notes": list(self.notes)}


def _where_args(port: int, data_dir: Path) -> str:
    """`` --port P --data-dir D`` for a ``tghost broker`` command line, each only when needed: the
    data dir of a broker that runs is found from its port (the pointer :func:`running_data_dir` reads)."""
    args = "" if port == DEFAULT_PORT else f" --port {port}"
    if Path(data_dir) not in (default_data_dir(port), _pointer(port)):
        args += f" --data-dir {data_dir}"
    return args


def broker_status(port: int = DEFAULT_PORT, data_dir: Path | None = None) -> BrokerStatus:
    """The embedded broker on ``port`` whose data is in ``data_dir``; without one, the data dir of
    the broker running on ``port`` (:func:`running_data_dir`)."""
    data_dir = Path(data_dir or running_data_dir(port))
    running = _DataDirLock.is_held(data_dir)
    return BrokerStatus(port, data_dir, running, is_reachable(f"pulsar://127.0.0.1:{port}", timeout=0.5),
                        BrokerRecord.read(data_dir) if running else None)


def running_data_dir(port: int = DEFAULT_PORT) -> Path:
    """The data dir of the embedded broker running on ``port``: :func:`default_data_dir`, unless
    a broker runs there with another data dir (``tghost broker --data-dir``), which leaves its
    path in the default one (:data:`ELSEWHERE`) while it runs."""
    default = default_data_dir(port)
    elsewhere = _pointer(port)
    if elsewhere is None:
        return default
    record = BrokerRecord.read(elsewhere) if elsewhere.is_absolute() else None
    if record is None or _port_of(record.url) != port or not _DataDirLock.is_held(elsewhere):
        return default  # a stale pointer: that broker was killed, or moved on to another port
    return elsewhere


def _pointer(port: int) -> Path | None:
    """The data dir that the port's default data dir points to (:data:`ELSEWHERE`), if any: only
    a broker running with it makes it count (:func:`running_data_dir` checks)."""
    try:
        return Path((default_data_dir(port) / ELSEWHERE).read_text().strip())
    except OSError:
        return None


def _point_to(record: BrokerRecord) -> Path | None:
    """Leave the path of ``record``'s data dir in its port's default data dir, unless it is that
    one; returns the pointer written (``None``: none needed, or it could not be written)."""
    data_dir = Path(record.data_dir)
    default = default_data_dir(_port_of(record.url))
    if data_dir == default:
        return None
    try:
        default.mkdir(parents=True, exist_ok=True)
        (default / ELSEWHERE).write_text(f"{data_dir}\n")
    except OSError:
        return None  # best effort: without it, 'tghost broker stop' needs --data-dir
    return default / ELSEWHERE


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
    data_dir = Path(data_dir or running_data_dir(port))
    status = broker_status(port, data_dir)
    if status.answering:
        return status
    status = start_detached(port, data_dir, log_level=log_level)
    for note in status.notes:
        log.warning("the embedded broker %s", note)
    return status


def start_detached(port: int = DEFAULT_PORT, data_dir: Path | None = None, *, log_level: str = "warn",
                   metrics_port: int | None = None, ready_timeout: float = 20.0,
                   low_space: int | None = None) -> BrokerStatus:
    """Start ``tghost broker`` detached: in its own session, so it is not stopped with the
    process that started it (signals, a closed terminal). Every process on its URL shares it;
    ``tghost broker stop`` (or :func:`stop_broker`) stops it. Its record (``broker.json``) and
    log are in ``data_dir``. Starters on one data dir take turns, so two never both start one.

    Returns the status of the running broker: the one started (``started`` True; its ``notes``
    say whether it moved a damaged store aside), or one another process started meanwhile.
    ``low_space`` (bytes) is where it starts warning about free space (default:
    :func:`tghost.pulsar.store.low_space_threshold`).

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
        if low_space is not None:
            command += ["--low-space", f"{low_space / MIB:g}"]
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
            notes = tuple(line.removeprefix(NOTE) for line in told.splitlines() if line.startswith(NOTE))
            return dataclasses.replace(status, started=True, notes=notes)
        code = child.wait()
        raise BrokerError(told.removeprefix("Error: ") or f"the embedded broker exited with code {code}; "
                          f"see {status.log_path}")


def stop_broker(port: int = DEFAULT_PORT, data_dir: Path | None = None, timeout: float = 10.0) -> BrokerStatus:
    """Stop the embedded broker on ``port`` with ``data_dir`` (default: the one running there,
    :func:`running_data_dir`): SIGTERM its ``tghost broker``
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


def local_disk_trouble(url: str) -> str | None:
    """What is wrong with the disk of the embedded broker at a loopback ``url``, as a clause for
    an error message (``"the disk of the embedded broker's data dir is full: 0.0 MiB free of ..."``),
    or ``None``: not loopback, no embedded broker running on that port, or space enough.
    Best effort: it reads files and asks the file system, never the broker."""
    found = endpoints(url)
    if len(found) != 1 or not is_loopback(found[0][0]):
        return None
    record = BrokerRecord.read(running_data_dir(found[0][1]))
    space = disk_space(Path(record.data_dir)) if record is not None else None
    if space is None or space.free >= low_space_threshold(space.total):
        return None
    state = "full" if space.free < MIB else "nearly full"
    return f"the disk of the embedded broker's data dir is {state}: {space.describe()}"


class _Stop(Exception):
    """SIGTERM or SIGHUP reached ``tghost broker``: stop as on Ctrl-C."""


def run_until_stopped(broker: EmbeddedBroker, *, detached: bool, on_ready: Callable[[BrokerRecord], None],
                      ready_timeout: float = 15.0) -> int:
    """Start ``broker``, write its record, call ``on_ready`` with it, and serve until Ctrl-C,
    SIGTERM or SIGHUP (exit code 0) or until pulsar-lite dies (1), watching its free space and
    store every :data:`WATCH_INTERVAL` seconds (:meth:`EmbeddedBroker.watch`; the record follows a
    restart's new pid). pulsar-lite is stopped and the record removed on every way out, and
    pulsar-lite also dies if this process is killed (Linux).

    Raises:
        BrokerError: the broker did not start, its record could not be written, or a restart
            on an empty store failed.
    """
    handlers = {sig: signal.signal(sig, _raise_stop) for sig in _STOP_SIGNALS}
    record: BrokerRecord | None = None
    pointer: Path | None = None
    try:
        broker.start(ready_timeout)
        assert broker.process is not None
        record = _write_record(BrokerRecord(os.getpid(), broker.process.pid, broker.url, str(broker.data_dir),
                                            str(broker.log_path), time.time(), detached))
        pointer = _point_to(record)
        on_ready(record)
        while (code := broker.wait(WATCH_INTERVAL)) is None:
            if broker.watch():
                record = _follow_restart(broker, record)
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
        if pointer is not None:
            with contextlib.suppress(OSError):
                if Path(pointer.read_text().strip()) == broker.data_dir:
                    pointer.unlink()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _follow_restart(broker: EmbeddedBroker, record: BrokerRecord) -> BrokerRecord:
    """The record with the restarted pulsar-lite's pid, written (if the data dir lets it: else
    noted in the log and the old one returned)."""
    assert broker.process is not None
    try:
        return _write_record(dataclasses.replace(record, broker_pid=broker.process.pid))
    except BrokerError as exc:
        broker.note(str(exc))
        return record


def _write_record(record: BrokerRecord) -> BrokerRecord:
    """Write ``record`` (:meth:`BrokerRecord.write`) and return it.

    Raises:
        BrokerError: the data dir cannot be written (a full disk).
    """
    try:
        record.write()
    except OSError as exc:
        raise BrokerError(f"cannot write {RECORD} in the data dir {record.data_dir} ({exc.strerror}): free space "
                          "there, then start the broker again") from None
    return record


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
    ``db.rocksdb/`` and ``db.metadata.json`` (its store: messages survive a restart on the same
    ``data_dir``), ``broker.log`` (pulsar-lite's output at ``log_level``, rotated at
    :data:`tghost.pulsar.broker_log.LOG_MAX_BYTES` with :data:`tghost.pulsar.broker_log.LOG_BACKUPS`
    old files kept), ``pulsar-lite.toml`` (its config, written at each start) and ``broker.lock``
    (held while it runs, so no second broker opens the same data). Its metrics endpoint is off, or
    on ``127.0.0.1:metrics_port``. With ``echo`` (a text stream), its output is copied there too (a
    line repeated within :data:`tghost.pulsar.broker_log.REPEAT_WINDOW` seconds once). With
    ``die_with_parent`` (Linux), pulsar-lite gets SIGTERM when the thread that started it ends,
    even by SIGKILL: start it from the main thread.

    A damaged store (a record torn by a write that failed, e.g. on a full disk, with messages
    behind it that pulsar-lite cannot read; or one pulsar-lite refuses to open) is moved aside
    at start (:func:`tghost.pulsar.store.move_store_aside`), and :attr:`notes` says so.
    :meth:`watch` looks at free space (warning below ``low_space`` bytes, default
    :func:`tghost.pulsar.store.low_space_threshold`) and, once a full disk has damaged the store
    and has room again, restarts pulsar-lite on an empty store.
    """

    def __init__(self, data_dir: Path, port: int = DEFAULT_PORT, *, log_level: str = "warn",
                 metrics_port: int | None = None, echo: IO[str] | None = None,
                 die_with_parent: bool = False, low_space: int | None = None) -> None:
        if log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {LOG_LEVELS}, not {log_level!r}")
        self.data_dir = Path(data_dir).resolve()  # the child runs in it: a relative path would nest
        self.port = port
        self.log_level = log_level
        self.metrics_port = metrics_port
        self.echo = echo
        self.die_with_parent = die_with_parent
        self.low_space = low_space
        self.process: subprocess.Popen[bytes] | None = None
        self.notes: list[str] = []
        """What tghost did to the store at start (moved it aside, and why), one line each."""
        self.restarts = 0
        """How many times :meth:`watch` restarted pulsar-lite on an empty store."""
        self._lock: _DataDirLock | None = None
        self._log: BrokerLog | None = None
        self._pump: LogPump | None = None
        self._space_low = False
        self._waiting_for_space = False
        self._ready_timeout = 15.0

    @property
    def config_path(self) -> Path:
        """pulsar-lite's config file, written at each start."""
        return self.data_dir / "pulsar-lite.toml"

    def start(self, ready_timeout: float = 15.0) -> EmbeddedBroker:
        """Start the process and wait (seconds) until it accepts connections. A damaged store is
        moved aside first, or when pulsar-lite refuses to open it (once).

        Raises:
            BrokerError: pulsar-lite is missing; the port is taken; the data dir is in use by
                another broker, or cannot be written (a full disk); it exited; or it was not
                ready in time. The message says which, and what to do.
        """
        binary = _binary()
        self._ready_timeout = ready_timeout
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock = _DataDirLock.acquire(self.data_dir)
        try:
            if not _port_is_free(self.port):
                raise BrokerError(self._port_taken())
            self._log = BrokerLog(self.log_path, self.echo)
            self._write_config()
            damage = find_damage(self.data_dir)
            if damage is not None:
                self._set_aside(f"it has {damage.describe()}")
            self._launch(binary, ready_timeout, retry_damaged=True)
        except BaseException:
            self.stop()
            raise
        assert self.process is not None
        log.info("embedded broker pid %s at %s, data in %s", self.process.pid, self.url, self.data_dir)
        return self

    def _write_config(self) -> None:
        try:
            self.config_path.write_text(self._config())
        except OSError as exc:
            raise BrokerError(f"cannot write to the data dir {self.data_dir} ({exc.strerror})"
                              f"{self._space_hint()}") from None

    def _space_hint(self) -> str:
        space = disk_space(self.data_dir)
        if space is None or space.free >= MIB:
            return ""
        return f": its disk is full ({space.describe()}); free space there, then start the broker again"

    def _launch(self, binary: str, ready_timeout: float, *, retry_damaged: bool) -> None:
        """Start pulsar-lite and wait until it accepts connections; a store it refuses to open
        is moved aside and pulsar-lite started again, once, if ``retry_damaged``."""
        command = [binary, "--config", str(self.config_path), "--addr", f"127.0.0.1:{self.port}",
                   "--db-path", str(self.data_dir / "db"), "--log-level", self.log_level]
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            cwd=self.data_dir, preexec_fn=self._preexec())
        assert self.process.stdout is not None and self._log is not None
        self._log.forget_lines()  # a failure to start is told by this process's lines alone
        self._pump = LogPump(self.process.stdout, self._log)
        self.note(f"started pulsar-lite pid {self.process.pid} at {self.url} (log level {self.log_level})")
        try:
            self._wait_ready(ready_timeout)
        except _RefusedStore as refused:
            if not retry_damaged:
                raise BrokerError(str(refused)) from None
            self._end_process()
            self._set_aside(f"pulsar-lite refused to open it ({refused.line})")
            self._launch(binary, ready_timeout, retry_damaged=False)

    def _set_aside(self, why: str) -> None:
        """Move the store aside (:func:`tghost.pulsar.store.move_store_aside`), saying so in the log
        and :attr:`notes`."""
        try:
            aside = move_store_aside(self.data_dir)
        except OSError as exc:
            raise BrokerError(f"the broker's store in {self.data_dir} is damaged ({why}) and could not be moved "
                              f"aside ({exc}): stop the broker, move {' and '.join(STORE)} out of {self.data_dir} "
                              "yourself, and start it again") from None
        message = (f"moved the damaged store aside to {aside}: {why}. pulsar-lite starts on an empty one; hosts "
                   "announce again when they reconnect. Delete it once you no longer need it")
        self.notes.append(message)
        self.note(message)
        if self.echo is None:  # else the note is on the terminal already
            log.warning("the embedded broker %s", message)

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
        assert self.process is not None and self._pump is not None and self._log is not None
        deadline = time.monotonic() + timeout
        while not is_reachable(self.url, timeout=0.2):
            if self.process.poll() is not None:
                self._pump.join(2.0)
                lines = self._log.last_lines()
                refused = next((line for line in lines if any(mark in line for mark in STORE_DAMAGED)), None)
                if refused is not None:
                    raise _RefusedStore(refused, self._exit_cause(self.process.returncode, lines))
                raise BrokerError(self._exit_cause(self.process.returncode, lines))
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
        if DISK_FULL in text:
            space = disk_space(self.data_dir)
            where = space.describe() if space else str(self.data_dir)
            return (f"the embedded broker cannot open its store: its disk is full ({where}). Free space there, "
                    "then start it again")
        errors = [line for line in lines if line.startswith("Error")] or lines[-1:]
        detail = f": {errors[0]}" if errors else ""
        return f"the embedded broker exited with code {code}{detail}; see {self.log_path}"

    def _port_taken(self) -> str:
        return (f"port {self.port} on 127.0.0.1 is already in use: is a broker running there "
                f"('tghost broker status{_where_args(self.port, default_data_dir(self.port))}')? "
                "Stop what listens there, or pass another --port (tghost run: --pulsar-url)")

    def note(self, message: str) -> None:
        """Add a line from tghost (not pulsar-lite) to the broker's log (and its echo)."""
        if self._log is not None:
            self._log.note(message)

    def wait(self, timeout: float) -> int | None:
        """pulsar-lite's exit code, once it exits within ``timeout`` seconds; ``None`` while it runs."""
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    # -- watching ------------------------------------------------------------------------------

    def watch(self) -> bool:
        """Look once at free space and at what pulsar-lite said about its disk and store (call it
        every :data:`WATCH_INTERVAL` seconds from the thread that started it). Says in the log when
        free space goes below the threshold, and when it is back; when pulsar-lite could not
        write (a full disk) or read its store. Once the disk has room again, a store that a
        failed write damaged is moved aside and pulsar-lite restarted on an empty one (hosts
        restate on reconnect). Returns whether it restarted pulsar-lite (a new pid).

        Raises:
            BrokerError: the restarted pulsar-lite did not start.
        """
        assert self._log is not None
        space = disk_space(self.data_dir)
        low = self._note_space(space)
        if self._log.disk_full is None and self._log.damaged is None:
            return False
        if low:
            self._note_waiting(space)
            return False
        damage = self._damage_now()
        if self._log.damaged is None and damage is None:
            self.note("pulsar-lite could not write while its disk was full; its store is whole")
            self._log.clear_trouble()
            self._waiting_for_space = False
            return False
        self._restart_empty(f"it has {damage.describe()}" if damage
                            else f"pulsar-lite cannot read it ({words(self._log.damaged)})")
        return True

    def _threshold(self, space: DiskSpace) -> int:
        return low_space_threshold(space.total, self.low_space)

    def _note_space(self, space: DiskSpace | None) -> bool:
        """Note when free space goes below the threshold, or back above it (with a margin of a
        tenth, so a disk at the threshold does not flap); returns whether it is low now."""
        if space is None:
            return self._space_low
        threshold = self._threshold(space)
        if not self._space_low and space.free < threshold:
            self._space_low = True
            self.note(f"low disk space for the broker's data: {space.describe()}, below {size(threshold)}. "
                      "On a full disk pulsar-lite refuses persistent messages (the hosts' announcements) and "
                      "may damage its store: free space there")
        elif self._space_low and space.free >= threshold * 1.1:
            self._space_low = False
            self.note(f"disk space for the broker's data is back: {space.describe()}")
        return self._space_low

    def _note_waiting(self, space: DiskSpace | None) -> None:
        if self._waiting_for_space:
            return
        self._waiting_for_space = True
        assert self._log is not None
        above = f"more than {size(self._threshold(space))}" if space else "space"
        self.note(f"pulsar-lite cannot write its store: its disk is full ({words(self._log.disk_full)}). "
                  "Announcements cannot be published (hosts report it); calls on non-persistent topics go on. "
                  f"Once {above} is free, a store the full disk damaged is moved aside and pulsar-lite restarted")

    def _damage_now(self) -> StoreDamage | None:
        """A torn record in the running store that stays torn (looked at twice, as a write may be
        under way)."""
        first = find_damage(self.data_dir, torn_tail=True)
        if first is None:
            return None
        time.sleep(0.2)
        again = find_damage(self.data_dir, torn_tail=True)
        return again if again is not None and (again.file, again.offset) == (first.file, first.offset) else None

    def _restart_empty(self, why: str) -> None:
        """Stop pulsar-lite, move its store aside (``why``: a clause for the log), and start it
        again on the same port."""
        assert self._log is not None
        self._end_process()
        time.sleep(RESTART_PAUSE)
        self._set_aside(why)
        self._log.clear_trouble()
        self._waiting_for_space = False
        self.restarts += 1
        self._launch(_binary(), self._ready_timeout, retry_damaged=False)

    # -- stopping ------------------------------------------------------------------------------

    def _end_process(self, timeout: float = 5.0) -> None:
        """Terminate pulsar-lite (then kill it after ``timeout`` seconds) and wait for its output."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._pump is not None:
            self._pump.join(2.0)
            self._pump = None
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()  # read to its end by the pump; unclosed, it warns (ResourceWarning)

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the process (then kill it after ``timeout`` seconds) and release the data
        dir. Idempotent."""
        self._end_process(timeout)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()


class _RefusedStore(BrokerError):
    """pulsar-lite exited at start, refusing its store; ``line`` is what it said."""

    def __init__(self, line: str, message: str) -> None:
        super().__init__(message)
        self.line = line


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
