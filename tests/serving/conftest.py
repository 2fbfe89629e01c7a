"""Fixtures of the serving tests: plain ``def`` calls on the inline driver's lane, or inline."""

from __future__ import annotations

import pytest

from tghost.serving import inline


def every_call_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let every plain ``def`` call run on the thread that received it from the first (no
    measured calls needed: :data:`tghost.serving.inline.RECENT` 0, a 60 s budget)."""
    monkeypatch.setattr(inline, "RECENT", 0)
    monkeypatch.setattr(inline, "BUDGET", 60.0)


@pytest.fixture
def eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call may run inline from the first (:func:`every_call_inline`)."""
    every_call_inline(monkeypatch)


@pytest.fixture(params=[False, True], ids=["lane", "inline"])
def inline_calls(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Run the test twice: with a plain ``def`` whose calls are never measured short, on the
    inline driver's lane (False), and with every call inline (True, :func:`every_call_inline`)."""
    if request.param:
        every_call_inline(monkeypatch)
    return bool(request.param)
