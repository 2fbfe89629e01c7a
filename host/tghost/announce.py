"""announce: publish what this host serves (and the external tool services its config declares,
marked ``"external": true``) on the ``tool-descriptors`` topic, renew its lease by heartbeat,
announce again after a reconnect, and withdraw it before shutdown (DESIGN.md, "Announcement
protocol"); with a signing key every value is signed (:mod:`tghost.trust`).

Never serves requests and never reads the topic: the directory does that.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pulsar.asyncio

from . import __version__
from .discover import Catalog
from .trust import Signer

__all__ = ["DEFAULT_TOPIC", "Announcer", "HostIdentity", "announcement_key"]

DEFAULT_TOPIC = "persistent://tg/config/tool-descriptors"
#: Seconds between checks of the producer's connection (a reconnect triggers a re-announce).
CONNECTION_CHECK = 0.2
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostIdentity:
    """Who serves: ``id`` is stable across restarts of the same host slot on this machine."""

    id: str
    hostname: str
    pid: int
    version: str = __version__

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "hostname": self.hostname, "pid": self.pid, "version": self.version}

    @classmethod
    @contextlib.contextmanager
    def claim(cls, state_dir: Path, explicit_id: str | None = None) -> Iterator[HostIdentity]:
        """Hold a host identity for the lifetime of the ``with`` block.

        With ``explicit_id`` that id is used. Otherwise the first free slot
        ``state_dir/hosts/<n>`` is locked (flock) and its stored uuid reused, so a restarted
        host gets its old id back while two hosts running at once never share one.
        """
        hostname = socket.gethostname()
        if explicit_id:
            yield cls(explicit_id, hostname, os.getpid())
            return
        slots = state_dir / "hosts"
        slots.mkdir(parents=True, exist_ok=True)
        handle, slot_id = _lock_free_slot(slots)
        try:
            yield cls(f"{hostname}-{slot_id}", hostname, os.getpid())
        finally:
            handle.close()


def _lock_free_slot(slots: Path) -> tuple[IO[str], str]:
    for n in range(10_000):
        handle = (slots / f"{n}.lock").open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        handle.seek(0)
        slot_id = handle.read().strip()
        if not slot_id:
            slot_id = uuid.uuid4().hex[:12]
            handle.write(slot_id)
            handle.flush()
        return handle, slot_id
    raise RuntimeError(f"no free host slot in {slots}")


def announcement_key(kind: str, name: str, host_id: str) -> str:
    """The message key: ``<kind>/<name>@<host-id>``, one per provider, so compaction keeps each
    provider's latest state. ``kind`` is ``tool-service``, ``tool`` or ``host`` (name = host id)."""
    return f"{kind}/{name}@{host_id}"


class Announcer:
    """Publishes a catalog's descriptors with this host's identity, plugin origin and lease.

    ``lease`` is seconds; a heartbeat every ``lease / 3`` seconds renews it. The producer's
    connection is checked every :data:`CONNECTION_CHECK` seconds (or lease/3 if shorter):
    once it is back after any disconnect, everything is announced again, since a directory
    may have expired this host meanwhile. With a ``signer`` every value is signed
    (:mod:`tghost.trust` gives the format); ``sent`` counts the messages published.
    """

    def __init__(
        self,
        catalog: Catalog,
        identity: HostIdentity,
        topic: str = DEFAULT_TOPIC,
        lease: float = 30.0,
        signer: Signer | None = None,
    ) -> None:
        self.catalog = catalog
        self.identity = identity
        self.topic = topic
        self.lease = lease
        self.signer = signer
        self.sent = 0
        self._producer: pulsar.asyncio.Producer | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._sending = asyncio.Lock()

    def _messages(self, status: str) -> Iterator[tuple[str, dict[str, Any]]]:
        yield self._message("host", self.identity.id, None, None, status)
        yield from self._entries(self.catalog, status)

    def _entries(self, catalog: Catalog, status: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """The messages of ``catalog``'s services and tools; read from a snapshot, since a live
        plugin install (:mod:`tghost.watch`) may change the catalog between two sends."""
        for sid, descriptor in list(catalog.descriptors.items()):
            origin = catalog.service_origin[sid]
            yield self._message("tool-service", sid, descriptor.to_json_dict(), origin.origin_json(), status)
        for sid, descriptor in list(catalog.external.items()):
            origin = catalog.service_origin[sid]
            yield self._message("tool-service", sid, descriptor.to_json_dict(), origin.origin_json(), status,
                                external=True)
        for name, tool in list(catalog.tools.items()):
            origin = catalog.tool_origin[name]
            yield self._message("tool", name, tool.to_json_dict(), origin.origin_json(), status)

    def _message(
        self, kind: str, name: str, descriptor: dict[str, Any] | None, plugin: dict[str, Any] | None, status: str,
        *, external: bool = False,
    ) -> tuple[str, dict[str, Any]]:
        value: dict[str, Any] = {
            "kind": kind,
            "name": name,
            "status": status,
            "descriptor": descriptor,
            "host": self.identity.to_json(),
            "plugin": plugin,
            "lease": {"seconds": self.lease, "sent_at": time.time()},
        }
        if external:  # a tool service this host announces but does not serve (config.py)
            value["external"] = True
        if self.signer is not None:
            value = self.signer.sign(value)
        return announcement_key(kind, name, self.identity.id), value

    async def _send(self, key: str, value: dict[str, Any]) -> None:
        assert self._producer is not None
        async with self._sending:  # the heartbeat and a live plugin install may send at once
            await self._producer.send(json.dumps(value).encode(), partition_key=key)
        self.sent += 1

    async def _publish(self, status: str) -> None:
        # One send at a time: with sends pipelined, pulsar-lite 0.2.0 delivered some messages
        # up to nine times to a reader tailing the topic (seen here; Apache Pulsar does not).
        for key, value in self._messages(status):
            await self._send(key, value)

    def is_connected(self) -> bool:
        """Whether the announcement producer is connected to the broker now (False before start)."""
        return self._producer is not None and bool(self._producer.is_connected())

    async def start(self, client: pulsar.asyncio.Client) -> None:
        """Announce everything as ``available`` and start the heartbeat.

        Raises:
            pulsar.asyncio.PulsarException: the producer could not be created or a send failed.
        """
        self._producer = await client.create_producer(self.topic, batching_enabled=False)
        await self._publish("available")
        log.info("announced %d service(s), %d tool(s) on %s as host %s (lease %ss%s)",
                 len(self.catalog.descriptors) + len(self.catalog.external), len(self.catalog.tools), self.topic,
                 self.identity.id, self.lease,
                 f", signed by key {self.signer.key_id}" if self.signer else ", unsigned")
        self._heartbeat = asyncio.create_task(self._beat(), name="announce heartbeat")

    async def publish(self, part: Catalog, status: str) -> None:
        """Announce (``status`` ``available``) or withdraw (``withdrawn``) only the services and
        tools of ``part``, a sub-catalog: a plugin installed or uninstalled while the host runs
        (:mod:`tghost.watch`). Keep :attr:`catalog` in step, since a reconnect announces it again.

        Raises:
            RuntimeError: before :meth:`start`.
            pulsar.asyncio.PulsarException: a send failed.
        """
        if self._producer is None:
            raise RuntimeError("Announcer.publish() before Announcer.start()")
        for key, value in self._entries(part, status):
            await self._send(key, value)
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
            connected = self._producer.is_connected()
            try:
                if connected and not was_connected:
                    log.info("broker connection is back: announcing again")
                    await self._publish("available")
                    due = loop.time() + interval
                elif connected and loop.time() >= due:
                    await self._send(*self._message("host", self.identity.id, None, None, "available"))
                    due = loop.time() + interval
            except pulsar.asyncio.PulsarException as exc:
                log.warning("heartbeat failed (%s); will announce again when connected", exc)
                connected = False
            if was_connected and not connected:
                log.warning("lost the broker connection; will announce again when it is back")
            was_connected = connected

    async def withdraw(self) -> None:
        """Stop the heartbeat and announce every entry as ``withdrawn``. Errors are logged."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        if self._producer is None:
            return
        try:
            await self._publish("withdrawn")
            log.info("withdrew everything this host announced")
        except pulsar.asyncio.PulsarException as exc:
            log.warning("could not withdraw (%s); entries expire after the %ss lease", exc, self.lease)
        with contextlib.suppress(Exception):
            await self._producer.close()
