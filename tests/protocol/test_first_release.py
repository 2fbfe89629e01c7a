"""first release: a directory of tghost's first release follows a host that announces the tool
keys added later (``title``, ``annotations``, ``output-schema``: docs/protocol.md §3.3). Its
tool model is frozen here as it shipped: it takes those keys for config values and sends them in
the request's config. It still lists the tool and calls it unchanged, and the tool service never
sees those keys."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

import tghost
from tghost.broker import EmbeddedBroker
from tghost.protocol import ADDED_TOOL_KEYS
from tghost.testing import LocalHost


class FirstReleaseTool(BaseModel):
    """The tool descriptor model of the first release (tghost 0.1.0's ``ToolDescriptor``), as it
    shipped: every key it does not know is a config value."""

    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="allow")

    type: Literal["tool-service"] = "tool-service"
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    description: str = Field(min_length=1)
    service: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    arguments: tuple[dict[str, Any], ...] = ()
    group: tuple[str, ...] = ("default",)
    state: str | None = None
    available_in_states: tuple[str, ...] | None = Field(
        default=None, validation_alias=AliasChoices("available_in_states", "applicable-states"))
    input_schema: dict[str, Any] | None = Field(default=None, alias="input-schema")

    @field_validator("group", mode="before")
    @classmethod
    def _group_as_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class Almanac(tghost.ToolService):
    id = "almanac"
    description = "A yearly weather figure of a city."
    config_params = (tghost.ConfigParam(name="figure", required=True),)
    arguments = (tghost.Argument(name="city", type="string", description="City name"),)

    def __init__(self) -> None:
        self.configs: list[dict[str, Any]] = []

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        self.configs.append(config)
        return json.dumps({"city": arguments["city"], "figure": "690 mm a year"})


#: The tool as a newer host announces it: a title, hints and an output schema, and one config value.
RAINFALL = {
    "name": "rainfall", "description": "Yearly rainfall of a city", "service": "almanac", "figure": "rainfall",
    "title": "Yearly rainfall", "annotations": {"read-only": True, "idempotent": True},
    "output-schema": {"type": "object", "properties": {"city": {"type": "string"}, "figure": {"type": "string"}},
                      "required": ["city", "figure"]},
}


async def test_a_first_release_directory_lists_and_calls_a_tool_announced_with_the_added_keys(
    pulsar_broker: EmbeddedBroker,
) -> None:
    almanac = Almanac()
    async with (LocalHost(pulsar_broker.url, [almanac], tools=[RAINFALL], announce_as="newer-host"),
                tghost.ToolDirectory(tghost.PulsarSettings(pulsar_broker.url)) as directory):
        await directory.wait_for("rainfall")
        announced = {"type": "tool-service", **directory.tools["rainfall"].descriptor.to_json_dict()}
        assert await directory.invoke("rainfall", {"city": "Lisbon"}) == {"city": "Lisbon", "figure": "690 mm a year"}
        old = FirstReleaseTool.model_validate(announced)  # the first release lists it ...
        assert old.name == "rainfall" and set(old.config) == {"figure", *ADDED_TOOL_KEYS}
        caller = await directory.caller(directory.tools["rainfall"].service.descriptor)
        chunks = [chunk async for chunk in caller.stream(old.config, {"city": "Lisbon"})]  # ... and calls it
    assert json.loads("".join(chunks)) == {"city": "Lisbon", "figure": "690 mm a year"}
    assert almanac.configs == [{"figure": "rainfall"}, {"figure": "rainfall"}]  # never the added keys
