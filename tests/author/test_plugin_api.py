"""docs/reference/plugin-api.md stays in step with the code, and its plugin runs as written.

Each section's table lists exactly what introspection finds: the public attributes of
``ToolService`` and ``ToolSet``, the options of ``@tghost.tool``, ``Context``'s fields, ``Argument``'s and
``ConfigParam``'s, a tool descriptor's JSON keys and ``LocalHost``'s parameters and methods.
A new option must be documented, and a removed one must leave the page. The error types are on
docs/reference/errors.md (tests/test_errors_page.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import tghost
from tests.test_docs import block, module_of
from tghost.broker import EmbeddedBroker
from tghost.protocol.descriptors import ToolDescriptor
from tghost.testing import LocalHost

PAGE = "docs/reference/plugin-api.md"
TEXT = (Path(__file__).resolve().parents[2] / PAGE).read_text()


def documented(heading: str) -> set[str]:
    """The names in the first column of the tables under ``## heading``."""
    section = TEXT.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE))


def public(cls: type) -> set[str]:
    return {name for name in {*vars(cls), *cls.__annotations__} if not name.startswith("_")}


def test_every_tool_service_attribute_is_documented_and_nothing_else() -> None:
    assert documented("ToolService") == public(tghost.ToolService)


def test_every_tool_option_is_documented_and_nothing_else() -> None:
    parameters = inspect.signature(tghost.tool).parameters.values()
    assert documented("@tghost.tool") == {f"**{p.name}" if p.kind is p.VAR_KEYWORD else p.name for p in parameters}


def test_context_argument_and_config_param_fields_are_documented() -> None:
    fields = {f.name for f in dataclasses.fields(tghost.Context) if f.repr}  # report (repr=False) is the host's
    methods = {name for name, value in vars(tghost.Context).items() if callable(value) and not name.startswith("_")}
    assert documented("Context") == fields | methods
    assert documented("Argument and ConfigParam") == {*tghost.Argument.model_fields, *tghost.ConfigParam.model_fields}


def test_every_tool_descriptor_key_is_documented() -> None:
    assert documented("Tools as dicts") == {f.alias or name for name, f in ToolDescriptor.model_fields.items()}


def test_every_toolset_attribute_is_documented_and_nothing_else() -> None:
    assert documented("ToolSet") == public(tghost.ToolSet)


def test_the_errors_take_what_the_page_says() -> None:
    """The error types themselves are listed on docs/reference/errors.md (tests/test_errors_page.py)."""
    assert {"error_type", "message"} <= set(inspect.signature(tghost.ToolCallError).parameters)
    assert list(inspect.signature(tghost.ToolError).parameters) == ["message", "error_type"]


def test_local_host_parameters_and_methods_are_documented() -> None:
    assert documented("Testing") == set(inspect.signature(LocalHost).parameters) | public(LocalHost)
    assert "`pulsar_broker`" in TEXT


@pytest.fixture
def units() -> Any:
    """The page's plugin, built from its blocks, importable as ``tghost_units``."""
    yield module_of(block(PAGE, "# tghost_units.py") + "\n" + block(PAGE, "# tghost_units.py, continued"),
                    "tghost_units")
    sys.modules.pop("tghost_units", None)


async def test_the_pages_plugin_and_its_tests_run_as_written(units: Any, pulsar_broker: EmbeddedBroker) -> None:
    tests = module_of(block(PAGE, "# tests/test_units.py"), "test_units")
    await tests.test_tools_answer_by_name_with_their_config(pulsar_broker)
    await tests.test_errors_carry_their_type(pulsar_broker)
    assert units.convert.tool("x", "y", source="mi", target="km").input_schema == units.convert.arguments_schema
