"""fingerprint: the code a plugin serves, as one SHA-256 (docs/protocol.md §4.3 ``plugin``'s
``fingerprint``): over its distribution's files as RECORD lists them, or, for an editable install
or a distribution without a RECORD, over the files of the entry point's top-level module or
package, so that editing an editable install changes it. Reads files; never imports a plugin.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Iterable
from importlib.metadata import Distribution
from pathlib import Path

__all__ = ["fingerprint"]

#: What a fingerprint leaves out: compiled bytecode, which Python writes beside the source.
BYTECODE = ("__pycache__",)


def fingerprint(distribution: Distribution | None, module: str) -> str | None:
    """The fingerprint of the code an entry point of ``distribution`` loads from ``module`` (its
    dotted module name): 64 lowercase hex digits, or ``None`` when there are no files to hash.

    An installed wheel: every file RECORD lists inside the install root, except the
    ``.dist-info`` directory (the installer writes its own files there) and bytecode. An editable
    install (its ``direct_url.json`` says ``editable``), a distribution without a RECORD, or
    none: every file under the directory of ``module``'s top-level package (or that module's
    file alone), bytecode left out. Each file counts as its path (RECORD's, or from the package's
    parent directory, with ``/``), a NUL, the hex SHA-256 of its bytes and a newline, in path
    order; the fingerprint is the SHA-256 of that text. A file that cannot be read is left out.
    """
    files = None if distribution is None or _editable(distribution) else _installed(distribution)
    files = files if files is not None else _source(module.split(".")[0])
    if not files:
        return None
    digest = hashlib.sha256()
    for name, path in sorted(files):
        try:
            digest.update(f"{name}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode())
        except OSError:
            continue
    return digest.hexdigest()


def _editable(distribution: Distribution) -> bool:
    """Whether ``direct_url.json`` (PEP 610) says the distribution is installed editable."""
    try:
        direct = json.loads(distribution.read_text("direct_url.json") or "{}")
    except ValueError:
        return False
    return isinstance(direct, dict) and bool((direct.get("dir_info") or {}).get("editable"))


def _installed(distribution: Distribution) -> list[tuple[str, Path]] | None:
    """RECORD's files inside the install root but its ``.dist-info``, bytecode left out; ``None``
    without a RECORD."""
    listed = distribution.files
    if listed is None:
        return None
    return [(str(f), Path(str(distribution.locate_file(f)))) for f in listed
            if f.parts and f.parts[0] != ".." and not f.parts[0].endswith(".dist-info") and not _bytecode(f.parts)]


def _source(top: str) -> list[tuple[str, Path]]:
    """Every file of top-level module or package ``top``, as found on ``sys.path`` (not imported)."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [pair for root in spec.submodule_search_locations for pair in _tree(Path(root))]
    return [(Path(spec.origin).name, Path(spec.origin))] if spec.origin and Path(spec.origin).is_file() else []


def _tree(root: Path) -> Iterable[tuple[str, Path]]:
    """The files under the package directory ``root``, named from its parent, bytecode left out."""
    for path in root.rglob("*"):
        relative = path.relative_to(root.parent)
        if path.is_file() and not _bytecode(relative.parts):
            yield relative.as_posix(), path


def _bytecode(parts: tuple[str, ...]) -> bool:
    return any(part in BYTECODE for part in parts) or parts[-1].endswith((".pyc", ".pyo"))
