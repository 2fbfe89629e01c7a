"""Fixtures: the notes server's log file, the notes server on streamable HTTP, a fresh
descriptors topic."""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

#: Where tghost-mcp is not installed (tox's default env: `tox -e mcp-servers` runs these), nothing here is collected.
collect_ignore_glob = [] if importlib.util.find_spec("tghost_mcp") else ["test_*.py"]

from mcp_helpers import HttpNotes  # noqa: E402


@pytest.fixture
def notes_log(tmp_path: Path) -> Path:
    """The file the notes server writes what happened to (``$NOTES_LOG``), empty."""
    path = tmp_path / "notes.log"
    path.write_text("")
    return path


@pytest.fixture
def http_notes(tmp_path: Path) -> Iterator[HttpNotes]:
    """The notes server on streamable HTTP, its token in ``tmp_path/token``; stopped at the end."""
    server = HttpNotes(token=uuid.uuid4().hex).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def topic() -> str:
    """A descriptors topic no other test uses."""
    return f"persistent://tg/config/mcp-{uuid.uuid4().hex[:8]}"
