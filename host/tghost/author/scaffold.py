"""scaffold: ``tghost new NAME`` writes a ready plugin distribution from the Jinja2 templates in
``tghost/author/templates/plugin``: pyproject with the entry point, one tool, a broker test, a README.
Never installs anything, and never overwrites a file unless told to (``force``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from tghost._version import __version__

__all__ = ["NAME_PATTERN", "BadPluginName", "PluginNames", "write_plugin"]

#: A plugin name: lowercase ASCII letters and digits, words joined by single ``-`` or ``_``.
NAME_PATTERN = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")

#: Template (under ``templates/plugin``) -> output path, relative to the distribution directory;
#: ``{module}`` and ``{short}`` are filled from :class:`PluginNames`.
TEMPLATES = {
    "pyproject.toml.jinja": "pyproject.toml",
    "README.md.jinja": "README.md",
    "package/__init__.py.jinja": "{module}/__init__.py",
    "tests/test_plugin.py.jinja": "tests/test_{short}.py",
}


class BadPluginName(ValueError):
    """The name given to ``tghost new`` cannot name a distribution and a module; says which rule."""


@dataclass(frozen=True)
class PluginNames:
    """Every name a plugin called ``name`` gets: entry point ``name`` (``-`` form), distribution
    ``tghost-<name>``, import package ``tghost_<name>`` (``_`` form), tool ``<name>-word-count``."""

    name: str

    @classmethod
    def parse(cls, raw: str) -> PluginNames:
        """Check and normalise ``raw`` (``_`` becomes ``-``; a leading ``tghost-`` is dropped).

        Raises:
            BadPluginName: ``raw`` is not lowercase letters, digits and single ``-``/``_`` between
                words, starting with a letter.
        """
        name = raw.strip().replace("_", "-").removeprefix("tghost-")
        if not NAME_PATTERN.fullmatch(name):
            raise BadPluginName(
                f"{raw!r} is not a plugin name: use lowercase letters and digits, words joined by '-' "
                "(starting with a letter), e.g. 'word-count' or 'weather2'")
        return cls(name)

    @property
    def short(self) -> str:
        return self.name.replace("-", "_")

    @property
    def dist(self) -> str:
        return f"tghost-{self.name}"

    @property
    def module(self) -> str:
        return f"tghost_{self.short}"

    @property
    def tool(self) -> str:
        return f"{self.name}-word-count"

    def context(self) -> dict[str, str]:
        """The variables every template gets."""
        return {"name": self.name, "short": self.short, "dist": self.dist, "module": self.module,
                "tool": self.tool, "description": "counts the words in a text", "tghost_version": __version__}


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("tghost.author", "templates/plugin"),
        undefined=jinja2.StrictUndefined,  # a misspelt variable fails, never renders empty
        keep_trailing_newline=True,
        autoescape=False,  # renders Python, TOML and Markdown, never HTML
    )


def write_plugin(names: PluginNames, parent: Path, force: bool = False) -> Path:
    """Render the plugin distribution into ``parent / names.dist``; returns that directory.

    Raises:
        FileExistsError: the directory exists and is not empty, and ``force`` is false.
        OSError: a file could not be written.
    """
    root = parent / names.dist
    if root.exists() and any(root.iterdir()) and not force:
        raise FileExistsError(f"{root} already exists and is not empty: choose another --dir or NAME, "
                              "or pass --force to overwrite its files")
    env = _environment()
    context = names.context()
    for template, target in TEMPLATES.items():
        path = root / target.format(**context)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(env.get_template(template).render(context))
    return root
