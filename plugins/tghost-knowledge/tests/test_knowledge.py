"""tghost-knowledge: every answer travels through a real embedded Pulsar broker (the ``pulsar_broker`` fixture)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest
import tghost_knowledge
from tghost_knowledge import Document, KnowledgeBase

from tghost import ToolCallError, discover
from tghost.protocol import encode_request
from tghost.testing import EmbeddedBroker, LocalHost, RawWire

WORKFLOW = {"group": ("default", "read-only", "knowledge"), "state": "analysis",
            "available_in_states": ("undefined", "research")}


class CountingKnowledgeBase(KnowledgeBase):
    """Counts how often each collection's documents are loaded, i.e. how often its index is built."""

    def __init__(self) -> None:
        super().__init__()
        self.loads: Counter[str] = Counter()

    def documents(self, collection: str) -> list[Document]:
        self.loads[collection] += 1
        return super().documents(collection)


@pytest.fixture
def service() -> CountingKnowledgeBase:
    """A fresh service, so every test starts with cold (unbuilt) indexes."""
    return CountingKnowledgeBase()


def first_title(answer: str) -> str:
    """The title of the top passage in an answer "[1] <title> (score s)\\n<text>..."."""
    assert answer.startswith("[1] "), answer
    return answer.splitlines()[0].removeprefix("[1] ").rsplit(" (score ", 1)[0]


@pytest.mark.parametrize(
    ("collection", "question", "title"),
    [
        ("customers", "Which customer complained about a late delivery?", "Greenleaf Grocers"),
        ("customers", "Which accounts are at risk of churning?", "Alpine Dairy Cooperative"),
        ("customers", "Who uses the 21 CFR Part 11 audit trail?", "St. Brigid's Hospital Pharmacy"),
        ("products", "How much does the compliance plan cost per sensor?", "ColdTrack Cloud Compliance plan"),
        ("products", "Which sensor works in ultra-low -80 freezers?", "Beacon T2-P probe sensor"),
        ("products", "barcode scanner for goods receipt", "ScanPoint S1 handheld barcode scanner"),
        ("orders", "Which order was refunded after arriving damaged?", "Order ORD-2205 for Copperfield Bakeries"),
        ("orders", "Where is the Blue Fjord pallet tracker shipment?", "Order ORD-2210 for Blue Fjord Seafood"),
        ("orders", "Which orders are backordered?", "Order ORD-2208 for Orion Cold Storage"),
    ],
)
async def test_the_right_document_ranks_first(
    pulsar_broker: EmbeddedBroker, service: KnowledgeBase, collection: str, question: str, title: str
) -> None:
    async with LocalHost(pulsar_broker.url, [service]) as host:
        answer = await host.call("custom-rag", {"question": question}, config={"collection": collection})
    assert first_title(answer) == title


async def test_answer_lists_limit_passages_with_rank_title_score_and_text(
    pulsar_broker: EmbeddedBroker, service: KnowledgeBase
) -> None:
    async with LocalHost(pulsar_broker.url, [service]) as host:
        answer = await host.call("custom-rag", {"question": "sensor battery life", "limit": 2},
                                 config={"collection": "products"})
        default = await host.call("custom-rag", {"question": "sensor battery life"},
                                  config={"collection": "products"})
    passages = answer.split("\n\n")
    assert [p[:4] for p in passages] == ["[1] ", "[2] "]
    scores = [float(p.splitlines()[0].rsplit("(score ", 1)[1].rstrip(")")) for p in passages]
    assert scores == sorted(scores, reverse=True) and scores[-1] > 0
    assert all(len(p.splitlines()) == 2 for p in passages)  # heading line, then the document text
    assert len(default.split("\n\n")) == tghost_knowledge.DEFAULT_LIMIT


async def test_a_question_matching_nothing_is_an_observation_not_an_error(
    pulsar_broker: EmbeddedBroker, service: KnowledgeBase
) -> None:
    async with LocalHost(pulsar_broker.url, [service]) as host:
        unrelated = await host.call("custom-rag", {"question": "zebra quantum"}, config={"collection": "orders"})
        stopwords = await host.call("custom-rag", {"question": "what is it?"}, config={"collection": "customers"})
    assert unrelated == "No document in 'orders' matches 'zebra quantum'."
    assert stopwords == "No document in 'customers' matches 'what is it?'."


async def test_missing_collection_is_answered_missing_config_without_calling_the_plugin(
    pulsar_broker: EmbeddedBroker, service: CountingKnowledgeBase
) -> None:
    async with LocalHost(pulsar_broker.url, [service]) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("custom-rag", {"question": "late delivery"}, config={})
    assert info.value.error_type == "missing-config" and "collection" in info.value.message
    assert not service.loads


async def test_unknown_collection_is_invalid_config_and_names_the_known_ones(
    pulsar_broker: EmbeddedBroker, service: KnowledgeBase
) -> None:
    async with LocalHost(pulsar_broker.url, [service]) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("custom-rag", {"question": "late delivery"}, config={"collection": "suppliers"})
    assert info.value.error_type == "invalid-config"
    assert info.value.message == "unknown collection 'suppliers'; known: customers, orders, products"


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"question": ""}, "question"),
        ({"question": "   "}, "question"),
        ({}, "question"),
        ({"question": 42}, "question"),
        ({"question": "late delivery", "limit": 0}, "limit"),
        ({"question": "late delivery", "limit": 11}, "limit"),
        ({"question": "late delivery", "limit": "three"}, "limit"),
        ({"question": "late delivery", "limit": "2.5"}, "limit"),
        ({"question": "late delivery", "top": 3}, "top"),
        ({"question": "late delivery", "limit": True}, "limit"),
    ],
)
async def test_bad_arguments_are_invalid_arguments_naming_the_field(
    pulsar_broker: EmbeddedBroker, service: KnowledgeBase, arguments: dict[str, object], field: str
) -> None:
    async with LocalHost(pulsar_broker.url, [service]) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("custom-rag", arguments, config={"collection": "customers"})
    assert info.value.error_type == "invalid-arguments"
    assert info.value.message.startswith(f"argument '{field}': ")


async def test_reply_follows_the_wire_contract(pulsar_broker: EmbeddedBroker, service: KnowledgeBase) -> None:
    request = encode_request("alice", {"collection": "products"}, {"question": "How long is the warranty?"})
    async with LocalHost(pulsar_broker.url, [service]), RawWire(pulsar_broker.url, service.descriptor) as raw:
        await raw.send(request, {"id": "kb-1"})
        [(properties, body)] = await raw.replies("kb-1")
    assert properties["id"] == "kb-1"
    assert set(body) == {"error", "response", "end_of_stream"}
    assert body["end_of_stream"] is True and body["error"] is None
    assert first_title(body["response"]) == "Extended warranty"


class GatedKnowledgeBase(CountingKnowledgeBase):
    """Holds the first index build open until ``callers`` calls are inside ``invoke`` at once, so that
    without the lock every one of them would build the index too."""

    def __init__(self, callers: int) -> None:
        super().__init__()
        self.callers, self.arrived = callers, 0
        self.all_in_flight = threading.Event()
        self._count = threading.Lock()

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        with self._count:
            self.arrived += 1
            if self.arrived == self.callers:
                self.all_in_flight.set()
        return super().invoke(user, config, arguments)

    def documents(self, collection: str) -> list[Document]:
        self.all_in_flight.wait(timeout=10)  # a guard against hanging; the test asserts the event was set
        return super().documents(collection)


async def test_concurrent_calls_on_a_cold_index_build_it_once_and_all_answer_right(
    pulsar_broker: EmbeddedBroker,
) -> None:
    questions = {
        "Which customer complained about a late delivery?": "Greenleaf Grocers",
        "Which accounts are at risk of churning?": "Alpine Dairy Cooperative",
        "Whose data must stay in the EU under GDPR?": "Lumen Biotech",
        "Which account is suspended for overdue invoices?": "Redwood Catering",
    }
    asked = list(questions) * 3  # 12 calls at once; the host runs up to 16 in worker threads
    service = GatedKnowledgeBase(callers=len(asked))
    async with LocalHost(pulsar_broker.url, [service]) as host:
        answers = await asyncio.gather(
            *(host.call("custom-rag", {"question": q}, config={"collection": "customers"}) for q in asked)
        )
    assert service.all_in_flight.is_set()  # all 12 were in invoke while the index was being built
    assert [first_title(a) for a in answers] == [questions[q] for q in asked]
    assert service.loads == {"customers": 1}


def test_service_descriptor_is_seed_000_custom_rag() -> None:
    descriptor = KnowledgeBase().descriptor.to_json_dict()
    assert descriptor["id"] == "custom-rag"
    assert descriptor["request-queue"] == "non-persistent://tg/request/custom-rag"
    assert descriptor["response-queue"] == "non-persistent://tg/response/custom-rag"
    assert descriptor["config-params"] == [{"name": "collection", "required": True}]


def test_installed_plugin_is_discovered_with_both_tools_carrying_collection_and_workflow() -> None:
    catalog = discover(strict=False)
    assert "custom-rag" in catalog.descriptors
    assert catalog.service_origin["custom-rag"].name == "knowledge"
    for name, collection in [("query-customers", "customers"), ("query-products", "products")]:
        tool = catalog.tools[name]
        assert catalog.tool_origin[name].name == "knowledge"
        assert tool.service == "custom-rag" and tool.config == {"collection": collection}
        assert {"group": tool.group, "state": tool.state, "available_in_states": tool.available_in_states} == WORKFLOW
        assert [a.name for a in tool.arguments] == ["question", "limit"]
