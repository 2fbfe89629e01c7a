"""typed calls: a directory's view of the keys of docs/protocol.md §3.3 on the embedded broker.
``invoke`` returns a tool's structured observation as the object it holds, and refuses one that
is not a JSON object; ``available`` and ``search`` keep only read-only-hinted tools when asked;
a tool's JSON carries its title, hints and output schema."""

from __future__ import annotations

import json
from typing import Any

import pytest

import tghost
from tghost.broker import EmbeddedBroker
from tghost.testing import LocalHost


class Notes(tghost.ToolService):
    id = "notes"
    description = "Notes kept by topic."
    config_params = (tghost.ConfigParam(name="answer", required=True),)
    arguments = (tghost.Argument(name="topic", type="string", description="A topic"),)

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        return {"json": json.dumps({"topic": arguments["topic"], "notes": 3}), "text": "three notes"}[config["answer"]]


OBJECT = {"type": "object", "properties": {"topic": {"type": "string"}, "notes": {"type": "integer"}}}
TOOLS = [
    {"name": "count-notes", "description": "Count the notes on a topic", "service": "notes", "answer": "json",
     "title": "Count notes", "annotations": {"read-only": True, "idempotent": True}, "output-schema": OBJECT},
    {"name": "erase-notes", "description": "Erase the notes on a topic", "service": "notes", "answer": "text",
     "annotations": {"destructive": True}},
    {"name": "broken-count", "description": "Count the notes, answering text", "service": "notes", "answer": "text",
     "output-schema": OBJECT},
]


@pytest.fixture
async def directory(pulsar_broker: EmbeddedBroker) -> Any:
    async with (LocalHost(pulsar_broker.url, [Notes()], tools=TOOLS, announce_as="notes-host"),
                tghost.ToolDirectory(tghost.PulsarSettings(pulsar_broker.url)) as directory):
        for tool in TOOLS:
            await directory.wait_for(tool["name"])
        yield directory


async def test_invoke_returns_the_object_of_a_structured_tool_and_text_otherwise(directory: Any) -> None:
    assert await directory.invoke("count-notes", {"topic": "pulsar"}) == {"topic": "pulsar", "notes": 3}
    assert await directory.invoke("erase-notes", {"topic": "pulsar"}) == "three notes"
    assert [chunk async for chunk in directory.stream("count-notes", {"topic": "pulsar"})] == [
        '{"topic": "pulsar", "notes": 3}']


async def test_a_structured_tool_that_answers_text_is_refused_as_a_bad_answer(directory: Any) -> None:
    with pytest.raises(tghost.ToolCallError) as refused:
        await directory.invoke("broken-count", {"topic": "pulsar"})
    assert refused.value.error_type == "bad-request" and "not a JSON object" in refused.value.message


async def test_available_and_search_keep_the_read_only_tools_when_asked(directory: Any) -> None:
    assert [d.name for d in directory.available()] == ["broken-count", "count-notes", "erase-notes"]
    assert [d.name for d in directory.available(read_only=True)] == ["count-notes"]
    assert {f.tool.descriptor.name for f in directory.search("notes topic", read_only=True)} == {"count-notes"}


async def test_a_tool_in_json_carries_its_title_hints_and_output_schema(directory: Any) -> None:
    shape = directory.tools["count-notes"].to_json()
    assert (shape["title"], shape["annotations"], shape["output-schema"]) == (
        "Count notes", {"read-only": True, "idempotent": True}, OBJECT)
    assert not {"title", "output-schema"} & set(directory.tools["erase-notes"].to_json())


@pytest.mark.parametrize("text", ['{"count": NaN}', '{"count": Infinity}', "[1, 2]", "not json", "[" * 100_000])
def test_only_a_json_object_is_a_structured_observation(text: str) -> None:
    from tghost.agent.calls import structured

    with pytest.raises(tghost.ToolCallError) as refused:
        structured("count-notes", text)
    assert refused.value.error_type == "bad-request"
