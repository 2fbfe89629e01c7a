"""control: the ``tghost broker`` process, which owns pulsar-lite (docs/operations/broker.md): run
in the foreground until stopped (:func:`run_until_stopped`), or started detached, in its own
session, shared by every process on its URL and outliving whoever started it
(:func:`start_detached`; :func:`ensure_broker` for ``tghost run``); and stopped (:func:`stop_broker`).

Never opens a Pulsar client: it knows ports, processes and files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from tghost.broker.process import WATCH_INTERVAL, EmbeddedBroker
from tghost.broker.status import (
    DEFAULT_PORT,
    RECORD,
    BrokerRecord,
    BrokerStatus,
    DataDirLock,
    broker_status,
    default_data_dir,
    make_data_dir,
    point_to,
    running_data_dir,
)
from tghost.broker.store import MIB
from tghost.pulsar.clients import BrokerError, endpoints
from tghost.system.locks import held
from tghost.system.net import is_loopback

__all__ = ["NOTE", "ensure_broker", "run_until_stopped", "start_detached", "stop_broker"]

#: How the detached ``tghost broker`` marks a note for its starter on stderr (:attr:`BrokerStatus.notes`).
NOTE = "note: "
_START_LOCK = "start.lock"

log = logging.getLogger(__name__)


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
    if status.answering and status.record is None and (data_dir / _START_LOCK).exists():
        with held(data_dir / _START_LOCK):  # another process is starting it: its record comes before the lock goes
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
    :func:`tghost.broker.store.low_space_threshold`).

    Raises:
        BrokerError: it did not start within ``ready_timeout`` seconds, or the port is taken, or
            the data dir is locked; the message is the broker's own, with the fix.
    """
    data_dir = make_data_dir(Path(data_dir or default_data_dir(port)))
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
    while DataDirLock.is_held(status.data_dir):
        if time.monotonic() > deadline:
            _signal(record.pid, signal.SIGKILL)
            _signal(record.broker_pid, signal.SIGKILL)
            time.sleep(0.5)
            if DataDirLock.is_held(status.data_dir):
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
        pointer = point_to(record)
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
