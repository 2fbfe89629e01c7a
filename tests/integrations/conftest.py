"""Fixtures of the integration tests: each test's hosts and directories on a fresh announcement
topic, so no test here sees another's tools, nor a README test in the same session these."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture
def topic() -> str:
    return f"persistent://tg/config/integrations-{uuid.uuid4().hex[:8]}"
