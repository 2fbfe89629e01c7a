"""Packaging: pytest starts in an environment that holds tghost-amplifier's declared dependencies.

amplifier-core registers a pytest plugin (``pytest11``: ``amplifier_core.pytest_plugin``) that
imports pytest_asyncio, which amplifier-core does not declare. The environment here is a fresh
venv whose site-packages links exactly the installed distributions that this checkout's
``pyproject.toml`` requires (their closure, by their installed metadata) plus pytest: nothing
else of the test environment leaks in, and nothing is downloaded.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def closure(requirements: list[str]) -> dict[str, Distribution]:
    """The installed distributions ``requirements`` need, by name, with what they need in turn
    (markers evaluated here, extras not followed)."""
    found: dict[str, Distribution] = {}
    pending = [Requirement(text) for text in requirements]
    while pending:
        requirement = pending.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        try:
            dist = distribution(requirement.name)
        except PackageNotFoundError:
            continue  # an optional one this environment lacks: then the venv lacks it too
        if dist.name.lower() not in found:
            found[dist.name.lower()] = dist
            pending += [Requirement(text) for text in dist.requires or []]
    return found


def link_into(site: Path, dist: Distribution) -> None:
    """Symlink the top-level files and directories of ``dist`` (code, .pth, .dist-info) into ``site``."""
    root = Path(str(dist.locate_file("")))
    for top in {Path(str(path)).parts[0] for path in dist.files or []}:
        if top not in ("..", "__pycache__") and not (site / top).exists() and (root / top).exists():
            (site / top).symlink_to(root / top)


def test_pytest_starts_where_tghost_amplifier_and_pytest_are_installed(tmp_path: Path) -> None:
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    for dist in closure([*declared, "pytest"]).values():
        link_into(Path(purelib), dist)
    assert "amplifier-core" in {Requirement(text).name for text in declared}
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    pass\n")
    # A plain run ('pytest --version' loads no plugin, so it would not show it).
    ran = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_plain.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and "1 passed" in ran.stdout, ran.stdout + ran.stderr
