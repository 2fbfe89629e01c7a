"""fuzz_requests: fuzzing the request handler with hypothesis: the pure decoder over arbitrary input, then
payloads through the embedded broker, each of which must get exactly one well-formed reply."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tghost
from tghost.broker import EmbeddedBroker
from tghost.protocol import wire
from tghost.serving.settings import ServeSettings
from tghost.testing import LocalHost, RawWire

#: Any JSON value (NaN and infinities too: Python's json reads and writes them).
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=25,
)


def _nested(depth: int, kind: str) -> str:
    return "[" * depth + "]" * depth if kind == "list" else '{"a":' * depth + "1" + "}" * depth


deeply_nested = st.builds(_nested, st.integers(1, 50_000), st.sampled_from(["list", "object"]))
huge_strings = st.integers(10_000, 1_500_000).map(lambda n: "x" * n)

#: A field of the envelope: right (a JSON object as a string) or wrong in every way we can think of.
fields = st.one_of(
    json_values,
    json_values.map(json.dumps),
    st.dictionaries(st.text(max_size=10), json_values, max_size=4).map(json.dumps),
    deeply_nested,
    huge_strings,
    st.text(),
)
envelopes = st.fixed_dictionaries(
    {}, optional={"user": fields, "config": fields, "arguments": fields, "flow": json_values}
).map(lambda envelope: json.dumps(envelope).encode())

payloads = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda value: json.dumps(value).encode()),
    envelopes,
    deeply_nested.map(str.encode),
    st.builds(lambda depth: ('{"arguments": ' + json.dumps(_nested(depth, "object")) + "}").encode(),
              st.integers(500, 5_000)),
)


@given(payload=payloads)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_decode_request_returns_a_request_or_raises_bad_request_and_nothing_else(payload: bytes) -> None:
    try:
        request = wire.decode_request(payload)
    except wire.BadRequest as exc:
        assert str(exc)  # says what is wrong
        return
    assert isinstance(request.user, str) and request.user
    assert isinstance(request.config, dict) and isinstance(request.arguments, dict)


@given(user=st.text(min_size=1), config=st.dictionaries(st.text(), json_values),
       arguments=st.dictionaries(st.text(), json_values))
@settings(max_examples=50, deadline=None)
def test_every_well_formed_envelope_decodes_to_what_was_encoded(
    user: str, config: dict[str, Any], arguments: dict[str, Any]
) -> None:
    request = wire.decode_request(wire.encode_request(user, config, arguments))
    # NaN != NaN, so compare the JSON texts, which round-trip exactly.
    assert (request.user, json.dumps(request.config), json.dumps(request.arguments)) == (
        user, json.dumps(config), json.dumps(arguments))


class Echo(tghost.ToolService):
    """Answers its arguments back; has a schema, so fuzzed arguments meet validation too."""

    id = "fuzz-echo"
    input_schema = {"type": "object", "properties": {"text": {"type": "string"}}}  # noqa: RUF012

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        return {"user": user, "arguments": arguments}


@pytest_asyncio.fixture(scope="module")
async def served(pulsar_broker: EmbeddedBroker) -> AsyncIterator[RawWire]:
    """One host serving ``Echo`` (payload limit 1 MiB) and a raw wire to it, for all the examples."""
    echo = Echo()
    async with LocalHost(pulsar_broker.url, [echo], ServeSettings(max_payload=1024 * 1024)), \
            RawWire(pulsar_broker.url, echo.descriptor) as raw:
        yield raw


async def _next_reply(raw: RawWire) -> tuple[str | None, dict[str, Any]]:
    message = await asyncio.wait_for(raw.consumer.receive(), 20)
    await raw.consumer.acknowledge(message)
    return message.properties().get("id"), json.loads(message.data())


@given(payload=payloads)
@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
async def test_every_fuzzed_request_with_an_id_gets_exactly_one_well_formed_reply(
    served: RawWire, payload: bytes
) -> None:
    request_id = uuid.uuid4().hex
    await served.send(payload, {"id": request_id})
    # The very next reply on the topic is this one: no earlier request was answered late or twice.
    replied_to, body = await _next_reply(served)
    assert replied_to == request_id
    assert set(body) == {"error", "response", "end_of_stream"} and body["end_of_stream"] is True
    if body["error"] is None:
        assert isinstance(json.loads(body["response"])["arguments"], dict)
    else:
        assert set(body["error"]) - {"host"} == {"type", "message", "request-id"} and body["error"]["message"]
        assert body["error"]["request-id"] == request_id  # where (docs/protocol.md §2.6)
        assert body["error"]["type"] in {wire.BAD_REQUEST, wire.INVALID_ARGUMENTS, wire.TOOL_SERVICE_ERROR}


async def test_after_the_fuzzing_the_host_still_answers_a_good_request(served: RawWire) -> None:
    await served.send(wire.encode_request("alice", {}, {"text": "still here"}), {"id": "after"})
    replied_to, body = await _next_reply(served)
    assert replied_to == "after"
    assert json.loads(body["response"]) == {"user": "alice", "arguments": {"text": "still here"}}
