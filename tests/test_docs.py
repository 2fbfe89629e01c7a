"""docs: every code block in README.md, CONTRIBUTING.md, CHANGELOG.md and docs/**/*.md is run by a test, or
is output (```text).

How it works: :func:`blocks` collects every fenced block with its language. A block a reader
would run or copy is claimed in :data:`RUN_BY` by its file and first line, naming the test
module that fetches it (with :func:`block` or :func:`commands`) and runs it; a block in
docs/protocol.md under an ``<!-- example: NAME -->`` marker is checked by tests/protocol/test_protocol.py;
the few that no test can run here are in :data:`NOT_RUN` with the reason. A new block that is
none of these fails :func:`test_every_code_block_is_run_by_a_test_or_is_output`.

docs/reference/plugin-hooks.md also stays in step with the hookspecs (as datasette checks its hooks).
"""

from __future__ import annotations

import inspect
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import tghost
from tghost.author import hookspecs
from tghost.discovery.discover import catalog_of_plugin

ROOT = Path(__file__).resolve().parent.parent
HOOKS_DOC = ROOT / "docs" / "reference" / "plugin-hooks.md"
#: Fenced blocks that show output to the reader; never run.
OUTPUT = "text"


@dataclass(frozen=True)
class Block:
    """One fenced code block: its file (relative to the repo), line, language, text and the
    ``<!-- example: NAME -->`` marker right above it, if any."""

    path: str
    line: int
    language: str
    text: str
    example: str | None

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0] if self.text else ""


def documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks() -> list[Block]:
    """Every fenced block of :func:`documents`, in order."""
    found = []
    for path in documents():
        text = path.read_text()
        for match in re.finditer(r"^(<!-- example: ([^\n]*?)\s*(?:-->)?\n)?```(\S*)\n(.*?)^```", text, re.M | re.S):
            found.append(Block(str(path.relative_to(ROOT)), text[:match.start()].count("\n") + 1 + bool(match[1]),
                               match[3], match[4], match[2]))
    return found


def block(path: str, first_line: str) -> str:
    """The text of the blocks of ``path`` whose first line is ``first_line``, joined in order (a
    file shown in parts: ``# x.py`` then ``# x.py, continued``, fetched one name at a time)."""
    texts = [b.text for b in blocks() if b.path == path and b.first_line == first_line]
    assert texts, f"no block in {path} starts with {first_line!r}"
    return "\n".join(texts)


def commands(path: str, first_line: str) -> list[tuple[list[str], str]]:
    """The commands of a shell or console block, each as ``(argv, output shown under it)``:
    ``$ `` prompts, ``&`` and ``# comments`` dropped, ``tghost``/``python`` (or their
    ``.venv/bin/`` forms) replaced by this interpreter, so a test runs them in its own env.
    In a console block, a line without a ``$ `` prompt is output of the command above it."""
    console = _is_console(path, first_line)
    runs: list[tuple[list[str], str]] = []
    for line in block(path, first_line).splitlines():
        if console and not line.startswith("$ "):
            argv, shown = runs[-1]
            runs[-1] = (argv, shown + line + "\n")
            continue
        command = re.sub(r"\s+#.*$", "", line.removeprefix("$ ")).strip().removesuffix("&").strip()
        runs.append((_local(shlex.split(command)), ""))
    return runs


def _is_console(path: str, first_line: str) -> bool:
    return any(b.language == "console" for b in blocks() if b.path == path and b.first_line == first_line)


def _local(argv: list[str]) -> list[str]:
    program = argv[0].removeprefix(".venv/bin/")
    if program == "tghost":
        return [sys.executable, "-m", "tghost", *argv[1:]]
    if program in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    return [program, *argv[1:]]


def module_of(source: str, name: str) -> ModuleType:
    """Run ``source`` as the body of a new module ``name`` (registered in ``sys.modules``, so a
    ``@tghost.tool`` in it can be pickled by reference)."""
    module = ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


#: The test module that runs each block a reader would run or copy, by (file, first line).
RUN_BY = {
    ("README.md", "$ .venv/bin/tghost tools "): "test_readme_try_it",
    ("README.md", "$ . .venv/bin/activate "): "test_scaffold",
    ("README.md", "# an agent"): "test_readme_try_it",
    ("docs/getting-started.md", "$ .venv/bin/tghost call --service joke-service "): "test_readme_try_it",
    ("docs/guides/writing-plugins.md", "# pyproject.toml"): "test_writing_plugins",
    ("docs/guides/writing-plugins.md", "# tghost_weather.py"): "test_writing_plugins",
    ("docs/guides/writing-plugins.md", "# tghost_weather.py, continued"): "test_writing_plugins",
    ("docs/guides/writing-plugins.md", "# tests/test_weather.py"): "test_writing_plugins",
    ("docs/guides/writing-plugins.md", "$ tghost install -e '.[test]'"): "test_writing_plugins",
    ("docs/guides/writing-plugins.md", "# tools.toml"): "test_examples",
    ("docs/guides/security.md", "# a deployment's own access check"): "test_docs",
    ("docs/guides/security.md", "# access.toml"): "test_access",
    ("docs/guides/isolation.md", "# tghost_wordcount.py"): "test_docs",
    ("docs/guides/agents.md", ".venv/bin/tghost run --config examples/tools.toml &"): "test_examples",
    ("docs/guides/inspector.md", "tghost inspect "): "test_inspector",
    ("docs/guides/search.md", "tghost tools --search "): "test_mcp",
    ("docs/guides/search.md", '{"mcpServers": {"tghost-search": '): "test_mcp",
    ("docs/guides/mcp.md", '{"mcpServers": {"tghost-read-only": '): "test_mcp",
    ("docs/integrations/trustgraph.md", "[external-services.tgpeer] "): "test_external_services",
    ("docs/integrations/mcp-servers.md", "[mcp-servers.memory]"): "test_mcp_servers",
    ("docs/integrations/mcp-servers.md", "# time.toml"): "test_mcp_servers",
    ("docs/integrations/mcp-servers.md", "$ tghost run --config time.toml &"): "test_mcp_servers",
    ("docs/integrations/openai-agents.md", "# calculator_agent.py"): "test_openai_agents",
    ("docs/integrations/openai-agents.md", "# calculator_agent.py, continued"): "test_openai_agents",
    ("docs/reference/plugin-hooks.md", "# tghost_textkit.py"): "test_docs",
    ("docs/reference/plugin-hooks.md", "# tghost_search.py"): "test_docs",
    ("docs/reference/plugin-hooks.md", "# tghost_access.py"): "test_docs",
    ("docs/reference/plugin-hooks.md", "# tghost_greeter.py"): "test_docs",
    ("docs/reference/plugin-hooks.md", "# tghost_lifecycle.py"): "test_docs",
    ("docs/reference/plugin-hooks.md", "# tghost_bridge.py"): "test_docs",
    ("docs/reference/plugin-api.md", "# tghost_units.py"): "test_plugin_api",
    ("docs/reference/plugin-api.md", "# tghost_units.py, continued"): "test_plugin_api",
    ("docs/reference/plugin-api.md", "# tests/test_units.py"): "test_plugin_api",
    ("docs/reference/plugin-api.md", "# tghost_crawl.py"): "test_progress",
    ("docs/reference/agent-api.md", "# agent.py"): "test_agent_api",
    ("docs/guides/embedding.md", "# my_app.py"): "test_host",
    ("docs/guides/embedding.md", "# with_my_app.py"): "test_host",
    ("docs/integrations/langchain.md", "# shop_agent.py"): "test_langchain",
    ("docs/integrations/pydantic-ai.md", "# agent.py: a Pydantic AI agent"): "test_pydantic_ai",
    ("docs/integrations/pydantic-ai.md", "# many tools: the model finds them"): "test_pydantic_ai",
}

#: Blocks no test runs here, and why.
NOT_RUN = {
    ("README.md", "python3 -m venv .venv && .venv/bin/pip install -e '.[mcp]' -e plugins/tghost-joke -e "
                  "plugins/tghost-calculator -e plugins/tghost-knowledge && .venv/bin/tghost run"):
        "the set-up command: a new venv and four installs from an index (minutes); the tests run in tox's "
        "venv, which installs the same distributions, and test_readme_try_it runs the 'tghost run' it ends with",
    ("README.md", "python3 -m pip install tox && python3 -m tox"): "the test suite itself (.ci/run runs it)",
    ("CONTRIBUTING.md", "python3 -m venv .venv && .venv/bin/pip install -e '.[mcp]' -e plugins/tghost-joke -e "
                        "plugins/tghost-calculator -e plugins/tghost-knowledge && .venv/bin/tghost run"):
        "the README's set-up command, repeated for contributors (see the README's reason)",
    ("CONTRIBUTING.md", "python3 -m pip install tox && python3 -m tox"): "the test suite itself (.ci/run runs it)",
    ("README.md", '{"mcpServers": {"tghost": {"command": "tghost", "args": ["mcp", "--group", "default"],'):
        "an MCP client's own config file; tests/adapters/test_mcp.py runs 'tghost mcp' over stdio as a client does",
    ("docs/operations/production.md", "export TGHOST_PULSAR_URL=pulsar+ssl://pulsar.example.com:6651"):
        "needs an Apache Pulsar cluster with TLS and token auth (pulsar-lite enforces neither)",
    ("docs/operations/production.md", "helm repo add apache https://pulsar.apache.org/charts"):
        "needs a Kubernetes cluster, Helm, Docker and a registry; tests/deploy validates every manifest against "
        "Kubernetes 1.31's schemas, checks the Dockerfile's entry point and runs 'tghost pulsar policies' as the "
        "Job does",
    ("docs/integrations/amplifier.md", "pip install -e plugins/tghost-amplifier"):
        "installs an Amplifier module from GitHub (network); plugins/tghost-amplifier/tests serve local modules",
    ("docs/integrations/amplifier.md", "[amplifier.tool-filesystem]"):
        "configures the GitHub module above; plugins/tghost-amplifier/tests pass the same table to local modules",
    ("docs/integrations/amplifier.md", "tools:"):
        "an Amplifier session's mount plan; plugins/tghost-amplifier/tests/test_session.py mounts tool-tghost "
        "with the same config keys",
    ("docs/integrations/openai-agents.md", 'pip install "tghost[openai-agents]"'):
        "installs from an index; tox -e frameworks installs the same extra and runs "
        "tests/integrations/test_openai_agents.py",
    ("docs/integrations/mcp-servers.md", "pip install tghost-mcp mcp-server-time"):
        "installs from an index; tox -e mcp-servers installs both (tox.ini), and tests/adapters/test_mcp_servers.py "
        "runs the page's time server there",
    ("docs/guides/security.md", "tghost run --signing-key keys/host-a.key --trusted-key keys/host-a.pub"):
        "needs the reader's keys and a fleet; tests/serving/test_policy_fleet.py's trusted-keys case runs two "
        "hosts with the HostConfig signer and trusted keys these flags set",
    ("docs/integrations/langchain.md", 'pip install "tghost[langchain]"'):
        "installs from an index; tox -e frameworks installs the same extra and runs "
        "tests/integrations/test_langchain.py",
    ("docs/integrations/pydantic-ai.md", 'pip install "tghost[pydantic-ai]"'):
        "installs from an index; tox -e frameworks installs the same extra and runs the page's agent",
    ("docs/integrations/pydantic-ai.md", "python agent.py anthropic:"):
        "needs a model provider's API key; tests/integrations/test_pydantic_ai.py runs the script's main with "
        "Pydantic AI's FunctionModel",
    ("docs/internals/performance.md", "python3 -m pip install tox && python3 -m tox -e bench"):
        "the benchmarks (minutes, and timing goes into bench/, never into tests)",
    ("docs/internals/scale.md", ".venv/bin/python bench/run.py scale"):
        "the scale benchmark (minutes at full size; timing goes into bench/, never into tests)",
}


def claim(b: Block) -> tuple[str, str] | None:
    """The key of :data:`RUN_BY` or :data:`NOT_RUN` that claims block ``b``: same file, and a
    first line that starts with the key's (the longest such key)."""
    keys = [key for key in {**RUN_BY, **NOT_RUN} if key[0] == b.path and b.first_line.startswith(key[1])]
    return max(keys, key=lambda key: len(key[1]), default=None)


def test_every_code_block_is_run_by_a_test_or_is_output() -> None:
    unclaimed = [f"{b.path}:{b.line}: ```{b.language or '(no language)'} {b.first_line!r}" for b in blocks()
                 if b.language != OUTPUT and b.example is None and claim(b) is None]
    assert not unclaimed, (
        "these blocks are run by no test: fence output as ```text; else name the test module that runs the block "
        "in RUN_BY (by file and first line), or the reason none can in NOT_RUN:\n" + "\n".join(unclaimed))


def test_every_claimed_block_exists_and_its_test_fetches_it() -> None:
    claimed = {claim(b) for b in blocks()}
    assert set(RUN_BY) | set(NOT_RUN) <= claimed, sorted((set(RUN_BY) | set(NOT_RUN)) - claimed)
    for (path, first_line), module in RUN_BY.items():
        source = next((ROOT / "tests").rglob(f"{module}.py")).read_text()
        assert path in source and first_line.split("  #")[0].strip() in source, (path, first_line, module)


def test_the_protocol_examples_are_checked_by_name() -> None:
    source = (ROOT / "tests" / "protocol" / "test_protocol.py").read_text()
    names = {b.example.split(":")[0].strip() for b in blocks() if b.example is not None}
    assert names and all(f'examples("{name}")' in source for name in names), names


def test_the_block_counts() -> None:
    """The figures of the report (``pytest -s``): blocks, output, protocol examples, run by tests, not run."""
    every = blocks()
    output = [b for b in every if b.language == OUTPUT]
    examples = [b for b in every if b.example is not None and b.language != OUTPUT]
    run = [b for b in every if (key := claim(b)) is not None and key in RUN_BY]
    not_run = [b for b in every if (key := claim(b)) is not None and key in NOT_RUN]
    print(f"\n{len(every)} blocks: {len(output)} output, {len(examples)} protocol examples, {len(run)} run by tests, "
          f"{len(not_run)} not run, with a reason")
    assert len(output) + len(examples) + len(run) + len(not_run) == len(every)


# docs/guides: the access check and the process-isolated tool.

async def test_the_guides_access_check_denies_with_its_reason(pulsar_broker: Any) -> None:
    from tghost.agent.client import ToolCallError
    from tghost.testing import LocalHost

    module = module_of(block("docs/guides/security.md", "# a deployment's own access check"), "tghost_readme_access")
    kb = tghost.tool(name="custom-rag")(lambda question: f"found: {question}")
    async with LocalHost(pulsar_broker.url, [kb], authorize=module.tghost_authorize) as host:
        assert await host.call("custom-rag", {"question": "q"}, user="alice") == "found: q"
        with pytest.raises(ToolCallError) as refused:
            await host.call("custom-rag", {"question": "q"}, user="eve")
    assert (refused.value.error_type, refused.value.message) == ("not-allowed", "eve may not search the knowledge base")


async def test_the_guides_process_isolated_services_run_in_worker_processes(
    pulsar_broker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tghost.testing import LocalHost

    (tmp_path / "tghost_wordcount.py").write_text(block("docs/guides/isolation.md", "# tghost_wordcount.py"))
    monkeypatch.syspath_prepend(str(tmp_path))  # a worker process imports the module to get the services
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    import tghost_wordcount  # type: ignore[import-not-found]

    services = [tghost_wordcount.word_count, tghost_wordcount.Parser()]
    assert [s.isolation for s in services] == ["process", "process"] and services[0].timeout == 5
    async with LocalHost(pulsar_broker.url, services) as host:
        assert await host.call("word-count", {"text": "one two three"}) == "3"
        assert await host.call("parser", {"text": "abcd"}) == "4"


# docs/reference/plugin-hooks.md: every example, run as a plugin module.

async def test_the_hooks_page_examples_register_serve_and_shut_down(pulsar_broker: Any) -> None:
    from tghost.testing import LocalHost

    textkit = module_of(block("docs/reference/plugin-hooks.md", "# tghost_textkit.py"), "tghost_textkit")
    async with LocalHost(pulsar_broker.url, plugin=textkit) as host:
        assert await host.call("word-count", {"text": "a b c"}) == "3"

    search = module_of(block("docs/reference/plugin-hooks.md", "# tghost_search.py"), "tghost_search")
    catalog = catalog_of_plugin(search)
    assert {name: tool.config for name, tool in catalog.tools.items()} == {
        "query-customers": {"collection": "customers"}, "query-products": {"collection": "products"}}

    access = module_of(block("docs/reference/plugin-hooks.md", "# tghost_access.py"), "tghost_access")
    assert access.tghost_authorize(user="eve", service="custom-rag") == "eve may not search the knowledge base"
    assert access.tghost_authorize(user="alice", service="custom-rag") is None

    greeter = module_of(block("docs/reference/plugin-hooks.md", "# tghost_greeter.py"), "tghost_greeter")
    added: dict[str, Any] = {}
    greeter.tghost_register_plugins(register=lambda name, load, **_: added.setdefault(name, load),
                                    config={"greeter": {"greetings": ["hello", "hi"]}})
    assert sorted(added) == ["greeter-hello", "greeter-hi"]
    assert list(catalog_of_plugin(added["greeter-hi"]()).tools) == ["greet-hi"]

    lifecycle = module_of(block("docs/reference/plugin-hooks.md", "# tghost_lifecycle.py"), "tghost_lifecycle")
    catalog_of_plugin(lifecycle).shutdown()
    assert lifecycle.stop.is_set()


async def test_the_hooks_page_toolset_serves_what_the_remote_server_lists_and_nothing_while_it_is_down(
    pulsar_broker: Any,
) -> None:
    from tghost.testing import LocalHost

    bridge = module_of(block("docs/reference/plugin-hooks.md", "# tghost_bridge.py"), "tghost_bridge")
    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    async with LocalHost(pulsar_broker.url, plugin=bridge) as host:
        assert await host.call("echo", {"text": "hi"}) == '{"tool": "echo", "arguments": {"text": "hi"}}'
        bridge.tools_listed([{"name": "echo", "description": "Echo", "input_schema": schema},
                             {"name": "shout", "description": "Shout", "input_schema": schema}])
        await bridge.remote.wait_applied()
        assert await host.call("shout", {"text": "hi"}) == '{"tool": "shout", "arguments": {"text": "hi"}}'
        bridge.server_down(4)
        await bridge.remote.wait_applied()
        assert host.catalog.tools == {}
        assert host.catalog.toolset_problems() == [
            "toolset 'remote' of plugin 'tghost_bridge': server down, restarting in 4 s"]


# docs/reference/plugin-hooks.md stays in step with the hookspecs.

def specs() -> dict[str, list[str]]:
    """Every hookspec in tghost.author.hookspecs: name -> argument names, in order."""
    return {name: list(inspect.signature(fn).parameters)
            for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
            if hasattr(fn, "tghost_spec")}


def documented() -> dict[str, list[str]]:
    """Every ``## tghost_name(args)`` heading in the hooks doc: name -> argument names."""
    headings = re.findall(r"^## (tghost_\w+)\(([^)]*)\)$", HOOKS_DOC.read_text(), re.MULTILINE)
    return {name: [a.strip() for a in args.split(",") if a.strip()] for name, args in headings}


def test_hookspecs_are_found() -> None:
    assert {"tghost_register_services", "tghost_register_tools", "tghost_authorize"} <= set(specs())


def test_every_hook_is_documented_with_its_exact_arguments_and_nothing_else_is() -> None:
    assert documented() == specs()


REPO = HOOKS_DOC.parent.parent
#: Where the project documents itself: what a reader or a docstring may cite.
SOURCES = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md", "docs", "host", "bench", "plugins", "tests", "examples",
           "tox.ini", "pyproject.toml")


def repo_text_files() -> dict[Path, str]:
    files = [path for source in SOURCES for path in ([REPO / source] if (REPO / source).is_file()
                                                     else (REPO / source).rglob("*"))]
    return {path: path.read_text() for path in files
            if path.is_file() and path.suffix in {".py", ".md", ".toml", ".ini", ".txt", ".j2"}
            and not {"__pycache__", ".tox", "build"} & set(path.relative_to(REPO).parts)}


def test_every_markdown_file_cited_is_in_the_repo_and_nothing_cites_outside_it() -> None:
    """The project documents itself: every cited ``*.md`` is here, and nothing points outside the repo."""
    present = {path.name for path in REPO.rglob("*.md") if ".tox" not in path.parts}
    outside = "../" + "shared"  # split, so this file does not cite it
    cited = {(path.relative_to(REPO).as_posix(), name) for path, text in repo_text_files().items()
             for name in re.findall(r"\b([\w-]+\.md)\b", text)}
    assert [(where, name) for where, name in sorted(cited) if name not in present] == []
    assert [path for path, text in repo_text_files().items() if outside in text] == []


#: The project's own words: docs/internals/architecture.md's glossary defines each (in bold).
GLOSSARY = ("seed 000", "seed 001", "hop", "lane", "port", "terms", "ledger", "window", "contest", "hand-off",
            "claim", "lease", "epoch", "restatement", "instance", "slot", "drain", "grace", "gate", "session",
            "toolset", "hints", "structured observation", "typed call", "driver", "loop driver", "inline driver")


def test_the_glossary_defines_the_projects_own_words() -> None:
    glossary = (ROOT / "docs" / "internals" / "architecture.md").read_text().split("\n## Glossary\n", 1)[1]
    assert set(GLOSSARY) <= set(re.findall(r"\*\*([^*]+)\*\*", glossary))
