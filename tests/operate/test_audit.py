"""audit: one JSON line per call, host side (a Server's call listener) and directory side
(a ToolDirectory's call listener), over the embedded broker."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

import tghost
from tghost.agent.client import ToolCallError
from tghost.agent.directory import ToolDirectory
from tghost.broker import EmbeddedBroker
from tghost.discovery.discover import catalog_of
from tghost.operate.audit import AuditLog, audit_entry
from tghost.pulsar.clients import PulsarSettings
from tghost.serving.request import CallRecord
from tghost.serving.server import Server
from tghost.testing import LocalHost, RawWire

SECRET_ARGUMENT = "argument-value-" + uuid.uuid4().hex
SECRET_CONFIG = "config-value-" + uuid.uuid4().hex


@tghost.tool(service="kb", config=["collection"], group=["staff"], state="answered")
async def lookup(question: str, collection: str) -> str:
    """Look a question up in a collection."""
    return f"{collection} says: {question}"


def deny_mallory(user: str, service: str, config: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    return "mallory may not ask" if user == "mallory" else None


async def audited_calls(url: str, audit: AuditLog) -> None:
    """Four requests to ``kb``: ok (alice), not-allowed (mallory), missing-config, and one without an id."""
    catalog = catalog_of([lookup], authorize=deny_mallory)
    server = Server(catalog.services, catalog.descriptors, listeners=[audit], authorize=catalog.authorize)
    client = await PulsarSettings(url).connect()
    await server.start(client)
    try:
        async with RawWire(url, catalog.descriptors["kb"]) as raw:
            await raw.request({"question": SECRET_ARGUMENT}, {"collection": SECRET_CONFIG}, user="alice")
            await raw.request({"question": SECRET_ARGUMENT}, {"collection": SECRET_CONFIG}, user="mallory")
            await raw.request({"question": SECRET_ARGUMENT}, {}, user="bob")
            await raw.send(b'{"arguments": "{}"}', {})
            async with asyncio.timeout(10):
                while sum(w.counters["received"] for w in server.endpoints) < 4 or any(
                        w.in_flight for w in server.endpoints):
                    await asyncio.sleep(0.02)
    finally:
        await server.stop()
        await client.close()


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_each_call_gives_one_line_with_names_not_values(pulsar_broker: EmbeddedBroker, tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog.open(str(path)) as audit:
        await audited_calls(pulsar_broker.url, audit)
    entries = lines(path)
    assert [(e["user"], e["status"]) for e in entries] == [
        ("alice", "ok"), ("mallory", "not-allowed"), ("bob", "missing-config"), (None, "unanswerable")]
    first = entries[0]
    assert first["kind"] == "call" and first["service"] == "kb" and len(first["request_id"]) == 32
    assert first["argument_names"] == ["question"] and "arguments" not in first
    assert isinstance(first["duration_ms"], float) and first["duration_ms"] > 0
    assert entries[3]["request_id"] is None and "argument_names" not in entries[3]
    text = path.read_text()
    assert SECRET_ARGUMENT not in text and SECRET_CONFIG not in text


async def test_argument_values_are_logged_only_when_asked(pulsar_broker: EmbeddedBroker, tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog.open(str(path), arguments=True) as audit:
        await audited_calls(pulsar_broker.url, audit)
    entries = lines(path)
    assert entries[0]["arguments"] == {"question": SECRET_ARGUMENT} and "argument_names" not in entries[0]
    assert SECRET_CONFIG not in path.read_text()  # config values never


def test_a_failing_sink_is_logged_once_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    audit = AuditLog(stream)
    stream.close()
    with caplog.at_level(logging.ERROR, logger="tghost.operate.audit"):
        for _ in range(3):
            audit(CallRecord("kb", "id-1", "alice"))
    assert audit.failures == 3
    [logged] = [r.getMessage() for r in caplog.records if r.name == "tghost.operate.audit"]
    assert logged.startswith("audit log: cannot write (ValueError: I/O operation on closed file")


async def test_a_failing_sink_does_not_stop_serving(pulsar_broker: EmbeddedBroker, tmp_path: Path) -> None:
    stream = (tmp_path / "closed.jsonl").open("w")
    stream.close()
    audit = AuditLog(stream)
    catalog = catalog_of([lookup])
    server = Server(catalog.services, catalog.descriptors, listeners=[audit])
    client = await PulsarSettings(pulsar_broker.url).connect()
    await server.start(client)
    try:
        async with RawWire(pulsar_broker.url, catalog.descriptors["kb"]) as raw:
            for n in range(2):
                [(_, reply)] = await raw.request({"question": f"q{n}"}, {"collection": "c"})
                assert reply["response"] == f"c says: q{n}"
    finally:
        await server.stop()
        await client.close()
    assert audit.failures == 2  # the sink was asked about both calls, and failed both times


async def test_directory_invokes_are_audited_with_tool_groups_and_state(
    pulsar_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    topic = f"persistent://tg/config/audit-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "invokes.jsonl"
    catalog = catalog_of([lookup], [lookup.tool("ask-staff", collection="staff", group=["staff"], state="answered")])
    with AuditLog.open(str(path)) as audit:
        async with LocalHost(pulsar_broker.url, catalog, announce_as="audit-host", topic=topic), \
                ToolDirectory(PulsarSettings(pulsar_broker.url), topic, listeners=[audit]) as directory:
            await directory.wait_for("ask-staff")
            answer = await directory.invoke("ask-staff", {"question": SECRET_ARGUMENT}, user="carol",
                                            groups=["staff"])
            with pytest.raises(ToolCallError):
                await directory.invoke("ask-staff", {"question": "x"}, user="dave")  # default group only
    assert answer == f"staff says: {SECRET_ARGUMENT}"
    ok, refused = lines(path)
    assert (ok["kind"], ok["tool"], ok["service"], ok["user"], ok["groups"]) == (
        "invoke", "ask-staff", "kb", "carol", ["staff"])
    assert ok["state"] == {"before": "undefined", "after": "answered"} and ok["status"] == "ok"
    assert (refused["user"], refused["groups"], refused["status"]) == ("dave", ["default"], "not-allowed")
    assert refused["state"] == {"before": "undefined", "after": "undefined"}
    assert SECRET_ARGUMENT not in path.read_text()


def test_audit_entry_matches_on_attributes() -> None:
    entry = audit_entry(CallRecord("kb", "r1", "alice", "timeout", 1.5, {"b": 1, "a": 2}))
    assert {k: entry[k] for k in ("kind", "request_id", "user", "service", "status", "duration_ms",
                                  "argument_names")} == {
        "kind": "call", "request_id": "r1", "user": "alice", "service": "kb", "status": "timeout",
        "duration_ms": 1500.0, "argument_names": ["a", "b"]}
    assert "tool" not in entry and "state" not in entry
