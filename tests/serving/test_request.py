"""request: the one request state machine both drivers share. Its parts on their own (the checks
and their order, the reply an exception comes to, exactly one last reply, the stream window),
and a chunk receipt that arrives for a caller who stopped waiting, on the embedded broker.
(The drivers themselves are tests/serving/test_endpoint.py and test_lane.py.)"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from concurrent import futures
from typing import Any

import _pulsar
import pulsar
import pytest

import tghost
from tghost.broker import EmbeddedBroker
from tghost.protocol import wire
from tghost.protocol.descriptors import ToolServiceDescriptor
from tghost.pulsar import hop
from tghost.serving.executors.base import WorkerRaised
from tghost.serving.request import (
    CallRecord,
    ChunkNotSent,
    NotStarted,
    Port,
    Request,
    Terms,
    _receipt_of,
    confirmed,
)


@tghost.tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


def terms(**overrides: Any) -> Terms:
    fields: dict[str, Any] = {"service": echo, "descriptor": echo.descriptor, "timeout": 2.0, "max_concurrency": 2,
                              "max_queue": 1, "max_payload": 200, "max_redeliveries": 3}
    return Terms(**{**fields, **overrides})


def message(body: dict[str, Any] | bytes) -> Any:
    """A real ``_pulsar.Message``, built as the client builds one, with an ``id`` property."""
    builder = _pulsar.MessageBuilder()
    builder.content(body if isinstance(body, bytes) else json.dumps(body).encode())
    builder.property("id", "r1")
    return builder.build()


def checked(t: Terms, body: dict[str, Any] | bytes) -> tuple[CallRecord, Any]:
    request = Request(CallRecord("echo", "r1"), message(body))
    return request.record, t.check(request, None)  # type: ignore[arg-type]  (no progress is sent)


def error_type(t: Terms, body: dict[str, Any] | bytes) -> str:
    with pytest.raises(tghost.ToolError) as info:
        checked(t, body)
    return info.value.error_type


def test_check_passes_a_good_request_and_records_its_user_and_arguments() -> None:
    record, call = checked(terms(), {"user": "ada", "config": "{}", "arguments": json.dumps({"text": "hi"})})
    assert call[:4] == ("ada", {}, {"text": "hi"}, None)  # user, config, arguments; no verified caller
    assert not call.cancelled.is_set() and call.report is not None  # the call's cancel and progress
    assert (record.user, record.arguments) == ("ada", {"text": "hi"})


def test_check_refuses_in_order_size_envelope_authorize_config_then_arguments() -> None:
    assert error_type(terms(max_payload=10), {"arguments": "{}"}) == wire.BAD_REQUEST
    assert error_type(terms(), b"not json") == wire.BAD_REQUEST
    deny = terms(authorize=lambda user, service, config, arguments, caller: "no")
    assert error_type(deny, {"arguments": json.dumps({"text": "x"})}) == wire.NOT_ALLOWED
    needs = ToolServiceDescriptor.model_validate({**echo.descriptor.to_json_dict(),
                                                  "config-params": [{"name": "style", "required": True}]})
    assert error_type(terms(descriptor=needs), {"arguments": "{}"}) == wire.MISSING_CONFIG
    assert error_type(terms(), {"arguments": json.dumps({"text": 1, "extra": 2})}) == wire.INVALID_ARGUMENTS


def test_refusal_texts_name_the_service_its_limits_and_what_to_do() -> None:
    t = terms()
    assert t.over_capacity(2) is None
    assert t.over_capacity(3) == t.refusal(wire.OVERLOADED) == \
        "service 'echo' has 2 calls running and 1 waiting; retry later"
    assert t.refusal(wire.TIMEOUT) == "service 'echo' did not finish within 2.0s"
    assert "stopped serving 'echo'" in t.refusal(wire.UNAVAILABLE) and "retry" in t.refusal(wire.UNAVAILABLE)
    assert t.refusal(wire.UNAVAILABLE, started=True) == "the host shut down before the call finished; retry"


def test_failure_keeps_a_tool_error_type_and_makes_anything_else_a_tool_service_error() -> None:
    t = terms()
    assert t.failure(tghost.ToolError("nope", "not-found"), "r1") == ("not-found", "nope", True)
    assert t.failure(ChunkNotSent("lost"), "r1") == (wire.TOOL_SERVICE_ERROR, "lost", True)
    assert t.failure(ZeroDivisionError("division by zero"), "r1") == \
        (wire.TOOL_SERVICE_ERROR, "ZeroDivisionError: division by zero", True)


def test_failure_says_a_call_refused_for_an_unreachable_replay_record_did_not_start_and_no_plugin_can_say_so() -> None:
    t = terms()
    assert t.failure(NotStarted("the replay record is out of reach", wire.UNAVAILABLE), "r1") == \
        (wire.UNAVAILABLE, "the replay record is out of reach", False)
    assert t.failure(tghost.ToolError("down for now", wire.UNAVAILABLE), "r1")[2] is True  # a plugin's own


@pytest.mark.parametrize(("detail", "told"), [
    ("full", "KeyError: 'GBP'"),
    ("type", "KeyError (its message and traceback are in the log of host h1, under request r1)"),
    ("none", "the tool failed; see the log of host h1 for request r1"),
])
def test_error_detail_withholds_an_unexpected_exception_from_the_caller_never_a_tool_error_nor_the_log(
    caplog: pytest.LogCaptureFixture, detail: str, told: str
) -> None:
    caplog.set_level(logging.ERROR, logger="tghost.serving.request")
    t = terms(host_id="h1", error_detail=detail)
    assert t.failure(KeyError("GBP"), "r1") == (wire.TOOL_SERVICE_ERROR, told, True)
    assert t.failure(WorkerRaised("KeyError", "'GBP'", "Traceback ...\nKeyError: 'GBP'\n", 42), "r1") == \
        (wire.TOOL_SERVICE_ERROR, told, True)
    assert t.failure(tghost.InvalidArguments("argument 'x': required"), "r1")[1] == "argument 'x': required"
    assert t.failure(tghost.ToolError("no rate for GBP"), "r1")[1] == "no rate for GBP"
    own, worker = caplog.records
    assert own.getMessage() == "service echo: request r1: invoke raised" and own.exc_info is not None
    assert own.exc_info[1] is not None and "GBP" in str(own.exc_info[1])
    assert worker.getMessage().startswith("service echo: request r1: invoke raised (in worker process 42)\n")
    assert worker.getMessage().endswith("KeyError: 'GBP'")


def test_without_a_host_id_the_withheld_text_points_at_the_hosts_log() -> None:
    assert terms(error_detail="none").failure(ValueError("secret"), "r1")[1] == \
        "the tool failed; see the host's log for request r1"


def test_an_error_reply_names_the_host_and_the_request() -> None:
    assert json.loads(terms(host_id="h1").error("r1", wire.TIMEOUT, "slow"))["error"] == \
        {"type": "timeout", "message": "slow", "host": "h1", "request-id": "r1"}
    assert json.loads(terms().error("r1", wire.TIMEOUT, "slow"))["error"] == \
        {"type": "timeout", "message": "slow", "request-id": "r1"}


def test_exactly_one_of_many_threads_claims_the_last_reply() -> None:
    request = Request(CallRecord("echo", "r1"), None)
    start = threading.Barrier(8)
    won: list[bool] = []

    def claim(status: str) -> None:
        start.wait()
        won.append(request.claim(status))

    threads = [threading.Thread(target=claim, args=(f"type-{n}",)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(won) == [False] * 7 + [True]
    assert request.record.status.startswith("type-")


class _Sent:
    """Records each chunk, confirmed at once: the window's arithmetic, without a broker."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def send_chunk(self, request: Request, payload: bytes) -> futures.Future[bool]:
        self.chunks.append(payload)
        done: futures.Future[bool] = futures.Future()
        done.set_result(True)
        return done


def test_the_stream_window_asks_for_receipts_every_window_and_stops_once_claimed() -> None:
    request, port = Request(CallRecord("echo", "r1"), None), _Sent()
    full = [request.chunk(port, str(n)) for n in range(2 * hop.STREAM_WINDOW + 5)]  # type: ignore[arg-type]
    assert [n for n, f in enumerate(full) if f] == [hop.STREAM_WINDOW - 1, 2 * hop.STREAM_WINDOW - 1]
    assert len(request.rest()) == 5 and request.rest() == []
    assert request.claim()
    assert request.chunk(port, "late") is None  # type: ignore[arg-type]
    assert len(port.chunks) == 2 * hop.STREAM_WINDOW + 5


def test_a_chunk_the_broker_refused_cuts_the_stream_short() -> None:
    refused: futures.Future[bool] = futures.Future()
    refused.set_result(False)
    with pytest.raises(ChunkNotSent):
        confirmed([refused])


def test_a_receipt_for_a_caller_who_stopped_waiting_is_dropped_without_raising() -> None:
    """The client runs the receipt on its I/O thread, where an exception ends the process."""
    gone: futures.Future[bool] = futures.Future()
    gone.cancel()
    _receipt_of(gone, pulsar.Result.Ok, None)  # raised InvalidStateError before
    assert gone.cancelled()


@pytest.mark.broker
async def test_chunk_receipts_arrive_over_the_broker_and_a_cancelled_wait_leaves_the_host_alive(
        pulsar_broker: EmbeddedBroker) -> None:
    client = pulsar.asyncio.Client(pulsar_broker.url)
    topic = "non-persistent://tg/response/test-request-receipts"
    try:
        producer = await client.create_producer(topic, batching_enabled=False)
        port = Port(producer, hop.Mailbox(asyncio.get_running_loop()), (), "echo")
        first, second = Request(CallRecord("echo", "r1"), None), Request(CallRecord("echo", "r2"), None)
        kept = [port.send_chunk(first, wire.encode_response(str(n), False)) for n in range(10)]
        dropped = [port.send_chunk(second, wire.encode_response(str(n), False)) for n in range(10)]
        for receipt in dropped:
            receipt.cancel()
        await producer.flush()
        await asyncio.wait_for(asyncio.wrap_future(kept[-1]), 10)
        assert all(receipt.result() for receipt in kept)
        # each was cancelled before its receipt came (then the receipt was dropped), or came first
        assert all(receipt.cancelled() or receipt.result() for receipt in dropped)
    finally:
        await client.close()
