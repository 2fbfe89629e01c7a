"""policy fleet: one access policy per service, on the embedded broker (docs/guides/security.md
"One policy per service"). One host serves calculate under an ``[access]`` policy (alice only),
another serves it with none: every anonymous call is refused by both, through the directory,
``tghost call`` and the raw wire; alice's calls run on the strict host and are refused by the
loose one, which cannot verify her key; every view reports the mismatch; once the strict host
stops, anonymous calls run again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import tghost
from tests.conftest import tghost_cli, until
from tghost.agent.client import ToolCallError, ToolServiceClient
from tghost.agent.directory import ToolDirectory
from tghost.broker import EmbeddedBroker
from tghost.cli.status import read_health
from tghost.conformance import RawWire
from tghost.discovery.discover import catalog_of
from tghost.protocol import wire
from tghost.protocol.access import NO_POLICY, AccessPolicy, policy_fingerprint
from tghost.protocol.trust import Signer, TrustedKeys, write_key_pair
from tghost.pulsar.clients import PulsarSettings
from tghost.serving.request import CallRecord

CALLS = 6


@tghost.tool(service="calculator")
def calculate(expression: str) -> str:
    """Calculate."""
    return f"= {expression}"


class Fleet:
    """The two hosts, the call records of each, and alice's key."""

    def __init__(self, strict: tghost.Host, loose: tghost.Host, records: dict[str, list[CallRecord]],
                 alice: Signer, env: dict[str, str], policy: str) -> None:
        self.strict, self.loose, self.records, self.alice, self.env = strict, loose, records, alice, env
        self.policy = policy


@contextlib.asynccontextmanager
async def two_hosts(broker: EmbeddedBroker, tmp_path: Path, signed: bool) -> AsyncIterator[Fleet]:
    """The strict and the loose host on a fresh topic; ``signed``: each signs its announcements
    and believes only the fleet's two keys (``tghost run --signing-key --trusted-key``)."""
    topic = f"persistent://tg/config/policy-{uuid.uuid4().hex[:8]}"
    alice = Signer.from_file(write_key_pair(tmp_path / "keys" / "alice").private)
    keys = {host_id: write_key_pair(tmp_path / "keys" / host_id) for host_id in ("strict", "loose")}
    trusted = TrustedKeys.from_files([pair.public for pair in keys.values()]) if signed else None
    strict_catalog = catalog_of([calculate])
    strict_catalog.access = AccessPolicy.from_table(
        {"callers": {"alice": {"public-key": "keys/alice.pub", "tools": ["calculate"]}}}, tmp_path)
    records: dict[str, list[CallRecord]] = {"strict": [], "loose": []}

    def host(host_id: str, catalog: tghost.Catalog) -> tghost.Host:
        signer = Signer.from_file(keys[host_id].private) if signed else None
        config = tghost.HostConfig(pulsar=PulsarSettings(broker.url), topic=topic, host_id=host_id,
                                   state_dir=tmp_path / host_id, metrics_port=0, signer=signer, trusted=trusted)
        return tghost.Host(config, catalog, listeners=[records[host_id].append])

    async with host("strict", strict_catalog) as strict, host("loose", catalog_of([calculate])) as loose:
        env = {**os.environ, "TGHOST_PULSAR_URL": broker.url, "TGHOST_DESCRIPTORS_TOPIC": topic}
        yield Fleet(strict, loose, records, alice, env,
                    policy_fingerprint(strict_catalog.access, strict_catalog.tools, "calculator"))


@pytest.fixture
async def fleet(pulsar_broker: EmbeddedBroker, tmp_path: Path) -> AsyncIterator[Fleet]:
    async with two_hosts(pulsar_broker, tmp_path, signed=False) as hosts:
        yield hosts


@pytest.fixture
async def signed_fleet(pulsar_broker: EmbeddedBroker, tmp_path: Path) -> AsyncIterator[Fleet]:
    async with two_hosts(pulsar_broker, tmp_path, signed=True) as hosts:
        yield hosts


async def raw_outcomes(url: str, descriptor: tghost.ToolServiceDescriptor) -> list[str]:
    """What :data:`CALLS` unsigned requests sent by hand on the request topic got: the observation
    or the error type."""
    got = []
    async with RawWire(url, descriptor) as raw:
        for _ in range(CALLS):
            _, reply = (await raw.request({"expression": "1+1"}))[-1]
            got.append(reply["error"]["type"] if reply.get("error") else reply["response"])
    return got


async def signed_outcomes(client: tghost.ToolServiceClient) -> list[str]:
    got = []
    for _ in range(CALLS):
        try:
            got.append(await client.call({}, {"expression": "2+2"}, timeout=10))
        except ToolCallError as exc:
            got.append(exc.error_type)
    return got


async def test_a_host_without_the_policy_refuses_what_the_strict_one_forbids_and_every_view_says_so(
    fleet: Fleet, pulsar_broker: EmbeddedBroker
) -> None:
    descriptor = fleet.strict.catalog.descriptors["calculator"]
    async with ToolDirectory(PulsarSettings(pulsar_broker.url), fleet.strict.config.topic) as directory:
        await until(lambda: len(directory.tools.get("calculate", None).providers  # type: ignore[union-attr]
                                if "calculate" in directory.tools else ()) == 2)
        tool = directory.tools["calculate"]
        assert tool.service.policies == {fleet.policy: ("strict",), NO_POLICY: ("loose",)}
        # the loose host has no policy: it takes alice as anonymous and refuses her, so not every
        # host admits her, and a directory must not send her call to be refused or lost at random
        assert tool.service.policy_mismatch and not tool.admits(None) and not tool.admits(fleet.alice.key_id)
        assert tool.access() == "nobody"
        assert [t.name for t in directory.available()] == []  # not listed for an anonymous caller
        with pytest.raises(ToolCallError) as refused:
            await directory.invoke("calculate", {"expression": "1+1"})
        assert refused.value.error_type == wire.UNAUTHORIZED

    assert set(await raw_outcomes(pulsar_broker.url, descriptor)) == {wire.UNAUTHORIZED}
    refusals = {host: {r.status for r in records} for host, records in fleet.records.items()}
    assert refusals == {"strict": {wire.UNAUTHORIZED}, "loose": {wire.UNAUTHORIZED}}, refusals
    loose_refusal = next(r for r in fleet.records["loose"] if r.status == wire.UNAUTHORIZED)
    assert loose_refusal.caller is None

    async with ToolServiceClient(fleet.loose.client, descriptor.request_queue, descriptor.response_queue,
                                 identity=fleet.alice) as alice:
        got = await signed_outcomes(alice)
    assert set(got) <= {"= 2+2", wire.UNAUTHORIZED}
    by_host = {host: {r.status for r in records if r.arguments == {"expression": "2+2"}}
               for host, records in fleet.records.items()}
    assert by_host["strict"] <= {"ok"} and by_host["loose"] <= {wire.UNAUTHORIZED}, by_host

    alice_key = next(Path(fleet.strict.config.state_dir).parent.glob("keys/alice.key"))
    as_alice = await asyncio.to_thread(tghost_cli, "call", "--identity", str(alice_key), "calculate",
                                       "expression=1+1", env=fleet.env)
    assert as_alice.returncode == 1 and "unauthorized" in as_alice.stderr, as_alice.stderr  # sent nowhere
    called = await asyncio.to_thread(tghost_cli, "call", "calculate", "expression=1+1", env=fleet.env)
    assert called.returncode == 1 and "unauthorized" in called.stderr, called.stderr
    by_service = await asyncio.to_thread(tghost_cli, "call", "--service", "calculator", "expression=1+1",
                                         env=fleet.env)
    assert by_service.returncode == 1 and "unauthorized" in by_service.stderr, by_service.stderr

    listed = await asyncio.to_thread(tghost_cli, "tools", "--all", env=fleet.env)
    assert listed.returncode == 0, listed.stderr
    assert "calculate POLICY" in listed.stdout and "nobody" in listed.stdout, listed.stdout
    assert "served under different access policies" in listed.stderr, listed.stderr
    rows = json.loads((await asyncio.to_thread(tghost_cli, "tools", "--all", "--json", env=fleet.env)).stdout)
    assert rows[0]["policy_mismatch"] == [{"policy": fleet.policy, "hosts": ["strict"]},
                                          {"policy": NO_POLICY, "hosts": ["loose"]}]
    status = await asyncio.to_thread(tghost_cli, "status", env=fleet.env)
    assert status.returncode == 1 and "different access policies" in status.stderr, status.stderr
    assert fleet.loose.monitor is not None
    health = await asyncio.to_thread(read_health, fleet.loose.monitor.http.health_url(), 5.0)
    assert any("served under different access policies" in p for p in health["problems"]), health


async def test_once_the_strict_host_stops_anonymous_calls_run_again(
    fleet: Fleet, pulsar_broker: EmbeddedBroker
) -> None:
    descriptor = fleet.strict.catalog.descriptors["calculator"]
    await until(lambda: fleet.loose._contest is not None and len(
        fleet.loose._contest.directory.services.get("calculator").providers  # type: ignore[union-attr]
        if "calculator" in fleet.loose._contest.directory.services else ()) == 2)
    await fleet.strict.stop()
    await until(lambda: [p.host["id"] for p in fleet.loose._contest.directory.services["calculator"].providers]
                == ["loose"])  # type: ignore[union-attr]
    assert await raw_outcomes(pulsar_broker.url, descriptor) == ["= 1+1"] * CALLS


@pytest.mark.parametrize("signed", [
    pytest.param(False, marks=pytest.mark.xfail(strict=True, reason="open mode: hosts believe every host's word, so a "
                 "rogue publisher can lift the rule (docs/protocol.md §2.8); --trusted-key closes it")),
    True], ids=["open-mode", "trusted-keys"])
async def test_a_forged_word_of_the_strict_host_never_lets_the_loose_one_admit_what_it_forbids(
    signed: bool, pulsar_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """A rogue on the broker re-announces the strict host's service and tool under its host id
    and instance, as if it had no policy (unsigned: it has not the strict host's key): the loose
    host must go on refusing."""
    async with two_hosts(pulsar_broker, tmp_path, signed) as fleet:
        await _forge_the_strict_hosts_word(fleet, pulsar_broker)


async def _forge_the_strict_hosts_word(fleet: Fleet, pulsar_broker: EmbeddedBroker) -> None:
    import pulsar

    from tghost.protocol.announcement import current_topic

    descriptor = fleet.strict.catalog.descriptors["calculator"]
    watch = fleet.loose._contest
    assert watch is not None and fleet.strict.announcer is not None
    await until(lambda: "calculator" in watch.directory.services
                and len(watch.directory.services["calculator"].providers) == 2)
    forged = []
    for key, value in fleet.strict.announcer._messages("available"):
        if value["kind"] == "tool-service":
            value = {**value, "access-policy": NO_POLICY}
        elif value["kind"] == "tool":
            value = {key: field for key, field in value.items() if key != "access"}
        forged.append((key, {**value, "lease": {**value["lease"], "sent_at": value["lease"]["sent_at"] + 1}}))
    directory, rejected = watch.directory, watch.directory.rejections.total()
    client = pulsar.asyncio.Client(pulsar_broker.url)
    try:
        producer = await client.create_producer(current_topic(fleet.strict.config.topic), batching_enabled=False)
        for key, value in forged:
            await producer.send(json.dumps(value).encode(), partition_key=key)
        await producer.close()
    finally:
        await client.close()
    # the loose host's directory reads the forgery: it rejects each message (signed), or believes it (open mode)
    await until(lambda: directory.rejections.total() >= rejected + len(forged)
                or not directory.services["calculator"].policy_mismatch, "the forgery is read", 10)
    assert set(await raw_outcomes(pulsar_broker.url, descriptor)) == {wire.UNAUTHORIZED}
