"""The documentation site as built (``tox -e docs``): every page is there, the CLI reference names
every ``tghost`` command (and only variables the commands have), the search index holds every
page, and nothing is left unrendered or links to a file the site does not have.

``mkdocs build --strict`` already fails on a broken link between pages, a missing anchor or a
missing snippet; these tests check what it does not: the pages it generates and the links of
the HTML it writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import click

from tghost.cli.app import cli

DOCS = Path(__file__).resolve().parents[2] / "docs"
#: Text that only an unrendered page holds: a snippet marker, a mkdocs-click block, click's
#: no-rewrap marker, or a default that mkdocs-click's table style prints for a flag.
UNRENDERED = ("--8<--", "::: mkdocs-click", "\b", "Sentinel.")


class Page(HTMLParser):
    """One built page: its headings' text and ids, every id, and every link's target."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.headings: dict[str, str] = {}  # text -> id
        self.ids: set[str] = set()
        self.links: list[str] = []
        self._heading: tuple[str, list[str]] | None = None
        self.feed(path.read_text())

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if attributes.get("id"):
            self.ids.add(attributes["id"] or "")
        if re.fullmatch(r"h[1-6]", tag):
            self._heading = (attributes.get("id") or "", [])
        for name in ("href", "src"):
            if attributes.get(name) and tag in ("a", "link", "img", "script"):
                self.links.append(attributes[name] or "")

    def handle_endtag(self, tag: str) -> None:
        if re.fullmatch(r"h[1-6]", tag) and self._heading is not None:
            identifier, text = self._heading
            self.headings["".join(text).replace("¶", "").strip()] = identifier
            self._heading = None

    def handle_data(self, data: str) -> None:
        if self._heading is not None:
            self._heading[1].append(data)


@cache
def page(path: Path) -> Page:
    return Page(path)


def built_pages(site: Path) -> list[Path]:
    return sorted(site.rglob("index.html"))


def location(site: Path, built: Path) -> str:
    """A page's location as the search index names it: ``""``, ``guides/agents/``."""
    where = built.parent.relative_to(site).as_posix()
    return "" if where == "." else f"{where}/"


def sources() -> list[str]:
    """The locations of the pages the sources make: docs/x/y.md is ``x/y/``."""
    found = []
    for path in sorted(DOCS.rglob("*.md")):
        relative = path.relative_to(DOCS).with_suffix("")
        found.append("" if relative.as_posix() == "index" else f"{relative.as_posix()}/")
    return found


def command_paths(group: click.Group, ctx: click.Context) -> Iterator[str]:
    """``tghost`` and the path of every command and group under it, e.g. ``tghost broker start``."""
    yield ctx.command_path
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        if command.hidden:
            continue
        sub = click.Context(command, parent=ctx, info_name=name)
        if isinstance(command, click.Group):
            yield from command_paths(command, sub)
        else:
            yield sub.command_path


def test_every_page_is_built(site: Path) -> None:
    built = {location(site, path) for path in built_pages(site)}
    assert len(built) >= 15
    assert set(sources()) <= built


def test_the_cli_page_names_every_command(site: Path) -> None:
    paths = list(command_paths(cli, click.Context(cli, info_name="tghost")))
    assert {"tghost", "tghost run", "tghost broker start", "tghost trustgraph sync"} <= set(paths)
    headings = page(site / "reference" / "cli" / "index.html").headings
    assert [path for path in paths if headings.get(path) != path.replace(" ", "-")] == []


def test_the_cli_pages_variables_are_the_commands_own(site: Path) -> None:
    """Each variable of the page's Environment table (but those with no option) and its option
    are named in the help that the page was generated from."""
    table = (DOCS / "reference" / "cli.md").read_text().split("\n## Environment\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([A-Z_]+)` \| (`--[a-z-]+`|none) \|", table, re.MULTILINE)
    assert len(rows) == table.count("\n| `")
    html = (site / "reference" / "cli" / "index.html").read_text()
    generated = html.split('id="tghost"', 1)[1]
    assert [(variable, option) for variable, option in rows if option != "none"
            and (variable not in generated or option.strip("`") not in generated)] == []


def test_the_search_index_holds_every_page_and_finds_its_words(site: Path) -> None:
    index = json.loads((site / "search" / "search_index.json").read_text())
    entries = index["docs"]
    locations = {entry["location"] for entry in entries}
    assert {location(site, path) for path in built_pages(site)} <= locations
    separator = re.compile(index["config"]["separator"])
    words = {word.lower() for entry in entries for word in separator.split(f"{entry['title']} {entry['text']}")}
    assert {"lease", "withdraw", "tooldirectory"} <= words


def test_nothing_is_left_unrendered(site: Path) -> None:
    left = [(path.relative_to(site).as_posix(), marker) for path in site.rglob("*.html")
            for marker in UNRENDERED if marker in path.read_text()]
    assert left == []


def test_every_link_of_the_site_reaches_a_file_and_its_anchor(site: Path) -> None:
    broken = []
    for path in built_pages(site):
        for link in page(path).links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "data:")):
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file() or (parts.fragment and target.suffix == ".html"
                                        and unquote(parts.fragment) not in page(target).ids):
                broken.append((path.relative_to(site).as_posix(), link))
    assert broken == []
