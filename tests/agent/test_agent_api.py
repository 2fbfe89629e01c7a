"""docs/reference/agent-api.md stays in step with the code, and its agent runs as written.

Each table lists exactly what introspection finds: ``ToolDirectory``'s parameters (with their
defaults), its public methods and attributes, the options of ``invoke``/``stream``, the fields
of a change and the keys of a tool and a host in JSON. A new option must be documented, and a
removed one must leave the page. The error types and exceptions are on docs/reference/errors.md
(tests/test_errors_page.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import tghost
from tests.conftest import HostProcess
from tests.test_docs import block
from tghost.agent import calls
from tghost.agent.entries import Change, DirectoryTool, ServiceEntry
from tghost.agent.hosts import LiveHost
from tghost.broker import EmbeddedBroker

PAGE = "docs/reference/agent-api.md"
TEXT = (Path(__file__).resolve().parents[2] / PAGE).read_text()


def rows(heading: str) -> dict[str, list[str]]:
    """The rows of the tables under ``heading`` (``## x`` or ``### x``): first-column name -> the other cells."""
    section = re.split(rf"\n#+ {re.escape(heading)}\n", TEXT, maxsplit=1)[1]
    section = re.split(r"\n#+ ", section, maxsplit=1)[0]
    return {m[1]: [cell.strip() for cell in m[2].split("|")]
            for m in re.finditer(r"^\| `([^`]+)` \|(.*)\|$", section, re.MULTILINE)}


def test_every_directory_parameter_is_documented_with_its_default() -> None:
    parameters = dict(inspect.signature(tghost.ToolDirectory).parameters)
    table = rows("ToolDirectory")
    assert set(table) == set(parameters)
    for name, (default, _) in table.items():
        value = parameters[name].default
        if value is inspect.Parameter.empty:
            assert default == "", name
        elif isinstance(value, str):
            assert default == f"`{value}`", name
        elif value is None or value == ():
            assert default == f"`{value!r}`", name
        else:
            assert float(default) == value, name


def test_every_public_method_and_attribute_of_the_directory_is_documented() -> None:
    directory = tghost.ToolDirectory(tghost.PulsarSettings())  # not started: nothing connects
    names = {*vars(type(directory)), *vars(directory)}
    assert set(rows("Methods and attributes")) == {name for name in names if not name.startswith("_")}


def test_every_call_option_is_documented_and_typed_for_invoke() -> None:
    options = {p.name for p in inspect.signature(calls.ToolCalls.stream).parameters.values()
               if p.kind is p.KEYWORD_ONLY}
    assert set(rows("Call options")) == options == set(calls.CallOptions.__annotations__)


def test_every_field_of_a_change_is_documented() -> None:
    assert set(rows("Changes")) == {f.name for f in dataclasses.fields(Change)}


def test_the_exports_named_for_agents_exist() -> None:
    section = TEXT.split("\n## The names\n", 1)[1]
    named = set(re.findall(r"`(\w+)`", section)) - {"tghost"}
    assert named and named <= set(tghost.__all__)


def test_the_agent_runs_as_a_script(
    pulsar_broker: EmbeddedBroker, tmp_path: Path, host_process: Callable[..., HostProcess],
) -> None:
    env = {**os.environ, "TGHOST_PULSAR_URL": pulsar_broker.url, "XDG_CONFIG_HOME": str(tmp_path),
           "TGHOST_LOAD_PLUGINS": "joke,calculator"}
    host = host_process(env=env)
    host.wait_for("announced")
    script = tmp_path / "agent.py"
    script.write_text(block(PAGE, "# agent.py"))
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    first, best, rest = result.stdout.split("\n", 2)
    assert first.startswith("live tools: ") and "tell-joke" in first and best == "best match: tell-joke"
    joke, steps = rest.split("2 * (3 + 4)\n", 1)
    assert joke.strip() and steps == "= 2 * 7\n= 14\nrefused: unknown-tool\n"


def test_every_key_of_a_tool_in_json_is_documented() -> None:
    service = tghost.ToolServiceDescriptor.model_validate(
        {"id": "svc", "request-queue": "non-persistent://tg/request/svc",
         "response-queue": "non-persistent://tg/response/svc"})
    descriptor = tghost.ToolDescriptor.model_validate(
        {"name": "t", "description": "d", "service": "svc", "state": "s", "available_in_states": ["s"], "title": "T",
         "annotations": {"read-only": True}, "output-schema": {"type": "object"}})
    shape = DirectoryTool(descriptor, ServiceEntry(service, ()), ()).to_json()
    assert set(rows("A tool in JSON")) == set(shape) and None not in shape.values()


def test_every_key_of_a_host_in_json_is_documented() -> None:
    host = LiveHost(id="h", instances=("i",), host={"hostname": "m", "version": "1"}, lease_end=1.0,
                    lease_seconds=30.0, signed_by="k", verified=True, services=(), external=(), tools=(),
                    conflicts=(), health="http://127.0.0.1:9/health")
    assert set(rows("A host in JSON")) == {*host.to_json(0.0), "health"}  # health: what tghost status fetched
