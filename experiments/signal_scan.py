"""Scan every logged column for an early collapse signal the detectors miss (issue #26).

    python experiments/signal_scan.py [--corpus experiments/corpus] [--top 30] [--block 8]

For each candidate (a column, as a per-block series, in one transform, read upward or downward) it prints the
level only 2 of the stable runs exceed over the whole run (their third-highest per-run maximum) and how many
collapsing runs exceed it in the window ``experiments/detector_eval.py`` credits (from the run's last recovery
to the fall's start), of all collapses and of the per-update misses listed in
``experiments/results/detector_eval.txt``. The plan and the rule for "separates":
``experiments/results/detector_eval_signal_scan.md``. Blocks are ``--block`` updates (default ``BLOCK``, the detectors'
blocks on the corpus); per block, the columns' ``mean``, ``max`` and within-block ``std`` are the series. Transforms,
judged from update ``FIRST_JUDGED`` on (``x`` the block's value, ``h`` the blocks before it):

    raw    x                                          (judged from the first block)
    fold   x / max(min h', floor)                     (clip and KL: from the first block, h' empty: floor)
    early  x / max(|median of x over updates 16–47|, floor)
    drop   (max h' − x) / max(|max h'|, floor)
    z      (x − mean h') / max(std h', 0.1 |mean h'|, floor)
    slope  OLS slope over the last n blocks × n / max(std h', 0.1 |mean h'|, floor)   n = SLOPE_STEPS / block, ≥ 4

``h'`` is the blocks of the previous ``HISTORY_STEPS`` updates (the detectors' 256-step history). ``floor`` is the detectors'
floor where the column has one (``FLOORS``), else 10 % of the column's median |x| over all corpus blocks (a unit,
so that a zero quiet level does not divide by zero). Upward: the value; downward: its negative.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT, ROOT / "experiments"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import detector_eval  # noqa: E402

from sorl_monitor.diagnose.detectors import DetectorConfig  # noqa: E402
from sorl_monitor.read.query import open_runs  # noqa: E402

BLOCK = 8
FIRST_JUDGED = 16
HISTORY_STEPS = 256
"""The history a block is judged against (the detectors' ``history_steps``)."""
SLOPE_STEPS = 64
NEAR_STEPS = 64
"""A crossing within this many updates before the fall's start is counted apart: a crossing only in the first
blocks of a run marks a setting's start, not the fall to come."""
STABLE_ALLOWED = 2
"""The level is the one only this many stable runs exceed."""

COLUMNS = {
    "loss": "loss", "ratio_max": "ratio_max", "ratio_p99": "ratio_p99", "turn_ratio_max": "turn_ratio_max",
    "clip_frac": "clip_frac", "clip_frac_turn": "clip_frac_turn", "kl_old_k3": "kl_old_k3",
    "kl_ref_k3": "kl_ref_k3", "entropy": "entropy", "grad_norm": "grad_norm", "reward_mean": "reward_mean",
    "reward_std": "reward_std", "zero_std_group_frac": "zero_std_group_frac",
    "response_len_mean": "response_len_mean", "nonfinite_count": "nonfinite_count",
    "ctn_active": "ctn_active::DOUBLE",
    # simple combinations of the logged columns
    "reward_cv": "reward_std / nullif(abs(reward_mean), 0)",
    "tail_shape": "ln(ratio_max) / nullif(ln(ratio_p99), 0)",
    "clip_per_kl": "clip_frac / nullif(kl_old_k3, 0)",
    "turn_over_token_clip": "clip_frac_turn / nullif(clip_frac, 0)",
    "entropy_x_length": "entropy * response_len_mean",
}  # fmt: skip
"""Each scanned series: a name and its SQL over one ``steps`` row."""

NEW_COLUMNS = (
    "pg_loss", "vf_loss", "ctn_penalty", "ratio_mean", "ratio_min", "ratio_p01", "log_ratio_std",
    "turn_ratio_mean", "turn_ratio_min", "turn_geo_ratio_mean", "turn_log_ratio_sum_max", "seq_ratio_mean",
    "clip_frac_low", "clip_frac_high", "clip_frac_active", "kl_old_k1", "kl_old_k2", "kl_ref_k1", "kl_ref_k2",
    "grad_norm_clipped", "param_norm", "adv_mean", "adv_std", "adv_min", "adv_max", "value_mean", "value_std",
    "value_min", "value_max", "vf_clip_frac", "return_mean", "return_std", "return_min", "return_max",
    "reward_min", "reward_max", "group_reward_std", "response_len_max", "turns_mean", "n_tokens",
    "completion_len_mean", "completion_len_max", "completion_len_min", "completion_truncated_frac",
    "ctn_clip_frac", "dual_clip_frac", "success_rate", "well_formed_frac",
)  # fmt: skip
"""The trainer's other ``steps`` columns, which only a corpus rebuilt with every column has
(``experiments/rebuild_corpus.py``; ``--columns new``). Left out: keys, the monitor's own counters, and what
the setting fixes (``lr``, ``ctn_coef``)."""

FLOORS = {"clip_frac": 0.02, "clip_frac_turn": 0.02, "kl_old_k3": 0.02, "kl_ref_k3": 0.02, "entropy": 0.01}
"""The detectors' floors (``DetectorConfig``) where a column has one; elsewhere 10 % of its median |x|."""

FOLD_FROM_START = ("clip_frac", "clip_frac_turn", "kl_old_k3", "kl_ref_k3")
"""Folds judged against the floor alone before a history exists, as the detectors' clip and KL folds."""

TRANSFORMS = ("raw", "fold", "early", "drop", "z", "slope")
AGGREGATES = ("mean", "max", "std")


@dataclass
class Result:
    name: str
    level: float
    caught: int
    missed_caught: int
    near_caught: int
    near_missed_caught: int
    first_steps: list[int]


def block_series(
    corpus: str, block: int = BLOCK, columns: dict[str, str] = COLUMNS
) -> dict[str, dict[str, np.ndarray]]:
    """``{run_id: {"step": block end steps, "<column>_<aggregate>": values}}`` from the corpus Parquet."""
    parts = []
    for name, expr in columns.items():
        value = f"CASE WHEN isfinite(({expr})::DOUBLE) THEN ({expr})::DOUBLE END"
        parts += [f"avg({value}) AS {name}_mean", f"max({value}) AS {name}_max",
                  f"stddev_pop({value}) AS {name}_std"]  # fmt: skip
    sql = f"""
        SELECT run_id, step // {block} AS block, max(step) AS step, {", ".join(parts)}
        FROM read_parquet('{corpus}/*/steps/*/*.parquet', union_by_name = true)
        GROUP BY run_id, block ORDER BY run_id, block
    """
    table = duckdb.sql(sql).fetchnumpy()
    runs: dict[str, dict[str, np.ndarray]] = {}
    run_ids = table.pop("run_id")
    table.pop("block")
    values = {k: np.asarray(v, dtype=float) if not hasattr(v, "filled") else v.filled(np.nan).astype(float)
              for k, v in table.items()}  # fmt: skip
    for run_id in np.unique(run_ids):
        rows = np.flatnonzero(run_ids == run_id)
        runs[str(run_id)] = {k: v[rows] for k, v in values.items()}
    return runs


def transforms(
    x: np.ndarray, steps: np.ndarray, floor: float, fold_from_start: bool = False, block: int = BLOCK
) -> dict[str, np.ndarray]:
    """Every transform of one run's block series of ``block``-update blocks (NaN where not judged)."""
    history_blocks, slope_blocks = HISTORY_STEPS // block, max(4, SLOPE_STEPS // block)
    series = pd.Series(x)
    before = series.shift(1)
    recent = before.rolling(history_blocks, min_periods=2)
    history_min, history_max = recent.min().to_numpy(), recent.max().to_numpy()
    mean = recent.mean().to_numpy()
    scale = np.fmax(np.fmax(recent.std(ddof=0).to_numpy(), 0.1 * np.abs(mean)), floor)
    ticks = pd.Series(np.arange(len(x), dtype=float)).where(series.notna())
    slope = (
        series.rolling(slope_blocks, min_periods=4).cov(ticks)
        / ticks.rolling(slope_blocks, min_periods=4).var()
    )
    early = x[(steps >= FIRST_JUDGED) & (steps < 48)]
    early_level = np.nanmedian(early) if np.isfinite(early).any() else np.nan
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero or empty history gives inf or NaN
        out = {
            "raw": x.copy(),
            "fold": x
            / np.fmax(np.nan_to_num(history_min, nan=floor) if fold_from_start else history_min, floor),
            "early": x / max(abs(early_level), floor)
            if np.isfinite(early_level)
            else np.full(len(x), np.nan),
            "drop": (history_max - x) / np.fmax(np.abs(history_max), floor),
            "z": (x - mean) / scale,
            "slope": slope.to_numpy() * slope_blocks / scale,
        }
    judged = (steps >= FIRST_JUDGED + block - 1) & np.isfinite(mean) & np.isfinite(x)
    from_start = ("raw", "fold") if fold_from_start else ("raw",)
    return {k: np.where(judged | (k in from_start), v, np.nan) for k, v in out.items()}


def misses_per_update(results_file: Path) -> set[str]:
    """The runs the leave-one-setting-out detectors miss per update, read off ``detector_eval.txt``."""
    text = results_file.read_text()
    section = text.split("### update:", 1)[1].split("false alarms:", 1)[0]
    missed = " ".join(section.split("missed:", 1)[1].split())
    return set(re.findall(r"([\w.\-]+) \(collapse", missed))


def score_candidate(
    name: str,
    values: dict[str, np.ndarray],
    steps: dict[str, np.ndarray],
    stable: list[str],
    collapsing: list[detector_eval.Labelled],
    misses: set[str],
) -> Result | None:
    """The level only ``STABLE_ALLOWED`` of the ``stable`` runs exceed (the next one's maximum over the whole
    run), and the collapsing runs whose ``values`` exceed it at a block ending in ``[streak_from,
    collapse_step]``; None where no stable run has a value."""
    stable_max = sorted((_nanmax(values[r]) for r in stable), reverse=True)
    level = stable_max[STABLE_ALLOWED]
    if not np.isfinite(level):
        return None
    caught, near, first_steps = set(), set(), []
    for run in collapsing:
        at = steps[run.run_id]
        window = (at <= run.collapse_step) & (at >= run.streak_from)
        above = window & (np.nan_to_num(values[run.run_id], nan=-np.inf) > level)
        if above.any():
            caught.add(run.run_id)
            first_steps.append(int(at[above][0]))
        if (above & (at > run.collapse_step - NEAR_STEPS)).any():
            near.add(run.run_id)
    return Result(name, level, len(caught), len(caught & misses), len(near), len(near & misses), first_steps)


def candidate_values(
    series: dict[str, dict[str, np.ndarray]], block: int = BLOCK, columns: dict[str, str] = COLUMNS
) -> Iterator[tuple[str, float, dict[str, np.ndarray]]]:
    """Every candidate of ``block_series``' output: its name, its sign (+1 up, −1 down), and per run its
    per-block values, signed (so that a candidate always fires upward)."""
    for column in columns:
        for aggregate in AGGREGATES:
            key = f"{column}_{aggregate}"
            every = np.concatenate([series[r][key] for r in series])
            floor = FLOORS.get(column) or 0.1 * float(np.nanmedian(np.abs(every)))
            floor = floor if floor > 0 else 1e-6
            every_kind = {r: transforms(series[r][key], series[r]["step"], floor, column in FOLD_FROM_START, block)
                          for r in series}  # fmt: skip
            for kind in TRANSFORMS:
                values = {r: every_kind[r][kind] for r in series}
                for sign, direction in ((1.0, "up"), (-1.0, "down")):
                    if kind in ("fold", "drop") and sign < 0:
                        continue  # a fold read downward mirrors the drop, a drop read downward the fold
                    yield (
                        f"{column} {aggregate} {kind} {direction}",
                        sign,
                        {r: sign * v for r, v in values.items()},
                    )


def scan_inputs(
    corpus: str, block: int = BLOCK, columns: dict[str, str] = COLUMNS
) -> tuple[dict[str, dict[str, np.ndarray]], list[str], list[detector_eval.Labelled]]:
    """The corpus's block series, its stable runs' ids and its collapsing runs (labels as
    ``experiments/detector_eval.py``'s)."""
    with open_runs([corpus]) as runs:
        labelled = {r.run_id: r for r in detector_eval.labels(runs, DetectorConfig())}
    series = block_series(corpus, block, columns)
    stable = [r.run_id for r in labelled.values() if r.collapse_step is None and not r.dipped]
    collapsing = [r for r in labelled.values() if r.collapse_step is not None]
    return series, stable, collapsing


def scan(
    corpus: str, misses: set[str], block: int = BLOCK, columns: dict[str, str] = COLUMNS
) -> list[Result]:
    """Every candidate's ``Result`` on the corpus at ``corpus`` (labels as ``experiments/detector_eval.py``'s)."""
    series, stable, collapsing = scan_inputs(corpus, block, columns)
    steps_of = {r: series[r]["step"] for r in series}
    results = []
    for name, sign, signed in candidate_values(series, block, columns):
        result = score_candidate(name, signed, steps_of, stable, collapsing, misses)
        if result is not None:
            result.level *= sign
            results.append(result)
    return results


def _nanmax(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.max()) if len(x) else -np.inf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(ROOT / "experiments" / "corpus"))
    parser.add_argument("--results", type=Path, default=ROOT / "experiments/results/detector_eval.txt")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--block", type=int, default=BLOCK, help=f"updates per block (default {BLOCK})")
    parser.add_argument("--columns", choices=("kept", "new"), default="kept",
                        help="kept: the committed corpus's columns; new: NEW_COLUMNS (a rebuilt corpus)")  # fmt: skip
    args = parser.parse_args(argv)
    columns = COLUMNS if args.columns == "kept" else {name: f"{name}::DOUBLE" for name in NEW_COLUMNS}
    misses = misses_per_update(args.results)
    if args.block < 1:
        parser.error("--block must be at least 1")
    results = scan(args.corpus, misses, args.block, columns)
    results.sort(key=lambda r: (r.missed_caught, r.caught), reverse=True)
    print(f"{len(results)} candidates; {len(misses)} per-update misses; blocks of {args.block} updates; level: only "
          f"{STABLE_ALLOWED} stable runs exceed it\n")  # fmt: skip
    print(f"| candidate | level | collapses caught in time | of the {len(misses)} misses | the same, crossing "
          f"within {NEAR_STEPS} updates of the fall | median first crossing (update) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in results[: args.top]:
        first = f"{np.median(r.first_steps):.0f}" if r.first_steps else "—"
        print(f"| {r.name} | {r.level:.3g} | {r.caught} | {r.missed_caught} | {r.near_caught}, "
              f"{r.near_missed_caught} | {first} |")  # fmt: skip
    print("\nbest per column (most misses, then most collapses):\n")
    print(f"| column | best candidate | level | collapses caught in time | of the {len(misses)} misses |")
    print("|---|---|---|---|---|")
    for column in columns:
        mine = [r for r in results if r.name.split()[0] == column]
        if mine:
            r = mine[0]
            print(f"| {column} | {r.name.removeprefix(column + ' ')} | {r.level:.3g} | {r.caught} | "
                  f"{r.missed_caught} |")  # fmt: skip
    for label, counts in (("misses caught", [r.missed_caught for r in results]),
                          (f"misses caught within {NEAR_STEPS} updates of the fall",
                           [r.near_missed_caught for r in results])):  # fmt: skip
        histogram = np.bincount(counts)
        print(f"\ncandidates by {label}: " + ", ".join(f"{k}: {n}" for k, n in enumerate(histogram) if n))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
