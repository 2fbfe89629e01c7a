"""replays: a captured signed or session request runs at most once across every host of its
service, and not again on a host that restarted (docs/protocol.md §2.8). Two hosts of one
service under one ``[access]`` policy on the embedded broker; the copies are sent on the raw
wire, as an attacker on the broker would, and the test counts what ran."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pulsar
import pulsar.exceptions
import pytest

import tghost
from tests.conftest import until
from tghost.broker import EmbeddedBroker
from tghost.conformance import RawWire
from tghost.discovery.discover import catalog_of
from tghost.protocol import wire
from tghost.protocol.access import AccessPolicy
from tghost.protocol.callers import SIGNED_AT, sign_request
from tghost.protocol.descriptors import ToolServiceDescriptor
from tghost.protocol.epochs import epoch_of, epoch_topic
from tghost.protocol.sessions import CallerSession
from tghost.protocol.trust import Signer, write_key_pair
from tghost.serving import replays
from tghost.serving.replays import REPLAY_EPOCH_SECONDS, replay_epochs, replays_topic
from tghost.testing import LocalHost

RAN: list[str] = []


@tghost.tool
def stamp(text: str) -> str:
    """Stamp a text."""
    RAN.append(text)
    return f"stamped {text}"


@pytest.fixture
def alice(tmp_path: Path) -> Signer:
    return Signer.from_file(write_key_pair(tmp_path / "keys" / "alice").private)


def guarded(tmp_path: Path) -> tghost.Catalog:
    catalog = catalog_of([stamp])
    catalog.access = AccessPolicy.from_table(
        {"callers": {"alice": {"public-key": "keys/alice.pub", "tools": ["stamp"]}}}, tmp_path)
    return catalog


@pytest.fixture
async def fleet(pulsar_broker: EmbeddedBroker, tmp_path: Path, alice: Signer) -> AsyncIterator[list[LocalHost]]:
    """Two hosts of the service, both subscribed: the Shared subscription alternates between them."""
    RAN.clear()
    async with LocalHost(pulsar_broker.url, guarded(tmp_path)) as one, \
            LocalHost(pulsar_broker.url, guarded(tmp_path)) as two:
        yield [one, two]


def signed(alice: Signer, descriptor: ToolServiceDescriptor, text: str,
           request_id: str) -> tuple[bytes, dict[str, str]]:
    body = wire.encode_request("u", {}, {"text": text})
    return body, {"id": request_id, **sign_request(alice, body, request_id, descriptor.request_queue, time.time())}


async def outcomes(raw: RawWire, request_id: str, settle: float = 0.0, ends: int = 1) -> list[str]:
    """What came back for one id (``ends`` last replies, and any more within ``settle`` seconds,
    or read meanwhile): the response, or the error type, of each."""
    replies = [reply.json() for reply in await raw.raw_replies(request_id, settle=settle, ends=ends)]
    return [reply["error"]["type"] if reply["error"] else reply["response"] for reply in replies]


async def test_a_copied_signed_request_runs_once_across_two_hosts(fleet: list[LocalHost], alice: Signer) -> None:
    descriptor = fleet[0].descriptors["stamp"]
    async with RawWire(fleet[0].pulsar.url, descriptor) as raw:
        sent = [signed(alice, descriptor, f"t{i}", f"r{i}") for i in range(30)]
        for body, properties in sent:  # each request and a copy at once: they reach both hosts
            await raw.send(body, properties)
            await raw.send(body, properties)
        await asyncio.sleep(1.0)
        for body, properties in sent:  # and again later, once the round-robin moved on
            await raw.send(body, properties)
        seen = [sorted(await outcomes(raw, f"r{i}", 1.0 if i == 0 else 0.0, ends=3)) for i in range(30)]
    assert sorted(RAN) == sorted(f"t{i}" for i in range(30))  # 0 of 60 copies ran
    assert seen == [sorted([f"stamped t{i}", wire.UNAUTHORIZED, wire.UNAUTHORIZED]) for i in range(30)]
    served = [host.server.endpoints[0].counters["received"] for host in fleet]  # type: ignore[union-attr]
    assert min(served) > 0, f"both hosts took copies: {served}"


async def test_a_copied_session_request_runs_once_across_two_hosts(fleet: list[LocalHost], alice: Signer) -> None:
    descriptor = fleet[0].descriptors["stamp"]
    gates = [host.server.gate for host in fleet]  # type: ignore[union-attr]
    session = CallerSession(alice, time.time())
    async with RawWire(fleet[0].pulsar.url, descriptor) as raw:
        for i in range(20):
            body = wire.encode_request("u", {}, {"text": f"s{i}"})
            properties = {"id": f"s{i}", **session.properties(body, f"s{i}", descriptor.request_queue, time.time(),
                                                              [gate.session.public for gate in gates])}
            for _ in range(3):
                await raw.send(body, properties)
        seen = [await outcomes(raw, f"s{i}", 1.0 if i == 0 else 0.0, ends=3) for i in range(20)]
    assert sorted(RAN) == sorted(f"s{i}" for i in range(20))
    assert [sorted(replies) for replies in seen] == [
        sorted([f"stamped s{i}", wire.UNAUTHORIZED, wire.UNAUTHORIZED]) for i in range(20)]


async def test_a_restarted_host_refuses_what_ran_before_it_stopped(
    pulsar_broker: EmbeddedBroker, tmp_path: Path, alice: Signer
) -> None:
    RAN.clear()
    async with LocalHost(pulsar_broker.url, guarded(tmp_path)) as host:
        descriptor = host.descriptors["stamp"]
        sent = [signed(alice, descriptor, f"b{i}", f"b{i}") for i in range(20)]
        async with RawWire(host.pulsar.url, descriptor) as raw:
            for body, properties in sent:
                await raw.send(body, properties)
            assert [await outcomes(raw, f"b{i}") for i in range(20)] == [[f"stamped b{i}"] for i in range(20)]
    async with LocalHost(pulsar_broker.url, guarded(tmp_path)) as restarted, \
            RawWire(restarted.pulsar.url, descriptor) as raw:
        for body, properties in sent:
            await raw.send(body, properties)
        after = [await outcomes(raw, f"b{i}", 1.0 if i == 0 else 0.0) for i in range(20)]
        fresh = signed(alice, descriptor, "new", "new")
        await raw.send(*fresh)
        assert await outcomes(raw, "new") == ["stamped new"]
    assert after == [[wire.UNAUTHORIZED]] * 20
    assert sorted(RAN) == sorted([f"b{i}" for i in range(20)] + ["new"])  # 0 of 20 ran again


def test_the_replays_topics_and_their_window_cover_every_signing_time_a_host_accepts() -> None:
    assert replays_topic("non-persistent://tg/request/joke-service") == "persistent://tg/request/joke-service.replays"
    assert replays_topic("persistent://t/n/x") == "persistent://t/n/x.replays"
    now = 1_000_000.0
    epochs = replay_epochs(now, 60.0, epoch_seconds=120.0)
    assert epochs.start * 120.0 <= now - 60.0 and now + 60.0 < epochs.stop * 120.0


def read_marks(url: str, topic: str) -> list[dict[str, str]]:
    """Every mark on one replay epoch topic, read from its first message."""
    client = pulsar.Client(url)
    try:
        reader, marks = client.create_reader(topic, pulsar.MessageId.earliest), []
        while reader.has_message_available():
            marks += json.loads(reader.read_next(5000).data())
        return marks
    except pulsar.exceptions.PulsarException:  # pulsar-lite: an empty topic has no last message
        return marks
    finally:
        client.close()


async def test_a_mark_goes_on_the_epoch_of_its_signing_time_whatever_the_hosts_clock(
    fleet: list[LocalHost], alice: Signer
) -> None:
    """Every copy of a request is marked on one topic, so two hosts whose clocks sit either side
    of an epoch's start still read each other's mark first (one epoch boundary is always
    within 60 s of now: the request is signed just across it).

    The boundary must be within 50 s, so up to 10 s are waited for it."""
    descriptor = fleet[0].descriptors["stamp"]
    while True:  # a boundary within 50 s (at most 10 s to wait), so the signing time is well inside the window
        now = time.time()
        here = epoch_of(now, REPLAY_EPOCH_SECONDS)
        start, end = here * REPLAY_EPOCH_SECONDS, (here + 1) * REPLAY_EPOCH_SECONDS
        if min(now - start, end - now) <= 50.0:
            break
        await asyncio.sleep(1.0)
    signed_at = start - 0.5 if now - start < end - now else end + 0.5
    body = wire.encode_request("u", {}, {"text": "edge"})
    properties = {"id": "edge", **sign_request(alice, body, "edge", descriptor.request_queue, signed_at)}
    async with RawWire(fleet[0].pulsar.url, descriptor) as raw:
        await raw.send(body, properties)
        await raw.send(body, properties)
        assert sorted(await outcomes(raw, "edge", 1.0)) == sorted(["stamped edge", wire.UNAUTHORIZED])
    base = replays_topic(descriptor.request_queue)
    marked = read_marks(fleet[0].pulsar.url, epoch_topic(base, epoch_of(signed_at, REPLAY_EPOCH_SECONDS)))
    # each host that took a copy marked it there (the broker may hand both copies to one host,
    # whose own record then refuses the second without a mark of its own)
    assert [c["id"] for c in marked].count("edge") in (1, 2)
    assert "edge" not in [c["id"] for c in read_marks(fleet[0].pulsar.url, epoch_topic(base, here))]


async def test_a_flood_of_marks_makes_a_host_refuse_not_forget(
    pulsar_broker: EmbeddedBroker, tmp_path: Path, alice: Signer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Marks are not signed: a flood past the record's bound pushes real marks out, and a
    request signed before what was pushed out is then refused 'unavailable', never run again."""
    monkeypatch.setattr(replays, "MAX_PAIRS", 50)
    RAN.clear()
    async with LocalHost(pulsar_broker.url, guarded(tmp_path)) as host:
        descriptor = host.descriptors["stamp"]
        first = signed(alice, descriptor, "early", "early")
        async with RawWire(host.pulsar.url, descriptor) as raw:
            await raw.send(*first)
            assert await outcomes(raw, "early") == ["stamped early"]
            now = time.time()
            flood = [{"caller": "f", "id": f"x{i}", "signed_at": f"{now:.3f}", "marker": f"c{i}"} for i in range(60)]
            forger = pulsar.Client(host.pulsar.url)
            try:
                topic = epoch_topic(replays_topic(descriptor.request_queue), epoch_of(now, REPLAY_EPOCH_SECONDS))
                forger.create_producer(topic, batching_enabled=False).send(json.dumps(flood).encode())
            finally:
                forger.close()
            shared = host.server.endpoints[0]._replays
            assert shared is not None
            signed_at = float(first[1][SIGNED_AT])  # (earlier tests' marks on the topic may be forgotten already)
            await until(lambda: shared._forgotten_until >= signed_at, "the flood pushes its mark out", 10)
            await raw.send(*first)  # its replay, once its mark was pushed out
            replies = [reply.json() for reply in await raw.raw_replies("early", settle=0.5)]
    assert [r["error"]["type"] for r in replies if r["error"]] == [wire.UNAVAILABLE]
    assert RAN == ["early"]


async def test_junk_on_the_replays_topic_is_skipped_and_the_host_keeps_serving(
    fleet: list[LocalHost], alice: Signer
) -> None:
    from tghost.protocol.epochs import current_topic

    descriptor = fleet[0].descriptors["stamp"]
    forger = pulsar.Client(fleet[0].pulsar.url)
    try:
        producer = forger.create_producer(current_topic(replays_topic(descriptor.request_queue), REPLAY_EPOCH_SECONDS),
                                          batching_enabled=False)
        for junk in (b"not json", b'[{"caller": 1}]', b'{"caller": "x"}', b"[" * 10_000):
            producer.send(junk)
    finally:
        forger.close()
    async with RawWire(fleet[0].pulsar.url, descriptor) as raw:
        await raw.send(*signed(alice, descriptor, "after", "after"))
        assert await outcomes(raw, "after") == ["stamped after"]
