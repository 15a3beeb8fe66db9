"""Fixtures of the integration tests."""

from __future__ import annotations

import pytest

from tests.helpers import verl_modules


@pytest.fixture
def verl_modules_installed(monkeypatch):
    """verl importable: the real one if installed, else stand-ins with verl's registry and Tracking code."""
    verl_modules.install(monkeypatch)
