"""The documentation site in a real browser: Debian's Chromium driven by Playwright, as a reader
opens it. The site is built with ``mkdocs build --strict`` and served over HTTP on a free port
(mkdocs-material's search runs in a web worker, which a ``file://`` page cannot start).

Run with ``tox -e browser``; without Playwright, Chromium or mkdocs these tests skip. The
screenshots of the home page and a guide go to a temporary folder, whose path is printed.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import CHROMIUM, TIMEOUT_MS, Page

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (tox -e browser)")
pytest.importorskip("mkdocs", reason="mkdocs is not installed (the docs extra: pip install -e '.[docs]')")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")

ROOT = Path(__file__).resolve().parents[2]
sync_api.expect.set_options(timeout=TIMEOUT_MS)
#: The sections of the navigation, as mkdocs.yml names them.
SECTIONS = ("Getting started", "Guides", "Operations", "Integrations", "Reference", "Internals")


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The site, built from this checkout and served on 127.0.0.1: its base URL."""
    folder = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
                           cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture(scope="module")
def screenshots() -> Path:
    """A temporary folder for the screenshots, outside the repository, kept after the run."""
    return Path(tempfile.mkdtemp(prefix="tghost-site-screenshots-"))


def screenshot(page: Page, folder: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = folder / name
    page.screenshot(path=str(path))
    with capsys.disabled():
        print(f"\nscreenshot: {path}")


def shows_the_sections(page: Page) -> None:
    """The sidebar's top level (not the page's own contents, which it holds for small screens)."""
    top = page.locator("nav.md-nav--primary > .md-nav__list > .md-nav__item > .md-nav__link")
    for section in SECTIONS:
        sync_api.expect(top.filter(has_text=re.compile(rf"^\s*{section}\s*$"))).to_be_visible()


def test_the_home_page_shows_the_sections(
    page: Page, site: str, screenshots: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    page.goto(site)
    sync_api.expect(page).to_have_title("tghost")
    sync_api.expect(page.locator("article h1")).to_contain_text("tghost")
    shows_the_sections(page)
    screenshot(page, screenshots, "home.png", capsys)


def test_a_guide_shows_the_sections_and_its_contents(
    page: Page, site: str, screenshots: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    page.goto(site + "guides/writing-plugins/")
    sync_api.expect(page.locator("article h1")).to_contain_text("Writing plugins")
    shows_the_sections(page)
    contents = page.locator(".md-sidebar--secondary nav.md-nav--secondary")  # the page's own, on the right
    sync_api.expect(contents).to_be_visible()
    assert contents.locator("a.md-nav__link").count() > 0
    screenshot(page, screenshots, "guide-writing-plugins.png", capsys)


def test_search_finds_a_word(page: Page, site: str) -> None:
    page.goto(site)
    query = page.locator("input.md-search__input")
    query.click()
    query.press_sequentially("lease")
    results = page.locator(".md-search-result__item")
    sync_api.expect(results.first).to_be_visible()
    assert results.count() > 0
    sync_api.expect(page.locator(".md-search-result__meta")).to_contain_text("matching")
