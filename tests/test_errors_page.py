"""docs/reference/errors.md is the one list of error types and exceptions, in step with the code.

It lists exactly what the code has (no more, no fewer): every error type a host answers with
(the wire's, :mod:`tghost.protocol.wire`) or a caller raises itself (:mod:`tghost.agent.calls`,
its client), once, under its own heading, with who sends it; and, in a table, every exception
``import tghost`` gives. docs/protocol.md §2.6 defines
the same types for other implementations; the Plugin API and Agent API pages link the list
instead of repeating it. No broker needed.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import re
from pathlib import Path

import tghost
from tghost.agent import answers, calls, client
from tghost.protocol import wire

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGE = DOCS / "reference" / "errors.md"
#: Upper-case strings of the wire module that are not error types: a user, a status, property names.
NOT_TYPES = {"DEFAULT_USER", "OK", "CANCEL", "PROGRESS", "CONTENT_TYPE", "JSON_CONTENT", "PROBE", "ALIVE", "HOLDS",
             "PROBES", "DRAINING", "STARTED"}


def section(text: str, heading: str) -> str:
    """The text under ``heading`` (any level, e.g. ``## Errors``), up to the next heading."""
    after = re.split(rf"\n#+ {re.escape(heading)}\n", text, maxsplit=1)[1]
    return re.split(r"\n#+ ", after, maxsplit=1)[0]


def rows(text: str) -> list[list[str]]:
    """The table rows whose first cell is inline code: the cells, stripped, backticks kept."""
    return [[cell.strip() for cell in m[1].split(" | ")]
            for m in re.finditer(r"^\| (`[^`]+` \|.*) \|$", text, re.MULTILINE)]


def sent_by_hosts() -> set[str]:
    """The error types of the wire: what a host answers a request with."""
    return {value for name, value in vars(wire).items()
            if name.isupper() and isinstance(value, str) and name not in NOT_TYPES}


def sent_by_callers() -> set[str]:
    """The types a caller raises itself: its refusals before sending (the second argument of each
    ``ToolCalls._refuse``, and its own ``ToolCallError`` classes), and what its client makes of
    an answer that does not come in time or does not decode."""
    source = inspect.getsource(calls)
    names = re.findall(r"self\._refuse\(\w+, ([\w.]+),", source)
    refused = {getattr(wire, n.split(".")[1]) if n.startswith("wire.") else vars(calls)[n] for n in names}
    assert {cls for cls in vars(calls).values() if isinstance(cls, type) and issubclass(cls, tghost.ToolCallError)
            and cls.__module__ == calls.__name__} == {calls.UnknownTool, calls.NoProvider}
    refused |= {calls.UnknownTool("x").error_type, calls.NoProvider("tool", "x").error_type}
    made = (re.findall(r"ToolCallError\(wire\.(\w+)", inspect.getsource(client))
            + re.findall(r'"type": wire\.(\w+)', inspect.getsource(answers)))
    assert made, "the client's own error types moved: find them again"
    return refused | {getattr(wire, name) for name in made}


#: Who sends a type, as the line under its heading says it.
SENDERS = {"Sent by the host.": "host", "Sent by the caller.": "caller",
           "Sent by the host or the caller.": "host, caller"}


def types_on_the_page() -> dict[str, str]:
    """Each error type of the page (a ``### `type``` heading under ``## Error types``), with who sends it."""
    types = PAGE.read_text().split("\n## Error types\n", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"^### `([^`]+)`\n\n(.*)$", types, re.MULTILINE)
    assert len(found) == types.count("\n### "), "a heading under Error types is not an error type"
    names = [name for name, _ in found]
    assert len(names) == len(set(names)), "an error type is listed twice"
    return {name: SENDERS[line] for name, line in found}


def test_the_page_lists_every_error_type_once_and_nothing_else() -> None:
    assert set(types_on_the_page()) == sent_by_hosts() | sent_by_callers()


def test_the_page_says_who_sends_each_type() -> None:
    hosts, callers = sent_by_hosts(), sent_by_callers()
    for name, sent_by in types_on_the_page().items():
        assert sent_by == ", ".join(who for who, types in (("host", hosts), ("caller", callers)) if name in types), name


def test_the_page_lists_every_exception_of_tghost() -> None:
    """tghost's own by their name (``ToolCallError``), the others as Python names them."""
    named = [row[0].strip("`") for row in rows(section(PAGE.read_text(), "Exceptions"))]
    assert len(named) == len(set(named))
    exported = {name for name in tghost.__all__
                if isinstance(value := getattr(tghost, name), type) and issubclass(value, BaseException)}
    assert exported <= set(named)
    for dotted in set(named) - exported:
        module, _, name = dotted.rpartition(".")
        error = getattr(importlib.import_module(module) if module else builtins, name)
        assert issubclass(error, BaseException), dotted


def test_the_protocol_defines_the_same_types() -> None:
    """§2.6's table holds the wire's types; its prose names each type a caller refuses with."""
    errors = section((DOCS / "protocol.md").read_text(), "2.6 Errors")
    assert {row[0].strip("`") for row in rows(errors)} == sent_by_hosts()
    assert {name for name in sent_by_callers() - sent_by_hosts() if f"`{name}`" not in errors} == set()
    assert "](reference/errors.md)" in errors


def test_the_api_pages_link_the_list_instead_of_repeating_it() -> None:
    every = sent_by_hosts() | sent_by_callers()
    for page in ("plugin-api.md", "agent-api.md"):
        errors = section((DOCS / "reference" / page).read_text(), "Errors")
        assert "](errors.md)" in errors, page
        assert [row for row in rows(errors) if row[0].strip("`") in every] == [], page
