"""exits: a process says that it will end with ``os._exit``, and it stays said. The ``tghost``
script's ending itself (exit code kept, no finalisation) is tests/cli/test_app.py's."""

from __future__ import annotations

import pytest

from tghost.system import exits


def test_a_process_ends_with_finalisation_until_it_says_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exits, "AT_ONCE", False)  # as every process starts (restored after the test)
    exits.end_at_once()
    assert exits.AT_ONCE is True
    exits.end_at_once()
    assert exits.AT_ONCE is True
