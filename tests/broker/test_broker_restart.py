"""broker_restart: the announcer, the directory and the endpoints survive a restart of the broker
process. The host reconnects, announces again and serves; the directory re-syncs; calls after
recovery succeed; no tool is lost or duplicated. Uses its own broker (never the session one) on a
fixed port and data dir.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

import tghost
from tests.conftest import OwnBrokers, until
from tghost.agent.directory import Change, ToolDirectory
from tghost.discovery.discover import catalog_of
from tghost.pulsar.clients import PulsarSettings
from tghost.system.net import free_port
from tghost.testing import LocalHost

LEASE = 1.5


@tghost.tool(service="kb", config=["collection"])
async def search(question: str, collection: str) -> str:
    """Search a collection."""
    return f"{collection}: {question}"


@tghost.tool(group=["math"])
async def count(text: str) -> int:
    """Count characters."""
    return len(text)


def catalog() -> Any:
    return catalog_of([search, count], [search.tool("query-customers", collection="customers"),
                                        search.tool("query-products", collection="products")])


def connected(host: LocalHost, found: ToolDirectory) -> bool:
    """Every consumer and producer of the host and the directory is connected to the broker."""
    assert host.announcer is not None and host.announcer._producer is not None
    handles = [host.announcer._producer]
    handles += [w._port.producer for w in host.server.endpoints]
    handles += [w._consumer._consumer for w in host.server.endpoints]
    for caller in found.calls._callers.values():
        handles += [caller._producer, caller._consumer._consumer]
    return found.is_connected() and all(handle is not None and handle.is_connected() for handle in handles)


def snapshot(found: ToolDirectory) -> dict[str, tuple[str, ...]]:
    """Each live tool and the ids of its providers."""
    return {name: tuple(p.host["id"] for p in tool.providers) for name, tool in found.tools.items()}


async def calls(found: ToolDirectory) -> list[str]:
    return list(await asyncio.gather(
        found.invoke("count", {"text": "abcd"}, groups=["math"], timeout=10),
        found.invoke("query-customers", {"question": "q"}, timeout=10),
        found.invoke("query-products", {"question": "p"}, timeout=10)))


async def test_host_and_directory_survive_a_broker_restart(
        own_brokers: OwnBrokers, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tghost")
    data_dir, port = tmp_path / "broker", free_port()
    broker = own_brokers.start(data_dir, port)
    topic = f"persistent://tg/config/restart-{uuid.uuid4().hex[:8]}"
    try:
        async with LocalHost(broker.url, catalog(), announce_as="host-a", lease=LEASE, topic=topic) as host:
            assert host.announcer is not None
            found = await ToolDirectory(PulsarSettings(broker.url), topic, expiry_interval=0.05).start()
            seen: list[Change] = []
            watcher = asyncio.create_task(_collect(found, seen))
            try:
                before = snapshot(found)
                assert sorted(before) == ["count", "query-customers", "query-products"]
                assert await calls(found) == ["4", "customers: q", "products: p"]
                full_announcement = 1 + len(host.catalog.descriptors) + len(host.catalog.tools)

                await asyncio.to_thread(broker.stop)
                await until(lambda: not found.is_connected())
                await asyncio.sleep(2 * LEASE)  # longer than a lease: a naive directory would expire the host
                sent_before = host.announcer.sent
                broker = await asyncio.to_thread(own_brokers.start, data_dir, port)  # a new process, same store

                await until(lambda: connected(host, found))
                await until(lambda: host.announcer.sent >= sent_before + full_announcement)  # announced again
                assert await calls(found) == ["4", "customers: q", "products: p"]
                assert snapshot(found) == before  # same tools, each provider once
                assert seen == []  # no tool was removed, expired or re-added meanwhile
                late = await ToolDirectory(PulsarSettings(broker.url), topic).start()  # one that syncs anew
                try:
                    assert snapshot(late) == before
                    assert await late.invoke("count", {"text": "ab"}, groups=["*"]) == "2"
                finally:
                    await late.close()
            finally:
                watcher.cancel()
                await found.close()
        assert "broker connection is back: announcing again" in caplog.text
    finally:
        broker.stop()


async def _collect(found: ToolDirectory, seen: list[Change]) -> None:
    async for change in found.changes():
        seen.append(change)
