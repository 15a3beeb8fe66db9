"""Every REAL log in ``../shared/real_logs`` (written outside this project) opens as it comes: its format told
from its content, the number of steps its README gives, and the signals it logged under their mapped columns.

Counts and step ranges are the README's (``../shared/real_logs/README.md``), not read off this reader's output.
The verdicts are not judged here (tests/detectors/test_real_logs.py holds the labels).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sorl_monitor.cli.main import app
from sorl_monitor.logs import read_log

REAL_LOGS = Path(__file__).resolve().parents[2].parent / "shared" / "real_logs"
STEP_LOGS_COLUMNS = {
    "reward_mean", "reward_std", "entropy", "grad_norm", "response_len_mean", "completion_truncated_frac",
    "clip_frac_active", "zero_std_group_frac",
}  # fmt: skip
EXPECTED = {
    # file: (format, rows, first step, last step, mapped columns it must have)
    "Bihan__dstack-configs__verl_ppo_qwen2.5-7b_gsm8k.log": (
        "verl-console", 335, 101, 435,
        {"reward_mean", "clip_frac_active", "kl_old_k1", "grad_norm", "completion_len_mean",
         "completion_truncated_frac", "pg_loss", "vf_loss", "entropy"},  # entropy: verl's older name
    ),
    "Ning-Guo__hotpotqa-agent__grpo_v1.log": (
        "hf-console", 93, 20, 1860,
        {"reward_mean", "reward_std", "kl_ref", "grad_norm", "loss", "lr", "response_len_mean"},  # TRL's older name
    ),
    "HaoranLuo__text2sql-grpo__trainer_state_1000steps.json": (
        "hf", 200, 5, 1000,
        {"reward_mean", "reward_std", "kl_ref", "grad_norm", "response_len_mean", "completion_truncated_frac"},
    ),
    "samyakshrestha__grpo-verified-reasoner__trainer_state_ckpt1134.json": (
        "hf", 226, 5, 1130,
        {"reward_mean", "reward_std", "kl_ref", "grad_norm", "response_len_mean", "completion_truncated_frac"},
    ),
    "ShibukiZero__assignment5-alignment__final_on_policy_lr4e-5_400_metrics.jsonl": (
        "jsonl", 368, 1, 368, {"reward_mean", "reward_std", "entropy", "grad_norm", "response_len_mean"},
    ),
}  # fmt: skip


def real_logs() -> list[Path]:
    if not REAL_LOGS.is_dir():
        return []
    return sorted(p for p in REAL_LOGS.rglob("*") if p.is_file() and p.suffix != ".md")


def expected(path: Path) -> tuple[str, int, int, int, set[str]]:
    if path.name.endswith(".step_logs.json"):  # TRL log_history lists: 40 rows, steps 5 … 200
        return ("hf", 40, 5, 200, STEP_LOGS_COLUMNS)
    return EXPECTED[path.name]


pytestmark = pytest.mark.skipif(
    not real_logs(), reason="../shared/real_logs is not here (it lives beside the repo)"
)


def test_every_real_log_is_known_here():
    assert {p.name for p in real_logs() if not p.name.endswith(".step_logs.json")} == set(EXPECTED)


@pytest.mark.parametrize("path", real_logs(), ids=lambda p: p.name[:40])
def test_a_real_log_opens_as_it_comes(path):
    fmt, rows, first, last, columns = expected(path)
    (run,) = read_log(path)
    assert run.format == fmt
    steps = run.steps.column("step").to_pylist()
    assert (len(steps), steps[0], steps[-1]) == (rows, first, last)
    assert columns <= set(run.steps.column_names)


@pytest.mark.parametrize("path", real_logs(), ids=lambda p: p.name[:40])
def test_postmortem_reads_every_real_log(path):
    result = CliRunner().invoke(app, ["postmortem", str(path), "--json"])
    assert result.exit_code in (0, 3), result.output
    assert json.loads(result.stdout)["updates"] == expected(path)[1]
