"""public API: the public line (docs/internals/architecture.md "The public line") is drawn in code and held.

Users import from ``tghost``, ``tghost.testing`` and ``tghost.protocol`` (and, once they exist,
``tghost.integrations`` packages); every other module is internal and free to move. So:

- each public module's ``__all__`` is pinned here, as httpx pins its exports: a name that
  appears or goes is a decision, made in this file and in docs/internals/architecture.md;
- ``tghost`` and ``tghost.protocol`` load each name on first use from the module that defines
  it, and their type-checking imports name the same modules;
- nothing a user reads or copies goes past the line: the Python in README.md and the user pages
  of docs/ (:data:`USER_PAGES`; the pages about internals, :data:`INTERNAL_PAGES`, name the
  modules they describe), the inline code in backticks of those pages and of the plugins'
  READMEs, ``examples/``, the shipped plugins (their code and their tests) and what ``tghost
  new`` writes. Output shown in fenced blocks (log lines name their logger, a module) is not
  checked. A failure names the file, the line and the public name to use instead.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_docs import ROOT, blocks
from tghost.author.scaffold import TEMPLATES, PluginNames, write_plugin

#: The public modules. ``tghost.integrations`` and its subpackages are public too (reserved).
PUBLIC = ("tghost", "tghost.testing", "tghost.protocol")
INTEGRATIONS = "tghost.integrations"

TGHOST = [
    "Argument", "BrokerError", "BrokerUnavailable", "CallOptions", "CallRecord", "Caller", "Catalog", "Change",
    "ConfigError", "ConfigParam", "Context", "DEFAULT_TOPIC", "DEFAULT_URL", "DescriptorError", "DirectoryTool",
    "Found", "Host", "HostConfig", "HostError", "InvalidArguments", "KeyFileError", "LiveHost", "NoProvider",
    "NotPulsarBroker", "PluginLoadError", "PluginSelection", "Progress", "PulsarSettings", "SearchError",
    "ServeSettings", "Signer", "ToolCallError", "ToolCallRecord", "ToolDescriptor", "ToolDirectory", "ToolError",
    "ToolService", "ToolServiceClient", "ToolServiceDescriptor", "ToolSet", "ToolView", "TrustedKeys", "UnknownTool",
    "__version__", "current_caller", "current_context", "discover", "hookimpl", "input_schema", "is_reachable",
    "next_state", "select", "tool",
]

TESTING = [
    "Conformance", "EmbeddedBroker", "Finding", "LocalHost", "RawWire", "check_conformance", "publish_history",
    "pulsar_broker", "simulated_history",
]

PROTOCOL = [
    "ADDED_TOOL_KEYS", "Announcement", "Argument", "BAD_REQUEST", "BAD_SIGNATURE", "BadRequest", "CALLER", "CANCEL",
    "CANCELLED", "CONTENT_TYPE", "Caller", "CallerSession", "ConfigParam", "DEFAULT_GROUPS", "DEFAULT_STATE",
    "DEFAULT_TIMEOUT", "DEFAULT_TOPIC", "DescriptorError", "EPOCH_SECONDS", "Entries", "HostInfo", "HostSessionKey",
    "INVALID_ARGUMENTS", "JSON_CONTENT", "KINDS", "KeyFileError", "Lease", "MACS", "MAX_LEASE", "MAX_LIFETIME",
    "MAX_MESSAGE", "MISSING_CONFIG", "NOT_ALLOWED", "OK", "OVERLOADED", "OpenSession", "PROGRESS", "Progress",
    "RATE_LIMITED", "REDELIVERY_LIMIT", "RESTATEMENT_MARGIN", "Request", "Response", "SESSION", "SESSION_KEY",
    "SESSION_SIGNATURE", "SIGNATURE", "SIGNATURE_FIELD", "SIGNED_AT", "Signer", "TIMEOUT", "TOOL_SERVICE_ERROR",
    "TooLarge", "ToolAccess", "ToolAnnotations", "ToolDescriptor", "ToolServiceDescriptor", "TrustedKeys",
    "UNAUTHORIZED", "UNAVAILABLE", "UNKNOWN_KEY", "UNKNOWN_SESSION", "UNSIGNED", "WILDCARD", "announcement_key",
    "announcement_value", "caller_key_id", "canonical_json", "check_lease", "control_topic", "current_topic",
    "decode_request", "decode_response", "encode_error", "encode_progress", "encode_request", "encode_response",
    "epoch_of", "epoch_topic", "fingerprint", "full_topic_name", "is_available", "key_id", "mac_bytes",
    "next_state", "observation", "open_session", "parse_descriptor", "read_window", "request_queue",
    "response_queue", "schema_of_arguments", "select", "sign_request", "signed_bytes", "signed_request_bytes",
    "signed_within", "verify_mac", "verify_request",
]

#: The modules of ``tghost.integrations``, each importable only beside its framework (its extra).
INTEGRATION_MODULES = {
    "tghost.integrations.langchain": ["DirectoryMiddleware", "PROGRESS_EVENT", "directory_tools"],
    "tghost.integrations.openai_agents": ["DirectoryServer", "directory_tools"],
    "tghost.integrations.pydantic_ai": ["DirectoryToolset", "ToolProgress"],
}

#: Pages a user reads to use tghost: they name public paths only.
DOCS = ROOT / "docs"
#: Pages about tghost's insides (docs/internals/), which name the internal modules they describe.
INTERNAL_PAGES = tuple(str(path.relative_to(ROOT)) for path in sorted((DOCS / "internals").rglob("*.md")))
#: Every other page of the site, and the README.
USER_PAGES = ("README.md", *(str(path.relative_to(ROOT)) for path in sorted(DOCS.rglob("*.md"))
                             if str(path.relative_to(ROOT)) not in INTERNAL_PAGES))
#: ``tghost.<x>`` in prose that is no Python name: the entry-point group and file names.
NOT_PYTHON = frozenset({"plugins", "toml", "key", "pub"})


@pytest.mark.parametrize(("module", "pinned"), [("tghost", TGHOST), ("tghost.testing", TESTING),
                                                ("tghost.protocol", PROTOCOL)])
def test_the_exported_names_are_pinned_and_each_resolves(module: str, pinned: list[str]) -> None:
    exported = importlib.import_module(module)
    assert sorted(exported.__all__) == pinned, (
        f"{module}.__all__ changed: the public line moves only on purpose; update the list in this test "
        "and docs/internals/architecture.md 'The public line'")
    for name in pinned:
        assert getattr(exported, name) is not None, f"{module}.{name}"


@pytest.mark.parametrize(("module", "pinned"), sorted(INTEGRATION_MODULES.items()))
def test_each_integrations_exported_names_are_pinned(module: str, pinned: list[str]) -> None:
    exported = pytest.importorskip(module, exc_type=ImportError, reason="needs its framework (tox -e frameworks)")
    assert sorted(exported.__all__) == pinned, f"{module}.__all__ changed: update INTEGRATION_MODULES on purpose"
    for name in pinned:
        assert getattr(exported, name) is not None, f"{module}.{name}"


@pytest.mark.parametrize("module", ["tghost", "tghost.protocol"])
def test_dir_lists_the_exported_names_and_anything_else_is_an_attribute_error(module: str) -> None:
    exported = importlib.import_module(module)
    assert dir(exported) == sorted(exported.__all__)
    with pytest.raises(AttributeError, match=rf"^module '{re.escape(module)}' has no attribute 'nothing_here'$"):
        exported.nothing_here  # noqa: B018


def type_checking_imports(source: str) -> dict[str, str]:
    """Name -> module of every ``from MODULE import NAME`` under a module's ``if TYPE_CHECKING:``."""
    guarded = [node for node in ast.parse(source).body
               if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    return {alias.name: str(statement.module) for node in guarded for statement in node.body
            if isinstance(statement, ast.ImportFrom) for alias in statement.names}


@pytest.mark.parametrize("module", ["tghost", "tghost.protocol"])
def test_each_lazy_name_comes_from_the_module_its_type_checking_import_names(module: str) -> None:
    exported = importlib.import_module(module)
    typed = type_checking_imports(Path(str(exported.__file__)).read_text())
    assert typed == exported._LAZY
    assert set(exported.__all__) - {"__version__"} == set(typed)
    for name, where in typed.items():
        assert getattr(exported, name) is getattr(importlib.import_module(where), name), name


def test_importing_the_public_modules_loads_no_heavy_library() -> None:
    probe = ("import sys, tghost, tghost.protocol, tghost.protocol.epochs\n"
             "print(sorted(m for m in ('pydantic', 'pulsar', 'pluggy', 'cryptography') if m in sys.modules))")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert shown.strip() == "[]"


# -- nothing a user reads or copies goes past the line ----------------------------------------


def exported(module: str) -> frozenset[str]:
    return frozenset(importlib.import_module(module).__all__)


def public_path(name: str) -> str | None:
    """Where a user gets ``name`` from: ``tghost.<name>``, ``tghost.testing.<name>`` or
    ``tghost.protocol.<name>``, the first that exports it; ``None`` if none does."""
    return next((f"{module}.{name}" for module in PUBLIC if name in exported(module)), None)


def instead(name: str) -> str:
    """What to write instead of an internal path that ends with ``name``."""
    path = public_path(name)
    if path is not None:
        return f"use `{path}`"
    return ("name a public path (tghost, tghost.testing, tghost.protocol; docs/internals/architecture.md "
            "'The public line'), or export the name there if users need it")


def past_the_line(dotted: str) -> str | None:
    """Why the dotted path ``tghost...`` goes past the public line (what to use instead), or
    ``None`` when it stays on the public side."""
    parts = dotted.split(".")
    if len(parts) == 1 or dotted == INTEGRATIONS or dotted.startswith(INTEGRATIONS + "."):
        return None
    module = ".".join(parts[:2])
    if module in PUBLIC and (len(parts) == 2 or parts[2] in exported(module)):
        return None
    if parts[1] in exported("tghost"):
        return None
    return instead(parts[-1])


class Crossings(ast.NodeVisitor):
    """Every import and every ``tghost.x.y`` attribute chain of a module that goes past the
    line, as ``(line, the code, what to use instead)``."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str, str]] = []

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.startswith("tghost.") and (why := past_the_line(alias.name)):
                self.found.append((node.lineno, f"import {alias.name}", why))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level or not (module == "tghost" or module.startswith("tghost.")):
            return
        for alias in node.names:
            if why := past_the_line(f"{module}.{alias.name}"):
                self.found.append((node.lineno, f"from {module} import {alias.name}", why))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = [node.attr]
        value = node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id == "tghost":
            dotted = ".".join(["tghost", *reversed(chain)])
            if why := past_the_line(dotted):
                self.found.append((node.lineno, dotted, why))
            return
        self.generic_visit(node)


def crossings(source: str) -> list[tuple[int, str, str]]:
    visitor = Crossings()
    visitor.visit(ast.parse(source))
    return visitor.found


def python_sources(scaffold: Path) -> Iterator[tuple[str, int, str]]:
    """``(where, first line, source)`` of every Python file or block a user reads or copies:
    the user pages' Python blocks, ``examples/``, the shipped plugins' code and tests, and the
    plugin ``tghost new`` writes (rendered into ``scaffold``, reported by its template)."""
    for block in blocks():
        if block.path in USER_PAGES and block.language == "python":
            yield block.path, block.line, block.text
    for pattern in ("examples/*.py", "plugins/*/tghost_*/**/*.py", "plugins/*/tests/**/*.py"):
        for path in sorted(ROOT.glob(pattern)):
            yield str(path.relative_to(ROOT)), 0, path.read_text()
    root = write_plugin(PluginNames.parse("textkit"), scaffold)
    names = PluginNames.parse("textkit").context()
    for template, target in TEMPLATES.items():
        if target.endswith(".py"):
            yield f"host/tghost/author/templates/plugin/{template}", 0, (root / target.format(**names)).read_text()


def user_pages(scaffold: Path) -> Iterator[tuple[str, str]]:
    """``(where, text)`` of every page a user reads: :data:`USER_PAGES`, the shipped plugins'
    READMEs and the README ``tghost new`` writes (rendered into ``scaffold``)."""
    for page in [*USER_PAGES, *(str(path.relative_to(ROOT)) for path in sorted(ROOT.glob("plugins/*/README.md")))]:
        yield page, (ROOT / page).read_text()
    root = write_plugin(PluginNames.parse("textkit"), scaffold)
    yield "host/tghost/author/templates/plugin/README.md.jinja", (root / "README.md").read_text()


def prose_paths(text: str) -> Iterator[tuple[int, str]]:
    """``(line, dotted path)`` of every ``tghost.x...`` inside inline code in ``text``, outside fenced blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for span in re.findall(r"`([^`]+)`", line):
            for dotted in re.findall(r"(?<![\w./-])tghost(?:\.[A-Za-z_]\w*)+", span):
                yield number, dotted


def test_the_pages_about_internals_are_found() -> None:
    assert {"docs/internals/architecture.md", "docs/protocol.md"} <= {*INTERNAL_PAGES, *USER_PAGES}
    assert "docs/internals/architecture.md" in INTERNAL_PAGES and "docs/protocol.md" in USER_PAGES


def test_no_code_a_user_reads_or_copies_imports_past_the_public_line(tmp_path: Path) -> None:
    found = [f"{where}:{first + line}: `{code}` goes past the public line: {why}"
             for where, first, source in python_sources(tmp_path) for line, code, why in crossings(source)]
    assert not found, "\n".join(found)


def test_no_user_page_names_an_internal_module_in_its_prose(tmp_path: Path) -> None:
    found = [f"{page}:{line}: `{dotted}` is not a public path: {why}"
             for page, text in user_pages(tmp_path) for line, dotted in prose_paths(text)
             if dotted.split(".")[1] not in NOT_PYTHON and (why := past_the_line(dotted))]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(("code", "complaint"), [
    ("from tghost.pulsar.clients import BrokerUnavailable", "use `tghost.BrokerUnavailable`"),
    ("import tghost.protocol.groups", "name a public path"),
    ("from tghost.protocol import wire", "name a public path"),
    ("from tghost.broker import EmbeddedBroker", "use `tghost.testing.EmbeddedBroker`"),
    ("import tghost\ntghost.discovery.discover.catalog_of([])", "name a public path"),
    ("import tghost\ntghost.agent.calls.CallOptions", "use `tghost.CallOptions`"),
])
def test_a_crossing_is_found_and_the_public_name_given(code: str, complaint: str) -> None:
    [(_, _, why)] = crossings(code)
    assert why.startswith(complaint)


@pytest.mark.parametrize("code", [
    "import tghost\ntghost.ToolService.arguments_schema", "from tghost.protocol import encode_request",
    "from tghost.testing import LocalHost", "import tghost.testing", "from tghost import protocol",
    "import tghost.integrations.langchain", "from .service import x",
])
def test_public_paths_pass(code: str) -> None:
    assert crossings(code) == []


def test_prose_paths_are_the_inline_code_outside_fenced_blocks() -> None:
    text = ("Fails with `tghost.pulsar.clients.BrokerUnavailable` (`tghost.plugins` group).\n"
            "```text\nINFO tghost.adapters.trustgraph.sync: put tool/x\n```\nthen `a.tghost.b` and `tghost.tool`\n")
    assert list(prose_paths(text)) == [(1, "tghost.pulsar.clients.BrokerUnavailable"), (1, "tghost.plugins"),
                                       (5, "tghost.tool")]
