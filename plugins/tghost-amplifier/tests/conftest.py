"""Fixtures: Amplifier module distributions on ``sys.path``, a fresh descriptors topic, and a
coordinator from amplifier-core's own test utilities."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from amplifier_core.testing import MockCoordinator
from amplifier_helpers import ModuleDir


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleDir:
    """An empty :class:`ModuleDir` on ``sys.path`` for this test."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    return ModuleDir(root)


@pytest.fixture
def topic() -> str:
    """A descriptors topic no other test uses."""
    return f"persistent://tg/config/amplifier-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def coordinator() -> AsyncIterator[MockCoordinator]:
    """A coordinator from amplifier-core (``MockCoordinator``: the real ``ModuleCoordinator``,
    recording mounts and unmounts); its cleanups run at the end of the test."""
    coordinator = MockCoordinator()
    yield coordinator
    await coordinator.cleanup()
