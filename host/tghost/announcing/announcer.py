"""announcer: publish what this host serves (and the external tool services its config declares,
marked ``"external": true``) on the announcement topics: everything on start, on
every new epoch's topic and after a reconnect; a heartbeat with the manifest every lease/3;
withdrawals before shutdown (docs/protocol.md §4.4). With a signing key every value is signed
(:mod:`tghost.protocol.trust`).

Never serves requests and never reads the topics: the directory does that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pulsar.asyncio

from tghost._version import __version__
from tghost.broker import local_disk_trouble
from tghost.discovery.catalog import Catalog
from tghost.protocol import wire
from tghost.protocol.access import policy_fingerprint, tools_for
from tghost.protocol.announcement import (
    DEFAULT_TOPIC,
    EPOCH_SECONDS,
    announcement_key,
    announcement_value,
    epoch_of,
    epoch_topic,
)
from tghost.protocol.descriptors import ToolDescriptor, ToolServiceDescriptor
from tghost.protocol.epochs import check_lease
from tghost.protocol.sessions import SESSION_KEY, HostSessionKey
from tghost.protocol.trust import Signer
from tghost.pulsar.clients import is_reachable
from tghost.system.locks import first_free_slot
from tghost.system.tasks import cancel_and_wait

__all__ = ["DEFAULT_TOPIC", "Announcer", "HostIdentity", "announcement_key"]

#: Seconds between checks of the producer's connection and of the epoch (a reconnect or a new
#: epoch triggers a restatement).
CONNECTION_CHECK = 0.2
#: Seconds (at least; a third of the lease if that is longer) an announcement may wait for the
#: broker's receipt before the host reports that announcements cannot be published. A broker
#: that drops the connection at each persistent publish (pulsar-lite on a full disk) never
#: answers one: the client sends it again at each reconnect, and its send timeout never fires.
UNCONFIRMED_AFTER = 5.0
log = logging.getLogger(__name__)

#: (kind, name) of an announced tool service or tool.
EntryKey = tuple[str, str]


def _new_instance() -> str:
    return uuid.uuid4().hex[:16]


def _working_directory() -> str:
    """This process's working directory (``""`` when it was removed)."""
    try:
        return os.getcwd()
    except OSError:
        return ""


@dataclass(frozen=True)
class HostIdentity:
    """Who serves: ``id`` is stable across restarts of the same host slot on this machine;
    ``instance`` is new for every process (docs/protocol.md §4.3), so a directory can tell a
    restart, and two processes wrongly sharing one id, from one host. ``session``: the key
    callers open sessions with (a host with an ``[access]`` policy; docs/protocol.md §2.9).
    ``cwd``: the process's working directory, so that another host on this machine can name it."""

    id: str
    hostname: str
    pid: int
    version: str = __version__
    instance: str = field(default_factory=_new_instance)
    session: HostSessionKey | None = field(default=None, compare=False, repr=False)
    cwd: str = ""
    """The process's working directory (:meth:`claim` sets it; ``""``: not announced), so that
    another host on this machine can name it."""

    def to_json(self) -> dict[str, Any]:
        info = {"id": self.id, "hostname": self.hostname, "pid": self.pid, "version": self.version,
                "instance": self.instance, wire.PROBES: True}
        info |= {"cwd": self.cwd} if self.cwd else {}
        return info if self.session is None else {**info, SESSION_KEY: self.session.public}

    @classmethod
    @contextlib.contextmanager
    def claim(cls, state_dir: Path, explicit_id: str | None = None,
              session: HostSessionKey | None = None) -> Iterator[HostIdentity]:
        """Hold a host identity for the lifetime of the ``with`` block.

        With ``explicit_id`` that id is used. Otherwise the first free slot
        ``state_dir/hosts/<n>`` is locked (flock) and its stored uuid reused, so a restarted
        host gets its old id back while two hosts running at once never share one. ``session``
        is announced as the host's session key, and the working directory as ``cwd``.
        """
        hostname, cwd = socket.gethostname(), _working_directory()
        if explicit_id:
            yield cls(explicit_id, hostname, os.getpid(), session=session, cwd=cwd)
            return
        slots = state_dir / "hosts"
        slots.mkdir(parents=True, exist_ok=True)
        handle, slot_id = _host_slot(slots)
        try:
            yield cls(f"{hostname}-{slot_id}", hostname, os.getpid(), session=session, cwd=cwd)
        finally:
            handle.close()


def _host_slot(slots: Path) -> tuple[IO[bytes], str]:
    """The first free slot of ``slots``, held, and the host id suffix stored in it (a new one for
    a slot never used)."""
    _, handle = first_free_slot(slots, limit=10_000)
    slot_id = handle.read().decode().strip()
    if not slot_id:
        slot_id = uuid.uuid4().hex[:12]
        handle.write(slot_id.encode())
        handle.flush()
    return handle, slot_id


def _catalog_keys(catalog: Catalog) -> list[EntryKey]:
    """The catalog's entries, services first; read from a snapshot, since a live plugin install
    (:mod:`tghost.operate.plugin_watch`) may change the catalog meanwhile."""
    return ([("tool-service", sid) for sid in [*catalog.descriptors, *catalog.external]]
            + [("tool", name) for name in list(catalog.tools)])


#: How :attr:`Announcer.problem` begins while announcements cannot be published.
UNPUBLISHED = "announcements cannot be published"


def _unpublished(url: str | None, since: float) -> str:
    """The problem of a broker at ``url`` that has not confirmed an announcement since unix time
    ``since``, with the cause when the embedded broker's disk shows it (reads files: run it in a
    worker thread)."""
    at = time.strftime("%H:%M:%S", time.localtime(since))
    cause = (local_disk_trouble(url) if url else None) or (
        "it drops the connection at each publish, as pulsar-lite does when its disk is full or its store "
        "damaged: see the broker's log ('tghost broker status' shows where)")
    return (f"{UNPUBLISHED}: the broker{f' at {url}' if url else ''} accepts connections but has confirmed none "
            f"since {at}; {cause}. Directories drop this host's tools when their lease ends; calls go on")


class Announcer:
    """Publishes a catalog's descriptors with this host's identity, plugin origin and lease.

    ``lease`` is seconds; a heartbeat (the host message, with the manifest) every ``lease / 3``
    seconds renews it. Messages go to the topic of the current epoch of ``topic``
    (``epoch_seconds`` long; :func:`tghost.protocol.announcement.epoch_topic`); the first message on a
    new epoch's topic starts a restatement of everything. The producer's connection is checked
    every :data:`CONNECTION_CHECK` seconds (or lease/3 if shorter): once it is back after any
    disconnect, everything is announced again, since a directory may have expired this host
    meanwhile. With a ``signer`` every value is signed (:mod:`tghost.protocol.trust` gives the format);
    ``sent`` counts the messages published. ``health_url``, if given, is announced in the host
    message (docs/protocol.md §4.3 ``health``).

    An announcement the broker has not confirmed after :data:`UNCONFIRMED_AFTER` seconds (or
    lease/3) while it accepts connections sets :attr:`problem` and logs it once at ERROR; its
    confirmation clears it ("announcements are being published again") and everything is
    announced again.
    """

    def __init__(
        self,
        catalog: Catalog,
        identity: HostIdentity,
        topic: str = DEFAULT_TOPIC,
        lease: float = 30.0,
        signer: Signer | None = None,
        *,
        epoch_seconds: float = EPOCH_SECONDS,
        health_url: str | None = None,
    ) -> None:
        """Raises:
            ValueError: ``lease`` is out of range (:func:`tghost.protocol.epochs.check_lease`).
        """
        check_lease(lease)
        self.catalog = catalog
        self.identity = identity
        self.topic = topic
        self.lease = lease
        self.signer = signer
        self.epoch_seconds = epoch_seconds
        self.health_url = health_url
        self.sent = 0
        self._started_at = time.time()
        #: What this instance announces now, and since when (unix seconds): the manifest.
        self._since: dict[EntryKey, float] = dict.fromkeys(_catalog_keys(catalog), self._started_at)
        self._client: pulsar.asyncio.Client | None = None
        self._producer: pulsar.asyncio.Producer | None = None
        self._epoch: int | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._sending = asyncio.Lock()
        self.problem: str | None = None
        """Why announcements cannot be published now (a sentence for ``/health``), else ``None``."""
        self._restate_due = False

    # -- messages --------------------------------------------------------------------------

    def _manifest(self) -> dict[str, list[str]]:
        return {kind: sorted(name for k, name in self._since if k == kind) for kind in ("tool-service", "tool")}

    def _descriptor(self, key: EntryKey) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The descriptor and plugin origin (JSON) of an entry, or ``None`` if the catalog no longer has it."""
        kind, name = key
        catalog = self.catalog
        descriptor: ToolServiceDescriptor | ToolDescriptor | None
        if kind == "tool-service":
            descriptor, origins = catalog.descriptors.get(name) or catalog.external.get(name), catalog.service_origin
        else:
            descriptor, origins = catalog.tools.get(name), catalog.tool_origin
        if descriptor is None or name not in origins:
            return None
        announced = descriptor.to_json_dict()
        if isinstance(descriptor, ToolDescriptor):
            announced = {"type": descriptor.type, **announced}  # REQUIRED by seed 000, so sent even when defaulted
        return announced, origins[name].origin_json()

    def _entry_message(self, key: EntryKey, status: str, now: float | None = None) -> tuple[str, dict[str, Any]] | None:
        found = self._descriptor(key)
        if found is None:
            return None
        descriptor, plugin = found
        return self._message(key[0], key[1], descriptor if status == "available" else None, plugin, status, now)

    def _messages(
        self, status: str, keys: Iterable[EntryKey] | None = None, now: float | None = None
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Everything (or just ``keys``) as ``status``; built as it is sent (or as at unix time
        ``now``). An ``available`` restatement starts with the host message, a withdrawal ends
        with it (docs/protocol.md §4.4)."""
        entries = list(self._since) if keys is None else list(keys)
        if keys is None and status == "available":
            yield self._message("host", self.identity.id, None, None, status, now)
        for key in entries:
            message = self._entry_message(key, status, now)
            if message is not None:
                yield message
        if keys is None and status == "withdrawn":
            yield self._message("host", self.identity.id, None, None, status, now)

    def _host_beat(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """The heartbeat: the host message, built when it is sent (stamped after anything the
        same send lock let out before it, such as a new epoch's restatement)."""
        yield self._message("host", self.identity.id, None, None, "available")

    def _message(
        self, kind: str, name: str, descriptor: dict[str, Any] | None, plugin: dict[str, Any] | None, status: str,
        now: float | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """One announcement (key, value) sent at unix time ``now`` (default: now; docs/protocol.md §4.3):
        a host message that is ``available`` carries the manifest and the health URL, a tool's
        who may call it (under an ``[access]`` policy), a served service's the fingerprint of its
        access rules, an external service's that it is one."""
        now = time.time() if now is None else now
        lists = kind == "host" and status == "available"
        value = announcement_value(
            kind, name, status, host=self.identity.to_json(), lease=self.lease, sent_at=now,
            since=min(now, self._started_at if kind == "host" else self._since.get((kind, name), now)),
            descriptor=descriptor, plugin=plugin, entries=self._manifest() if lists else None,
            health=self.health_url if lists else None,
            external=kind == "tool-service" and name in self.catalog.external,
            access=self._access(name) if kind == "tool" and status == "available" else None,
            access_policy=self._access_policy(name) if kind == "tool-service" and status == "available" else None)
        if self.signer is not None:
            value = self.signer.sign(value, self.topic)
        return announcement_key(kind, name, self.identity.id), value

    def _access(self, tool: str) -> dict[str, Any] | None:
        """Who may call ``tool`` here, as announced (``None``: no ``[access]`` policy, everyone):
        who may send its own request, which is for each tool over its service with the same config
        values (docs/protocol.md §2.8)."""
        access, tools = self.catalog.access, self.catalog.tools
        if access is None:
            return None
        descriptor = tools[tool]
        return access.access_of(tools_for(tools, descriptor.service, descriptor.config)).to_json()

    def _access_policy(self, service: str) -> str | None:
        """The fingerprint of the access rules this host applies to ``service`` (docs/protocol.md
        §4.3 ``access-policy``); ``None`` for an external service, which it does not serve."""
        if service in self.catalog.external:
            return None
        return policy_fingerprint(self.catalog.access, self.catalog.tools, service)

    # -- sending ---------------------------------------------------------------------------

    async def _send(self, key: str, value: dict[str, Any]) -> None:
        """Send one message on the current epoch's topic (hold ``_sending``) and wait for the
        broker's receipt, however long it takes: past :meth:`_patience` seconds, report it
        (:meth:`_await_unconfirmed`).

        Raises:
            pulsar.asyncio.PulsarException: the send failed.
        """
        assert self._producer is not None
        sending = asyncio.ensure_future(self._producer.send(json.dumps(value).encode(), partition_key=key))
        try:
            await asyncio.wait({sending}, timeout=self._patience())
            if not sending.done():
                await self._await_unconfirmed(sending)
            await sending
        except asyncio.CancelledError:
            sending.cancel()  # the client may still deliver it; nobody waits for its receipt
            raise
        self.sent += 1
        if self.problem is not None:
            self._set_problem(None)

    def _patience(self) -> float:
        return max(UNCONFIRMED_AFTER, self.lease / 3)

    async def _await_unconfirmed(self, sending: asyncio.Future[Any]) -> None:
        """Wait for ``sending``, reporting (once) that announcements cannot be published while
        the broker accepts connections (while it does not, its outage is reported as a lost
        connection instead)."""
        since = time.time() - self._patience()
        url = self._url()
        while not sending.done():
            if self.problem is None and (url is None or await asyncio.to_thread(is_reachable, url, 1.0)):
                self._set_problem(await asyncio.to_thread(_unpublished, url, since))
            await asyncio.wait({sending}, timeout=self._patience())

    def _url(self) -> str | None:
        """The broker's URL, when the client knows its settings (the host's clients do)."""
        settings = getattr(self._client, "settings", None)
        url = getattr(settings, "url", None)
        return url if isinstance(url, str) else None

    def _set_problem(self, problem: str | None) -> None:
        """Log ``problem`` once at ERROR (again only when it changes), or that it is over."""
        if problem == self.problem:
            return
        if problem is not None:
            log.error("%s", problem)
        else:
            log.info("announcements are being published again: announcing everything again")
            self._restate_due = True  # what the broker did with those it never confirmed is unknown
        self.problem = problem

    async def _send_all(self, messages: Iterable[tuple[str, dict[str, Any]]]) -> None:
        # One send at a time: with sends pipelined, pulsar-lite 0.2.0 delivered some messages
        # up to nine times to a reader tailing the topic (seen here; Apache Pulsar does not).
        for key, value in messages:
            await self._send(key, value)

    async def _roll(self) -> bool:
        """Move to the current epoch's topic if the epoch changed (or none is open yet), and
        restate everything there. Returns whether it restated. Hold ``_sending``.

        Raises:
            pulsar.asyncio.PulsarException: the producer could not be created or a send failed.
        """
        epoch = epoch_of(time.time(), self.epoch_seconds)
        if epoch == self._epoch and self._producer is not None:
            return False
        assert self._client is not None
        producer = await self._client.create_producer(epoch_topic(self.topic, epoch), batching_enabled=False)
        old, self._producer = self._producer, producer
        if old is not None:
            with contextlib.suppress(Exception):
                await old.close()
        await self._send_all(self._messages("available"))
        self._epoch = epoch  # only now: a restatement cut short by a failed send is sent again
        return True

    async def _emit(self, messages: Iterable[tuple[str, dict[str, Any]]], *, restatement: bool = False) -> None:
        """Send ``messages`` (built lazily, under the send lock, so each carries the send time and
        the manifest of that moment) on the current epoch's topic. A ``restatement`` that a new
        epoch already caused is not sent twice."""
        async with self._sending:  # the heartbeat and a live plugin install may send at once
            if await self._roll() and restatement:
                return
            await self._send_all(messages)

    def is_connected(self) -> bool:
        """Whether the announcement producer is connected to the broker now (False before start)."""
        return self._producer is not None and bool(self._producer.is_connected())

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, client: pulsar.asyncio.Client) -> None:
        """Announce everything as ``available`` on the current epoch's topic and start the heartbeat.

        Raises:
            pulsar.asyncio.PulsarException: the producer could not be created or a send failed.
        """
        self._client = client
        self._started_at = time.time()
        self._since = dict.fromkeys(self._since, self._started_at)
        async with self._sending:
            await self._roll()
        log.info("announced %d service(s), %d tool(s) on %s as host %s, instance %s (lease %ss%s)",
                 len(self.catalog.descriptors) + len(self.catalog.external), len(self.catalog.tools),
                 epoch_topic(self.topic, self._epoch or 0),
                 self.identity.id, self.identity.instance, self.lease,
                 f", signed by key {self.signer.key_id}" if self.signer else ", unsigned")
        self._heartbeat = asyncio.create_task(self._beat(), name="announce heartbeat")

    async def publish(self, part: Catalog, status: str) -> None:
        """Announce (``status`` ``available``) or withdraw (``withdrawn``) only the services and
        tools of ``part``, a sub-catalog: a plugin installed or uninstalled while the host runs
        (:mod:`tghost.operate.plugin_watch`). Merge ``part`` into :attr:`catalog` before announcing it, and drop
        it after withdrawing it. The manifest changes before the first message is sent.

        Raises:
            RuntimeError: before :meth:`start`.
            pulsar.asyncio.PulsarException: a send failed (the heartbeat then restates everything).
        """
        if self._producer is None:
            raise RuntimeError("Announcer.publish() before Announcer.start()")
        keys = _catalog_keys(part)
        if status == "available":
            now = time.time()
            self._since.update((key, self._since.get(key, now)) for key in keys)
        else:
            for key in keys:
                self._since.pop(key, None)
        try:
            await self._emit(self._messages(status, keys))
        except pulsar.asyncio.PulsarException:
            self._restate_due = True  # the heartbeat announces everything again once connected
            raise
        log.info("%s %d service(s), %d tool(s) on %s", "announced" if status == "available" else "withdrew",
                 len(part.descriptors), len(part.tools), self.topic)

    async def _beat(self) -> None:
        assert self._producer is not None
        loop = asyncio.get_running_loop()
        interval = self.lease / 3
        due = loop.time() + interval
        was_connected = True
        while True:
            await asyncio.sleep(min(interval, CONNECTION_CHECK))
            connected = self.is_connected()
            try:
                if connected and (not was_connected or self._restate_due):
                    if not was_connected:
                        log.info("broker connection is back: announcing again")
                    self._restate_due = False
                    await self._emit(self._messages("available"), restatement=True)
                    due = loop.time() + interval
                elif connected and loop.time() >= due:
                    await self._emit(self._host_beat(), restatement=True)  # a new epoch's restatement has it
                    due = loop.time() + interval
                elif connected and epoch_of(time.time(), self.epoch_seconds) != self._epoch:
                    async with self._sending:
                        await self._roll()
            except pulsar.asyncio.PulsarException as exc:
                log.warning("heartbeat failed (%s); will announce again when connected", exc)
                connected = False
            if was_connected and not connected:
                log.warning("lost the broker connection; will announce again when it is back")
            was_connected = connected

    async def withdraw(self) -> None:
        """Stop the heartbeat, then withdraw every entry and last the host itself. Errors are logged.

        With no broker connection now, or while announcements cannot be published
        (:attr:`problem`), nothing is sent (the send would only wait out the client's operation
        timeout, 30 s, or forever): the entries expire after the lease (docs/protocol.md §4.4,
        §4.7). A withdrawal the broker has not confirmed within 0.8 x :data:`UNCONFIRMED_AFTER`
        seconds (or of lease/3) is given up.
        """
        await cancel_and_wait(self._heartbeat)
        if self._producer is None:
            return
        if not self.is_connected() or self.problem is not None:
            why = "not connected to the broker" if self.problem is None else UNPUBLISHED
            log.warning("%s: withdrawing nothing; entries expire after the %ss lease", why, self.lease)
            return
        try:
            async with self._sending, asyncio.timeout(0.8 * self._patience()):  # before _send reports it
                await self._send_all(self._messages("withdrawn"))
            log.info("withdrew everything this host announced")
        except TimeoutError:
            log.warning("could not withdraw (the broker confirmed nothing in %gs); entries expire after the %ss lease",
                        0.8 * self._patience(), self.lease)
        except pulsar.asyncio.PulsarException as exc:
            log.warning("could not withdraw (%s); entries expire after the %ss lease", exc, self.lease)
        with contextlib.suppress(Exception):
            await self._producer.close()
