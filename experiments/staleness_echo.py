"""Staleness echo in sweep runs (not a test): does the reward dip every ``staleness + 1`` iterations?

    python experiments/staleness_echo.py sweep_runs/v2/default [more folders] [--variants ppo so_ppo-auto]

With rollouts ``s`` iterations stale, iteration ``k``'s batch is sampled by the learner as it left
iteration ``k − s − 1``; with CTN pulling each learner towards its batch's sampler, a bad learner comes
back as the sampler every ``s + 1`` iterations. For each variant (runs named as ``collapse_sweep.py``
names them, ``<variant>-s<seed>``) this prints, at iterations ``k = j·(s + 1)``, the reward minus the
mean of its four neighbours (``k ± 1``, ``k ± 2``), averaged over the runs, in points (reward × 100),
and the same averaged over every iteration that is not such a multiple (the control).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sorl_monitor.read.query import open_runs  # noqa: E402


def dips(rewards: list[float], iterations: list[int]) -> list[float]:
    """``reward[k] − mean(reward[k−2], reward[k−1], reward[k+1], reward[k+2])`` for each ``k`` given."""
    return [rewards[k] - statistics.fmean(rewards[k + d] for d in (-2, -1, 1, 2))
            for k in iterations if 2 <= k < len(rewards) - 2]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument(
        "--variants", nargs="+", help="run-name prefixes, e.g. ppo-auto (default: every one found)"
    )
    parser.add_argument("--multiples", type=int, default=6, help="how many multiples of staleness + 1")
    args = parser.parse_args()
    by_variant: dict[str, list[Path]] = defaultdict(list)
    for folder in args.folders:
        for run in sorted(p for p in folder.iterdir() if (p / "run.json").exists()):
            by_variant[run.name.rsplit("-s", 1)[0]].append(run)
    variants = args.variants or sorted(by_variant)
    for variant in variants:
        runs = by_variant.get(variant, [])
        if not runs:
            continue
        at = defaultdict(list)
        control = []
        for run in runs:
            with open_runs(run) as rs:
                rewards = rs.sql("SELECT avg(reward_mean) FROM steps GROUP BY iteration ORDER BY iteration")
                shape = rs.sql(
                    "SELECT max(policy_lag) FILTER (WHERE ppo_epoch = 0 AND minibatch = 0) AS lag,"
                    " count(*) FILTER (WHERE iteration = 0) AS steps FROM steps"
                ).to_pylist()[0]
                rewards, lag, steps = rewards.column(0).to_pylist(), shape["lag"], shape["steps"]
            period = lag // steps + 1  # policy_lag counts updates: staleness · updates per batch
            for j in range(1, args.multiples + 1):
                at[j * period] += dips(rewards, [j * period])
            control += dips(rewards, [k for k in range(len(rewards)) if k % period])
        cells = " ".join(f"{k}:{statistics.fmean(v) * 100:+5.1f}" for k, v in sorted(at.items()) if v)
        print(
            f"{variant:<30} n={len(runs):<3} {cells}   other iterations {statistics.fmean(control) * 100:+.1f}"
        )


if __name__ == "__main__":
    main()
