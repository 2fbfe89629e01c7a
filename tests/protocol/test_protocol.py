"""docs/protocol.md: every example message on the page is exactly what tghost sends, and what
it accepts: requests and descriptors as encoded, responses as the example services answer,
announcements as an Announcer builds them and a directory applies them, the signature test
vector as tghost.protocol.trust signs it."""

from __future__ import annotations

import json
import re
import uuid
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tghost.agent.ledger import Ledger
from tghost.announcing.announcer import Announcer, HostIdentity
from tghost.broker import EmbeddedBroker
from tghost.discovery.catalog import Catalog
from tghost.discovery.discover import ENTRY_POINT_GROUP, discover
from tghost.protocol import wire
from tghost.protocol.announcement import (
    DEFAULT_TOPIC,
    Announcement,
    announcement_key,
    epoch_of,
    epoch_topic,
    read_window,
)
from tghost.protocol.descriptors import ToolDescriptor
from tghost.protocol.trust import Signer, TrustedKeys, signed_bytes
from tghost.testing import LocalHost, RawWire

PAGE = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
EXAMPLE = re.compile(r"<!-- example: (?P<label>[^>]+?) -->\n```(?:json|text)\n(?P<body>.*?)\n```", re.S)
#: The host of the page's examples, at its clock.
IDENTITY = HostIdentity("laptop-3f9a2b1c0d4e", "laptop", 4242, version="0.1.0", instance="9c1e5b7a2d4f6e80")
STARTED, SENT = 1770999990.5, 1771000000.25


def examples(label: str) -> list[str]:
    found = [m["body"] for m in EXAMPLE.finditer(PAGE.read_text()) if m["label"] == label]
    assert found, f"no example {label!r} in {PAGE}"
    return found


#: The page's fingerprint of the joke plugin's code: the real one changes with every edit of it.
FINGERPRINT = "3f1c9a0e6b2d4f8a7c5e1b9d0a2f4c6e8b1d3f5a7c9e0b2d4f6a8c1e3b5d7f9a"


def plugin(name: str) -> Catalog:
    catalog = discover([ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name])
    for report in catalog.plugins:
        assert report.fingerprint is not None
        report.fingerprint = FINGERPRINT
    return catalog


def announcer() -> Announcer:
    """The page's host, serving the joke plugin, started at STARTED."""
    host = Announcer(plugin("joke"), IDENTITY, lease=30.0)
    host._started_at, host._since = STARTED, dict.fromkeys(host._since, STARTED)
    return host


def test_every_example_is_labelled_and_checked() -> None:
    labels = {m["label"] for m in EXAMPLE.finditer(PAGE.read_text())}
    assert labels == {"request", "response", "stream", "error", "progress", "tool-service descriptor",
                      "tool descriptor", "tool descriptor with hints", "epoch", "announcement", "canonical",
                      "signed announcement"}
    assert PAGE.read_text().count("<!-- example:") == len(list(EXAMPLE.finditer(PAGE.read_text())))


def test_the_request_is_what_a_caller_encodes_and_a_service_decodes() -> None:
    [text] = examples("request")
    assert text == wire.encode_request("alice", {"style": "pun"}, {"topic": "cats"}).decode()
    assert wire.decode_request(text.encode()) == wire.Request("alice", {"style": "pun"}, {"topic": "cats"})


async def test_the_responses_are_what_the_example_services_answer(pulsar_broker: EmbeddedBroker) -> None:
    catalog, knowledge = plugin("calculator"), plugin("knowledge")
    [response], [stream], [error] = examples("response"), examples("stream"), examples("error")
    arguments = {"expression": "2 * (3 + 4)"}
    async with LocalHost(pulsar_broker.url, catalog):
        async with RawWire(pulsar_broker.url, catalog.descriptors["calculator"]) as raw:
            assert [body for _, body in await raw.request(arguments)] == [json.loads(response)]
        async with RawWire(pulsar_broker.url, catalog.descriptors["calculator-steps"]) as raw:
            streamed = [body for _, body in await raw.request(arguments)]
        assert streamed == [json.loads(line) for line in stream.splitlines()]
    assert response.encode() == wire.encode_response("14")
    example = json.loads(error)
    topic = f"persistent://tg/config/docs-{uuid.uuid4().hex[:8]}"
    async with LocalHost(pulsar_broker.url, knowledge, announce_as=IDENTITY.id, topic=topic), \
            RawWire(pulsar_broker.url, knowledge.descriptors["custom-rag"]) as raw:
        request_id = example["error"]["request-id"]
        await raw.send(wire.encode_request("test", {}, {"question": "Who is on the enterprise tier?"}),
                       {"id": request_id})
        assert [body for _, body in await raw.replies(request_id)] == [example]


def test_a_progress_update_is_what_a_host_encodes_and_a_caller_decodes() -> None:
    [text] = examples("progress")
    update = wire.Progress(2, 3, "page 2")
    assert text.encode() == wire.encode_progress(update)
    assert wire.decode_response(text.encode()) == wire.Response("", False, None, update)


def test_the_descriptor_with_hints_parses_with_no_config_values() -> None:
    [text] = examples("tool descriptor with hints")
    tool = ToolDescriptor.model_validate_json(text)
    assert tool.config == {} and tool.read_only and tool.title == "Weather forecast"
    assert tool.output_schema is not None and tool.output_schema["type"] == "object"
    assert {"type": "tool-service", **tool.to_json_dict()} == json.loads(text)


def test_the_descriptors_are_the_joke_plugins() -> None:
    catalog = plugin("joke")
    [service], [tool] = examples("tool-service descriptor"), examples("tool descriptor")
    assert json.loads(service) == catalog.descriptors["joke-service"].to_json_dict()
    assert json.loads(tool) == {"type": "tool-service", **catalog.tools["tell-joke"].to_json_dict()}


def test_the_epoch_example_is_computed_as_specified() -> None:
    [text] = examples("epoch")
    example = json.loads(text)
    assert example["epoch"] == epoch_of(example["now"])
    assert example["topic"] == epoch_topic("persistent://tg/config/tool-descriptors", example["epoch"])
    assert example["read"] == list(read_window(example["now"], max_clock_skew=60.0))


def test_the_announcements_are_what_the_announcer_sends() -> None:
    host = announcer()
    sent = dict(host._messages("available", None, SENT))
    withdrawal = host._message("tool", "tell-joke", None, plugin("joke").tool_origin["tell-joke"].origin_json(),
                               "withdrawn", SENT + 20)
    expected = [sent[announcement_key("host", IDENTITY.id, IDENTITY.id)],
                sent[announcement_key("tool-service", "joke-service", IDENTITY.id)],
                sent[announcement_key("tool", "tell-joke", IDENTITY.id)], withdrawal[1]]
    assert [json.loads(text) for text in examples("announcement")] == expected


def test_a_directory_applies_the_announcements_in_order() -> None:
    ledger = Ledger("docs")
    values: list[dict[str, Any]] = [json.loads(text) for text in examples("announcement")]
    for value in values[:3]:
        Announcement.model_validate(value)
        assert ledger.apply(json.dumps(value).encode(), value["lease"]["sent_at"],
                            announcement_key(value["kind"], value["name"], value["host"]["id"])) is not None
    assert ledger.rejections == {}
    assert sorted(ledger.claims) == [("tool", "tell-joke"), ("tool-service", "joke-service")]
    last = values[3]
    ledger.apply(json.dumps(last).encode(), last["lease"]["sent_at"],
                 announcement_key("tool", "tell-joke", IDENTITY.id))
    assert sorted(ledger.claims) == [("tool-service", "joke-service")]


@pytest.fixture
def test_vector() -> Signer:
    return Signer(Ed25519PrivateKey.from_private_bytes(bytes(range(32))))


def test_the_signature_test_vector(test_vector: Signer) -> None:
    heartbeat = announcer()._message("host", IDENTITY.id, None, None, "available", SENT + 10)[1]
    [canonical], [signed] = examples("canonical"), examples("signed announcement")
    assert canonical.encode() == signed_bytes(heartbeat, DEFAULT_TOPIC)
    assert json.loads(signed) == test_vector.sign(heartbeat, DEFAULT_TOPIC)
    assert TrustedKeys([test_vector.public_key]).verify(json.loads(signed), DEFAULT_TOPIC) is None
    pem = test_vector.public_key.public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    assert "\n".join("    " + line for line in pem.strip().splitlines()) in PAGE.read_text()
