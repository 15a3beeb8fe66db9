"""The bundled trainer's updates match those recorded when the objective moved to ``sorl_monitor.remedy.objective``
(a regression record of every loss path, not a claim about the numbers).

``data/objective_steps.json`` holds, for five tiny runs (3 iterations; critic or group advantage, token or
turn ratio in both forms, CTN off / on / auto with its λ controller, the proximal anchor and clip level),
each update's loss terms and grad norm as ``float.hex``, recorded by ``record`` at the commit named in the file.

Float32 kernels differ between CPUs (MKL and ATen pick other code paths), so ``make test`` compares with a
tolerance: ``|new − recorded| ≤ RTOL · scale``, where ``scale`` is the largest ``|recorded|`` of that column in
that run (a loss near 0 and a recorded 0.0 are judged on the column's size, not their own). How RTOL was
chosen, from a measured spread and the changes it must catch: tests/README.md. The bit-for-bit comparison of
the machine that recorded it is opt-in: ``pytest -m record``.

``python -m tests.trainer.test_objective_identical record | spread`` rewrites the record, or measures the
spread of this machine's kernels (each ``ATEN_CPU_CAPABILITY`` and MKL code path it has) against it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sorl_monitor.read.query import open_runs
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
                         "kl_ref_coef": 0.05, "ctn_kl_cap": None, "ctn_coef_max": 128.0},
    "grpo_token_level": {"algo": "grpo", "ctn": "on", "ctn_clip_level": "token", "lr": 3e-3, "ctn_coef_max": 128.0},
}  # fmt: skip
"""The runs the record holds. The GRPO ones name λ's bound of 128, the default when they were recorded (a group
advantage's default bound is 32 since 2026-12-05): the record checks the objective, not the defaults."""
RTOL = 1e-2
"""Allowed deviation, as a share of the column's largest recorded magnitude in the run (tests/README.md)."""
SCALE_FLOOR = 1e-3
"""A column recorded all 0 is judged against this size (a CTN term that should stay off must stay < 1e-5)."""
KERNEL_SETTINGS = ({}, {"ATEN_CPU_CAPABILITY": "default"}, {"ATEN_CPU_CAPABILITY": "avx2"},
                   {"ATEN_CPU_CAPABILITY": "avx512"}, {"MKL_CBWR": "COMPATIBLE"}, {"MKL_CBWR": "AVX2"},
                   {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"})  # fmt: skip
"""The environments ``spread`` runs the record under (a capability the CPU lacks falls back to one it has)."""


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


def deviations(steps: list[dict], recorded: list[dict]) -> dict[str, float]:
    """Per column, the largest ``|new − recorded| / scale`` over the updates; ``inf`` where one is None and the
    other not, or the update counts differ."""
    if len(steps) != len(recorded):
        return {c: float("inf") for c in COLUMNS}
    out = {}
    for column in COLUMNS:
        new = [None if s[column] is None else float.fromhex(s[column]) for s in steps]
        old = [None if s[column] is None else float.fromhex(s[column]) for s in recorded]
        scale = max([abs(v) for v in old if v is not None] + [SCALE_FLOOR])
        worst = 0.0
        for a, b in zip(new, old, strict=True):
            if (a is None) != (b is None):
                worst = float("inf")
            elif a is not None:
                worst = max(worst, abs(a - b) / scale)
        out[column] = worst
    return out


def record(log_dir: Path) -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    runs = {name: steps_of(name, log_dir) for name in RUNS}
    RECORD.write_text(json.dumps({"commit": commit, "columns": COLUMNS, "runs": runs}, indent=0) + "\n")


def spread() -> None:
    """Run the record under each of ``KERNEL_SETTINGS`` in a child process and print its deviation."""
    recorded = json.loads(RECORD.read_text())["runs"]
    root = Path(__file__).resolve().parents[2]
    for setting in KERNEL_SETTINGS:
        child = [sys.executable, "-c", "import json; from tests.trainer.test_objective_identical import *; "
                 "import tempfile; d = tempfile.mkdtemp(); "
                 "print(json.dumps({n: steps_of(n, Path(d)) for n in RUNS}))"]  # fmt: skip
        env = {**os.environ, **setting, "PYTHONPATH": str(root)}
        out = subprocess.run(child, env=env, capture_output=True, text=True, check=True).stdout
        runs = json.loads(out.strip().splitlines()[-1])
        worst = max(max(deviations(runs[n], recorded[n]).values()) for n in RUNS)
        exact = all(runs[n] == recorded[n] for n in RUNS)
        print(
            f"{setting or 'native'}: largest deviation {worst:.1e} of scale{' (bit-identical)' if exact else ''}"
        )


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_every_update_matches_the_record_within_the_kernels_spread(tmp_path, name):
    recorded = json.loads(RECORD.read_text())["runs"][name]
    assert len(recorded) == 12  # 3 iterations × 2 epochs × 2 mini-batches
    off = {c: d for c, d in deviations(steps_of(name, tmp_path), recorded).items() if d > RTOL}
    assert not off, f"columns off the record by more than {RTOL:.0%} of their scale: {off}"


@pytest.mark.record
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_every_update_matches_the_record_bit_for_bit(tmp_path, name):
    """Only on a machine whose kernels made the record (opt-in: ``pytest -m record``)."""
    assert steps_of(name, tmp_path) == json.loads(RECORD.read_text())["runs"][name]


def test_the_tolerance_tells_a_kernel_difference_from_a_changed_objective():
    """Synthetic updates: a 0.07 % wobble (the measured spread's size) passes; λ 3 % higher does not."""
    recorded = [{c: float(1.0 + 0.1 * i).hex() for c in COLUMNS} for i in range(4)]
    wobble = [{c: float(float.fromhex(v) * (1 + 7e-4)).hex() for c, v in row.items()} for row in recorded]
    changed = [{**row, "ctn_coef": float(float.fromhex(row["ctn_coef"]) * 1.03).hex()} for row in recorded]
    assert max(deviations(wobble, recorded).values()) < RTOL
    assert deviations(changed, recorded)["ctn_coef"] > RTOL
    assert deviations(recorded[:3], recorded)["loss"] == float("inf")
    assert deviations([{**recorded[0], "ctn_penalty": None}] + recorded[1:], recorded)[
        "ctn_penalty"
    ] == float("inf")
    zero = [{**row, "ctn_penalty": (0.0).hex()} for row in recorded]
    assert (
        deviations([{**row, "ctn_penalty": (2.6e-8).hex()} for row in recorded], zero)["ctn_penalty"] < RTOL
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["record"]:
        with tempfile.TemporaryDirectory() as folder:
            record(Path(folder))
    elif sys.argv[1:] == ["spread"]:
        spread()
    else:
        sys.exit("usage: python -m tests.trainer.test_objective_identical record | spread")
