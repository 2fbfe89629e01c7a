"""access: a host's ``[access]`` policy on the embedded broker (docs/guides/security.md "Who may call what"):
anonymous callers and signed ones allowed and refused, a tampered body, a replay and a stale
signature refused, a rate exceeded, and the verified caller reaching the tool and the call
records. Nothing refused reaches ``invoke``."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

import tghost
from tests.conftest import live_tools, tghost_cli, until
from tests.test_docs import block
from tghost.adapters.inspector.views import snapshot
from tghost.agent.client import ToolCallError, ToolServiceClient
from tghost.agent.directory import ToolDirectory
from tghost.broker import EmbeddedBroker
from tghost.conformance import RawWire
from tghost.discovery.config import load_access
from tghost.discovery.discover import catalog_of
from tghost.operate.audit import audit_entry
from tghost.operate.metrics import HostMetrics
from tghost.protocol import wire
from tghost.protocol.access import AccessPolicy
from tghost.protocol.callers import CALLER, sign_request
from tghost.protocol.sessions import CallerSession, HostSessionKey
from tghost.protocol.trust import Signer, write_key_pair
from tghost.pulsar.clients import PulsarSettings
from tghost.serving.request import CallRecord
from tghost.testing import LocalHost

INVOKED: list[str] = []


@tghost.tool
def tell_joke(topic: str) -> str:
    """Tell a joke on a topic."""
    INVOKED.append("tell-joke")
    return f"a joke about {topic}"


@tghost.tool
def calculate(expression: str, ctx: tghost.Context) -> str:
    """Calculate, saying for whom."""
    INVOKED.append("calculate")
    return f"{expression} for {ctx.caller.name if ctx.caller else 'anonymous'}"


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Signer]:
    """Caller keys: alice and bob are in the policy (bob without tools), mallory is not."""
    found = {}
    for name in ("alice", "bob", "mallory"):
        pair = write_key_pair(tmp_path / "keys" / name)
        found[name] = Signer.from_file(pair.private)
    return found


@pytest.fixture
async def host(pulsar_broker: EmbeddedBroker, tmp_path: Path, keys: dict[str, Signer]) -> AsyncIterator[LocalHost]:
    catalog = catalog_of([tell_joke, calculate])
    catalog.access = AccessPolicy.from_table({
        "anonymous": ["tell-joke"],
        "callers": {"alice": {"public-key": "keys/alice.pub", "tools": ["calculate"], "rate": "5/minute"},
                    "bob": {"public-key": "keys/bob.pub"}},
    }, tmp_path)
    records: list[CallRecord] = []
    async with LocalHost(pulsar_broker.url, catalog, listeners=[records.append]) as started:
        started.records = records  # type: ignore[attr-defined]
        INVOKED.clear()
        yield started


async def call(host: LocalHost, tool: str, arguments: dict[str, Any], identity: Signer | None = None) -> str:
    """The observation, or the error type of the reply."""
    descriptor = host.descriptors[tool]
    assert host.client is not None
    async with ToolServiceClient(host.client, descriptor.request_queue, descriptor.response_queue,
                                 identity=identity) as caller:
        try:
            return await caller.call({}, arguments, timeout=10)
        except ToolCallError as exc:
            return exc.error_type


async def test_anonymous_callers_get_the_anonymous_tools_only(host: LocalHost) -> None:
    assert await call(host, "tell-joke", {"topic": "cats"}) == "a joke about cats"
    assert await call(host, "calculate", {"expression": "1+1"}) == wire.UNAUTHORIZED
    assert INVOKED == ["tell-joke"]


async def test_a_signed_caller_gets_its_tools_and_the_anonymous_ones_and_the_tool_learns_who(
    host: LocalHost, keys: dict[str, Signer]
) -> None:
    assert await call(host, "calculate", {"expression": "1+1"}, keys["alice"]) == "1+1 for alice"
    assert await call(host, "tell-joke", {"topic": "dogs"}, keys["alice"]) == "a joke about dogs"
    assert await call(host, "calculate", {"expression": "2"}, keys["bob"]) == wire.UNAUTHORIZED
    assert await call(host, "calculate", {"expression": "3"}, keys["mallory"]) == wire.UNAUTHORIZED
    assert INVOKED == ["calculate", "tell-joke"]
    await until(lambda: len(host.records) == 4, "every call is recorded")  # type: ignore[attr-defined]  # after its reply
    callers = sorted((r.status, r.caller.name if r.caller else "") for r in host.records)  # type: ignore[attr-defined]
    assert callers == [("ok", "alice"), ("ok", "alice"), (wire.UNAUTHORIZED, ""), (wire.UNAUTHORIZED, "")]


async def test_a_tampered_body_a_replay_and_a_stale_signature_are_refused_and_summarised_in_the_log(
    host: LocalHost, keys: dict[str, Signer], caplog: pytest.LogCaptureFixture
) -> None:
    descriptor = host.descriptors["calculate"]
    body = wire.encode_request("u", {}, {"expression": "6*7"})
    async with RawWire(host.pulsar.url, descriptor) as raw:
        def signed(data: bytes, request_id: str, when: float) -> dict[str, str]:
            return {"id": request_id, **sign_request(keys["alice"], data, request_id, descriptor.request_queue, when)}

        good = signed(body, "good", time.time())
        await raw.send(body, good)
        await raw.send(body, good)  # the same request again: a replay
        tampered = signed(body, "tampered", time.time())
        await raw.send(wire.encode_request("u", {}, {"expression": "666"}), tampered)
        await raw.send(body, signed(body, "stale", time.time() - 120))
        outcomes = {rid: (await raw.replies(rid))[0][1]["error"] for rid in ("tampered", "stale")}
        replies = [reply.json() for reply in await raw.raw_replies("good", settle=0.5, ends=2)]
    [replayed] = [reply["error"] for reply in replies if reply["error"]]
    assert [reply["response"] for reply in replies if not reply["error"]] == ["6*7 for alice"]
    assert replayed["type"] == wire.UNAUTHORIZED and "already received (a replay)" in replayed["message"]
    assert outcomes["tampered"]["type"] == wire.UNAUTHORIZED and "does not verify" in outcomes["tampered"]["message"]
    assert outcomes["stale"]["type"] == wire.UNAUTHORIZED and "more than 60s" in outcomes["stale"]["message"]
    assert INVOKED == ["calculate"]
    summaries = [r.getMessage() for r in caplog.records if "under this host's [access] policy" in r.getMessage()]
    assert len(summaries) <= 1 and not [r for r in caplog.records if r.exc_info]  # no traceback, no line per refusal


async def test_a_caller_over_its_rate_is_answered_rate_limited_saying_when_to_retry(
    host: LocalHost, keys: dict[str, Signer]
) -> None:
    outcomes = [await call(host, "calculate", {"expression": str(i)}, keys["alice"]) for i in range(6)]
    assert outcomes[:5] == [f"{i} for alice" for i in range(5)] and outcomes[5] == wire.RATE_LIMITED
    descriptor = host.descriptors["calculate"]
    assert host.client is not None
    async with ToolServiceClient(host.client, descriptor.request_queue, descriptor.response_queue,
                                 identity=keys["alice"]) as caller:
        with pytest.raises(ToolCallError, match=r"over its rate of 5/minute on this host; retry in \d+\.\ds"):
            await caller.call({}, {"expression": "7"})
    assert len(INVOKED) == 5


def test_an_access_table_naming_a_missing_key_or_a_bad_rate_says_where(tmp_path: Path) -> None:
    from tghost.protocol.access import AccessError

    with pytest.raises(AccessError, match=r"\[access\] callers.x.public-key: cannot read the caller.s public key"):
        AccessPolicy.from_table({"callers": {"x": {"public-key": "nope.pub"}}}, tmp_path)
    write_key_pair(tmp_path / "k")
    with pytest.raises(AccessError, match=r"\[access\]: callers.x.rate: .*'often' is not a rate"):
        AccessPolicy.from_table({"callers": {"x": {"public-key": "k.pub", "rate": "often"}}}, tmp_path)
    with pytest.raises(AccessError, match=r"\[access\]: anonymus: Extra inputs are not permitted"):
        AccessPolicy.from_table({"anonymus": ["x"]}, tmp_path)


# -- what the directory shows each caller, and who else calls ---------------------------------


@pytest.fixture
async def announced(pulsar_broker: EmbeddedBroker, tmp_path: Path,
                    keys: dict[str, Signer]) -> AsyncIterator[tuple[LocalHost, str]]:
    """A host with the policy above announcing on a fresh topic; gives it and the topic."""
    topic = f"persistent://tg/config/access-{uuid.uuid4().hex[:8]}"
    catalog = catalog_of([tell_joke, calculate])
    catalog.access = AccessPolicy.from_table({
        "anonymous": ["tell-joke"],
        "callers": {"alice": {"public-key": "keys/alice.pub", "tools": ["calculate"]},
                    "bob": {"public-key": "keys/bob.pub"}},
    }, tmp_path)
    records: list[CallRecord] = []
    metrics = HostMetrics()
    async with LocalHost(pulsar_broker.url, catalog, announce_as="guarded", topic=topic,
                         listeners=[metrics.calls, records.append]) as started:  # a record: the metrics have it too
        started.records = records  # type: ignore[attr-defined]
        started.metrics = metrics  # type: ignore[attr-defined]
        yield started, topic


async def test_the_directory_lists_each_caller_the_tools_its_hosts_admit_it_to(
    pulsar_broker: EmbeddedBroker, announced: tuple[LocalHost, str], keys: dict[str, Signer]
) -> None:
    host, topic = announced
    listed = {}
    for name in (None, "alice", "bob"):
        identity = keys[name] if name else None
        async with ToolDirectory(PulsarSettings(pulsar_broker.url), topic, identity=identity) as found:
            await found.wait_for("calculate")
            listed[name] = [tool.name for tool in found.available(["*"])]
            if name == "alice":
                assert await found.invoke("calculate", {"expression": "2+2"}) == "2+2 for alice"
            else:
                with pytest.raises(ToolCallError) as refused:
                    await found.invoke("calculate", {"expression": "2+2"})
                assert refused.value.error_type == wire.UNAUTHORIZED and "its hosts admit" in refused.value.message
    assert listed == {None: ["tell-joke"], "alice": ["calculate", "tell-joke"], "bob": ["tell-joke"]}
    await until(lambda: host.records, "the call is recorded")  # type: ignore[attr-defined]  # after its reply
    entry = audit_entry(host.records[0])  # type: ignore[attr-defined]
    assert entry["caller"] == {"name": "alice", "key_id": keys["alice"].key_id} and entry["status"] == "ok"
    scraped = generate_latest(host.metrics.registry).decode()  # type: ignore[attr-defined]
    assert 'tghost_caller_invocations_total{caller="alice",service="calculate",status="ok"} 1.0' in scraped


async def test_tghost_tools_lists_an_identitys_tools_and_all_of_them_with_who_may_call_them(
    pulsar_broker: EmbeddedBroker, announced: tuple[LocalHost, str], keys: dict[str, Signer], tmp_path: Path
) -> None:
    _, topic = announced
    env = {**os.environ, "TGHOST_PULSAR_URL": pulsar_broker.url, "TGHOST_DESCRIPTORS_TOPIC": topic}
    anonymous = await asyncio.to_thread(live_tools, env)
    alice = await asyncio.to_thread(live_tools, {**env, "TGHOST_IDENTITY": str(tmp_path / "keys" / "alice.key")})
    everything = await asyncio.to_thread(tghost_cli, "tools", "--all", env=env)
    assert sorted(anonymous) == ["tell-joke"] and sorted(alice) == ["calculate", "tell-joke"]
    assert re.search(r"^calculate\s.*\salice$", everything.stdout, re.M), everything.stdout  # the policy's names
    assert re.search(r"^tell-joke\s.*\sanonymous,", everything.stdout, re.M), everything.stdout
    called = await asyncio.to_thread(tghost_cli, "call", "calculate", "expression=1", "--identity",
                                     str(tmp_path / "keys" / "alice.key"), env=env)
    assert (called.returncode, called.stdout) == (0, "1 for alice\n"), called.stderr


async def test_trustgraphs_own_client_calls_an_anonymous_tool(pulsar_broker: EmbeddedBroker, host: LocalHost) -> None:
    base = pytest.importorskip("trustgraph.base.request_response_client", reason="trustgraph-base is not installed")
    backend_module = pytest.importorskip("trustgraph.base.async_pulsar_backend")
    schema = pytest.importorskip("trustgraph.schema")
    descriptor = host.descriptors["tell-joke"]
    backend = backend_module.AsyncPulsarBackend(pulsar_broker.url)
    client = await base.RequestResponseClient.create(
        backend=backend, request_topic=descriptor.request_queue, response_topic=descriptor.response_queue,
        request_schema=schema.ToolServiceRequest, response_schema=schema.ToolServiceResponse)
    try:
        joke = await client.request(schema.ToolServiceRequest(config="{}", arguments=json.dumps({"topic": "tg"})),
                                    timeout=10)
    finally:
        await client.close()
    assert joke.error is None and joke.response == "a joke about tg"
    assert INVOKED == ["tell-joke"]


@pytest.mark.parametrize(("table", "says"), [
    ('anonymous = ["nope"]\n', "[access] names tool(s) ['nope'] that this host does not serve"),
    ('[callers.x]\npublic-key = "missing.pub"\n', "[access] callers.x.public-key: cannot read the caller's public key"),
    ('[callers.x]\npublic-key = "k.pub"\nrate = "often"\n', "[access]: callers.x.rate: Value error, 'often' is not"),
])
def test_tghost_run_with_a_bad_access_table_exits_1_naming_the_file_table_and_field(
    tmp_path: Path, table: str, says: str
) -> None:
    write_key_pair(tmp_path / "k")
    config = tmp_path / "tools.toml"
    config.write_text("[access]\n" + table.replace("[callers", "[access.callers"))
    result = tghost_cli("run", "--config", str(config), "--pulsar-url", "pulsar://127.0.0.1:1",
                        env={**os.environ, "TGHOST_LOAD_PLUGINS": "joke"})
    assert result.returncode == 1, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert str(config) in line and says in line, line


async def test_the_readme_access_table_is_what_tghost_run_serves_under(
    pulsar_broker: EmbeddedBroker, tmp_path: Path, host_process: Any
) -> None:
    config = tmp_path / "access.toml"
    config.write_text(block("docs/guides/security.md", "# access.toml"))
    keygen = tghost_cli("keygen", "--out", str(tmp_path / "keys" / "alice"))
    assert keygen.returncode == 0, keygen.stderr
    env = {**os.environ, "TGHOST_PULSAR_URL": pulsar_broker.url, "TGHOST_LOAD_PLUGINS": "joke,calculator",
           "TGHOST_DESCRIPTORS_TOPIC": f"persistent://tg/config/readme-{uuid.uuid4().hex[:8]}"}
    host = host_process("--config", str(config), env=env)
    await asyncio.to_thread(host.wait_for, "announced")
    alice = {**env, "TGHOST_IDENTITY": str(tmp_path / "keys" / "alice.key")}
    outcomes = [await asyncio.to_thread(tghost_cli, "call", *args, env=who) for who, args in [
        (env, ("tell-joke", "topic=cats")), (env, ("calculate", "expression=6*7")),
        (alice, ("calculate", "expression=6*7"))]]
    assert [o.returncode for o in outcomes] == [0, 1, 0], [o.stderr for o in outcomes]
    assert "unauthorized" in outcomes[1].stderr and outcomes[2].stdout.strip() == "42"
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0


# -- access by tool: a request is allowed only to a caller granted every tool it could be for ------


class Jester(tghost.ToolService):
    """One service, two tools over it: ``joke-plain`` (no config values) and ``joke-knock``
    (``style = "knock-knock"``); a request carrying that style could be for either."""

    id = "jester"
    description = "Tells a joke in the style its config asks for."
    config_params = ("style",)
    arguments = (tghost.Argument(name="topic", type="string", description="What about."),)

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        INVOKED.append(str(config.get("style", "plain")))
        return f"a {config.get('style', 'plain')} joke about {arguments['topic']}"


def jester_catalog(tmp_path: Path, table: dict[str, Any], twin: bool = False) -> Any:
    """joke-plain (no config values) and joke-knock (style = "knock-knock") over one service;
    ``twin`` adds joke-door, with joke-knock's config values."""
    jester = Jester()
    tools = [jester.tool("joke-plain", "Tell a joke"),
             jester.tool("joke-knock", "Tell a knock-knock joke", style="knock-knock")]
    if twin:
        tools.append(jester.tool("joke-door", "Tell a joke at the door", style="knock-knock"))
    catalog = catalog_of([jester], tools)
    catalog.access = AccessPolicy.from_table(table, tmp_path)
    return catalog


#: The trial's policy: anyone may call joke-plain, alice alone joke-knock.
PAIR = {"anonymous": ["joke-plain"], "callers": {"alice": {"public-key": "keys/alice.pub", "tools": ["joke-knock"]}}}
#: With the twin joke-door bob's alone: alice's joke-knock request is for joke-door too (the same
#: config values), so she may not call joke-knock, nor bob joke-door.
CROSSED = {"callers": {"alice": {"public-key": "keys/alice.pub", "tools": ["joke-knock"]},
                       "bob": {"public-key": "keys/bob.pub", "tools": ["joke-door"]}}}


async def test_no_anonymous_request_guessing_a_restricted_tools_config_runs(
    pulsar_broker: EmbeddedBroker, tmp_path: Path, keys: dict[str, Signer]
) -> None:
    async with LocalHost(pulsar_broker.url, jester_catalog(tmp_path, PAIR)) as host:
        INVOKED.clear()
        descriptor = host.descriptors["jester"]
        guesses = [{"style": "knock-knock"}, {"style": "knock-knock", "topic": "x"}, {"style": "pun"},
                   {"style": "Knock-Knock"}, {"style": None}]  # the restricted tool's values, or any other style
        async with RawWire(host.pulsar.url, descriptor) as raw:
            for i in range(30):
                await raw.send(wire.encode_request("u", guesses[i % 5], {"topic": "doors"}), {"id": f"guess-{i}"})
            errors = [(await raw.replies(f"guess-{i}"))[-1][1]["error"] for i in range(30)]
        assert INVOKED == []  # 0 of 30 ran
        assert {e["type"] for e in errors} == {wire.UNAUTHORIZED}
        assert errors[0]["message"] == ("anonymous may not call tool 'joke-knock' on this host (its [access] "
                                        "policy); sign requests with a caller key (--identity)")
        assert errors[2]["message"] == (
            "anonymous may not call service 'jester' with these config values on this host: no tool of its has "
            "them; send one tool's own config values and no other tool's (tghost tools --json shows them)")
        assert host.client is not None
        async with ToolServiceClient(host.client, descriptor.request_queue, descriptor.response_queue) as anonymous:
            assert await anonymous.call({}, {"topic": "cats"}, timeout=10) == "a plain joke about cats"
        async with ToolServiceClient(host.client, descriptor.request_queue, descriptor.response_queue,
                                     identity=keys["alice"]) as alice:
            knock = await alice.call({"style": "knock-knock"}, {"topic": "doors"}, timeout=10)
        assert knock == "a knock-knock joke about doors" and INVOKED == ["plain", "knock-knock"]


async def test_a_tool_is_listed_and_called_only_by_callers_granted_every_tool_its_request_could_be_for(
    pulsar_broker: EmbeddedBroker, tmp_path: Path, keys: dict[str, Signer]
) -> None:
    """With ``PAIR`` anonymous callers see joke-plain and alice both; with ``CROSSED`` alice's
    joke-knock request could be bob's joke-plain, so nobody may call joke-knock: the directory,
    ``tghost tools --all`` and the inspector say so, and alice's call is refused."""
    listed: dict[tuple[str, str | None], list[str]] = {}
    for name, table in (("pair", PAIR), ("crossed", CROSSED)):
        topic = f"persistent://tg/config/access-{uuid.uuid4().hex[:8]}"
        catalog = jester_catalog(tmp_path, table, twin=table is CROSSED)
        async with LocalHost(pulsar_broker.url, catalog, announce_as=name, topic=topic) as host:
            INVOKED.clear()
            for who in (None, "alice", "bob"):
                async with ToolDirectory(PulsarSettings(pulsar_broker.url), topic,
                                         identity=keys[who] if who else None) as found:
                    await found.wait_for("joke-knock")
                    listed[name, who] = [tool.name for tool in found.available(["*"])]
                    admitted = [t["name"] for t in snapshot(found, time.time())["tools"] if t["admitted"]]
                    assert admitted == listed[name, who], (name, who)  # the inspector agrees
                    for tool in listed[name, who]:  # each tool listed is one the caller's call runs
                        assert (await found.invoke(tool, {"topic": "x"})).startswith("a "), (name, who, tool)
            env = {**os.environ, "TGHOST_PULSAR_URL": pulsar_broker.url, "TGHOST_DESCRIPTORS_TOPIC": topic}
            everything = await asyncio.to_thread(tghost_cli, "tools", "--all", env=env)
            if name == "crossed":
                assert re.search(r"^joke-knock\s.*\snobody$", everything.stdout, re.M), everything.stdout
                descriptor = host.descriptors["jester"]
                assert host.client is not None
                async with ToolServiceClient(host.client, descriptor.request_queue, descriptor.response_queue,
                                             identity=keys["alice"]) as alice:
                    with pytest.raises(ToolCallError, match=r"caller 'alice' may not call tool 'joke-door'"):
                        await alice.call({"style": "knock-knock"}, {"topic": "x"}, timeout=10)
                assert INVOKED == []  # nobody's joke-knock or joke-door
    assert listed == {("pair", None): ["joke-plain"], ("pair", "alice"): ["joke-knock", "joke-plain"],
                      ("pair", "bob"): [],  # a key the host does not know is refused every tool there
                      ("crossed", None): [], ("crossed", "alice"): [], ("crossed", "bob"): []}


def test_a_grant_the_rule_voids_is_a_warning_naming_the_tool_who_and_what_to_do(
    tmp_path: Path, keys: dict[str, Signer], caplog: pytest.LogCaptureFixture
) -> None:
    for table in (PAIR, CROSSED):
        catalog = jester_catalog(tmp_path, {}, twin=table is CROSSED)
        load_access(catalog, tmp_path / "tools.toml", {"access": table})
    knock, door = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]  # CROSSED's alone
    assert "tool 'joke-door' is granted to bob" in door and "is for joke-knock too" in door
    assert knock == (
        f"{tmp_path / 'tools.toml'}: [access]: tool 'joke-knock' is granted to alice, who may not call it all the "
        "same: a request for it is for joke-door too (the same config values over its service), which they are not "
        "granted; grant them that too, or give the tools different config values")


# -- caller sessions: one Ed25519 check per session, an HMAC per request (docs/protocol.md §2.9) ----


def session_properties(session: CallerSession, body: bytes, request_id: str, topic: str, host_keys: list[str],
                       when: float | None = None) -> dict[str, str]:
    return {"id": request_id, **session.properties(body, request_id, topic, when or time.time(), host_keys)}


async def test_a_session_request_is_checked_by_its_mac_and_a_tamper_replay_stale_or_forged_binding_is_refused(
    host: LocalHost, keys: dict[str, Signer]
) -> None:
    descriptor, gate = host.descriptors["calculate"], host.server.gate
    assert gate is not None
    topic, mine = descriptor.request_queue, [gate.session.public]
    body = wire.encode_request("u", {}, {"expression": "6*7"})
    alice = CallerSession(keys["alice"], time.time())
    forged = CallerSession(keys["mallory"], time.time())  # mallory's binding, claiming to be alice
    forged._binding = {**forged._binding, CALLER: keys["alice"].key_id}
    async with RawWire(host.pulsar.url, descriptor) as raw:
        good = session_properties(alice, body, "good", topic, mine)
        sent = {"good": (body, good), "replay": (body, good),
                "tampered": (wire.encode_request("u", {}, {"expression": "666"}),
                             session_properties(alice, body, "tampered", topic, mine)),
                "stale": (body, session_properties(alice, body, "stale", topic, mine, time.time() - 120)),
                "forged": (body, session_properties(forged, body, "forged", topic, mine)),
                "expired": (body, session_properties(CallerSession(keys["alice"], time.time() - 7200), body,
                                                     "expired", topic, mine))}
        for name, (payload, properties) in sent.items():
            if name != "replay":
                await raw.send(payload, properties)
        await raw.send(body, good)  # the same request again: a replay
        outcomes = {rid: (await raw.replies(rid))[0][1] for rid in ("tampered", "stale", "forged", "expired")}
        replies = [reply.json() for reply in await raw.raw_replies("good", settle=0.5, ends=2)]
    assert [r["response"] for r in replies if not r["error"]] == ["6*7 for alice"]
    assert ["already received (a replay)" in r["error"]["message"] for r in replies if r["error"]] == [True]
    says = {"tampered": "MAC does not verify", "stale": "more than 60s", "forged": "binding does not verify",
            "expired": "session expired"}
    for name, text in says.items():
        error = outcomes[name]["error"]
        assert error["type"] == wire.UNAUTHORIZED and text in error["message"], (name, error)
    assert INVOKED == ["calculate"] and gate.open_sessions == 1


async def test_a_session_request_without_a_mac_for_the_host_is_resent_signed_and_answered(
    host: LocalHost, keys: dict[str, Signer]
) -> None:
    """A host the caller did not know yet (its key is not among those it MACs for) answers
    ``unknown-session`` before anything runs; once the caller learns the host (its directory
    reads the host's announcement), it checks that answer and resends the request signed."""
    descriptor, gate = host.descriptors["calculate"], host.server.gate
    assert gate is not None
    elsewhere = [HostSessionKey().public]  # another host's key: the request has no MAC for this one
    learned = iter([elsewhere])  # what the caller knows when it sends; then it learns this host

    def host_keys() -> list[str]:
        return next(learned, [*elsewhere, gate.session.public])

    assert host.client is not None
    async with ToolServiceClient(host.client, descriptor.request_queue, descriptor.response_queue,
                                 identity=keys["alice"], host_keys=host_keys) as caller:
        assert await caller.call({}, {"expression": "1+2"}, timeout=10) == "1+2 for alice"
    await until(lambda: len(host.records) == 2, "both answers are recorded")  # type: ignore[attr-defined]  # after the reply
    statuses = sorted(r.status for r in host.records)  # type: ignore[attr-defined]  # each told by its thread
    assert INVOKED == ["calculate"] and statuses == ["ok", wire.UNKNOWN_SESSION]


async def test_a_directory_calls_in_sessions_with_the_hosts_that_announce_a_session_key(
    pulsar_broker: EmbeddedBroker, announced: tuple[LocalHost, str], keys: dict[str, Signer]
) -> None:
    host, topic = announced
    assert host.server.gate is not None
    async with ToolDirectory(PulsarSettings(pulsar_broker.url), topic, identity=keys["alice"]) as found:
        await found.wait_for("calculate")
        service = found.tools["calculate"].service.descriptor.id
        assert found.calls.session_keys(service) == [host.server.gate.session.public]
        for i in range(3):
            assert await found.invoke("calculate", {"expression": str(i)}) == f"{i} for alice"
    assert host.server.gate.open_sessions == 1  # one binding verified for three calls


def test_a_rate_is_counted_from_many_threads_at_once(tmp_path: Path, keys: dict[str, Signer]) -> None:
    """Checks run on several threads at once (the thread lane; a claim's wait): limits' memory
    storage raised 'threads can only be started once' when two first hits met."""
    policy = AccessPolicy.from_table({"callers": {"alice": {"public-key": "keys/alice.pub", "rate": "1000/minute"}}},
                                     tmp_path)
    grant, failed, interval = policy.callers[keys["alice"].key_id], [], sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often, as under load
    try:
        meet(policy, grant, failed)
    finally:
        sys.setswitchinterval(interval)
    assert failed == []


def meet(policy: AccessPolicy, grant: Any, failed: list[Exception]) -> None:
    """Eight threads at once make each of 500 new gates' first hits."""
    import threading

    from tghost.serving.access import Gate

    for _ in range(500):
        gate, start = Gate(policy, {}), threading.Barrier(8)

        def hit(gate: Gate = gate, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                gate._within_rate(grant)
            except Exception as exc:
                failed.append(exc)

        threads = [threading.Thread(target=hit) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
