"""typed results over the wire: a service with an output schema answers with its result's JSON
text and the reply property ``tghost-content-type: application/json`` (docs/protocol.md §2.14),
a result that does not match is answered ``tool-service-error`` naming the field, in thread and
process isolation alike; and a request whose config carries a tool's ``title``, ``annotations``
and ``output-schema``, as a directory of tghost's first release sends them, still calls the tool,
whose ``invoke`` never sees those keys. On the embedded broker."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import pulsar
import pytest
import typing_extensions
from pydantic import BaseModel

import tghost
from tghost.agent.client import ToolCallError
from tghost.broker import EmbeddedBroker
from tghost.protocol import wire
from tghost.protocol.descriptors import ToolServiceDescriptor
from tghost.serving.executors.base import PROCESS, THREAD
from tghost.serving.settings import ServeSettings
from tghost.testing import LocalHost


class Weather(BaseModel):
    city: str
    high: int


class Later(typing_extensions.TypedDict):
    city: str
    days: int


@tghost.tool
def forecast(city: str, high: int = 20) -> Weather:
    """A plain def (the thread lane in thread isolation); high -1 breaks the result."""
    return Weather(city=city, high=high) if high >= 0 else {"city": city, "high": "unknown"}  # type: ignore[return-value]


@tghost.tool
async def forecast_later(city: str, days: int = 2) -> Later:
    """An async def (the loop path); no days breaks the result."""
    return {"city": city, "days": days} if days else {"city": city}  # type: ignore[typeddict-item]


@tghost.tool(persistent=True)
def filed(city: str) -> Weather:
    """On a persistent topic: its reply is waited for (Port.receipt)."""
    return Weather(city=city, high=18)


@tghost.tool
def plain(text: str) -> str:
    """No output schema: nothing on its replies says JSON."""
    return text


class Almanac(tghost.ToolService):
    """A class service with an explicit output schema, checked with jsonschema."""

    id = "almanac"
    input_schema: ClassVar[dict[str, Any]] = {"type": "object", "properties": {"figure": {}}}
    output_schema: ClassVar[dict[str, Any]] = {
        "type": "object", "properties": {"figure": {"type": "number"}}, "required": ["figure"]}

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        return {"figure": arguments.get("figure", 690)}


class Keeper(tghost.ToolService):
    """Answers with the config its ``invoke`` got."""

    id = "keeper"
    config_params = ("collection",)

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        return config


@tghost.tool(config=["collection"])
def kept(ctx: tghost.Context, collection: str = "none") -> dict[str, Any]:
    """Answers with its config value and the config its Context got."""
    return {"collection": collection, "context": ctx.config}


SERVICES = [forecast, forecast_later, filed, plain, Almanac(), Keeper(), kept]


class Tap:
    """Reads every reply on a service's response topic, as any caller's subscription does."""

    def __init__(self, url: str, descriptor: ToolServiceDescriptor) -> None:
        self.client = pulsar.Client(url)
        self.replies: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.consumer = self.client.subscribe(descriptor.response_queue, f"tap-{uuid.uuid4().hex[:6]}",
                                              message_listener=self._take)

    def _take(self, consumer: Any, message: Any) -> None:
        consumer.acknowledge(message)
        self.replies.append((message.properties(), json.loads(message.data())))

    async def last_replies(self, count: int) -> list[tuple[dict[str, str], dict[str, Any]]]:
        """The replies once ``count`` last replies (``end_of_stream``) have come."""
        while sum(reply["end_of_stream"] for _, reply in self.replies) < count:
            await asyncio.sleep(0.01)
        return self.replies


@pytest.fixture(params=[THREAD, PROCESS])
async def host(request: pytest.FixtureRequest, pulsar_broker: EmbeddedBroker) -> Any:
    async with LocalHost(pulsar_broker.url, SERVICES, ServeSettings(isolation=request.param, grace=5.0)) as served:
        yield served


@pytest.fixture
def taps(host: LocalHost) -> Iterator[dict[str, Tap]]:
    tapped = {sid: Tap(host.pulsar.url, host.descriptors[sid])
              for sid in ("forecast", "forecast-later", "filed", "almanac", "plain")}
    yield tapped
    for tap in tapped.values():
        tap.client.close()


async def test_a_typed_result_is_its_json_text_and_its_reply_says_so(host: LocalHost, taps: dict[str, Tap]) -> None:
    assert json.loads(await host.call("forecast", {"city": "Lisbon"})) == {"city": "Lisbon", "high": 20}
    assert json.loads(await host.call("forecast-later", {"city": "Porto"})) == {"city": "Porto", "days": 2}
    assert json.loads(await host.call("filed", {"city": "Faro"})) == {"city": "Faro", "high": 18}
    assert json.loads(await host.call("almanac", {"figure": 2.5})) == {"figure": 2.5}
    assert await host.call("plain", {"text": "hi"}) == "hi"
    for sid in ("forecast", "forecast-later", "filed", "almanac"):
        [(properties, reply)] = await taps[sid].last_replies(1)
        assert properties[wire.CONTENT_TYPE] == wire.JSON_CONTENT, sid
        assert reply["error"] is None and json.loads(reply["response"])
    [(properties, _)] = await taps["plain"].last_replies(1)
    assert wire.CONTENT_TYPE not in properties


@pytest.mark.parametrize(("name", "arguments", "field"), [
    ("forecast", {"city": "Lisbon", "high": -1}, "field 'high': Input should be a valid integer"),
    ("forecast-later", {"city": "Lisbon", "days": 0}, "field 'days': required, but not given"),
    ("almanac", {"figure": "lots"}, "field 'figure': 'lots' is not of type 'number'"),
])
async def test_a_result_that_does_not_match_is_a_tool_service_error_naming_the_field(
    host: LocalHost, taps: dict[str, Tap], name: str, arguments: dict[str, Any], field: str
) -> None:
    with pytest.raises(ToolCallError) as error:
        await host.call(name, arguments)
    assert error.value.error_type == wire.TOOL_SERVICE_ERROR
    assert error.value.message.startswith(f"service '{name}': the tool's result does not match its output schema: "
                                          f"{field}")
    [(properties, _)] = await taps[name].last_replies(1)
    assert wire.CONTENT_TYPE not in properties  # an error reply has no observation to read as JSON


async def test_an_old_directorys_title_annotations_and_output_schema_config_values_never_reach_invoke(
    host: LocalHost
) -> None:
    sent = {"title": "Keeper", "annotations": {"read-only": True}, "output-schema": {"type": "object"},
            "collection": "customers"}
    assert json.loads(await host.call("keeper", config=sent)) == {"collection": "customers"}
    assert json.loads(await host.call("kept", config=sent)) == {"collection": "customers",
                                                                  "context": {"collection": "customers"}}
