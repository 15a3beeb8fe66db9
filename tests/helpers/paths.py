"""Where the tests find the repository's own files and, beside the checkout, the shared real logs."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root."""
SAMPLE_LOGS = ROOT / "sample_logs"
ARTIFACTS = ROOT / "test-artifacts"
"""Screenshots and measured numbers the tests keep (not committed)."""
REAL_LOGS = ROOT.parent / "shared" / "real_logs"
"""Real logs of others' runs, outside the repository (tests that read them skip where they are absent)."""
NINE_B = REAL_LOGS / "trl-grpo-qwen3.5-9b-rho-sweep" / "rho0.70_seed44.step_logs.json"
"""The 9B TRL GRPO run its authors label collapsed."""
