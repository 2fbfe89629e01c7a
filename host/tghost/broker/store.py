"""store: the embedded broker's data directory on disk: the free space of its file system (and
when it is low), and pulsar-lite's store in it (a record torn by a failed write, found from the entry
logs' headers; a damaged store moved aside).

Never starts or talks to a broker: it reads files and asks the file system.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
import time
from pathlib import Path
from typing import Any

__all__ = [
    "LOW_SPACE_CAP",
    "LOW_SPACE_FRACTION",
    "MIB",
    "STORE",
    "DiskSpace",
    "StoreDamage",
    "disk_space",
    "find_damage",
    "low_space_threshold",
    "move_store_aside",
    "size",
]

#: ``tghost broker`` warns when the file system of its data dir has less free space than this
#: fraction of its size, or than :data:`LOW_SPACE_CAP` bytes, whichever is less (``--low-space``
#: sets another threshold).
LOW_SPACE_FRACTION = 0.05
LOW_SPACE_CAP = 1 << 30
MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class DiskSpace:
    """The file system holding ``path``: ``free`` bytes (what a process without root may still
    write) and ``total`` bytes."""

    path: Path
    free: int
    total: int

    def describe(self) -> str:
        """E.g. ``"0.4 MiB free of 20.0 MiB (2%) in /data"``."""
        share = 100 * self.free / self.total if self.total else 0.0
        return f"{size(self.free)} free of {size(self.total)} ({share:.0f}%) in {self.path}"

    def to_json(self, threshold: int | None = None) -> dict[str, Any]:
        """``{"path", "free_bytes", "total_bytes", "low_below_bytes", "low"}``."""
        limit = low_space_threshold(self.total, threshold)
        return {"path": str(self.path), "free_bytes": self.free, "total_bytes": self.total,
                "low_below_bytes": limit, "low": self.free < limit}


def size(count: int | float) -> str:
    """``count`` bytes for a human: ``"0.4 MiB"``, ``"12.3 GiB"`` (GiB from 10 GiB up)."""
    return f"{count / MIB:.1f} MiB" if count < 10 * 1024 * MIB else f"{count / (1024 * MIB):.1f} GiB"


def disk_space(path: Path) -> DiskSpace | None:
    """The free space of the file system holding ``path``; ``None`` when ``path`` cannot be read."""
    try:
        found = os.statvfs(path)
    except OSError:
        return None
    return DiskSpace(Path(path), found.f_bavail * found.f_frsize, found.f_blocks * found.f_frsize)


def low_space_threshold(total: int, given: int | None = None) -> int:
    """Bytes of free space below which a file system of ``total`` bytes is low: ``given``, else
    :data:`LOW_SPACE_FRACTION` of it but at most :data:`LOW_SPACE_CAP` (1 MiB of a 20 MiB disk,
    1 GiB of anything over 20 GiB)."""
    return given if given is not None else min(int(total * LOW_SPACE_FRACTION), LOW_SPACE_CAP)


#: Where pulsar-lite 0.2.0 keeps its store, under the data dir: RocksDB (its index, with the
#: message payloads in ``entrylog/N.log``) and the subscriptions' metadata.
STORE = ("db.rocksdb", "db.metadata.json")
#: A record of pulsar-lite 0.2.0's entry logs: magic ``GELP``, version, header length (44), ledger
#: id, entry id, batch index, metadata and payload lengths, checksum, reserved (little-endian; read
#: from its files, as the format is not documented).
_RECORD = struct.Struct("<4sHHQQiIIII")
_MAGIC = b"GELP"


@dataclasses.dataclass(frozen=True)
class StoreDamage:
    """A torn record in one of pulsar-lite's entry logs: ``file``, the ``offset`` of the first
    record that is not whole, and ``after``, the whole records found behind it, which pulsar-lite
    cannot read (it says "entrylog checksum mismatch" or "invalid entrylog magic": its index
    assumed the torn record was never written)."""

    file: Path
    offset: int
    after: int

    def describe(self) -> str:
        return (f"a record torn at byte {self.offset} of {self.file.name} (a write that failed, e.g. on a full "
                f"disk), with {self.after} message(s) written after it that cannot be read")


def find_damage(data_dir: Path, *, torn_tail: bool = False) -> StoreDamage | None:
    """The first torn record in pulsar-lite's entry logs under ``data_dir`` with records behind
    it; with ``torn_tail``, also one at the very end of the newest log (pulsar-lite running now
    appends its next message behind it; a restarted one starts a new log, so it is harmless then).
    ``None``: every record is whole, or there is no store. Reads only record headers."""
    logs = sorted((data_dir / STORE[0] / "entrylog").glob("*.log"), key=_log_number)
    for path in logs:
        damage = _scan_entrylog(path)
        if damage is not None and (damage.after or (torn_tail and path == logs[-1])):
            return damage
    return None


def _log_number(path: Path) -> int:
    return int(path.stem) if path.stem.isdigit() else -1


def _scan_entrylog(path: Path) -> StoreDamage | None:
    """The first record of entry log ``path`` that is not whole (bad magic, or past the end),
    with a count of the whole records behind it; ``None`` when all are whole."""
    try:
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            end = _whole_records(data, 0)[1]
            if end == len(data):
                return None
            return StoreDamage(path, end, _records_behind(data, end))
    except (OSError, ValueError):  # unreadable, or empty (mmap refuses a file of 0 bytes)
        return None


def _whole_records(data: mmap.mmap, offset: int) -> tuple[int, int]:
    """(how many whole records follow one another from ``offset``, the offset after the last)."""
    count = 0
    while offset + _RECORD.size <= len(data):
        magic, _, header, _, _, _, metadata, payload, _, _ = _RECORD.unpack_from(data, offset)
        end = offset + header + metadata + payload
        if magic != _MAGIC or header != _RECORD.size or end > len(data):
            break
        count, offset = count + 1, end
    return count, offset


def _records_behind(data: mmap.mmap, torn: int) -> int:
    """Whole records after the torn one at ``torn``: runs of records found from each later magic."""
    count, at = 0, data.find(_MAGIC, torn + 1)
    while at != -1:
        found, end = _whole_records(data, at)
        count += found
        at = data.find(_MAGIC, max(end, at + 1))
    return count


def move_store_aside(data_dir: Path) -> Path:
    """Move pulsar-lite's store (:data:`STORE`) into ``<data_dir>/store.corrupt-<UTC time>/``, so
    that the next start begins with an empty one; returns that directory. Renames only: it
    takes no space, and frees none (delete it once it is no longer needed).

    Raises:
        OSError: the data dir cannot be written.
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = data_dir / f"store.corrupt-{stamp}"
    suffix = 1
    while aside.exists():
        suffix += 1
        aside = data_dir / f"store.corrupt-{stamp}-{suffix}"
    aside.mkdir()
    for name in STORE:
        if (data_dir / name).exists():
            (data_dir / name).rename(aside / name)
    return aside
