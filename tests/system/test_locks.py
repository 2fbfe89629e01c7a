"""locks: a lock file is held by one handle at a time, slots are taken lowest first, and the
kernel releases a lock when its process dies, so a crash never leaves one stale."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tghost.system.locks import first_free_slot, held, try_lock


def test_a_lock_is_held_until_its_handle_is_closed(tmp_path: Path) -> None:
    first = try_lock(tmp_path / "a.lock")
    assert first is not None and (tmp_path / "a.lock").exists()  # created if missing
    assert try_lock(tmp_path / "a.lock") is None
    first.close()
    again = try_lock(tmp_path / "a.lock")
    assert again is not None
    again.close()


def test_a_held_lock_reads_and_appends_from_the_start(tmp_path: Path) -> None:
    (tmp_path / "a.lock").write_bytes(b"pid 1\n")
    handle = try_lock(tmp_path / "a.lock")
    assert handle is not None
    with handle:
        assert handle.read() == b"pid 1\n"
        handle.write(b"pid 2\n")
    assert (tmp_path / "a.lock").read_bytes() == b"pid 1\npid 2\n"


def test_slots_are_taken_lowest_free_first(tmp_path: Path) -> None:
    zero, one = first_free_slot(tmp_path), first_free_slot(tmp_path)
    assert (zero[0], one[0]) == (0, 1)
    zero[1].close()
    again = first_free_slot(tmp_path)
    assert again[0] == 0  # a freed slot is taken again
    for _, handle in (one, again):
        handle.close()


def test_with_every_slot_held_first_free_slot_raises_naming_the_folder(tmp_path: Path) -> None:
    taken = [first_free_slot(tmp_path, limit=2) for _ in range(2)]
    with pytest.raises(RuntimeError, match=f"no free slot among the 2 in {tmp_path}"):
        first_free_slot(tmp_path, limit=2)
    for _, handle in taken:
        handle.close()


def test_held_waits_for_the_lock_and_keeps_it_for_the_block(tmp_path: Path) -> None:
    path = tmp_path / "start.lock"
    order: list[str] = []
    holder = try_lock(path)
    assert holder is not None

    def wait_for_it() -> None:
        with held(path):
            order.append("waiter in")

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    time.sleep(0.1)
    order.append("holder out")
    holder.close()
    waiter.join(10)
    assert order == ["holder out", "waiter in"]
    with held(path):
        assert try_lock(path) is None  # held for the block


def test_a_killed_process_leaves_no_lock_behind(tmp_path: Path) -> None:
    path = tmp_path / "slot.lock"
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom tghost.system.locks import try_lock\n"
                               f"handle = try_lock(Path({str(path)!r}))\nprint(handle is not None, flush=True)\n"
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "True\n"
    assert try_lock(path) is None
    child.kill()
    child.wait(10)
    handle = try_lock(path)
    assert handle is not None
    handle.close()
