"""replays: the record of verified requests that a service's hosts share (docs/protocol.md
§2.8), so a captured signed or session request runs at most once across every host of the
service within its window, and not again on a host that restarted.

Each host that checks a service's callers tails the service's replay topics from their first
message: ``persistent://<tenant>/<namespace>/<request topic name>.replays-epoch-<n>``, one per
:data:`REPLAY_EPOCH_SECONDS` of the requests' own ``tghost-signed-at`` (so every copy of a request
is marked on one topic, whatever the hosts' clocks), those a request still inside the window
can be marked on (:func:`replay_epochs`). Before it runs a verified request, a host sends a *mark* of its
(key id, ``id``) pair there and waits to read it back: the first mark of a pair on the topic
wins, and every later one (another host's, a copy's, this host's after a restart) is a replay.
A marks message is a JSON array of marks, ``{"caller", "id", "signed_at", "marker"}`` (all
strings; ``marker`` is unique per mark), so a busy host marks many requests per message.
A topic's messages arrive in one order at every reader, so the hosts agree without talking to
each other.

The record lives in the broker: a host reads it back when it starts and keeps in memory only
the pairs of signing times it still accepts (within the window, and :data:`MARGIN`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import threading
import time
import uuid
from collections import OrderedDict
from concurrent import futures
from typing import Any

import pulsar
import pulsar.asyncio
import pulsar.exceptions

from tghost.agent.window import Handler, TopicWindow
from tghost.protocol.epochs import epoch_of, epoch_topic
from tghost.pulsar import hop
from tghost.system.tasks import cancel_and_wait

__all__ = ["MARGIN", "REPLAY_EPOCH_SECONDS", "SharedReplays", "replay_epochs", "replays_topic"]

log = logging.getLogger(__name__)

#: Seconds per replay epoch topic: twice the 60 s window, so a host reads two or three.
REPLAY_EPOCH_SECONDS = 120.0
#: Seconds beyond the window either side that a host still reads and keeps marks of.
MARGIN = 5.0
#: Pairs a record keeps at most; past it, the oldest are forgotten (logged once), and a request
#: signed no later than a forgotten one is not run: it may be its replay.
MAX_PAIRS = 1_000_000
#: Seconds a catch-up waits for a mark the broker says it has (new readers included, see
#: :class:`~tghost.agent.window.TopicWindow`) before the service fails to start.
CATCH_UP_STALL = 10.0
#: Marks messages a host has on their way to the broker at most; later marks wait to go together.
IN_FLIGHT = 1
#: Seconds between looks at which epoch topics to read and mark on.
MOVE_EVERY = REPLAY_EPOCH_SECONDS / 8
#: Milliseconds a following thread waits for a mark before it looks whether its reader closed.
FOLLOW_POLL_MS = 1000


def replays_topic(request_queue: str) -> str:
    """The base name of a service's replay topics: ``persistent://`` and the request topic's
    tenant, namespace and name, then ``.replays`` (its epochs add ``-epoch-<n>``), e.g.
    ``persistent://tg/request/joke-service.replays`` for either ``persistent://`` or
    ``non-persistent://tg/request/joke-service``."""
    return "persistent://" + request_queue.split("://", 1)[-1] + ".replays"


def replay_epochs(now: float, window: float, epoch_seconds: float = REPLAY_EPOCH_SECONDS) -> range:
    """The replay epochs a host reads and marks on at unix time ``now`` (seconds), oldest
    first: those of every ``tghost-signed-at`` it still accepts (within ``window`` of now) and
    :data:`MARGIN` more either side. A mark goes on the epoch of its request's signing time."""
    return range(epoch_of(now - window - MARGIN, epoch_seconds), epoch_of(now + window + MARGIN, epoch_seconds) + 1)


class _ReplayWindow(TopicWindow):
    """The replay epochs of :func:`replay_epochs` (a directory's window reaches back less far),
    followed on a thread of their own each: a mark read back wakes the thread waiting for it
    directly, with no hop through the event loop."""

    def __init__(self, client: pulsar.asyncio.Client, base: str, window: float) -> None:
        super().__init__(client, base, MARGIN, REPLAY_EPOCH_SECONDS, stall_timeout=CATCH_UP_STALL)
        self.window = window
        self._threads: dict[int, threading.Thread] = {}

    def wanted(self, now: float) -> range:
        return replay_epochs(now, self.window, self.epoch_seconds)

    def follow(self, handler: Handler) -> None:
        """Tail every open topic on a daemon thread, handing each new mark to ``handler`` there
        (a closed reader ends its thread)."""
        self._handler = handler
        for epoch, reader in self.readers.items():
            if epoch not in self._threads or not self._threads[epoch].is_alive():
                self._threads[epoch] = thread = threading.Thread(
                    target=_follow_blocking, args=(reader._reader, handler), daemon=True,
                    name=f"replay epoch {epoch}")
                thread.start()


def _follow_blocking(reader: Any, handler: Handler) -> None:
    """Read a blocking ``_pulsar.Reader`` until it is closed, handing each message on."""
    while True:
        try:
            message = reader.read_next(FOLLOW_POLL_MS)
        except pulsar.exceptions.Timeout:
            continue
        except pulsar.exceptions.AlreadyClosed:
            return
        except Exception as exc:  # _pulsar raises its own types; the reader reconnects by itself
            log.debug("reading marks failed (%s); retrying", exc)
            time.sleep(0.5)
            continue
        handler(message)


class SharedReplays:
    """The replay record of one service, shared through its replay topics.

    :meth:`open` reads the marks still in the window, then tails them; :meth:`mark` is safe
    from any thread but the event loop's (it blocks for a broker round trip). ``window``:
    seconds a signature is valid either side of the host's clock (the access gate's).
    """

    def __init__(self, client: pulsar.asyncio.Client, request_queue: str, window: float) -> None:
        self.topic = replays_topic(request_queue)
        self.window = window
        self._client = client
        self._marks = _ReplayWindow(client, self.topic, window)
        self._producers: dict[int, pulsar.asyncio.Producer] = {}
        self._first: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()  # pair -> (marker, signed at)
        self._waiting: dict[str, tuple[tuple[str, str], futures.Future[bool]]] = {}
        self._pending: dict[int, list[dict[str, str]]] = {}  # by epoch, marks waiting for those in flight
        self._forgotten_until = -math.inf  # the latest signing time of a mark forgotten for room
        self._in_flight = 0  # marks messages the broker has not taken yet
        self._lock = threading.Lock()
        self._me = uuid.uuid4().hex[:16]
        self._count = itertools.count()
        self._moving: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._forgot = False

    @classmethod
    async def open(cls, client: pulsar.asyncio.Client, request_queue: str, window: float) -> SharedReplays:
        """The record of the service on ``request_queue``, read up to now and followed.

        Raises:
            pulsar.asyncio.PulsarException: the broker did not give the replay topics.
        """
        record = cls(client, request_queue, window)
        try:
            await record._start()
        except BaseException:
            await record.close()
            raise
        return record

    async def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._marks.catch_up(self._read)
        self._marks.follow(self._read)
        await self._open_producers(time.time())
        self._moving = asyncio.create_task(self._keep_moving(), name=f"marks {self.topic}")

    async def _open_producers(self, now: float) -> None:
        """Producers for the topics of every signing time accepted until the next move (opened
        before they are needed); those of times no longer accepted closed."""
        wanted = range(replay_epochs(now, self.window).start, replay_epochs(now + MOVE_EVERY, self.window).stop)
        for epoch in [e for e in self._producers if e < wanted.start]:
            with contextlib.suppress(Exception):
                await self._producers.pop(epoch).close()
        for epoch in wanted:
            if epoch not in self._producers:
                self._producers[epoch] = await self._client.create_producer(
                    epoch_topic(self.topic, epoch), batching_enabled=False)

    async def _keep_moving(self) -> None:
        while True:
            await asyncio.sleep(MOVE_EVERY)
            try:
                now = time.time()
                await self._marks.move(now)
                await self._open_producers(now)
            except pulsar.asyncio.PulsarException as exc:
                log.warning("marks %s: could not open the next epoch's topic (%s); retrying", self.topic, exc)

    def mark(self, key_id: str, request_id: str, signed_at: str, timeout: float) -> bool:
        """Whether this host may run the request of ``key_id`` with ``request_id`` (signed at the
        unix time ``signed_at``, as sent): ``True`` when its mark is the pair's first on the
        topic, ``False`` for a replay. Blocks until the mark is read back.

        Raises:
            TimeoutError: the mark did not come back within ``timeout`` seconds, or the broker
                did not take it: the request must not run (retry later).
            RuntimeError: called on the event loop, which it would block.
        """
        if self._loop is not None and _running_loop() is self._loop:
            raise RuntimeError("SharedReplays.mark blocks: call it off the event loop")
        if _seconds(signed_at) <= self._forgotten_until:
            raise TimeoutError(f"the replay record of {self.topic} forgot marks of requests signed until "
                               f"{self._forgotten_until:.3f} (over {MAX_PAIRS} marks in the window)")
        marker = f"{self._me}-{next(self._count)}"
        decided = self._send((key_id, request_id), signed_at, marker)
        try:
            return decided.result(timeout)
        except futures.TimeoutError:
            raise TimeoutError(f"the mark of request {request_id!r} did not come back from {self.topic} "
                               f"within {timeout:g}s") from None
        finally:
            self._waiting.pop(marker, None)

    def _send(self, pair: tuple[str, str], signed_at: str, marker: str) -> futures.Future[bool]:
        """Mark ``pair``: the future is its answer once read back (done at once if already
        marked). At most :data:`IN_FLIGHT` marks messages are on their way at a time: the marks
        made meanwhile go out together in the next, so a busy host's messages carry many."""
        decided: futures.Future[bool] = futures.Future()
        with self._lock:
            if pair in self._first:
                decided.set_result(False)
                return decided
            self._waiting[marker] = (pair, decided)
            mark = {"caller": pair[0], "id": pair[1], "signed_at": signed_at, "marker": marker}
            self._pending.setdefault(epoch_of(_seconds(signed_at), REPLAY_EPOCH_SECONDS), []).append(mark)
            batches = {} if self._in_flight >= IN_FLIGHT else self._take()
        for epoch, batch in batches.items():
            self._publish(epoch, batch)
        return decided

    def _take(self) -> dict[int, list[dict[str, str]]]:
        """The marks to send next, by epoch, now in flight (held: the lock)."""
        batches, self._pending = self._pending, {}
        self._in_flight += len(batches)
        return batches

    def _publish(self, epoch: int, batch: list[dict[str, str]]) -> None:
        producer = self._producers.get(epoch)
        if producer is None:  # a signing time the gate accepted is always covered: the broker failed to give it
            self._sent(batch, None)
            return
        hop.send(producer, json.dumps(batch, separators=(",", ":")).encode(), {},
                 lambda result, _: self._sent(batch, result))

    def _sent(self, batch: list[dict[str, str]], result: Any) -> None:
        """On the client's I/O thread, once the broker has a marks message (or refused it: its
        marks fail, and their requests do not run); then the marks made meanwhile go out."""
        if result != pulsar.Result.Ok:
            with self._lock:
                failed = [self._waiting.pop(mark["marker"], None) for mark in batch]
            for waiting in failed:
                if waiting is not None:
                    with contextlib.suppress(futures.InvalidStateError):
                        waiting[1].set_exception(futures.TimeoutError())
        with self._lock:
            self._in_flight -= 1
            following = self._take() if self._in_flight < IN_FLIGHT else {}
        for epoch, marks in following.items():
            self._publish(epoch, marks)

    def _read(self, message: pulsar.Message) -> None:
        """A marks message read from the topic (on the loop while catching up, then on a
        following thread); the first mark of each pair wins. One that does not parse is skipped."""
        try:
            marks = [(str(c["caller"]), str(c["id"]), str(c["marker"]), _seconds(c.get("signed_at")))
                      for c in json.loads(message.data())]
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            return
        now, decided = time.time(), []
        with self._lock:
            for key_id, request_id, marker, signed_at in marks:
                if abs(signed_at - now) > self.window + MARGIN:
                    continue  # no request signed then is accepted now: nothing to decide
                pair = (key_id, request_id)
                first = self._first.setdefault(pair, (marker, signed_at))[0]
                waiting = self._waiting.pop(marker, None)
                if waiting is not None and waiting[0] == pair:
                    decided.append((waiting[1], first == marker))
            self._forget(now)
        for future, won in decided:
            with contextlib.suppress(futures.InvalidStateError):
                future.set_result(won)

    def _forget(self, now: float) -> None:
        """Drop the pairs no request is accepted under any more; past :data:`MAX_PAIRS`, the
        oldest too, and refuse from then on what was signed before them (held: the lock)."""
        while self._first and next(iter(self._first.values()))[1] < now - self.window - MARGIN:
            self._first.popitem(last=False)
        while len(self._first) > MAX_PAIRS:
            signed_at = self._first.popitem(last=False)[1][1]
            self._forgotten_until = max(self._forgotten_until, signed_at)
            if not self._forgot:
                self._forgot = True
                log.warning("marks %s: over %d marks within the window (a flood?); the oldest are forgotten, and "
                            "requests signed before them are refused 'unavailable'", self.topic, MAX_PAIRS)

    async def close(self) -> None:
        """Stop tailing and close the readers and producers; waiting marks fail."""
        await cancel_and_wait(self._moving)
        await self._marks.close()
        for producer in self._producers.values():
            with contextlib.suppress(Exception):
                await producer.close()
        with self._lock:
            for _, decided in self._waiting.values():
                if not decided.done():
                    decided.set_exception(futures.TimeoutError())


def _seconds(text: Any) -> float:
    """A mark's ``signed_at`` in unix seconds; now, if it has none that reads as one."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return time.time()
    return value if math.isfinite(value) else time.time()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None

