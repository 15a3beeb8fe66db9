"""Fixtures of the reliability suite: measured numbers on record (test-artifacts/reliability/)."""

from __future__ import annotations

import json

import pytest

from tests.helpers.paths import ROOT

MEASURED = ROOT / "test-artifacts" / "reliability"


@pytest.fixture
def record_measurement(request):
    """Write ``{name: values}`` of a test to test-artifacts/reliability/<test>.json (for docs/reliability.md)."""

    def record(**values) -> None:
        MEASURED.mkdir(parents=True, exist_ok=True)
        (MEASURED / f"{request.node.name}.json").write_text(json.dumps(values, indent=2, default=str))

    return record
