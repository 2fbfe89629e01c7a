"""answers: a caller with an identity, or with trusted host keys, accepts only the answers a host
of the service proved for its request (docs/protocol.md §2.13). A tap on the request topic, as
anyone on the broker can run, answers every request first with a spoofed response, a fake
progress update and an injected ``unknown-session`` error; the test counts what callers took."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

import tghost
from tests.conftest import until
from tghost.agent.client import ToolCallError, ToolServiceClient
from tghost.agent.directory import ToolDirectory
from tghost.broker import EmbeddedBroker
from tghost.discovery.discover import catalog_of
from tghost.protocol import wire
from tghost.protocol.access import AccessPolicy
from tghost.protocol.descriptors import ToolServiceDescriptor
from tghost.protocol.trust import Signer, TrustedKeys, write_key_pair
from tghost.pulsar.clients import PulsarSettings
from tghost.testing import LocalHost

#: ``slow_sum``'s n-th call answers once ``INTERLOPER[0](n)`` is true: the tap or copier has done
#: its part for that request, so what it causes reaches the caller before the call's own answer.
INTERLOPER: list[Callable[[int], bool]] = []
SUMS: list[int] = []


@tghost.tool
async def slow_sum(a: int, b: int, ctx: tghost.Context) -> str:
    """Add two numbers, slowly, telling how far it got."""
    ctx.progress(1, 2, "adding")
    SUMS.append(a)
    calls = len(SUMS)
    if INTERLOPER:
        await until(lambda: INTERLOPER[0](calls), "the interloper did its part", 10)
    await asyncio.sleep(0.2)
    return str(a + b)


class Tap:
    """Reads every request of a service on its own subscription and answers each at once, as
    an attacker would: a progress update, an ``unknown-session`` error and a spoofed response."""

    def __init__(self, url: str, descriptor: ToolServiceDescriptor) -> None:
        self.client = pulsar.Client(url)
        self.producer = self.client.create_producer(descriptor.response_queue, batching_enabled=False)
        self.answered = 0
        self.consumer = self.client.subscribe(descriptor.request_queue, f"tap-{uuid.uuid4().hex[:6]}",
                                              message_listener=self._answer)

    def _answer(self, consumer: Any, message: Any) -> None:
        consumer.acknowledge(message)
        request_id = message.properties().get("id")
        if request_id is None:
            return
        for payload in (wire.encode_progress(wire.Progress(9, 9, "FAKE")),
                        wire.encode_error(wire.UNKNOWN_SESSION, "resend it"), wire.encode_response("SPOOFED")):
            self.producer.send(payload, properties={"id": request_id})
        self.answered += 1

    def close(self) -> None:
        self.client.close()


class Copier:
    """Reads every request of a service on its own subscription and sends it again at once, as
    is (a replay) or with its properties on a body of its own (a forgery), so a host refuses the
    copy under the caller's ``id``."""

    def __init__(self, url: str, descriptor: ToolServiceDescriptor, forge: bool) -> None:
        self.client = pulsar.Client(url)
        self.producer = self.client.create_producer(descriptor.request_queue, batching_enabled=False)
        self.forge = forge
        self.copied: set[str] = set()
        self.consumer = self.client.subscribe(descriptor.request_queue, f"copier-{uuid.uuid4().hex[:6]}",
                                              message_listener=self._copy)

    def _copy(self, consumer: Any, message: Any) -> None:
        consumer.acknowledge(message)
        properties = message.properties()
        if properties.get("id") in self.copied:
            return  # its own copy
        self.copied.add(properties.get("id", ""))
        self.producer.send(b"garbage" if self.forge else message.data(), properties=properties)

    def close(self) -> None:
        self.client.close()


@pytest.mark.parametrize("forge", [False, True], ids=["replayed", "forged body"])
async def test_a_hosts_proven_refusal_of_a_copy_never_ends_the_callers_call(
    host: LocalHost, keys: dict[str, Signer], forge: bool
) -> None:
    """The copy is refused (a replay, or a bad request): the refusal goes unproven, or is proven
    for another body, so the caller drops it and takes its own call's answer."""
    copier = Copier(host.pulsar.url, host.descriptors["slow-sum"], forge)
    [endpoint] = host.server.endpoints
    INTERLOPER.append(lambda calls: endpoint.counters["received"] >= 2 * calls)  # its copy reached the host
    try:
        async with ToolDirectory(PulsarSettings(host.pulsar.url), host.announced_on,  # type: ignore[attr-defined]
                                 identity=keys["alice"]) as directory:
            await directory.wait_for("slow-sum")
            results, _ = await calls(directory, 10)
            [caller] = directory.calls._callers.values()
    finally:
        copier.close()
    assert results == [str(i + 1) for i in range(10)] and len(copier.copied) == 10
    assert caller.dropped_answers == 10  # each copy's refusal


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Signer]:
    return {name: Signer.from_file(write_key_pair(tmp_path / "keys" / name).private) for name in ("alice", "host")}


@pytest.fixture
async def host(pulsar_broker: EmbeddedBroker, tmp_path: Path, keys: dict[str, Signer]) -> AsyncIterator[LocalHost]:
    """A host with an access policy and a signing key, announcing on a fresh topic."""
    catalog = catalog_of([slow_sum])
    catalog.access = AccessPolicy.from_table(
        {"anonymous": ["slow-sum"], "callers": {"alice": {"public-key": "keys/alice.pub"}}}, tmp_path)
    topic = f"persistent://tg/config/answers-{uuid.uuid4().hex[:8]}"
    SUMS.clear()
    async with LocalHost(pulsar_broker.url, catalog, announce_as="proving", signer=keys["host"],
                         topic=topic) as started:
        started.announced_on = topic  # type: ignore[attr-defined]
        yield started
    INTERLOPER.clear()


@pytest.fixture
def tap(host: LocalHost) -> Iterator[Tap]:
    tapping = Tap(host.pulsar.url, host.descriptors["slow-sum"])
    INTERLOPER.append(lambda calls: tapping.answered >= calls)  # its answers went out first
    yield tapping
    tapping.close()


async def calls(directory: ToolDirectory, count: int) -> tuple[list[str], list[str]]:
    """The observations of ``count`` calls, and every progress message they were told."""
    told: list[str] = []
    results = [await directory.invoke("slow-sum", {"a": i, "b": 1}, progress=lambda p: told.append(p.message))
               for i in range(count)]
    return results, told


async def test_a_caller_with_an_identity_takes_no_spoofed_answer_progress_or_error(
    host: LocalHost, tap: Tap, keys: dict[str, Signer]
) -> None:
    async with ToolDirectory(PulsarSettings(host.pulsar.url), host.announced_on,  # type: ignore[attr-defined]
                             identity=keys["alice"]) as directory:
        await directory.wait_for("slow-sum")
        results, told = await calls(directory, 20)
        [caller] = directory.calls._callers.values()
    assert results == [str(i + 1) for i in range(20)]  # 0 of 20 spoofed answers, every call answered
    assert told == ["adding"] * 20  # 0 fake progress updates
    assert tap.answered == 20 and caller.dropped_answers == 60


async def test_an_anonymous_caller_that_trusts_the_hosts_keys_takes_only_signed_answers(
    host: LocalHost, tap: Tap, keys: dict[str, Signer]
) -> None:
    trusted = TrustedKeys([keys["host"].public_key])
    async with ToolDirectory(PulsarSettings(host.pulsar.url), host.announced_on,  # type: ignore[attr-defined]
                             trusted=trusted) as directory:
        await directory.wait_for("slow-sum")
        results, told = await calls(directory, 10)
    assert results == [str(i + 1) for i in range(10)] and told == ["adding"] * 10


async def test_a_seed_000_caller_without_keys_is_unchanged_and_unprotected(host: LocalHost, tap: Tap) -> None:
    """What §2.13 does not protect: an anonymous caller that trusts no key takes the first
    answer, here the tap's injected error."""
    descriptor = host.descriptors["slow-sum"]
    assert host.client is not None
    async with ToolServiceClient(host.client, descriptor.request_queue, descriptor.response_queue) as caller:
        with pytest.raises(ToolCallError, match="unknown-session: resend it"):
            await caller.call({}, {"a": 1, "b": 1}, timeout=10)
    assert caller.dropped_answers == 0
