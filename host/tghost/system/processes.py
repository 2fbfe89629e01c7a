"""processes: tghost's child processes: how they start (:data:`CONTEXT`), that they end with
their parent (:func:`die_with_parent`), and how an exit reads to a person (:func:`describe_exit`).
Used by the import probe, worker processes and the embedded broker.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import signal
import sys

__all__ = ["CONTEXT", "describe_exit", "die_with_parent"]


def _context() -> multiprocessing.context.ForkServerContext | multiprocessing.context.SpawnContext:
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # Workers fork from a server that has imported tghost once, so a worker is up in tens of
    # milliseconds plus its plugin's import. Each worker still runs the host's main module as
    # ``__mp_main__`` (Python 3.11's forkserver never preloads it), which for the ``tghost``
    # script is an import of ``tghost.cli``: preloaded too (it starts no thread, Pulsar's
    # client included, so forking after it is safe).
    context.set_forkserver_preload(["tghost.serving.executors.child", "tghost.cli"])
    return context


#: The multiprocessing context of worker and probe processes (forkserver, else spawn).
CONTEXT = _context()


def describe_exit(code: int | None) -> str:
    """``exit code 3``, or ``killed by SIGSEGV`` for a negative code (a signal), with a hint for SIGKILL."""
    if code is None:
        return "unknown exit status"
    if code >= 0:
        return f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    hint = " (the kernel's OOM killer, or an operator?)" if -code == signal.SIGKILL else ""
    return f"killed by {name}{hint}"


def die_with_parent(sig: signal.Signals, parent: int | None = None) -> None:
    """Ask Linux to send this process ``sig`` when its parent ends (``prctl(PR_SET_PDEATHSIG)``),
    and end it now (``sig``) if the parent already ended, or is no longer ``parent`` (a pid).
    Does nothing elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    except Exception:
        return
    if os.getppid() == 1 or (parent is not None and os.getppid() != parent):  # it ended before the line above
        os.kill(os.getpid(), sig)
