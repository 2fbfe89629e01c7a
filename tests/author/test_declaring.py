"""declaring: a tool's title, behaviour hints and typed result, as a plugin author declares them
(``@tghost.tool`` options, ``ToolService`` attributes, ``service.tool(...)``, tool dicts and the
config file), the descriptors they give, the errors at decoration and registration, and the
result check that ``invoke`` makes once for every executor. No broker: tests/serving/test_typed_results.py
serves the same over the wire."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import sys
import typing
from pathlib import Path
from typing import Any, ClassVar

import pytest
import typing_extensions
from pydantic import BaseModel, RootModel

import tghost
from tghost.author.service import Call, invoke
from tghost.discovery.config import load_config_tools
from tghost.discovery.discover import catalog_of
from tghost.protocol import wire


class Weather(BaseModel):
    city: str
    high: int


class WeatherDict(typing_extensions.TypedDict):
    city: str
    high: int


@dataclasses.dataclass
class WeatherData:
    city: str
    high: int


@tghost.tool(title="Weather forecast", read_only=True, open_world=True)
def forecast(city: str, high: int = 20) -> Weather:
    """Forecast the weather."""
    return Weather(city=city, high=high)


@tghost.tool
async def forecast_later(city: str, broken: bool = False) -> WeatherDict:
    """Forecast the weather, asynchronously; broken, without its high."""
    return {"city": city} if broken else {"city": city, "high": 21}  # type: ignore[typeddict-item]


class Almanac(tghost.ToolService):
    """A class service with an explicit output schema and hints for its tools."""

    id = "almanac"
    description = "A yearly weather figure."
    input_schema: ClassVar[dict[str, Any]] = {"type": "object", "properties": {"city": {"type": "string"}}}
    title = "Almanac"
    read_only = True
    idempotent = True
    output_schema: ClassVar[dict[str, Any]] = {
        "type": "object", "properties": {"figure": {"type": "number"}}, "required": ["figure"]}

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        city = arguments.get("city", "")
        return {"figure": "lots"} if city == "Atlantis" else Weather(city=city, high=1) if city else {"figure": 690}


def call(**arguments: Any) -> Call:
    return Call("test", {}, arguments)


def tool_json(service: tghost.ToolService, name: str | None = None, **fields: Any) -> dict[str, Any]:
    tool = service.tool(name, **fields) if name else service.default_tools()[0]
    return tool.to_json_dict()


# Title and hints

def test_the_decorator_puts_the_title_and_the_hints_set_on_its_tool_and_leaves_the_rest_out() -> None:
    described = tool_json(forecast)
    assert described["title"] == "Weather forecast"
    assert described["annotations"] == {"read-only": True, "open-world": True}


def test_a_tool_without_a_title_or_hints_carries_neither_key() -> None:
    def echo(text: str) -> str:
        return text

    assert not {"title", "annotations", "output-schema"} & tool_json(tghost.tool(echo)).keys()


def test_a_services_tools_carry_its_title_and_hints_and_a_tool_may_override_or_unset_them() -> None:
    almanac = Almanac()
    assert tool_json(almanac, "rainfall")["annotations"] == {"read-only": True, "idempotent": True}
    described = tool_json(almanac, "purge", title="Purge", read_only=False, destructive=True, idempotent=None)
    assert described["title"] == "Purge" and described["annotations"] == {"read-only": False, "destructive": True}
    assert almanac.tool("purge", read_only=False).read_only is False and almanac.tool("x").read_only is True


def test_a_hint_that_is_not_a_boolean_is_refused_naming_the_tool_and_the_hint() -> None:
    with pytest.raises(tghost.DescriptorError, match="service 'almanac': tool 'x': field 'destructive': 'yes' is not"):
        Almanac().tool("x", destructive="yes")


def test_a_tool_dict_and_a_config_file_tool_take_the_wire_keys(tmp_path: Path) -> None:
    catalog = catalog_of([Almanac()], [{"name": "sunshine", "description": "Sunshine", "service": "almanac",
                                        "title": "Sunshine hours", "annotations": {"read-only": True}}])
    assert catalog.tools["sunshine"].title == "Sunshine hours" and catalog.tools["sunshine"].read_only
    path = tmp_path / "tools.toml"
    path.write_text('[tools.frost]\nservice = "almanac"\ndescription = "Frost days"\ntitle = "Frost"\n'
                    '[tools.frost.annotations]\nread-only = true\nopen-world = false\n')
    report = load_config_tools(catalog, path)
    frost = catalog.tools["frost"].to_json_dict()
    assert not report.errors and frost["title"] == "Frost"
    assert frost["annotations"] == {"read-only": True, "open-world": False}
    assert frost["output-schema"] == Almanac.output_schema  # its service's, left out of the table


def test_a_tool_dict_without_a_title_or_hints_takes_its_services() -> None:
    catalog = catalog_of([Almanac()], [{"name": "rain", "description": "Rainfall", "service": "almanac"}])
    rain = catalog.tools["rain"].to_json_dict()
    assert rain["title"] == "Almanac" and rain["annotations"] == {"read-only": True, "idempotent": True}


# Unknown keywords of the decorator

def test_an_unknown_keyword_is_a_type_error_naming_it_and_the_closest_option() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'read_onyl'; did you mean 'read_only'"):
        tghost.tool(read_onyl=True)
    with pytest.raises(TypeError, match="'colection'; did you mean 'collection'"):
        tghost.tool(config=["collection"], colection="customers")


def test_seed_001_keys_and_the_values_of_config_params_are_still_taken() -> None:
    def count(text: str, language: str = "en") -> str:
        return f"{language}: {len(text.split())}"

    for states in ({"available_in_states": ["reading"]}, {"applicable-states": ["reading"]}):
        [own] = tghost.tool(config=["language"], language="fr", group=["text"], state="counted", **states)(
            count).default_tools()
        assert own.config == {"language": "fr"} and own.group == ("text",) and own.available_in_states == ("reading",)


@pytest.mark.parametrize("param", sorted(tghost.protocol.ADDED_TOOL_KEYS))
def test_a_config_param_named_as_a_tool_key_is_refused_naming_the_service_and_the_param(param: str) -> None:
    class Keyed(tghost.ToolService):
        id = "keyed"
        config_params = (param,)

    with pytest.raises(tghost.DescriptorError, match=f"service 'keyed': config param '{param}': a tool key"):
        _ = Keyed().descriptor


def test_a_function_config_param_named_title_is_refused_too() -> None:
    @tghost.tool(service="titled", config=["title"])
    def titled(text: str, title: str = "") -> str:
        return title + text

    with pytest.raises(tghost.DescriptorError, match="service 'titled': config param 'title'"):
        _ = titled.descriptor


# Typed results: the schema

@pytest.mark.parametrize("annotation", [Weather, WeatherDict, WeatherData], ids=["pydantic", "TypedDict", "dataclass"])
def test_a_typed_return_annotation_gives_the_output_schema_of_what_it_dumps(annotation: type) -> None:
    def fn(city: str) -> Any:
        return annotation(city=city, high=1)

    fn.__annotations__["return"] = annotation
    typed = tghost.tool(fn)
    assert typed.output_schema is not None and typed.output_schema["type"] == "object"
    assert set(typed.output_schema["properties"]) == {"city", "high"}
    assert tool_json(typed)["output-schema"] == typed.output_schema


@pytest.mark.parametrize("annotation", [str, dict, dict[str, int], list[Weather], Weather | None, None])
def test_any_other_return_annotation_gives_no_output_schema(annotation: Any) -> None:
    def fn(city: str) -> Any:
        return city

    fn.__annotations__["return"] = annotation
    assert tghost.tool(fn).output_schema is None


def test_an_explicit_output_schema_wins_over_the_annotation() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}

    @tghost.tool(output_schema=schema)
    def explicit(city: str) -> Weather:
        return Weather(city=city, high=3)

    assert explicit.output_schema == schema == tool_json(explicit)["output-schema"]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="pydantic takes typing.TypedDict from Python 3.12")
def test_a_typing_typed_dict_before_python_3_12_is_refused_at_decoration_saying_what_to_use() -> None:
    class Plain(typing.TypedDict):
        city: str

    def fn(city: str) -> Any:
        return {"city": city}

    fn.__annotations__["return"] = Plain
    with pytest.raises(tghost.DescriptorError, match=r"service 'fn': field 'output_schema': .*typing_extensions"):
        tghost.tool(fn)


def test_an_output_schema_that_is_not_an_object_or_not_json_schema_is_refused_at_registration() -> None:
    def listed(city: str) -> RootModel[list[int]]:
        return RootModel[list[int]]([1])

    with pytest.raises(tghost.DescriptorError, match=r"""service 'listed': field 'output_schema': .*"type" must be"""):
        _ = tghost.tool(listed).descriptor
    bad = tghost.tool(name="bad", output_schema={"type": "object", "properties": 3})(listed)
    with pytest.raises(tghost.DescriptorError, match="service 'bad': field 'output_schema': not a valid JSON Schema"):
        _ = bad.descriptor


def test_a_streaming_tool_with_an_output_schema_is_refused_at_registration() -> None:
    @tghost.tool(output_schema={"type": "object"})
    def chunks(n: int) -> typing.Iterator[str]:
        yield from map(str, range(n))

    class Stream(Almanac):
        async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
            yield {"figure": 1}

    for service in (chunks, Stream()):
        with pytest.raises(tghost.DescriptorError, match="field 'output_schema': invoke streams"):
            _ = service.descriptor


def test_a_tool_of_a_service_with_an_output_schema_cannot_have_another() -> None:
    with pytest.raises(tghost.DescriptorError, match="tool 'x': field 'output-schema': a tool's output schema is its"):
        Almanac().tool("x", output_schema={"type": "object"})
    assert Almanac().tool("x", output_schema=Almanac.output_schema).output_schema == Almanac.output_schema
    other = {"name": "other", "description": "d", "service": "almanac", "output-schema": {"type": "object"}}
    with pytest.raises(ValueError, match=r"tool 'other': field 'output-schema': .* service 'almanac' has another"):
        catalog_of([Almanac()], [other])
    unchecked = {**other, "name": "unchecked", "service": "untyped"}  # a service without one: as given, unchecked
    assert catalog_of([tghost.tool(untyped)], [unchecked]).tools["unchecked"].output_schema == {"type": "object"}


# Typed results: the check, made by invoke for every executor

def test_a_typed_result_is_validated_and_sent_as_its_json_text() -> None:
    assert invoke(forecast, call(city="Lisbon", high=24)) == '{"city": "Lisbon", "high": 24}'
    assert forecast("Porto") == Weather(city="Porto", high=20)  # called directly, it is the function


def test_an_async_typed_result_is_checked_once_awaited() -> None:
    assert asyncio.run(invoke(forecast_later, call(city="Lisbon"))) == '{"city": "Lisbon", "high": 21}'
    with pytest.raises(tghost.ToolError) as error:
        asyncio.run(invoke(forecast_later, call(city="Lisbon", broken=True)))
    assert error.value.error_type == wire.TOOL_SERVICE_ERROR
    assert str(error.value) == ("service 'forecast-later': the tool's result does not match its output schema: "
                                "field 'high': required, but not given")


def test_a_class_services_result_is_checked_against_its_schema_a_model_dumped() -> None:
    almanac = Almanac()
    assert invoke(almanac, call()) == '{"figure": 690}'
    with pytest.raises(tghost.ToolError, match="does not match its output schema: field 'figure': required, but not"):
        invoke(almanac, call(city="Lisbon"))  # a Weather: dumped, then checked
    with pytest.raises(tghost.ToolError, match="field 'figure': 'lots' is not of type 'number'"):
        invoke(almanac, call(city="Atlantis"))
    with pytest.raises(tghost.ToolError, match=r"'almanac': the tool's result is not JSON data: .*unknown type"):
        almanac._observation({"figure": object()})
    with pytest.raises(tghost.ToolError, match="not JSON data: Out of range float values"):
        almanac._observation({"figure": float("nan")})


def test_an_explicit_schema_on_a_function_is_checked_with_json_schema() -> None:
    @tghost.tool(output_schema={"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}})
    def counted(n: int) -> dict[str, Any]:
        return {"n": n} if n >= 0 else {"n": "negative"}

    assert invoke(counted, call(n=2)) == '{"n": 2}'
    with pytest.raises(tghost.ToolError, match="field 'n': 'negative' is not of type 'integer'"):
        invoke(counted, call(n=-1))


def untyped(text: str) -> dict[str, str]:
    return {"text": text}


def test_an_untyped_result_is_returned_as_it_is() -> None:
    assert invoke(tghost.tool(untyped), call(text="a")) == {"text": "a"}


def test_a_class_service_with_an_output_schema_pickles_after_its_check_compiled() -> None:
    almanac = Almanac()
    _ = almanac.descriptor
    assert invoke(pickle.loads(pickle.dumps(almanac)), call()) == '{"figure": 690}'


class Reading(BaseModel):
    value: float


@tghost.tool
def sensor(broken: bool) -> Reading:
    """Read the sensor."""
    return Reading(value=float("nan") if broken else 1.5)


def test_a_typed_functions_nan_is_refused_as_a_class_services_is() -> None:
    assert invoke(sensor, call(broken=False)) == '{"value": 1.5}'
    with pytest.raises(tghost.ToolError, match="not JSON data"):
        invoke(sensor, call(broken=True))
