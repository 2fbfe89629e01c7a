"""driver: the one interface of every driver of a service's requests (:class:`Driver`).

A driver takes each answerable request along the one request state machine
(:mod:`tghost.serving.request`): admit, check, invoke, answer, settle. There are three: the
event loop (:class:`tghost.serving.loop.LoopDriver`), the thread lane
(:class:`tghost.serving.lane.ThreadLane`) and the inline driver, the lane that runs short calls
on the thread that received them (:class:`tghost.serving.inline.InlineDriver`, a subclass of the
lane); the loop driver and the lane never import each other. The endpoint
(:class:`tghost.serving.endpoint.ServiceEndpoint`) picks one per service when it opens
(:func:`driver_for`), hands it every answerable request, and never asks
which kind it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import pulsar
import pulsar.asyncio

from tghost.pulsar import hop
from tghost.serving.executors.base import Executor
from tghost.serving.executors.thread import ThreadExecutor
from tghost.serving.inline import InlineDriver
from tghost.serving.lane import ThreadLane
from tghost.serving.loop import LoopDriver
from tghost.serving.request import Port, Request, Terms

__all__ = ["RECEIVER_QUEUE", "Driver", "Receiving", "driver_for", "subscription_options"]

#: Messages the client may buffer per consumer of a non-persistent request topic: the burst one
#: host absorbs per service (beyond the service's bound, the driver answers ``overloaded``). A
#: larger burst, faster than the host takes it, is partly dropped by the broker (no free permit):
#: use a persistent topic for such bursts, whose consumer buffers nothing and receives only when
#: a slot is free. (tests/serving/test_faults.py sends 2000 at once; the default 1000 lost a third.)
RECEIVER_QUEUE = 10_000


class Driver(Protocol):
    """Takes one service's answerable requests along the request state machine.

    ``listens``: the endpoint subscribes with a C++ message listener and calls :meth:`take` from
    it; else the driver receives by itself (:class:`Receiving`). ``on_loop``: :meth:`take` is
    called on the event loop (the endpoint hops there first, and decides there what the driver
    does not take); else on the thread that received the request. :meth:`running` is also
    called on the control topic's listener thread (a liveness probe); every other method on the
    event loop the service's endpoint runs on.
    """

    listens: bool
    on_loop: bool

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


@runtime_checkable
class Receiving(Protocol):
    """A driver that receives by itself (``listens`` is False)."""

    async def receive(self, consumer: pulsar.asyncio.Consumer, take: Callable[[Any], None]) -> None:
        """Receive the service's requests and hand each (a raw ``_pulsar.Message``) to ``take``
        (the endpoint's door, which calls :meth:`Driver.take`); returns once the consumer closes."""


def driver_for(terms: Terms, port: Port, executor: Executor, mailbox: hop.Mailbox) -> Driver:
    """The driver of a service. A plain ``def`` in the host's worker threads on a non-persistent
    topic: the inline driver, or with an access policy (whose replay mark waits for the broker,
    so no call is short) the thread lane. Any other: the event loop (receiving on the loop
    itself on a persistent topic)."""
    if isinstance(executor, ThreadExecutor) and terms.service.runs_in_thread and not terms.persistent:
        if terms.gate is None:
            return InlineDriver(terms, port, executor, mailbox.loop)
        return ThreadLane(terms, port, executor, mailbox.loop)
    return LoopDriver(terms, port, executor, listens=not terms.persistent, threaded_checks=terms.gate is not None)


def subscription_options(driver: Driver, terms: Terms, on_message: Callable[[Any, Any], None]) -> dict[str, Any]:
    """The request consumer's options for ``driver`` (keywords of ``subscribe``): a buffer of
    :data:`RECEIVER_QUEUE` messages, and ``on_message`` as its listener when the driver
    listens; on a persistent topic, no buffer (a request is received only when a slot is free)
    and, past the redeliveries, the dead letter topic."""
    if terms.persistent and not driver.listens:
        return {"receiver_queue_size": 0,
                "dead_letter_policy": pulsar.ConsumerDeadLetterPolicy(terms.max_redeliveries + 1)}
    options: dict[str, Any] = {"receiver_queue_size": RECEIVER_QUEUE}
    if driver.listens:
        options["message_listener"] = on_message
    return options
