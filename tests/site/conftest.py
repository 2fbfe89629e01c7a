"""tests/site checks the documentation site as built, not its sources: ``tox -e docs`` builds it
(``mkdocs build --strict``) and runs ``pytest tests/site --site-dir DIR``. Without
``--site-dir`` (the default tox env, which has no mkdocs) every test here skips.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--site-dir", default=None, metavar="DIR",
                     help="a site built by 'mkdocs build' (tox -e docs): run tests/site against it")


@pytest.fixture(scope="session")
def site(request: pytest.FixtureRequest) -> Path:
    """The built site's directory, from --site-dir; skips the test without one."""
    given = request.config.getoption("--site-dir", default=None)
    if given is None:
        pytest.skip("no --site-dir: these tests check a built site (tox -e docs builds one and passes it)")
    path = Path(given)
    assert (path / "index.html").is_file(), f"--site-dir {path}: no index.html, so no site was built there"
    return path
