"""error replies say where (docs/protocol.md §2.6): a failing tool's reply names the host and the
request id, the host's log line for it names the same request, and ``error_detail`` decides how
much of an unexpected exception a caller is told, on each path a call takes (the thread lane, the
event loop, a worker process). A result that JSON cannot hold names its type. TrustGraph's own
client still reads the type and the message."""

from __future__ import annotations

import json
import logging
import re
import uuid
from typing import Any

import pytest

import tghost
from tghost.agent.client import ToolCallError
from tghost.broker import EmbeddedBroker
from tghost.serving.settings import ServeSettings
from tghost.testing import LocalHost

HOST = "errors-host"
RATES = {"EUR": 1.0, "USD": 0.9}


@tghost.tool
def convert(amount: float, currency: str) -> float:
    """Convert an amount to euros (a plain def: the thread lane, or a worker process)."""
    if currency == "XXX":
        raise tghost.ToolError(f"{currency} is no currency: give an ISO 4217 code")
    return amount * RATES[currency]


@tghost.tool
async def convert_later(amount: float, currency: str) -> float:
    """Convert an amount to euros (an async def: the event loop)."""
    return amount * RATES[currency]


@tghost.tool
def distinct(words: str) -> Any:
    """The distinct words, as a set: what JSON cannot hold."""
    return set(words.split())


PATHS = {"lane": ("convert", ServeSettings()), "loop": ("convert-later", ServeSettings()),
         "process": ("convert", ServeSettings(isolation="process"))}


def host(url: str, settings: ServeSettings) -> LocalHost:
    """The tools above on a host with an id (``HOST``), announcing on a topic of its own."""
    return LocalHost(url, [convert, convert_later, distinct], settings, announce_as=HOST,
                     topic=f"persistent://tg/config/errors-{uuid.uuid4().hex[:8]}")


async def failed(local: LocalHost, tool: str, **arguments: Any) -> ToolCallError:
    with pytest.raises(ToolCallError) as info:
        await local.call(tool, arguments)
    return info.value


def logged(caplog: pytest.LogCaptureFixture, request_id: str) -> logging.LogRecord:
    """The one host log line that names ``request_id``."""
    [record] = [record for record in caplog.records if request_id in record.getMessage()]
    return record


def traceback_of(record: logging.LogRecord) -> str:
    """The traceback a log line carries: its exception's, or a worker process's in its text."""
    return logging.Formatter().formatException(record.exc_info) if record.exc_info else record.getMessage()


@pytest.mark.parametrize("path", list(PATHS))
async def test_a_failing_tools_reply_names_the_host_and_the_request_its_log_line_names(
    pulsar_broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    caplog.set_level(logging.ERROR, logger="tghost.serving.request")
    tool, settings = PATHS[path]
    async with host(pulsar_broker.url, settings) as local:
        error = await failed(local, tool, amount=3, currency="GBP")
    assert (error.error_type, error.message, error.host) == ("tool-service-error", "KeyError: 'GBP'", HOST)
    assert error.request_id is not None and re.fullmatch(r"[0-9a-f]{32}", error.request_id)
    record = logged(caplog, error.request_id)
    assert record.getMessage().startswith(f"service {tool}: request {error.request_id}: invoke raised")
    assert "KeyError: 'GBP'" in traceback_of(record) and "RATES[currency]" in traceback_of(record)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize(("detail", "told"), [
    ("type", "KeyError (its message and traceback are in the log of host errors-host, under request {id})"),
    ("none", "the tool failed; see the log of host errors-host for request {id}"),
])
async def test_error_detail_keeps_the_exception_from_the_caller_and_in_the_log(
    pulsar_broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture, path: str, detail: str, told: str
) -> None:
    caplog.set_level(logging.ERROR, logger="tghost.serving.request")
    tool, settings = PATHS[path]
    async with host(pulsar_broker.url, ServeSettings(isolation=settings.isolation, error_detail=detail)) as local:
        error = await failed(local, tool, amount=3, currency="GBP")
    assert error.request_id is not None
    assert (error.error_type, error.message, error.host) == ("tool-service-error", told.format(id=error.request_id),
                                                             HOST)
    assert "GBP" in traceback_of(logged(caplog, error.request_id))


@pytest.mark.parametrize("path", ["lane", "process"])
async def test_a_tool_error_and_invalid_arguments_are_told_in_full_whatever_the_detail(
    pulsar_broker: EmbeddedBroker, path: str
) -> None:
    async with host(pulsar_broker.url, ServeSettings(isolation=PATHS[path][1].isolation, error_detail="none")) \
            as local:
        meant = await failed(local, "convert", amount=3, currency="XXX")
        invalid = await failed(local, "convert", amount="three", currency="EUR")
    assert (meant.error_type, meant.message) == ("tool-service-error", "XXX is no currency: give an ISO 4217 code")
    assert invalid.error_type == "invalid-arguments" and invalid.message.startswith("argument 'amount':")
    assert meant.host == invalid.host == HOST


@pytest.mark.parametrize("isolation", ["thread", "process"])
async def test_a_result_json_cannot_hold_names_the_type_the_tool_returned(
    pulsar_broker: EmbeddedBroker, isolation: str
) -> None:
    async with host(pulsar_broker.url, ServeSettings(isolation=isolation)) as local:
        error = await failed(local, "distinct", words="a b a")
    assert (error.error_type, error.message) == (
        "tool-service-error", "service 'distinct': the tool returned a set, which is not JSON: return a str, list, "
                              "dict, number, bool or None")


@pytest.mark.parametrize("isolation", ["thread", "process"])
async def test_every_tool_service_error_a_caller_is_pointed_to_has_its_line_in_the_hosts_log(
    pulsar_broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture, isolation: str
) -> None:
    # 'tghost call' sends the reader of a tool-service-error to the host's log under its request id: a result
    # JSON cannot hold (a fault of the plugin's, once logged as a TypeError) and a ToolError are found there too
    caplog.set_level(logging.WARNING, logger="tghost.serving.request")
    async with host(pulsar_broker.url, ServeSettings(isolation=isolation)) as local:
        unsent = await failed(local, "distinct", words="a b a")
        meant = await failed(local, "convert", amount=3, currency="XXX")
    for error in (unsent, meant):
        assert error.request_id is not None
        line = logged(caplog, error.request_id).getMessage()
        assert line.startswith(f"service {'distinct' if error is unsent else 'convert'}: request {error.request_id}: "
                               f"tool-service-error: ") and line.endswith(error.message)


async def test_trustgraphs_own_client_reads_the_type_and_the_message_of_an_error_that_says_where(
    pulsar_broker: EmbeddedBroker
) -> None:
    base = pytest.importorskip("trustgraph.base.request_response_client", reason="trustgraph-base is not installed")
    backend_module = pytest.importorskip("trustgraph.base.async_pulsar_backend")
    schema = pytest.importorskip("trustgraph.schema")
    async with host(pulsar_broker.url, ServeSettings()) as local:
        descriptor = local.descriptors["convert"]
        client = await base.RequestResponseClient.create(
            backend=backend_module.AsyncPulsarBackend(pulsar_broker.url), request_topic=descriptor.request_queue,
            response_topic=descriptor.response_queue, request_schema=schema.ToolServiceRequest,
            response_schema=schema.ToolServiceResponse)
        try:
            response = await client.request(schema.ToolServiceRequest(
                config="{}", arguments=json.dumps({"amount": 3, "currency": "GBP"})), timeout=30)
        finally:
            await client.close()
    assert (response.error.type, response.error.message) == ("tool-service-error", "KeyError: 'GBP'")
    assert response.response == "" and response.end_of_stream
