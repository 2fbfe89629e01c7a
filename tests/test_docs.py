"""docs: docs/plugin-hooks.md stays in step with the hookspecs (as datasette checks its hooks)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from tghost import hookspecs

HOOKS_DOC = Path(__file__).resolve().parent.parent / "docs" / "plugin-hooks.md"


def specs() -> dict[str, list[str]]:
    """Every hookspec in tghost.hookspecs: name -> argument names, in order."""
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
SOURCES = ("README.md", "docs", "host", "bench", "plugins", "tests", "examples", "tox.ini", "pyproject.toml")


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
