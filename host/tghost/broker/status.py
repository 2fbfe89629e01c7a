"""status: where an embedded broker lives and what is known of it without asking it: its port
and data dir (by default one per port, :func:`default_data_dir`), the record a running ``tghost
broker`` keeps there (:class:`BrokerRecord`), the lock that says a broker holds it
(:class:`DataDirLock`), its status (:func:`broker_status`) and its disk's trouble
(:func:`local_disk_trouble`).

Never starts or stops a broker: it reads files, tries a lock and a TCP connection.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import IO, Any

from tghost.broker.store import MIB, DiskSpace, disk_space, low_space_threshold
from tghost.pulsar.clients import BrokerError, endpoints, is_reachable
from tghost.system.locks import try_lock
from tghost.system.net import is_loopback
from tghost.system.paths import app_dir

__all__ = [
    "DEFAULT_PORT",
    "ELSEWHERE",
    "RECORD",
    "BrokerRecord",
    "BrokerStatus",
    "DataDirLock",
    "Place",
    "broker_status",
    "default_data_dir",
    "local_disk_trouble",
    "make_data_dir",
    "point_to",
    "port_of",
    "running_data_dir",
    "where_args",
]

#: The embedded broker's port unless told otherwise (Pulsar's own).
DEFAULT_PORT = 6650


def default_data_dir(port: int = DEFAULT_PORT) -> Path:
    """Where the embedded broker on ``port`` keeps its data, record and log:
    ``<tghost app dir>/brokers/<port>`` (e.g. ``~/.config/tghost/brokers/6650``). One per port,
    so two embedded brokers never share a RocksDB directory."""
    return app_dir() / "brokers" / str(port)


def make_data_dir(data_dir: Path) -> Path:
    """Create ``data_dir`` (and its parents) if missing; returns it.

    Raises:
        BrokerError: it cannot be made (a file is in the way, no permission, a full disk); the
            message names the directory and says to choose another.
    """
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BrokerError(f"cannot use {data_dir} as the broker's data dir ({exc.strerror}): choose a directory "
                          "this user can write (--data-dir)") from None
    return data_dir


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
_LOCK = "broker.lock"


class Place:
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
class BrokerStatus(Place):
    """What is known about the embedded broker on ``port`` with ``data_dir``."""

    port: int
    data_dir: Path
    running: bool
    """A ``tghost broker`` (or an in-process :class:`tghost.broker.process.EmbeddedBroker`) holds ``data_dir`` now."""
    answering: bool
    """Something accepts TCP connections at ``url``."""
    record: BrokerRecord | None
    """The running broker's record (``None`` when not running, or run in-process)."""
    started: bool = False
    """Whether the call that returned this status started the broker."""
    notes: tuple[str, ...] = ()
    """What the broker it started did to its store (:attr:`tghost.broker.process.EmbeddedBroker.notes`)."""

    def stop_command(self) -> str:
        """The ``tghost broker stop`` command line that stops this broker."""
        return "tghost broker stop" + where_args(self.port, self.data_dir)

    def disk(self) -> DiskSpace | None:
        """The free space of the data dir's file system now (``None``: no data dir yet)."""
        return disk_space(self.data_dir)

    def to_json(self) -> dict[str, Any]:
        """``{"url", "port", "data_dir", "log", "running", "answering", "pid", "broker_pid",
        "started_at", "detached", "started", "stop", "disk", "notes"}``; the pids, ``started_at`` and
        ``detached`` are ``null`` without a record, ``disk``
        (:meth:`tghost.broker.store.DiskSpace.to_json`) without a data dir."""
        record, disk = self.record, self.disk()
        return {"url": self.url, "port": self.port, "data_dir": str(self.data_dir), "log": str(self.log_path),
                "running": self.running, "answering": self.answering,
                "pid": record.pid if record else None, "broker_pid": record.broker_pid if record else None,
                "started_at": record.started_at if record else None,
                "detached": record.detached if record else None, "started": self.started,
                "stop": self.stop_command(), "disk": disk.to_json() if disk else None, "notes": list(self.notes)}


def where_args(port: int, data_dir: Path) -> str:
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
    running = DataDirLock.is_held(data_dir)
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
    if record is None or port_of(record.url) != port or not DataDirLock.is_held(elsewhere):
        return default  # a stale pointer: that broker was killed, or moved on to another port
    return elsewhere


def _pointer(port: int) -> Path | None:
    """The data dir that the port's default data dir points to (:data:`ELSEWHERE`), if any: only
    a broker running with it makes it count (:func:`running_data_dir` checks)."""
    try:
        return Path((default_data_dir(port) / ELSEWHERE).read_text().strip())
    except OSError:
        return None


def point_to(record: BrokerRecord) -> Path | None:
    """Leave the path of ``record``'s data dir in its port's default data dir, unless it is that
    one; returns the pointer written (``None``: none needed, or it could not be written)."""
    data_dir = Path(record.data_dir)
    default = default_data_dir(port_of(record.url))
    if data_dir == default:
        return None
    try:
        default.mkdir(parents=True, exist_ok=True)
        (default / ELSEWHERE).write_text(f"{data_dir}\n")
    except OSError:
        return None  # best effort: without it, 'tghost broker stop' needs --data-dir
    return default / ELSEWHERE


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


class DataDirLock:
    """``<data dir>/broker.lock``, ``flock``-ed by the process whose broker uses the data dir;
    the kernel releases it when that process dies, so a crash never leaves it stale."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle

    @classmethod
    def acquire(cls, data_dir: Path) -> DataDirLock:
        """Raises BrokerError (naming the other broker's pid) when the data dir is in use."""
        handle = try_lock(data_dir / _LOCK)
        if handle is None:
            record = BrokerRecord.read(data_dir)
            owner = (f"the embedded broker pid {record.pid} at {record.url}" if record
                     else "another embedded broker")
            stop = (" ('tghost broker stop" + where_args(port_of(record.url), data_dir) + "')") if record else ""
            raise BrokerError(f"the data dir {data_dir} is in use by {owner}: stop it{stop}, or pass another "
                              "--data-dir") from None
        return cls(handle)

    def release(self) -> None:
        """Let the data dir go (closing the file drops the flock)."""
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


def port_of(url: str) -> int:
    """The port of a broker's service URL (its first host's; 6650 when it names none)."""
    return endpoints(url)[0][1]
