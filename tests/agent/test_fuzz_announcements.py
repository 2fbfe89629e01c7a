"""directory: fuzz the announcement consumer. Garbage bytes, arbitrary JSON, wrong-shape
announcements and replays of old messages never raise, are each counted once as rejected,
and never replace or remove a valid live tool. Most examples go through the pure ``_apply``
path; a few dozen go through a real topic on the embedded broker.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pulsar
import pulsar.asyncio
import pytest
import pytest_asyncio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import tghost
from tghost.agent.directory import ToolDirectory
from tghost.announcing.announcer import Announcer, HostIdentity, announcement_key
from tghost.broker import EmbeddedBroker
from tghost.discovery.discover import catalog_of
from tghost.protocol.announcement import DEFAULT_TOPIC, current_topic
from tghost.protocol.descriptors import ToolDescriptor
from tghost.protocol.trust import Signer, TrustedKeys
from tghost.pulsar.clients import PulsarSettings
from tghost.testing import LocalHost


@tghost.tool(group=["math"])
async def count(text: str) -> int:
    """Count characters."""
    return len(text)


TRUSTED = Signer(Ed25519PrivateKey.generate())
STRANGER = Signer(Ed25519PrivateKey.generate())
TOOL_KEY = announcement_key("tool", "count", "h")
DEEP = "__deep__"

# -- strategies ------------------------------------------------------------------------------

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
json_values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=4)
                           | st.dictionaries(st.text(max_size=6), kids, max_size=4), max_leaves=12)


def _is_valid_tool(descriptor: Any) -> bool:
    try:
        return ToolDescriptor.model_validate(descriptor).name == "count"
    except (ValidationError, ValueError, TypeError):
        return False


def good_descriptor() -> dict[str, Any]:
    return catalog_of([count]).tools["count"].to_json_dict()


bad_numbers = st.sampled_from([0, -1, -1e9, math.nan, math.inf, -math.inf, 86_401, 1e300, "30", None, [30]])
bad_descriptors = st.one_of(
    json_values.filter(lambda v: not isinstance(v, dict)),
    st.builds(lambda field, v: {**good_descriptor(), field: v},
              st.sampled_from(["name", "description", "service", "type", "arguments", "group", "input-schema",
                               "available_in_states"]), json_values),
    st.builds(lambda name: {**good_descriptor(), "name": name}, st.text(min_size=1, max_size=200)),
    st.just({**good_descriptor(), "description": ""}),
    st.just({**good_descriptor(), "service": "no/slashes here"}),
).filter(lambda d: not _is_valid_tool(d))
bad_leases = st.one_of(
    st.builds(lambda s: {"seconds": s, "sent_at": time.time()}, bad_numbers),  # drawn after the history: newer
    st.builds(lambda t: {"seconds": 30, "sent_at": t}, bad_numbers),
)
bad_hosts = json_values.filter(lambda v: not (isinstance(v, dict) and v.get("id") == "h"))
#: (field, garbage): replacing ``field`` of a valid tool announcement with ``garbage`` makes it invalid.
wrong_fields = st.one_of(
    st.tuples(st.just("kind"), json_values.filter(lambda v: v not in ("tool", "tool-service", "host"))),
    st.tuples(st.just("status"), json_values.filter(lambda v: v not in ("available", "withdrawn"))),
    st.tuples(st.just("name"), json_values.filter(lambda v: v != "count")),
    st.tuples(st.just("descriptor"), bad_descriptors),
    st.tuples(st.just("host"), bad_hosts),
    st.tuples(st.just("lease"), bad_leases),
    st.tuples(st.sampled_from(["kind", "name", "status"]),
              st.sampled_from([300_000, 2_000_000]).map(lambda n: "x" * n)),
)


@dataclass(frozen=True)
class Bad:
    """One bad message: how to make its bytes from the valid history, and its message key."""

    make: Callable[[list[tuple[str, dict[str, Any]]]], bytes]
    key: Callable[[list[tuple[str, dict[str, Any]]]], str]
    what: str


def _encode(value: dict[str, Any], depth: int = 0) -> bytes:
    text = json.dumps(value)
    return text.replace(json.dumps(DEEP), "[" * depth + "]" * depth).encode() if depth else text.encode()


def _resign(value: dict[str, Any], signer: str) -> dict[str, Any]:
    unsigned = {k: v for k, v in value.items() if k != "signature"}
    return {"none": unsigned, "trusted": TRUSTED.sign(unsigned, DEFAULT_TOPIC),
            "stranger": STRANGER.sign(unsigned, DEFAULT_TOPIC),
            "keep": value}[signer]


def _newest_tool(history: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    return next(value for key, value in reversed(history) if key == TOOL_KEY)


def _wrong_shape(field: str, garbage: Any, signer: str) -> Bad:
    def make(history: list[tuple[str, dict[str, Any]]]) -> bytes:
        value = _newest_tool(history)
        newer = {**value, "lease": {**value["lease"], "sent_at": value["lease"]["sent_at"] + 1}}
        return _encode(_resign({**newer, field: garbage}, signer))
    return Bad(make, lambda _: TOOL_KEY, f"{field}={str(garbage)[:60]!r} signed {signer}")


def _deep(where: str, depth: int, signer: str) -> Bad:
    def make(history: list[tuple[str, dict[str, Any]]]) -> bytes:
        value = _newest_tool(history)
        newer = {**value, "lease": {**value["lease"], "sent_at": value["lease"]["sent_at"] + 1}}
        if where == "descriptor":
            newer["descriptor"] = {**newer["descriptor"], "collection": DEEP}
        else:
            newer[where] = DEEP
        return _encode(_resign(newer, signer), depth)
    return Bad(make, lambda _: TOOL_KEY, f"{where} nested {depth} deep, signed {signer}")


def _replay(index: int, shift: float, signer: str) -> Bad:
    def pick(history: list[tuple[str, dict[str, Any]]]) -> tuple[str, dict[str, Any]]:
        return history[index % len(history)]

    def make(history: list[tuple[str, dict[str, Any]]]) -> bytes:
        value = pick(history)[1]
        older = {**value, "lease": {**value["lease"], "sent_at": value["lease"]["sent_at"] - shift}}
        return _encode(older if shift == 0 else _resign(older, signer))
    return Bad(make, lambda history: pick(history)[0], f"replay of message {index} shifted by -{shift}s")


def _misfiled(name: str, host: str, signer: str) -> Bad:
    """A well-formed announcement of another tool or host, sent under the live tool's key
    (compaction would let it erase the live tool's entry)."""
    def make(history: list[tuple[str, dict[str, Any]]]) -> bytes:
        value = _newest_tool(history)
        other = {**value, "name": name, "host": {**value["host"], "id": host},
                 "descriptor": {**value["descriptor"], "name": name},
                 "lease": {**value["lease"], "sent_at": value["lease"]["sent_at"] + 1}}
        return _encode(_resign(other, signer))
    return Bad(make, lambda _: TOOL_KEY, f"tool {name!r} of host {host!r} under key {TOOL_KEY!r}")


def _raw(data: bytes, what: str) -> Bad:
    return Bad(lambda _: data, lambda _: TOOL_KEY, what)


signers = st.sampled_from(["none", "trusted", "stranger", "keep"])
bad_messages = st.one_of(
    st.binary(max_size=200).map(lambda b: _raw(b, f"bytes {b[:40]!r}")),
    json_values.map(lambda v: _raw(json.dumps(v).encode(), f"json {str(v)[:60]}")),
    st.builds(lambda fv, s: _wrong_shape(fv[0], fv[1], s), wrong_fields, signers),
    st.builds(lambda lease, s: _wrong_shape("lease", lease, s), bad_leases, signers),
    st.builds(_misfiled, st.from_regex(r"\A[a-z][a-z0-9-]{0,20}\Z"), st.sampled_from(["h", "h2"]), signers).filter(
        lambda bad: "'count' of host 'h' " not in bad.what),
    st.builds(_deep, st.sampled_from(["descriptor", "plugin", "host", "lease"]),
              st.integers(min_value=33, max_value=3000), signers),
    st.builds(_replay, st.integers(min_value=0, max_value=50), st.sampled_from([0.0, 0.001, 1.0, 1e6]), signers),
)

# -- the pure path -------------------------------------------------------------------------


def history(signer: Signer | None) -> list[tuple[str, dict[str, Any]]]:
    """What a host serving ``count`` published: its first announcement, then two heartbeats."""
    announcer = Announcer(catalog_of([count]), HostIdentity("h", "localhost", os.getpid()), lease=30.0,
                          signer=signer)
    sent = list(announcer._messages("available"))
    for _ in range(2):
        time.sleep(0.001)
        sent.append(announcer._message("host", "h", None, None, "available"))
    return sent


def live_directory(trusted: bool, sent: list[tuple[str, dict[str, Any]]]) -> ToolDirectory:
    found = ToolDirectory(PulsarSettings("pulsar://127.0.0.1:1"), DEFAULT_TOPIC,
                          trusted=TrustedKeys([TRUSTED.public_key]) if trusted else None)
    for key, value in sent:
        found._resolve(found._apply(json.dumps(value).encode(), time.time(), key), "removed")
    assert "count" in found.tools and found.rejected == 0
    return found


SENT = {"open": history(None), "trusted": history(TRUSTED)}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mode=st.sampled_from(["open", "trusted"]), bad=st.lists(bad_messages, min_size=1, max_size=4))
def test_bad_messages_are_counted_and_never_touch_the_live_tool(mode: str, bad: list[Bad]) -> None:
    sent = SENT[mode]
    found = live_directory(mode == "trusted", sent)
    tool, service = found.tools["count"], found.services["count"]
    lease = found.hosts["h"].expires_at
    for n, message in enumerate(bad, start=1):
        dirty = found._apply(message.make(sent), time.time(), message.key(sent))
        found._resolve(dirty, "removed")
        assert found.rejected == n, message.what
    assert found.tools == {"count": tool} and found.services == {"count": service}
    assert found.hosts["h"].expires_at == lease  # no replay renewed the lease


# -- through a real topic ------------------------------------------------------------------


@dataclass
class Live:
    found: ToolDirectory
    producer: pulsar.asyncio.Producer
    sent: list[tuple[str, dict[str, Any]]]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def live(pulsar_broker: EmbeddedBroker) -> AsyncIterator[Live]:
    """A host announcing ``count`` on a fresh topic, a directory following it, a producer for
    bad messages, and the messages the host really published (read back from the topic)."""
    topic = f"persistent://tg/config/fuzz-{uuid.uuid4().hex[:8]}"
    async with LocalHost(pulsar_broker.url, [count], announce_as="h", topic=topic) as host:
        assert host.client is not None
        reader = await host.client.create_reader(current_topic(topic), pulsar.MessageId.earliest)
        sent = []
        while await reader.has_message_available():
            message = await reader.read_next()
            sent.append((message.partition_key(), json.loads(message.data())))
        await reader.close()
        found = await ToolDirectory(PulsarSettings(pulsar_broker.url), topic).start()
        producer = await host.client.create_producer(current_topic(topic), batching_enabled=False)
        try:
            yield Live(found, producer, sent)
        finally:
            await found.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=bad_messages)
async def test_bad_messages_on_the_topic_are_counted_and_the_tool_still_answers(live: Live, bad: Bad) -> None:
    found = live.found
    tool, before = found.tools["count"], found.rejected
    await live.producer.send(bad.make(live.sent), partition_key=bad.key(live.sent))
    async with asyncio.timeout(10):
        while found.rejected == before:
            await asyncio.sleep(0.01)
    assert found.rejected == before + 1, bad.what
    assert found.tools["count"] == tool and list(found.tools) == ["count"]
    assert await found.invoke("count", {"text": "abc"}, groups=["math"]) == "3"


@pytest.mark.parametrize("depth", [100, 100_000])
def test_json_too_deep_for_the_parser_is_rejected_not_raised(depth: int) -> None:
    found = live_directory(False, SENT["open"])
    data = b'{"kind": ' + b"[" * depth + b"]" * depth + b"}"
    found._resolve(found._apply(data, time.time(), TOOL_KEY), "removed")
    assert found.rejections == {"invalid": 1} and "count" in found.tools
