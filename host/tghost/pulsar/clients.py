"""clients: Pulsar clients for the cluster named by ``--pulsar-url`` (auth, TLS), that wait for
the broker, fail fast and clearly when the URL is not a Pulsar broker, and log through Python
logging (pulsar-lite's limits: docs/protocol.md §4.10). The embedded pulsar-lite process is
:mod:`tghost.broker`'s.

Never knows about plugins, services or tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import pulsar
import pulsar.asyncio

from tghost.pulsar import hop
from tghost.system import exits
from tghost.system.locks import first_free_slot
from tghost.system.net import is_loopback

__all__ = [
    "CLIENT_LOG",
    "DEFAULT_URL",
    "START_A_BROKER",
    "BrokerError",
    "BrokerUnavailable",
    "ClientLog",
    "NotPulsarBroker",
    "PulsarSettings",
    "client_logger",
    "endpoints",
    "is_reachable",
]

DEFAULT_URL = "pulsar://localhost:6650"
log = logging.getLogger(__name__)


#: What to do when no broker answers, in every such message (the CLI's and the library's).
START_A_BROKER = ("start one ('tghost run' or 'tghost broker start' runs the embedded broker on a local URL), "
                  "or pass --pulsar-url (env TGHOST_PULSAR_URL)")


class BrokerError(RuntimeError):
    """The broker could not be reached, started or stopped; the message names the URL (or data
    directory) and says what to do next."""


class BrokerUnavailable(BrokerError):
    """Nothing accepted a TCP connection at the URL within ``PulsarSettings.connect_timeout``."""


class NotPulsarBroker(BrokerError):
    """Something accepts TCP connections at the URL, but it did not answer a Pulsar request
    within ``PulsarSettings.handshake_timeout``: another service's port, or TLS on one side only."""


@dataclass(frozen=True)
class PulsarSettings:
    """How to reach Pulsar: the service URL (``pulsar://host:port`` or ``pulsar+ssl://``, several
    hosts comma-separated), how long to wait for it, token auth and TLS. Every client the host,
    the directory and the CLI create comes from :meth:`connect`.

    The embedded broker (pulsar-lite 0.2.0) accepts any token and enforces no auth; the
    options matter against an Apache Pulsar cluster. The token is kept out of ``repr``.
    """

    url: str = DEFAULT_URL
    operation_timeout: float = 30.0
    """Seconds the client waits for broker operations (subscribe, create producer)."""
    connect_timeout: float = 30.0
    """Seconds :meth:`connect` waits for something to accept connections at the URL (a broker
    still starting) before :class:`BrokerUnavailable`; 0 checks once."""
    retry_interval: float = 2.0
    """Seconds between two connection attempts while :meth:`connect` waits; one log line each."""
    handshake_timeout: float = 5.0
    """Seconds a broker that accepts the connection has to answer a first request before
    :meth:`connect` raises :class:`NotPulsarBroker`."""
    token: str | None = field(default=None, repr=False)
    """A Pulsar JWT sent with ``AuthenticationToken``; ``None`` for no auth."""
    tls_trust_certs: str | None = None
    """Path of a PEM file of CA certificates to trust for ``pulsar+ssl://`` URLs."""
    tls_allow_insecure: bool = False
    """Accept any TLS certificate the broker shows (testing only)."""
    tls_validate_hostname: bool = False
    """Check that the broker's certificate names the host in the URL."""

    def client_kwargs(self) -> dict[str, Any]:
        """The keyword arguments for ``pulsar.asyncio.Client`` (and ``pulsar.Client``): ``logger``
        (the C++ client's log through Python logging, see :func:`client_logger`), ``authentication``
        (only with a token), ``tls_trust_certs_file_path`` (only with a path),
        ``tls_allow_insecure_connection`` and ``tls_validate_hostname``.
        """
        kwargs: dict[str, Any] = {
            "logger": client_logger(),
            "tls_allow_insecure_connection": self.tls_allow_insecure,
            "tls_validate_hostname": self.tls_validate_hostname,
        }
        if self.token:
            kwargs["authentication"] = pulsar.AuthenticationToken(self.token)
        if self.tls_trust_certs:
            kwargs["tls_trust_certs_file_path"] = self.tls_trust_certs
        return kwargs

    async def connect(self) -> pulsar.asyncio.Client:
        """A new ``pulsar.asyncio`` client with :meth:`client_kwargs`, once a Pulsar broker has
        answered it.

        While nothing accepts connections at the URL it waits, trying every
        :attr:`retry_interval` seconds (one log line per try) for up to :attr:`connect_timeout`
        seconds. Once something does, it asks for a topic's partition metadata, which any Pulsar
        broker answers, even with an error.

        Raises:
            BrokerUnavailable: nothing accepted a connection within ``connect_timeout``.
            NotPulsarBroker: no Pulsar answer within ``handshake_timeout`` (a wrong port).
            BrokerError: the broker refused the client (e.g. authentication failed).
        """
        deadline = time.monotonic() + self.connect_timeout
        while True:
            if await _accepts_connections(self.url, min(self.retry_interval, 2.0)):
                client = _Client(self)
                try:
                    await self._handshake(client)
                except BaseException:
                    await client.close()
                    raise
                return client
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrokerUnavailable(
                    f"no Pulsar broker answers at {self.url} (waited {self.connect_timeout:g}s): {START_A_BROKER}")
            log.warning("waiting for a Pulsar broker at %s: nothing accepts connections yet (%.0fs left)",
                        self.url, left)
            await asyncio.sleep(min(self.retry_interval, left))

    async def _handshake(self, client: pulsar.asyncio.Client) -> None:
        try:
            async with asyncio.timeout(self.handshake_timeout):
                await client.get_topic_partitions(_PROBE_TOPIC)
        except TimeoutError:
            raise NotPulsarBroker(
                f"not a Pulsar broker at {self.url}: it accepts connections but gave no Pulsar answer within "
                f"{self.handshake_timeout:g}s. Check the port (Pulsar's binary protocol is 6650, 6651 with "
                "TLS; 8080 is its HTTP admin port) and that pulsar+ssl:// is used only with TLS") from None
        except pulsar.asyncio.PulsarException as exc:
            if exc.error() in (pulsar.Result.AuthenticationError, pulsar.Result.AuthorizationError):
                raise BrokerError(f"the Pulsar broker at {self.url} refused this client ({exc}): check the token, "
                                  "--pulsar-token-file or --pulsar-token (env TGHOST_PULSAR_TOKEN_FILE or "
                                  "TGHOST_PULSAR_TOKEN)") from None
            if exc.error() in (pulsar.Result.ConnectError, pulsar.Result.Timeout):
                raise NotPulsarBroker(f"not a Pulsar broker at {self.url} ({exc}): check the URL's port and "
                                      "TLS options") from None
            # Any other answer (e.g. no such tenant) came from a Pulsar broker: that is all we asked.


#: A topic whose partition metadata :meth:`PulsarSettings.connect` asks for; nothing is created.
_PROBE_TOPIC = "non-persistent://tg/tghost/connect-probe"


class ClientLog(logging.Logger):
    """Where the C++ Pulsar client's log goes: the ``pulsar`` Python logger, one level down.

    pulsar-client hands a Python logger every line, including DEBUG, whatever the logger's
    level, so a client gets this logger only at ``--log-level debug`` (:func:`client_logger`).
    Its errors and warnings are mostly retries it will make on its own (a broker restarting,
    pulsar-lite answering ``UnknownError`` for an empty topic); tghost reports what matters to a
    user in its own words (a lost broker connection, a failed call). So its ERROR and WARN lines
    become INFO, and INFO and DEBUG become DEBUG.
    """

    def __init__(self) -> None:
        super().__init__("pulsar")

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        target = logging.getLogger("pulsar")
        level = logging.INFO if level >= logging.WARNING else logging.DEBUG
        if target.isEnabledFor(level):
            target.log(level, msg, *args, **kwargs)


CLIENT_LOG = ClientLog()


def client_logger() -> logging.Logger | pulsar.FileLogger:
    """The ``logger`` for a new Pulsar client: :data:`CLIENT_LOG` when the ``pulsar`` logger shows
    DEBUG (``--log-level debug``: every line of the C++ client, its errors and warnings as INFO),
    else a native logger that keeps ERROR lines only and writes them to ``os.devnull``.

    Why: a Python logger gets every line the C++ client writes, DEBUG included (about nine per
    request and reply), each taking the GIL from a client thread; that was a third of ``tghost
    run``'s CPU per call (docs/internals/performance.md). pulsar-client 3.13 has no level filter for a Python
    logger, and its native file logger holds lines in a buffer until the client's threads end, so
    it cannot carry warnings to a user in time. What they say that matters (a lost broker, a
    refused client, a failed call) tghost says in its own words at INFO and above. The C++ client
    keeps the logger of the first client a process creates for every later one.
    """
    if logging.getLogger("pulsar").isEnabledFor(logging.DEBUG):
        return CLIENT_LOG
    return pulsar.FileLogger(pulsar.LoggerLevel.Error, os.devnull)


#: Seconds a closed client keeps the event loop alive for its C++ callbacks (see :class:`_Client`).
CLOSE_DRAIN = 0.05


class _Client(pulsar.asyncio.Client):  # type: ignore[misc]
    """``pulsar.asyncio.Client`` that cannot hit pulsar-lite's consumer-id collisions, and whose
    ``close`` lets the C++ client's last callbacks land.

    Consumer ids: pulsar-lite 0.2.0 keys a subscription's consumers by the id the *client* chose
    (every client numbers its consumers from 0). When a second client's consumer on a Shared
    subscription has an id already there, pulsar-lite logs "Consumer N already exists" and drops
    the connection, and the client retries with the same id until its operation timeout. Apache
    Pulsar keys consumers by connection and needs none of this. So on a loopback URL (where
    pulsar-lite runs) every non-exclusive subscription is made on a second client:

    - its ids start at a machine-wide slot's range (see :class:`_IdSlot`), which no other live
      client of this user on this broker port holds, so two hosts never pick the same id;
    - its operation timeout is :data:`SHARED_SUBSCRIBE_TIMEOUT`: a subscribe that still collides
      (a client of another user, another machine, or more consumers than a slot's range) fails
      then, cleanly (the C++ client drops the attempt), and is retried with the next id, up to
      the settings' ``operation_timeout`` in all. It never fails the host for an id.

    Closing fails the pending receives of its consumers and readers from a C++ thread; when
    such a callback reaches an event loop that ``asyncio.run`` has already closed, the process
    can abort or segfault at exit (apache/pulsar-client-python#153, #203; seen here in about
    1 of 4 short-lived processes under load, and in none of 60 with a pause of :data:`CLOSE_DRAIN`).
    A process that ends with ``os._exit`` (:mod:`tghost.system.exits`: the ``tghost`` commands) has
    no finalisation to crash in and does not pause (none of 120 ``tghost tools`` and ``tghost call``
    under load crashed).
    """

    def __init__(self, settings: PulsarSettings) -> None:
        super().__init__(settings.url, operation_timeout_seconds=max(1, round(settings.operation_timeout)),
                         **settings.client_kwargs())
        self.settings = settings
        self.id_collisions = 0
        """Subscribes retried with another consumer id (pulsar-lite answered "already exists")."""
        self._spread = all(is_loopback(host) for host, _ in endpoints(settings.url))
        self._shared: pulsar.asyncio.Client | None = None
        self._slot: _IdSlot | None = None
        self._shared_lock = asyncio.Lock()

    async def subscribe(self, topic: Any, subscription_name: str,
                        consumer_type: pulsar.ConsumerType = pulsar.ConsumerType.Exclusive,
                        **kwargs: Any) -> pulsar.asyncio.Consumer:
        """``pulsar.asyncio.Client.subscribe``, plus ``message_listener``: a
        :data:`tghost.pulsar.hop.Listener` gets every message on a C++ thread (see
        :func:`tghost.pulsar.hop.subscribe_listening`; ``receive`` is not allowed then)."""
        if consumer_type == pulsar.ConsumerType.Exclusive or not self._spread:
            return await _subscribe_on(self, topic, subscription_name, consumer_type, kwargs)
        shared = await self._shared_client()
        attempts = max(1, int(self.settings.operation_timeout // SHARED_SUBSCRIBE_TIMEOUT))
        for attempt in itertools.count(1):
            try:
                return await _subscribe_on(shared, topic, subscription_name, consumer_type, kwargs)
            except pulsar.asyncio.PulsarException as exc:
                if exc.error() not in (pulsar.Result.Timeout, pulsar.Result.ConsumerBusy) or attempt >= attempts:
                    raise
                self.id_collisions += 1
                log.info("subscription %s on %s: no answer in %ss, as when pulsar-lite already has this consumer "
                         "id there; retrying with the next id (%d/%d)", subscription_name, topic,
                         SHARED_SUBSCRIBE_TIMEOUT, attempt, attempts)
        raise AssertionError("unreachable")

    async def _shared_client(self) -> pulsar.asyncio.Client:
        async with self._shared_lock:
            if self._shared is None:
                self._slot = _IdSlot.claim(endpoints(self.settings.url)[0][1])
                shared = pulsar.asyncio.Client(self.settings.url, operation_timeout_seconds=SHARED_SUBSCRIBE_TIMEOUT,
                                               **self.settings.client_kwargs())
                await _skip_consumer_ids(shared, self._slot.first_id)
                self._shared = shared
            return self._shared

    async def close(self) -> None:
        await super().close()
        if self._shared is not None:
            await self._shared.close()
        if self._slot is not None:
            self._slot.release()
        if not exits.AT_ONCE:
            await asyncio.sleep(CLOSE_DRAIN)


async def _subscribe_on(client: pulsar.asyncio.Client, topic: Any, subscription_name: str,
                        consumer_type: pulsar.ConsumerType, kwargs: dict[str, Any]) -> pulsar.asyncio.Consumer:
    """Subscribe on ``client`` itself (never :class:`_Client`'s spreading), with a message
    listener when ``kwargs`` has ``message_listener``; returns once the broker took the consumer's
    first permits (:func:`tghost.pulsar.hop.permits_taken`)."""
    options = dict(kwargs)
    listener = options.pop("message_listener", None)
    if listener is not None:
        return await hop.subscribe_listening(client, topic, subscription_name, consumer_type, listener, **options)
    consumer = await pulsar.asyncio.Client.subscribe(client, topic, subscription_name, consumer_type, **options)
    await hop.permits_taken(client, topic)
    return consumer


#: Seconds (whole) a non-exclusive subscribe may take on a loopback URL before it is retried with
#: another consumer id (pulsar-lite subscribes in about 1 ms).
SHARED_SUBSCRIBE_TIMEOUT = 3
#: Consumer ids per :class:`_IdSlot`: a client's non-exclusive consumers beyond this many may
#: meet the next slot's ids (then a collision is retried; see :class:`_Client`).
ID_STRIDE = 32


class _IdSlot:
    """Slot ``k`` of this user's machine-wide consumer-id slots for one broker port: a lock file
    ``<tmp>/tghost-<uid>/consumer-id-slots/<port>/<k>.lock`` held (``flock``) while the client
    lives, released at close or when the process dies. A client in slot ``k`` numbers its
    non-exclusive consumers from ``(k + 1) * ID_STRIDE`` (ids below are left to other clients,
    which count from 0).
    """

    def __init__(self, index: int, handle: IO[bytes] | None) -> None:
        self.index = index
        self._handle = handle

    @property
    def first_id(self) -> int:
        return (self.index + 1) * ID_STRIDE

    @classmethod
    def claim(cls, port: int) -> _IdSlot:
        slots = Path(tempfile.gettempdir()) / f"tghost-{os.getuid()}" / "consumer-id-slots" / str(port)
        slots.mkdir(parents=True, exist_ok=True, mode=0o700)
        return cls(*first_free_slot(slots))

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing drops the flock
            self._handle = None


async def _skip_consumer_ids(client: pulsar.asyncio.Client, count: int) -> None:
    """Use up about ``count`` consumer ids of ``client``: multi-topic subscribes of up to
    :data:`SKIP_CHUNK` topics each take one id per topic plus one (about 1 ms per id on
    loopback). Best effort: if the broker is too slow for one, the ids left are a collision
    :class:`_Client` retries, not a failure."""
    name = uuid.uuid4().hex[:8]
    left = count
    while left > 1:
        topics = [f"non-persistent://tg/tghost/consumer-id-{i}" for i in range(min(SKIP_CHUNK, left - 1))]
        try:
            spacer = await client.subscribe(topics, f"tghost-consumer-id-spacer-{name}-{left}")
            await spacer.close()
        except pulsar.asyncio.PulsarException as exc:
            log.info("could not use up consumer ids (%s); a collision, if any, will be retried", exc)
            return
        left -= len(topics) + 1


#: Topics per subscribe when :func:`_skip_consumer_ids` uses up ids.
SKIP_CHUNK = 16


def endpoints(url: str) -> list[tuple[str, int]]:
    """The (host, port) pairs of a service URL: ``pulsar://a:6650,b:6650`` gives two. The port
    defaults to 6650 (6651 for ``pulsar+ssl://``)."""
    parts = urlsplit(url)
    default = 6651 if parts.scheme.endswith("+ssl") else 6650
    found = []
    for netloc in parts.netloc.rpartition("@")[2].split(","):
        one = urlsplit(f"//{netloc}")
        found.append((one.hostname or "localhost", one.port or default))
    return found


def is_reachable(url: str, timeout: float = 1.0) -> bool:
    """True when something accepts TCP connections at one of the URL's hosts (``timeout`` seconds each)."""
    for address in endpoints(url):
        try:
            with socket.create_connection(address, timeout=timeout):
                return True
        except OSError:
            continue
    return False


async def _accepts_connections(url: str, timeout: float) -> bool:
    """:func:`is_reachable`, without blocking the event loop."""
    for host, port in endpoints(url):
        try:
            async with asyncio.timeout(timeout):
                _, writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError):
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True
    return False
