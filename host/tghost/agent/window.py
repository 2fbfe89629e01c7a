"""window: read the epoch topics a directory needs (docs/protocol.md §4.6). Catch up on each
topic of the read window from its first message, then tail them all, opening the next epoch's
topic before it begins and closing those that left the window.

Never interprets a message: each one goes to the handler it is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import pulsar
import pulsar.asyncio
import pulsar.exceptions

from tghost.broker import local_disk_trouble
from tghost.protocol.epochs import EPOCH_SECONDS, epoch_topic, read_window
from tghost.system.tasks import cancel_and_wait

__all__ = ["CATCH_UP_BATCH", "CATCH_UP_NUDGE", "CATCH_UP_POLL_MS", "CATCH_UP_STALL", "CatchUpStalled", "NoReader",
           "TopicWindow"]

log = logging.getLogger(__name__)

#: Messages :func:`_read_batch` reads per worker-thread hop during catch-up.
CATCH_UP_BATCH = 500
#: Milliseconds :func:`_read_batch` waits for the next message before it asks whether the
#: topic has more (a message may still be on its way from the broker).
CATCH_UP_POLL_MS = 5

#: Seconds a catch-up waits for a message the broker says a topic still has before it reads on
#: with a new reader, from the last message it got: pulsar-lite 0.2.0 now and then stops
#: delivering to a reader partway through a topic (1 catch-up in 4 or 5 of 2,500 messages of
#: 13 KB), and its duplicate deliveries can leave a reader saying there is more when it had
#: everything. A new reader resumes the one and tells the end of the other.
CATCH_UP_NUDGE = 0.5
#: Seconds a catch-up waits for a message the broker says a topic still has, new readers
#: included, when neither the window nor its client's settings (``connect_timeout``) give
#: another bound; never less than :data:`MIN_CATCH_UP_STALL` (a connect timeout of 0 means
#: "check once", not "wait 0 s").
CATCH_UP_STALL = 30.0
MIN_CATCH_UP_STALL = 2.0

#: What a message read from the window is handed to.
Handler = Callable[[pulsar.Message], Any]


class CatchUpStalled(pulsar.asyncio.PulsarException):  # type: ignore[misc]
    """The broker says ``topic`` has more messages but delivered none for ``seconds``, to new
    readers either: it cannot read them (pulsar-lite 0.2.0 after a write failed on a full disk
    logs "entrylog checksum mismatch" or "invalid entrylog magic" for each try, and the reader
    waits forever). A catch-up that is slow but gets messages is never stalled."""

    def __init__(self, topic: str, seconds: float) -> None:
        super().__init__(pulsar.Result.Timeout)
        self.topic = topic
        self.seconds = seconds

    def __str__(self) -> str:
        return (f"the broker says {self.topic} has more messages but delivered none in {self.seconds:g}s, to new "
                "readers either: it cannot "
                "read its store (pulsar-lite does this after its disk filled up; its log says 'entrylog checksum "
                "mismatch' or 'invalid entrylog magic'). Free space on the broker's disk: 'tghost broker' then moves "
                "the damaged store aside and restarts pulsar-lite, and hosts announce again (or restart it yourself: "
                "'tghost broker stop', then 'tghost broker start')")


class NoReader(pulsar.asyncio.PulsarException):  # type: ignore[misc]
    """The broker did not create a reader of ``topic`` within ``seconds``: pulsar-lite 0.2.0 does
    not while its disk is full (a reader's creation waits for a write; producers and calls on
    non-persistent topics go on). ``cause`` says what the embedded broker's disk shows, if it is
    local and short of space (:func:`tghost.broker.local_disk_trouble`)."""

    def __init__(self, topic: str, seconds: float, cause: str | None) -> None:
        super().__init__(pulsar.Result.Timeout)
        self.topic = topic
        self.seconds = seconds
        self.cause = cause

    def __str__(self) -> str:
        cause = self.cause or ("pulsar-lite does not while its disk is full: check the broker's disk and its log "
                               "('tghost broker status' shows both for the embedded broker)")
        return f"the broker did not create a reader of {self.topic} within {self.seconds:g}s; {cause}"


class _EmptyTopicNoise(logging.Filter):
    """Drops the C++ client's complaints about asking an empty topic for its last message:
    pulsar-lite 0.2.0 answers that with an error (see :func:`_has_message_available`), and an
    epoch topic is often empty, so a user would see them on every ``tghost tools``."""

    NOISE = ("Topic has no messages", "Failed to getLastMessageId: UnknownError")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(noise in message for noise in self.NOISE)


_QUIET = _EmptyTopicNoise()


class TopicWindow:
    """The epoch topics of ``base`` that a directory at the current time must read: those of
    :func:`tghost.protocol.announcement.read_window` for ``max_clock_skew`` (seconds) and ``epoch_seconds``.

    Readers ask for the compacted view (``is_read_compacted``): on Apache Pulsar with topic
    compaction a catch-up then reads one message per key and epoch; pulsar-lite 0.2.0 has no
    compaction and delivers every message.

    A catch-up that gets no message for :data:`CATCH_UP_NUDGE` seconds while the broker says the
    topic has more reads on with a new reader from the last message it got. One that gets none
    for ``stall_timeout`` seconds, new readers included, raises :class:`CatchUpStalled` (default:
    the client's settings' ``connect_timeout``, else :data:`CATCH_UP_STALL`; at least
    :data:`MIN_CATCH_UP_STALL`). One that still reads after ``stall_timeout`` seconds says once
    that it is behind the topic, and reads on.
    """

    def __init__(self, client: pulsar.asyncio.Client, base: str, max_clock_skew: float,
                 epoch_seconds: float = EPOCH_SECONDS, *, stall_timeout: float | None = None) -> None:
        self.client = client
        self.base = base
        self.max_clock_skew = max_clock_skew
        self.epoch_seconds = epoch_seconds
        self.stall_timeout = max(MIN_CATCH_UP_STALL, stall_timeout if stall_timeout is not None
                                 else getattr(getattr(client, "settings", None), "connect_timeout", CATCH_UP_STALL))
        self.readers: dict[int, pulsar.asyncio.Reader] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._handler: Handler | None = None
        self._unheard: set[int] = set()
        """Epochs whose topic was empty when last asked, and whose reader has handed on nothing
        since: :meth:`behind` does not ask them again (see there)."""
        logging.getLogger("pulsar").addFilter(_QUIET)  # a no-op when already added

    def wanted(self, now: float) -> range:
        """The epochs to read at unix time ``now`` (seconds), oldest first."""
        return read_window(now, self.max_clock_skew, self.epoch_seconds)

    async def _open(self, epoch: int, start: pulsar.MessageId = pulsar.MessageId.earliest) -> pulsar.asyncio.Reader:
        """A reader of ``epoch``'s topic from after ``start`` (default: its first message), as the window's.

        Raises:
            NoReader: the broker did not create it within ``stall_timeout`` seconds.
            pulsar.asyncio.PulsarException: the broker refused it.
        """
        topic = epoch_topic(self.base, epoch)
        try:
            async with asyncio.timeout(self.stall_timeout):
                reader = await self.client.create_reader(topic, start, is_read_compacted=True)
        except TimeoutError:
            url = getattr(getattr(self.client, "settings", None), "url", None)
            cause = await asyncio.to_thread(local_disk_trouble, url) if url else None
            raise NoReader(topic, self.stall_timeout, cause) from None
        self.readers[epoch] = reader
        return reader

    async def catch_up(self, handler: Handler) -> int:
        """Read every message now on the window's topics, oldest epoch first, handing each to
        ``handler``; returns how many were read.

        Raises:
            CatchUpStalled: the broker says a topic has messages it does not deliver.
            pulsar.asyncio.PulsarException: the broker did not answer.
        """
        read = 0
        for epoch in self.wanted(time.time()):
            read += await self._catch_up(epoch, handler)
        return read

    async def _catch_up(self, epoch: int, handler: Handler) -> int:
        """Hand every message now on ``epoch``'s topic to ``handler``; returns how many. A topic
        silent for :data:`CATCH_UP_NUDGE` seconds while its reader says it has more is read on by
        a new reader from the furthest message handed (see the constant).

        Raises:
            CatchUpStalled: nothing came for ``stall_timeout`` seconds, new readers included.
        """
        progress = _Progress(handler, epoch_topic(self.base, epoch), self.stall_timeout)
        reader = await self._open(epoch)
        while True:
            try:
                await _catch_up(reader, progress.hand, CATCH_UP_NUDGE)
                if not progress.handed:
                    self._unheard.add(epoch)
                return progress.handed
            except _Silent:
                if time.monotonic() - progress.heard >= self.stall_timeout:
                    raise CatchUpStalled(reader.topic(), self.stall_timeout) from None
            log.debug("%s: no message for %ss though the broker says there are more; reading on with a new reader "
                      "after %s", reader.topic(), CATCH_UP_NUDGE, progress.furthest)
            await self._close(epoch)
            reader = await self._open(epoch, progress.furthest)

    def follow(self, handler: Handler) -> None:
        """Tail every open topic in the background, handing each new message to ``handler``."""
        self._handler = handler
        for epoch, reader in self.readers.items():
            if epoch not in self._tasks:
                self._tasks[epoch] = asyncio.create_task(_follow(reader, self._heard(epoch, handler)),
                                                         name=f"follow epoch {epoch}")

    def _heard(self, epoch: int, handler: Handler) -> Handler:
        """``handler``, for ``epoch``'s topic: once it hands on a message the topic is not empty."""
        def hand(message: pulsar.Message) -> Any:
            self._unheard.discard(epoch)
            return handler(message)
        return hand

    async def move(self, now: float) -> None:
        """Open (and tail) the topics that entered the window by unix time ``now`` and close those
        that left it. Call after :meth:`follow`.

        Raises:
            pulsar.asyncio.PulsarException: a reader could not be created (retry later).
        """
        wanted = self.wanted(now)
        for epoch in [e for e in self.readers if e < wanted.start]:
            await self._close(epoch)
        for epoch in wanted:
            if epoch not in self.readers:
                await self._open(epoch)
                log.debug("reading %s", epoch_topic(self.base, epoch))
        if self._handler is not None:
            self.follow(self._handler)

    async def behind(self) -> bool:
        """Whether a topic of the window has messages that its reader has not handed to the
        handler yet: in its client's queue, or still on the broker (one round trip per topic
        whose client queue is empty). Never raises: a topic the broker cannot say that of
        (pulsar-lite 0.2.0 on an empty topic, a broker error) counts as read up.

        A followed topic found empty (at catch-up, or here) is not asked again until its reader
        hands on a message, which it does as soon as one comes: pulsar-lite answers an empty topic with
        an error, and the C++ client logs that error at ERROR through the process's one Pulsar
        logger, which is another client's when that client was made first (TrustGraph's print
        ERROR lines): a following directory would print a line at each expiry check."""
        for epoch, reader in list(self.readers.items()):
            if epoch in self._unheard and epoch in self._tasks:
                continue
            try:
                if await reader.has_message_available():
                    return True
            except pulsar.asyncio.PulsarException as exc:
                if exc.error() == pulsar.Result.UnknownError:
                    self._unheard.add(epoch)
        return False

    def is_connected(self) -> bool:
        """Whether every open reader is connected to the broker."""
        return all(reader.is_connected() for reader in self.readers.values())

    async def _close(self, epoch: int) -> None:
        self._unheard.discard(epoch)
        await cancel_and_wait(self._tasks.pop(epoch, None))
        reader = self.readers.pop(epoch)
        with contextlib.suppress(Exception):
            await reader.close()

    async def close(self) -> None:
        """Stop tailing and close every reader."""
        for epoch in list(self.readers):
            await self._close(epoch)


class _Silent(Exception):
    """No message came for the quiet bound although the reader says its topic has more;
    ``batch`` holds those read before the silence, still to hand on."""

    def __init__(self, batch: list[Any]) -> None:
        super().__init__()
        self.batch = batch


class _Progress:
    """What a catch-up of one topic handed on to ``handler``: how many messages, the furthest
    message id (a duplicate delivered late is not further) and when the last one came. Says
    once, as a warning, when the catch-up still reads after ``behind`` seconds."""

    def __init__(self, handler: Handler, topic: str, behind: float) -> None:
        self.handler = handler
        self.topic = topic
        self.handed = 0
        self.furthest: pulsar.MessageId = pulsar.MessageId.earliest
        self.started = self.heard = time.monotonic()
        self._behind = behind

    def hand(self, message: pulsar.Message) -> None:
        self.handler(message)
        self.handed += 1
        at = message.message_id()
        if self.furthest < at:
            self.furthest = at
        self.heard, first = time.monotonic(), self.heard - self.started <= self._behind
        if first and self.heard - self.started > self._behind:
            log.warning("catching up on %s: %d messages read in %.0fs and the broker says there are more: this "
                        "directory is behind the topic (it grows about as fast as it is read: a flood of "
                        "announcements?); reading on", self.topic, self.handed, self.heard - self.started)


async def _catch_up(reader: pulsar.asyncio.Reader, handler: Handler, quiet: float) -> None:
    """Hand every message already on ``reader``'s topic to ``handler``.

    The blocking C++ reader behind ``reader`` reads batches in a worker thread while the
    loop handles the previous batch: one thread hop per batch, where ``read_next`` costs
    two event-loop wake-ups per message (10,000 announcements: see docs/internals/performance.md).
    Falls back to the async reader if pulsar-client no longer exposes the blocking one.

    Raises:
        _Silent: no message came for ``quiet`` seconds although the broker says there are more.
    """
    blocking = getattr(reader, "_reader", None)
    if blocking is None:
        while await _has_message_available(reader):
            try:
                async with asyncio.timeout(quiet):
                    message = await reader.read_next()
            except TimeoutError:
                raise _Silent([]) from None
            handler(message)
        return
    reading = asyncio.ensure_future(asyncio.to_thread(_read_batch, blocking, quiet))
    try:
        while batch := await _batch(reading, handler):
            reading = asyncio.ensure_future(asyncio.to_thread(_read_batch, blocking, quiet))
            for message in batch:
                handler(message)
    finally:
        await _settled(reading)


async def _batch(reading: asyncio.Future[list[Any]], handler: Handler) -> list[Any]:
    """The batch ``reading`` reads; when it ends in a silence, it hands on what came before it
    and raises that :class:`_Silent`."""
    try:
        return await asyncio.shield(reading)
    except _Silent as silent:
        for message in silent.batch:
            handler(message)
        raise


async def _settled(reading: asyncio.Future[list[Any]]) -> None:
    """Wait until a batch read in a worker thread is over (it is, within one batch or the
    stall bound). A catch-up cancelled or failed meanwhile must not let the reader be closed
    under the thread: its blocking ``has_message_available`` would then wait for ever, and
    so would the event loop's shutdown, which joins that thread."""
    if not reading.done():
        await asyncio.wait({reading})
    if not reading.cancelled():
        reading.exception()  # retrieved: it was raised, or superseded by what ended the catch-up


async def _follow(reader: pulsar.asyncio.Reader, handler: Handler) -> None:
    while True:
        try:
            message = await reader.read_next()
        except pulsar.asyncio.PulsarException as exc:
            if exc.error() == pulsar.Result.AlreadyClosed:
                return
            log.warning("reading %s failed (%s); retrying", reader.topic(), exc)
            await asyncio.sleep(0.5)
            continue
        handler(message)


def _read_batch(reader: Any, quiet: float) -> list[Any]:
    """Up to :data:`CATCH_UP_BATCH` messages from a blocking ``_pulsar.Reader``; an empty list
    once the topic has no more. Runs in a worker thread: every call here blocks.

    Raises:
        _Silent: no message for ``quiet`` seconds, although the broker says there are more (with
            the messages read before).
        pulsar.exceptions.PulsarException: the broker failed (not merely "no more messages").
    """
    batch: list[Any] = []
    last = time.monotonic()
    while len(batch) < CATCH_UP_BATCH:
        try:  # asked first: at a topic's end the answer is one round trip, where a read waits out its poll
            if not reader.has_message_available():
                break
        except pulsar.exceptions.UnknownError:  # pulsar-lite 0.2.0 on an empty topic
            break
        try:
            batch.append(reader.read_next(CATCH_UP_POLL_MS))
            last = time.monotonic()
        except pulsar.exceptions.Timeout:
            if time.monotonic() - last > quiet:
                raise _Silent(batch) from None
    return batch


async def _has_message_available(reader: pulsar.asyncio.Reader) -> bool:
    """``reader.has_message_available()``, except that pulsar-lite 0.2.0 answers an empty topic
    with UnknownError ("Topic has no messages") where Apache Pulsar answers False."""
    try:
        return bool(await reader.has_message_available())
    except pulsar.asyncio.PulsarException as exc:
        if exc.error() == pulsar.Result.UnknownError:
            return False
        raise
