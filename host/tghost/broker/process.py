"""process: one pulsar-lite process on ``127.0.0.1:port``, a child of this one
(:class:`EmbeddedBroker`): started with its data dir held, its output in the broker's log, a
damaged store moved aside, watched for a full disk and restarted on an empty store, stopped.

Never opens a Pulsar client: it knows ports, processes and files.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO

from tghost.broker.log import DISK_FULL, STORE_DAMAGED, BrokerLog, LogPump, words
from tghost.broker.status import DEFAULT_PORT, DataDirLock, Place, default_data_dir, make_data_dir, where_args
from tghost.broker.store import (
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
from tghost.pulsar.clients import BrokerError, is_reachable
from tghost.system.processes import die_with_parent

__all__ = ["LOG_LEVELS", "RESTART_PAUSE", "WATCH_INTERVAL", "EmbeddedBroker"]

#: pulsar-lite's log levels (``--log-level``); tghost starts it at ``warn``.
LOG_LEVELS = ("error", "warn", "info", "debug", "trace")
#: Seconds between two looks of ``tghost broker`` at its free space and at pulsar-lite's store.
WATCH_INTERVAL = 1.0
#: Seconds pulsar-lite stays stopped when ``tghost broker`` restarts it on an empty store, so that
#: every client sees its connection drop (and a host restates what it announces).
RESTART_PAUSE = 0.5

log = logging.getLogger(__name__)


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


class EmbeddedBroker(Place):
    """A pulsar-lite process on ``127.0.0.1:port`` with its data in ``data_dir``, a child of this
    process (the test fixture's, and ``tghost broker``'s in the foreground).

    Use as a context manager, or call :meth:`start` and :meth:`stop`. In ``data_dir``:
    ``db.rocksdb/`` and ``db.metadata.json`` (its store: messages survive a restart on the same
    ``data_dir``), ``broker.log`` (pulsar-lite's output at ``log_level``, rotated at
    :data:`tghost.broker.log.LOG_MAX_BYTES` with :data:`tghost.broker.log.LOG_BACKUPS`
    old files kept), ``pulsar-lite.toml`` (its config, written at each start) and ``broker.lock``
    (held while it runs, so no second broker opens the same data). Its metrics endpoint is off, or
    on ``127.0.0.1:metrics_port``. With ``echo`` (a text stream), its output is copied there too (a
    line repeated within :data:`tghost.broker.log.REPEAT_WINDOW` seconds once). With
    ``die_with_parent`` (Linux), pulsar-lite gets SIGTERM when the thread that started it ends,
    even by SIGKILL: start it from the main thread.

    A damaged store (a record torn by a write that failed, e.g. on a full disk, with messages
    behind it that pulsar-lite cannot read; or one pulsar-lite refuses to open) is moved aside
    at start (:func:`tghost.broker.store.move_store_aside`), and :attr:`notes` says so.
    :meth:`watch` looks at free space (warning below ``low_space`` bytes, default
    :func:`tghost.broker.store.low_space_threshold`) and, once a full disk has damaged the store
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
        self._lock: DataDirLock | None = None
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
        make_data_dir(self.data_dir)
        self._lock = DataDirLock.acquire(self.data_dir)
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
        """Move the store aside (:func:`tghost.broker.store.move_store_aside`), saying so in the log
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
                f"('tghost broker status{where_args(self.port, default_data_dir(self.port))}')? "
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


def _port_is_free(port: int) -> bool:
    """Whether pulsar-lite can listen on ``127.0.0.1:port`` (it binds with SO_REUSEADDR, as here)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
