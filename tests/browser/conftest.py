"""Browser tests' shared parts: Debian's Chromium (``CHROMIUM``; a module skips without it), the
timeout a loaded CI machine needs (``TIMEOUT_MS``: wait for the page, never time it) and the
``page`` fixture, one Chromium page per test that fails the test if the page raised."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium")
TIMEOUT_MS = 20_000
Page = Any  # playwright.sync_api.Page


@pytest.fixture
def page() -> Iterator[Page]:
    from playwright import sync_api  # the test modules skip without it (pytest.importorskip)

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.set_default_timeout(TIMEOUT_MS)
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        yield page
        browser.close()
        assert not errors, f"the page raised: {errors}"
