"""driver: the one interface of every driver of a service's requests (:class:`Driver`).

A driver takes each answerable request along the one request state machine
(:mod:`tghost.serving.request`): admit, check, invoke, answer, settle. There are two, and
neither imports the other: the event loop (:class:`tghost.serving.loop.LoopDriver`) and the
thread lane (:class:`tghost.serving.lane.ThreadLane`). The endpoint
(:class:`tghost.serving.endpoint.ServiceEndpoint`) picks one per service when it opens
(:func:`driver_for`), hands it every answerable request, and never asks
which kind it is.
"""

from __future__ import annotations

from typing import Protocol

from tghost.pulsar import hop
from tghost.serving.executors.base import Executor
from tghost.serving.executors.thread import ThreadExecutor
from tghost.serving.lane import ThreadLane
from tghost.serving.loop import LoopDriver
from tghost.serving.request import Port, Request, Terms

__all__ = ["Driver", "driver_for"]


class Driver(Protocol):
    """Takes one service's answerable requests along the request state machine.

    :meth:`take` is called on the thread that received the request; every other method on the
    event loop the service's endpoint runs on.
    """

    @property
    def in_flight(self) -> int:
        """Requests taken and not yet answered (waiting for a slot or running)."""

    def take(self, request: Request) -> None:
        """Admit ``request`` (one with an ``id``) and run it, or answer it ``overloaded`` beyond
        the service's :meth:`~tghost.serving.request.Terms.over_capacity`, or ``unavailable``
        once :meth:`stop` was called. Returns at once."""

    def running(self, request_id: str) -> Request | None:
        """The call of ``request_id`` taken and not yet answered, if any (for a cancel)."""

    def cancel(self, request: Request) -> None:
        """The caller cancelled ``request`` (its cancel was checked): answer it ``cancelled`` at
        once, free its slot, and stop the call where that can be done."""

    def stop(self) -> None:
        """Answer ``unavailable`` every call that did not start, now and from now on (a drain)."""

    async def idle(self) -> None:
        """Return once no call is in flight."""

    async def cut_off(self) -> int:
        """The grace ended: answer every call still in flight ``unavailable`` (a persistent one
        goes back to the broker instead). Returns how many were cut off."""

    def close(self) -> None:
        """Let go of what the driver runs on its own (a timer thread); calls are no longer timed."""


def driver_for(terms: Terms, port: Port, executor: Executor, mailbox: hop.Mailbox) -> Driver:
    """The driver of a service: the thread lane for a plain ``def`` in the host's worker threads on
    a non-persistent topic, else the event loop (on the loop itself for a persistent topic)."""
    if isinstance(executor, ThreadExecutor) and terms.service.runs_in_thread and not terms.persistent:
        return ThreadLane(terms, port, executor, mailbox.loop)
    return LoopDriver(terms, port, executor, mailbox, on_loop=terms.persistent, threaded_checks=terms.gate is not None)
