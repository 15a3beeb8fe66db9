"""The bundled trainer's updates are bit-identical to those recorded before the objective moved to
``sorl_monitor.objective`` (a regression record, not a claim about the numbers).

``data/objective_steps.json`` holds, for a few tiny runs (3 iterations, every loss path: critic or group
advantage, token or turn ratio in both forms, CTN off / on / auto with its λ controller, the proximal anchor
and clip level), each update's loss terms and grad norm as ``float.hex``, recorded by this module's
``record`` at the commit named in the file (``python -m tests.trainer.test_objective_identical``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sorl_monitor.query import open_runs
from sorl_monitor.trainer.config import TrainConfig
from sorl_monitor.trainer.env import TaskConfig
from sorl_monitor.trainer.train import train

RECORD = Path(__file__).parent / "data" / "objective_steps.json"
COLUMNS = ("loss", "pg_loss", "vf_loss", "ctn_penalty", "ctn_clip_frac", "dual_clip_frac", "ctn_coef",
           "grad_norm", "ratio_max", "turn_ratio_max", "entropy")  # fmt: skip
RUNS = {
    "ppo_ctn_on": {"algo": "ppo", "ctn": "on", "ctn_target_clip": 0.01, "lr": 5e-3},
    "so_ppo_auto": {"algo": "so_ppo", "ctn": "auto"},
    "turn_ppo_mean": {"algo": "turn_ppo", "turn_ratio": "mean", "dual_clip": None, "ent_coef": 0.01},
    "so_grpo_proximal": {"algo": "so_grpo", "ctn_anchor": "proximal", "ctn_clip_level": "proximal",
                         "kl_ref_coef": 0.05, "ctn_kl_cap": None},
    "grpo_token_level": {"algo": "grpo", "ctn": "on", "ctn_clip_level": "token", "lr": 3e-3},
}  # fmt: skip


def tiny(name: str, log_dir: Path) -> TrainConfig:
    return TrainConfig(seed=3, iterations=3, episodes=16, group_size=4, epochs=2, minibatches=2, staleness=1,
                       warmstart_steps=20, warmstart_cache=None, log_dir=str(log_dir), run_name=name,
                       log_turns="none", task=TaskConfig(max_hops=2, max_turns=3, format_reward=0.5),
                       **RUNS[name])  # fmt: skip


def steps_of(name: str, log_dir: Path) -> list[dict[str, str | None]]:
    """Each update's ``COLUMNS`` of run ``name`` as ``float.hex`` (exact), in step order."""
    train(tiny(name, log_dir))
    with open_runs(log_dir) as runs:
        rows = runs.sql(f"SELECT * FROM steps WHERE run_id = '{name}' ORDER BY step").to_pylist()
    return [{c: None if row.get(c) is None else float(row[c]).hex() for c in COLUMNS} for row in rows]


def record(log_dir: Path) -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    runs = {name: steps_of(name, log_dir) for name in RUNS}
    RECORD.write_text(json.dumps({"commit": commit, "columns": COLUMNS, "runs": runs}, indent=0) + "\n")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_every_update_matches_the_record_bit_for_bit(tmp_path, name):
    recorded = json.loads(RECORD.read_text())["runs"][name]
    assert len(recorded) == 12  # 3 iterations × 2 epochs × 2 mini-batches
    assert steps_of(name, tmp_path) == recorded


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        record(Path(folder))
    sys.exit(0)
