"""Helpers for the tghost-amplifier tests: Amplifier module distributions written on ``sys.path``
(as if pip-installed), and this distribution's own tghost plugin alone."""

from __future__ import annotations

import importlib
import re
import sys
import textwrap
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from tghost_amplifier.modules import ENTRY_POINT_GROUP

#: The entry-point group of tghost plugins (README "Write a tool").
TGHOST_GROUP = "tghost.plugins"


class ModuleDir:
    """A directory of Amplifier module distributions: ``<module>.py`` plus a ``.dist-info`` whose
    ``amplifier.modules`` entry point names the module's ``mount``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(self, name: str, source: str, version: str = "1.0") -> str:
        """Write module ``name`` (an entry point name such as ``tool-notes``); returns ``name``."""
        module = "amplifier_test_" + re.sub(r"\W", "_", name)
        self._write(module, source, f"amplifier-module-{name}", version,
                    f"[{ENTRY_POINT_GROUP}]\n{name} = {module}:mount\n")
        return name

    def add_tghost_plugin(self, name: str, source: str) -> EntryPoint:
        """Write a tghost plugin ``name`` (a ``tghost.plugins`` entry point); returns its entry point."""
        module = "tghost_test_" + re.sub(r"\W", "_", name)
        self._write(module, source, f"tghost-test-{name}", "1.0", f"[{TGHOST_GROUP}]\n{name} = {module}\n")
        return next(ep for ep in entry_points(group=TGHOST_GROUP) if ep.name == name)

    def _write(self, module: str, source: str, distribution: str, version: str, entry_points_txt: str) -> None:
        sys.modules.pop(module, None)
        (self.root / f"{module}.py").write_text(textwrap.dedent(source))
        info = self.root / f"{module}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(entry_points_txt)
        importlib.invalidate_caches()

    def module(self, name: str) -> Any:
        """The imported module of ``name`` (after the host loaded it)."""
        return sys.modules["amplifier_test_" + re.sub(r"\W", "_", name)]


def amplifier_plugin() -> list[EntryPoint]:
    """The ``tghost.plugins`` entry point of this distribution, alone (no other tghost plugin)."""
    return [ep for ep in entry_points(group=TGHOST_GROUP) if ep.name == "amplifier"]
