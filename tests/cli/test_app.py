"""cli.app: the ``tghost`` group (its help lists every command without importing one, and each
command loads only the libraries it uses: the MCP SDK only ``tghost mcp``, an agent framework
none) and the console script's ending (exit code kept, no finalisation). In process with click's
CliRunner, and in forks of one fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Sequence

import click
import pytest
from click.testing import CliRunner

from tghost._version import __version__
from tghost.cli.app import COMMANDS, cli

#: Run in a fresh interpreter: import the group as the ``tghost`` script does, then for each
#: argv (one JSON list per line of stdin) fork, run it, and print one line
#: ``LOADED [argv, modules]``: the ``tghost.cli.*`` modules and the libraries of ``HEAVY`` that
#: are imported then. A fork of one interpreter costs a fraction of a fresh one per argv.
PROBE = textwrap.dedent("""
    import json, os, sys
    from tghost.cli.app import cli

    heavy = set(json.loads(sys.argv[1]))
    for line in sys.stdin:
        argv = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                cli(argv)
            except SystemExit:
                pass
            loaded = sorted(m for m in sys.modules if m.startswith("tghost.cli.") or m in heavy)
            print("LOADED", json.dumps([argv, loaded]), flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
""")

#: The optional libraries: the MCP SDK (the ``mcp`` extra, ``tghost mcp`` alone) and the agent
#: frameworks of ``tghost.integrations`` (their extras; no command).
OPTIONAL = ("mcp", "pydantic_ai", "langchain", "langchain_core", "agents")
#: The libraries that cost start-up.
HEAVY = ("pydantic", "pulsar", "pluggy", "cryptography", "opentelemetry", "tantivy", "starlette", "uvicorn",
         "jinja2", "prometheus_client", *OPTIONAL)


def loaded_by(argvs: Sequence[Sequence[str]]) -> dict[tuple[str, ...], set[str]]:
    """What ``tghost ARGV`` has imported once it ran, for each argv (see :data:`PROBE`)."""
    shown = subprocess.run([sys.executable, "-c", PROBE, json.dumps(HEAVY)], capture_output=True, text=True,
                           check=True, input="".join(json.dumps(list(argv)) + "\n" for argv in argvs)).stdout
    rows = [json.loads(line.removeprefix("LOADED ")) for line in shown.splitlines() if line.startswith("LOADED ")]
    return {tuple(argv): set(loaded) for argv, loaded in rows}


def test_help_lists_every_command_by_its_own_first_line_without_importing_any() -> None:
    ctx = click.Context(cli)
    for name, entry in COMMANDS.items():  # the table's help is the command's own
        assert cli.get_command(ctx, name).get_short_help_str(10_000) == entry.help, name  # type: ignore[union-attr]
    listed = CliRunner().invoke(cli, ["--help"], terminal_width=200).output
    assert all(f"  {name} " in listed for name in COMMANDS)
    imported = loaded_by([["--help"]])[("--help",)]
    assert imported == {"tghost.cli.app"}  # no command module, and none of the heavy libraries


#: What each command loads before it runs (its module's imports, as ``COMMAND --help`` shows them),
#: among the libraries that cost start-up: only what it uses. The rest load where they are used
#: (tracing, signing keys, search, the web and MCP adapters).
LOADS = {
    "new": set(), "install": set(), "uninstall": set(), "keygen": set(), "pulsar": set(),  # no plugin, no broker
    "broker": {"pulsar"},  # asks the port with the client's handshake
    **dict.fromkeys(("tools", "call", "watch", "export", "inspect", "mcp", "trustgraph"),
                    frozenset({"pulsar", "pydantic"})),  # the directory: Pulsar and the descriptor models
    "status": {"pulsar"},  # the directory's models once it asks the announcements, not for --url
    "plugins": {"pulsar", "pydantic", "pluggy"}, "run": {"pulsar", "pydantic", "pluggy"},  # plugins too
}


@pytest.fixture(scope="module")
def loads() -> dict[str, set[str]]:
    """The heavy libraries each command's ``--help`` loaded."""
    found = loaded_by([[command, "--help"] for command in LOADS])
    return {argv[0]: loaded & set(HEAVY) for argv, loaded in found.items()}


@pytest.mark.parametrize("command", sorted(LOADS))
def test_no_command_loads_a_library_it_does_not_use(loads: dict[str, set[str]], command: str) -> None:
    assert loads[command] == LOADS[command]


def test_every_command_has_its_loads_stated() -> None:
    assert set(LOADS) == set(COMMANDS)


#: In a fresh interpreter where the optional libraries cannot be imported (as where they are not
#: installed), import every tghost module but the MCP bridge and the framework modules; print the
#: ones that fail and the optional libraries loaded.
WITHOUT_OPTIONAL = textwrap.dedent("""
    import importlib, json, pkgutil, sys
    optional = json.loads(sys.argv[1])
    for name in optional:
        sys.modules[name] = None
    import tghost
    failed = []
    for module in pkgutil.walk_packages(tghost.__path__, "tghost."):
        if module.name in ("tghost.__main__", "tghost.adapters.mcp") or module.name.startswith("tghost.integrations."):
            continue
        try:
            importlib.import_module(module.name)
        except ImportError as exc:
            failed.append(f"{module.name}: {exc}")
    print(json.dumps([failed, sorted(name for name in optional if sys.modules.get(name) is not None)]))
""")


def test_only_the_mcp_bridge_and_the_framework_modules_need_an_optional_library() -> None:
    """So no command but ``tghost mcp`` loads the MCP SDK, and none an agent framework, however it runs."""
    shown = subprocess.run([sys.executable, "-c", WITHOUT_OPTIONAL, json.dumps(OPTIONAL)], capture_output=True,
                           text=True, check=True, timeout=120).stdout
    assert json.loads(shown) == [[], []]


def test_version_and_short_help() -> None:
    version = CliRunner().invoke(cli, ["--version"])
    assert (version.exit_code, version.output) == (0, f"tghost, version {__version__}\n")
    assert CliRunner().invoke(cli, ["-h"]).output == CliRunner().invoke(cli, ["--help"]).output


def test_an_unknown_command_is_a_usage_error_exit_2() -> None:
    result = CliRunner().invoke(cli, ["serve"])
    assert result.exit_code == 2 and "No such command 'serve'" in result.stderr


#: A ``tghost`` script that leaves a mark if the interpreter finalises (``atexit``).
ENDING = textwrap.dedent("""
    import atexit, sys
    from tghost.cli import main

    atexit.register(print, "finalised")
    sys.argv = ["tghost", *sys.argv[1:]]
    main()
""")


@pytest.mark.parametrize(("args", "code"), [(["--version"], 0), (["serve"], 2)])
def test_the_script_ends_with_its_command_s_exit_code_and_no_finalisation(args: list[str], code: int) -> None:
    """``main`` ends with ``os._exit`` (:mod:`tghost.system.exits`): output flushed, code kept."""
    ended = subprocess.run([sys.executable, "-c", ENDING, *args], capture_output=True, text=True, timeout=60)
    assert ended.returncode == code, ended.stderr
    assert "finalised" not in ended.stdout and (ended.stdout + ended.stderr).strip()
