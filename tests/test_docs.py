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
