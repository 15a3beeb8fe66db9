"""Shared pieces of the reliability suite: runs with one part per update, and measured numbers on record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sorl_monitor import Monitor

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / "test-artifacts" / "reliability"


def run_with_parts(log_dir: Path, name: str = "run", updates: int = 6) -> Path:
    """A run whose every update is flushed to its own part (steps and turns), from random batches."""
    g = torch.Generator().manual_seed(0)
    with Monitor(log_dir, name, flush_interval_s=3600, compact=False) as mon:
        for _ in range(updates):
            logp = -torch.rand(4, 12, generator=g)
            mask = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1]] * 4)
            mon.log_update(logp=logp, old_logp=logp + 0.2 * torch.randn(4, 12, generator=g), mask=mask)
            assert mon.flush()
    return log_dir / name


@pytest.fixture
def record_measurement(request):
    """Write ``{name: values}`` of a test to test-artifacts/reliability/<test>.json (for docs/reliability.md)."""

    def record(**values) -> None:
        MEASURED.mkdir(parents=True, exist_ok=True)
        (MEASURED / f"{request.node.name}.json").write_text(json.dumps(values, indent=2, default=str))

    return record
