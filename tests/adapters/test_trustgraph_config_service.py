"""trustgraph.config_service: the bytes tghost puts on the config service's queues are the bytes
trustgraph-base 2.11 puts there, its queue ids map to the same topics, and its responses and
pushes decode. The round trip with the config service itself is tests/adapters/test_trustgraph_interop.py."""

from __future__ import annotations

import json

import pytest

from tghost.adapters.trustgraph.config_service import (
    PUSH_QUEUE,
    REQUEST_QUEUE,
    RESPONSE_QUEUE,
    ConfigPush,
    ConfigResponse,
    encode_request,
    pulsar_topic,
)

schema = pytest.importorskip("trustgraph.schema", reason="trustgraph-base 2.11 is not installed here")
serialization = pytest.importorskip("trustgraph.base.serialization", reason="trustgraph-base 2.11 is not installed")
backend = pytest.importorskip("trustgraph.base.async_pulsar_backend", reason="trustgraph-base 2.11 is not installed")


def trustgraph_bytes(message: object) -> bytes:
    """What trustgraph-base's Pulsar producer sends for ``message`` (AsyncPulsarProducer.send)."""
    return json.dumps(serialization.dataclass_to_dict(message)).encode("utf-8")


def test_requests_are_byte_for_byte_trustgraph_bases() -> None:
    key, value = schema.ConfigKey, schema.ConfigValue
    assert encode_request("list", "default", type="tool") == trustgraph_bytes(
        schema.ConfigRequest(operation="list", workspace="default", type="tool"))
    assert encode_request("get", "ws", keys=[("tool", "a"), ("tool-service", "b")]) == trustgraph_bytes(
        schema.ConfigRequest(operation="get", workspace="ws", keys=[key(type="tool", key="a"),
                                                                    key(type="tool-service", key="b")]))
    assert encode_request("put", "default", values={("tool", "ask"): '{"name": "ask"}'}) == trustgraph_bytes(
        schema.ConfigRequest(operation="put", workspace="default",
                             values=[value(type="tool", key="ask", value='{"name": "ask"}')]))
    assert encode_request("delete", "default", keys=[("tool", "ask")]) == trustgraph_bytes(
        schema.ConfigRequest(operation="delete", workspace="default", keys=[key(type="tool", key="ask")]))


def test_responses_and_pushes_as_trustgraph_base_sends_them_decode() -> None:
    response = ConfigResponse.model_validate_json(trustgraph_bytes(schema.ConfigResponse(
        version=7, values=[schema.ConfigValue(type="tool", key="ask", value="{}")], directory=["ask"])))
    assert (response.version, response.directory, response.error) == (7, ["ask"], None)
    assert [(v.type, v.key, v.value) for v in response.values] == [("tool", "ask", "{}")]
    failed = ConfigResponse.model_validate_json(trustgraph_bytes(schema.ConfigResponse(
        error=schema.Error(type="bad-request", message="Workspace is required"))))
    assert failed.error is not None and (failed.error.type, failed.error.message) == (
        "bad-request", "Workspace is required")
    push = ConfigPush.model_validate_json(trustgraph_bytes(schema.ConfigPush(
        version=3, changes={"tool": ["default"]}, workspace_changes=schema.WorkspaceChanges(created=["x"]))))
    assert push.touches("default", ["tool-service", "tool"]) and not push.touches("other", ["tool"])
    assert ConfigPush.model_validate_json(trustgraph_bytes(schema.ConfigPush(version=0))).touches("any", ["tool"])


def test_queue_ids_map_to_trustgraph_bases_topics() -> None:
    theirs = (schema.config_request_queue, schema.config_response_queue, schema.config_push_queue)
    assert theirs == (REQUEST_QUEUE, RESPONSE_QUEUE, PUSH_QUEUE)
    map_topic = backend.AsyncPulsarBackend._map_topic  # uses no instance state
    for queue in (REQUEST_QUEUE, RESPONSE_QUEUE, PUSH_QUEUE, "flow:tg:work", "request:tg:config:ws1",
                  "persistent://tenant/ns/topic"):
        assert pulsar_topic(queue) == map_topic(None, queue)
    for bad in ("config", "bogus:tg:config", "request::config"):
        with pytest.raises(ValueError):
            pulsar_topic(bad)
