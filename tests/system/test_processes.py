"""processes: how a child's exit reads to a person, that a child can be made to end with its
parent (Linux), and how worker and probe processes start."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tghost.system.processes import CONTEXT, describe_exit

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


@pytest.mark.parametrize(("code", "text"), [
    (None, "unknown exit status"),
    (0, "exit code 0"),
    (7, "exit code 7"),
    (-signal.SIGSEGV, "killed by SIGSEGV"),
    (-signal.SIGKILL, "killed by SIGKILL (the kernel's OOM killer, or an operator?)"),
    (-99, "killed by signal 99"),
], ids=["unknown", "0", "7", "SIGSEGV", "SIGKILL", "no-such-signal"])
def test_an_exit_reads_as_its_code_or_its_signal(code: int | None, text: str) -> None:
    assert describe_exit(code) == text


def test_workers_start_from_a_forkserver_where_there_is_one() -> None:
    methods = multiprocessing.get_all_start_methods()
    assert CONTEXT.get_start_method() == ("forkserver" if "forkserver" in methods else "spawn")


#: A child that asks to die with a parent that is not its parent (``sys.argv[1]``): it ends at once.
ORPHAN = textwrap.dedent("""
    import signal, sys
    from tghost.system.processes import die_with_parent

    die_with_parent(signal.SIGTERM, parent=int(sys.argv[1]))
    print("still running")
""")


@linux_only
def test_a_child_whose_parent_already_changed_ends_at_once_with_the_signal() -> None:
    not_its_parent = os.getpid() + 1_000_000  # no such process
    ended = subprocess.run([sys.executable, "-c", ORPHAN, str(not_its_parent)], capture_output=True, text=True,
                           timeout=60)
    assert ended.returncode == -signal.SIGTERM and ended.stdout == ""


#: A parent that starts a child asking to die with it, prints the child's pid, then ends.
PARENT = textwrap.dedent("""
    import os, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c",
        "import os, signal, time\\n"
        "from tghost.system.processes import die_with_parent\\n"
        f"die_with_parent(signal.SIGTERM, parent={os.getpid()})\\n"
        "print('armed', flush=True)\\n"
        "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "armed\\n"
    print(child.pid, flush=True)
""")


@linux_only
def test_a_child_that_asked_ends_with_its_parent() -> None:
    parent = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True, timeout=60)
    child = int(parent.stdout)
    assert _ends_within(child, 10), f"pid {child} outlived its parent"


#: A process that says it runs elsewhere, then asks to die with a parent that is not its parent.
ELSEWHERE = textwrap.dedent("""
    import signal, sys
    from tghost.system import processes

    processes.sys.platform = sys.argv[1]
    processes.die_with_parent(signal.SIGTERM, parent=int(sys.argv[2]))
    print("still running")
""")


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_elsewhere_die_with_parent_does_nothing(platform: str) -> None:
    not_its_parent = os.getpid() + 1_000_000
    ran = subprocess.run([sys.executable, "-c", ELSEWHERE, platform, str(not_its_parent)], capture_output=True,
                         text=True, timeout=60)
    assert (ran.returncode, ran.stdout) == (0, "still running\n"), ran.stderr


def _ends_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` is gone (or a zombie) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rpartition(")")[2].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False
