"""Scan pairs of signals that must cross together for an early collapse signal the detectors miss (issue #26).

    python experiments/pair_scan.py [--corpus sweep_runs/corpus_full] [--pool 120] [--top 20] [--loso]

Plan and rule, written before the first run: ``experiments/results/detector_eval_pair_scan.md``. Candidates are
``signal_scan``'s (kept and other columns, 8-update blocks, six transforms, up and down). The pool: the
``--pool`` candidates catching the most per-update misses (then collapses) at the level ``POOL_STABLE`` stable
runs exceed. A pair (two pool members of different columns) fires at the first block where both exceed their
levels, each level from ``LEVEL_RANKS`` (the per-run maxima of the stable runs at those ranks); a level pair is
admissible when at most ``signal_scan.STABLE_ALLOWED`` stable runs ever fire. A pair's score: its admissible
level pair with the most misses, then collapses, caught in the credited window (last recovery to fall start).
``--loso``: the gate for the pairs that separate, their levels refit leave-one-setting-out (``loso_gate``).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT, ROOT / "experiments"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import detector_eval  # noqa: E402
import signal_scan  # noqa: E402

POOL_STABLE = 8
"""The pool is ranked at the single level this many stable runs exceed."""
LEVEL_RANKS = (2, 3, 4, 6, 8, 12, 16, 24)
"""Each member's levels: the stable runs' per-run maxima at these ranks (the level that many exceed alone)."""
SEPARATES_MISSES = 8
"""The rule: a pair separates iff it catches at least this many misses and at least (misses + 5) collapses."""


@dataclass
class Windows:
    """The blocks a scan reads, gathered into one array: every block of each stable run, and the credited
    window's blocks of each collapsing run (segments in that order; empty windows left out)."""

    index: dict[str, np.ndarray]  # run_id → positions of its blocks in the run's series
    stable: list[str]
    collapsing: list[str]
    misses: np.ndarray  # per collapsing segment: one of the per-update misses
    first_steps: dict[str, np.ndarray]


def windows(series, stable, collapsing, misses: set[str]) -> Windows:
    index = {r: np.arange(len(series[r]["step"])) for r in stable}
    kept = []
    for run in collapsing:
        at = series[run.run_id]["step"]
        inside = np.flatnonzero((at <= run.collapse_step) & (at >= run.streak_from))
        if len(inside):
            index[run.run_id] = inside
            kept.append(run.run_id)
    steps = {r: series[r]["step"][index[r]] for r in index}
    return Windows(index, list(stable), kept, np.array([r in misses for r in kept]), steps)


def gathered(values: dict[str, np.ndarray], win: Windows) -> np.ndarray:
    """One candidate's signed values over ``win``'s segments, NaN as −inf (never crossing)."""
    parts = [values[r][win.index[r]] for r in (*win.stable, *win.collapsing)]
    return np.nan_to_num(np.concatenate(parts), nan=-np.inf).astype(np.float64)


def stable_levels(values: dict[str, np.ndarray], stable: list[str], ranks=LEVEL_RANKS) -> np.ndarray:
    """The stable runs' per-run maxima at ``ranks`` (descending): the level that many stable runs exceed."""
    maxima = sorted((signal_scan._nanmax(values[r]) for r in stable), reverse=True)
    return np.array([maxima[k] for k in ranks], dtype=np.float64)


def single_score(values, win: Windows, level: float) -> tuple[int, int]:
    """(misses, collapses) caught by one candidate at ``level`` in the credited windows."""
    caught = np.array(
        [np.nan_to_num(values[r][win.index[r]], nan=-np.inf).max() > level for r in win.collapsing]
    )
    return int((caught & win.misses).sum()), int(caught.sum())


def pair_fires(a: np.ndarray, b: np.ndarray, levels_a, levels_b, starts: np.ndarray) -> np.ndarray:
    """``(len(levels_a), segments, len(levels_b))``: whether each segment has a block where ``a`` exceeds
    ``levels_a[i]`` and ``b`` exceeds ``levels_b[j]``."""
    masked = np.where(a[None, :] > levels_a[:, None], b[None, :], -np.inf)
    best_b = np.maximum.reduceat(masked, starts, axis=1)
    return best_b[:, :, None] > levels_b[None, None, :]


def best_levels(fires: np.ndarray, stable: np.ndarray, missed: np.ndarray, use: np.ndarray) -> tuple | None:
    """The admissible level pair (at most ``STABLE_ALLOWED`` of the ``use``d stable segments firing) with the
    most ``missed`` then collapsing segments caught among the ``use``d ones; None if none is admissible."""
    collapsing = ~stable
    fired = fires[:, stable & use, :].sum(1)
    caught = fires[:, collapsing & use, :]
    key = caught[:, missed[collapsing & use], :].sum(1) * 1000 + caught.sum(1)
    key = np.where(fired <= signal_scan.STABLE_ALLOWED, key, -1)
    ia, ib = np.unravel_index(int(np.argmax(key)), key.shape)
    return None if key[ia, ib] < 0 else (ia, ib)


def loso_gate(fires: np.ndarray, segments: list[str], n_stable: int, misses: set[str],
              quiet_false: set[str]) -> tuple[list[str], list[str]]:  # fmt: skip
    """The misses a pair adds and the stable runs it newly alarms, its levels refit on the other settings
    for each held-out setting; ``quiet_false``: the stable runs the detectors already alarm on."""
    settings = np.array([detector_eval.setting_of(r) for r in segments])
    stable = np.arange(len(segments)) < n_stable
    missed = np.array([r in misses for r in segments])
    added, new_false = [], []
    for setting in sorted(set(settings)):
        held = settings == setting
        levels = best_levels(fires, stable, missed, ~held)
        if levels is None:
            continue
        for i in np.flatnonzero(held & fires[levels[0], :, levels[1]]):
            if stable[i] and segments[i] not in quiet_false:
                new_false.append(segments[i])
            elif not stable[i] and missed[i]:
                added.append(segments[i])
    return added, new_false


def false_alarms_per_update(results_file: Path) -> set[str]:
    """The stable runs the leave-one-setting-out detectors alarm on per update, read off ``detector_eval.txt``."""
    section = results_file.read_text().split("### update:", 1)[1].split("###", 1)[0]
    return set(re.findall(r"([\w.\-]+) \(alarm", " ".join(section.split("false alarms:", 1)[1].split())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(ROOT / "sweep_runs" / "corpus_full"))
    parser.add_argument("--results", type=Path, default=ROOT / "experiments/results/detector_eval.txt")
    parser.add_argument("--pool", type=int, default=120)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument(
        "--loso", action="store_true", help="the gate: separating pairs' levels refit per fold"
    )
    args = parser.parse_args(argv)
    columns = {**signal_scan.COLUMNS, **{name: f"{name}::DOUBLE" for name in signal_scan.NEW_COLUMNS}}
    misses = signal_scan.misses_per_update(args.results)
    series, stable, collapsing = signal_scan.scan_inputs(args.corpus, signal_scan.BLOCK, columns)
    win = windows(series, stable, collapsing, misses)

    scored = []  # (misses, collapses, name)
    for name, _sign, values in signal_scan.candidate_values(series, signal_scan.BLOCK, columns):
        level = stable_levels(values, stable, (POOL_STABLE,))[0]
        if np.isfinite(level):
            scored.append((*single_score(values, win, level), name))
    scored.sort(key=lambda item: (item[0], item[1]), reverse=True)
    pool_names = {name for _, _, name in scored[: args.pool]}
    pool = {}
    for name, _sign, values in signal_scan.candidate_values(series, signal_scan.BLOCK, columns):
        if name in pool_names:
            pool[name] = (gathered(values, win), stable_levels(values, stable))
    print(f"{len(scored)} candidates; pool {len(pool)} (best single at the {POOL_STABLE}-of-{len(stable)} level: "
          f"{scored[0][2]}, {scored[0][0]} misses, {scored[0][1]} collapses); {len(misses)} per-update misses; "
          f"{len(win.collapsing)} collapses with a credited window")  # fmt: skip

    lengths = [len(win.index[r]) for r in (*win.stable, *win.collapsing)]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    n_stable = len(win.stable)
    names = sorted(pool)
    results = []  # (misses, collapses, a, b, level_a, level_b, stable fired)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if a.split()[0] == b.split()[0]:
                continue  # two transforms of one column are not two signals
            (va, la), (vb, lb) = pool[a], pool[b]
            if not (np.isfinite(la).all() and np.isfinite(lb).all()):
                la, lb = np.nan_to_num(la, neginf=-1e300), np.nan_to_num(lb, neginf=-1e300)
            fires = pair_fires(va, vb, la, lb, starts)
            stable_fired = fires[:, :n_stable, :].sum(1)
            caught = fires[:, n_stable:, :]
            missed_caught = caught[:, win.misses, :].sum(1)
            total = caught.sum(1)
            admissible = stable_fired <= signal_scan.STABLE_ALLOWED
            key = np.where(admissible, missed_caught * 1000 + total, -1)
            ia, ib = np.unravel_index(int(np.argmax(key)), key.shape)
            if key[ia, ib] >= 0:
                results.append((int(missed_caught[ia, ib]), int(total[ia, ib]), a, b,
                                LEVEL_RANKS[ia], LEVEL_RANKS[ib], int(stable_fired[ia, ib])))  # fmt: skip
    results.sort(key=lambda r: (r[0], r[1]), reverse=True)
    separating = [r for r in results if r[0] >= SEPARATES_MISSES and r[1] >= r[0] + 5]
    print(f"{len(results)} pairs scored; separating by the rule (≥ {SEPARATES_MISSES} misses and ≥ misses + 5 "
          f"collapses): {len(separating)}\n")  # fmt: skip
    print("| pair (both must cross) | ranks of their levels | stable runs firing | collapses caught in time | "
          f"of the {len(misses)} misses |")  # fmt: skip
    print("|---|---|---|---|---|")
    for m, total, a, b, ra, rb, fired in results[: args.top]:
        print(f"| {a} & {b} | {ra}, {rb} | {fired} | {total} | {m} |")
    histogram = np.bincount([r[0] for r in results])
    print("\npairs by misses caught: " + ", ".join(f"{k}: {n}" for k, n in enumerate(histogram) if n))
    if args.loso:
        quiet_false = false_alarms_per_update(args.results)
        segments = [*win.stable, *win.collapsing]
        print(f"\ngate, levels refit leave-one-setting-out (passes: ≥ 3 misses added, no new false alarm; the "
              f"detectors' false alarms: {', '.join(sorted(quiet_false))})\n")  # fmt: skip
        print("| pair | misses added | new false alarms | passes |")
        print("|---|---|---|---|")
        for _m, _total, a, b, *_ in separating:
            (va, la), (vb, lb) = pool[a], pool[b]
            fires = pair_fires(va, vb, la, lb, starts)
            added, new_false = loso_gate(fires, segments, n_stable, misses, quiet_false)
            passes = len(added) >= 3 and not new_false
            print(f"| {a} & {b} | {len(added)} ({', '.join(added) or '—'}) | {len(new_false)} "
                  f"({', '.join(new_false) or '—'}) | {'yes' if passes else 'no'} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
