"""Tests of tghost.integrations: each framework's own tool set over a live directory, on a real
broker (tox -e frameworks; skipped where the framework is not installed)."""
