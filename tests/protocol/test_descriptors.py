"""descriptors: the seed 000/001 descriptor models round-trip the seeds' own JSON examples."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from tghost import ToolDescriptor, ToolServiceDescriptor
from tghost.protocol.descriptors import describe_validation_error

# Every tool-service and tool example in seed 000, verbatim.
SEED_SERVICES = [
    {"id": "custom-rag", "request-queue": "non-persistent://tg/request/custom-rag",
     "response-queue": "non-persistent://tg/response/custom-rag",
     "config-params": [{"name": "collection", "required": True}]},
    {"id": "calculator", "request-queue": "non-persistent://tg/request/calc",
     "response-queue": "non-persistent://tg/response/calc", "config-params": []},
    {"id": "joke-service", "request-queue": "non-persistent://tg/request/joke",
     "response-queue": "non-persistent://tg/response/joke",
     "config-params": [{"name": "style", "required": False}]},
]
SEED_TOOLS = [
    {"type": "tool-service", "name": "query-customers", "description": "Query the customer knowledge base",
     "service": "custom-rag", "collection": "customers",
     "arguments": [{"name": "question", "type": "string",
                    "description": "The question to ask about customers"}]},
    {"type": "tool-service", "name": "query-products", "description": "Query the product knowledge base",
     "service": "custom-rag", "collection": "products",
     "arguments": [{"name": "question", "type": "string",
                    "description": "The question to ask about products"}]},
    {"type": "tool-service", "name": "tell-joke", "description": "Tell a joke on a given topic",
     "service": "joke-service", "style": "pun",
     "arguments": [{"name": "topic", "type": "string",
                    "description": "The topic for the joke (e.g., programming, animals, food)"}]},
]
# Seed 001 section 2.1.2, as a tool-service tool.
SEED_001_TOOL = {"type": "tool-service", "name": "knowledge-query", "description": "Query the knowledge graph",
                 "service": "custom-rag", "collection": "kg", "group": ["read-only", "knowledge", "basic"],
                 "state": "analysis", "available_in_states": ["undefined", "research"]}


@pytest.mark.parametrize("example", SEED_SERVICES, ids=lambda e: e["id"])
def test_service_descriptor_round_trips_seed_json(example: dict[str, Any]) -> None:
    descriptor = ToolServiceDescriptor.model_validate_json(json.dumps(example))
    assert descriptor.to_json_dict() == example


@pytest.mark.parametrize("example", [*SEED_TOOLS, SEED_001_TOOL], ids=lambda e: e["name"])
def test_tool_descriptor_round_trips_seed_json(example: dict[str, Any]) -> None:
    tool = ToolDescriptor.model_validate_json(json.dumps(example))
    assert tool.to_json_dict() == example


def test_config_values_are_the_top_level_keys_that_are_not_fields() -> None:
    tool = ToolDescriptor.model_validate(SEED_TOOLS[0])
    assert tool.config == {"collection": "customers"}


def test_required_config_lists_only_required_params() -> None:
    assert ToolServiceDescriptor.model_validate(SEED_SERVICES[0]).required_config == ("collection",)
    assert ToolServiceDescriptor.model_validate(SEED_SERVICES[2]).required_config == ()


def test_group_defaults_to_default_and_state_to_none() -> None:
    tool = ToolDescriptor.model_validate(SEED_TOOLS[2])
    assert tool.group == ("default",)
    assert tool.state is None and tool.available_in_states is None


def test_applicable_states_is_accepted_as_an_alias_and_written_canonically() -> None:
    tool = ToolDescriptor.model_validate({**SEED_TOOLS[2], "applicable-states": ["analysis"]})
    assert tool.available_in_states == ("analysis",)
    assert tool.to_json_dict()["available_in_states"] == ["analysis"]
    assert "applicable-states" not in tool.to_json_dict()


def test_a_single_group_string_becomes_a_list() -> None:
    assert ToolDescriptor.model_validate({**SEED_TOOLS[2], "group": "admin"}).group == ("admin",)


@pytest.mark.parametrize(
    ("change", "field"),
    [({"request-queue": None}, "request-queue"), ({"id": "has space"}, "id"),
     ({"max-concurrency": 0}, "max-concurrency"), ({"timeout": -1}, "timeout")],
)
def test_invalid_service_descriptor_error_names_the_field_and_origin(
    change: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as info:
        ToolServiceDescriptor.model_validate({**SEED_SERVICES[0], **change})
    message = str(describe_validation_error(info.value, "plugin 'x'"))
    assert message.startswith("plugin 'x': ")
    assert f"field '{field}'" in message


def test_tool_without_description_is_rejected_naming_the_field() -> None:
    bad = {k: v for k, v in SEED_TOOLS[2].items() if k != "description"}
    with pytest.raises(ValidationError) as info:
        ToolDescriptor.model_validate(bad)
    assert "field 'description'" in str(describe_validation_error(info.value, "plugin 'joke'"))
