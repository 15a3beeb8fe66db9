"""Retrain every corpus run with every column logged, and check it reproduces the committed one (not a test).

    python experiments/rebuild_corpus.py [--corpus experiments/corpus] [--out sweep_runs/corpus_full] [--jobs 2]
        [--check-only]

The committed corpus (``experiments/corpus``) keeps 20 ``steps`` columns per run (``make_corpus.EXPORT_COLUMNS``);
the trainer logs about 80 (value, advantage, return, turn-ratio, KL estimator, completion-length columns …).
Each run is retrained from its ``run.json``: the ``TrainConfig`` fields it keeps, over the defaults of the
commit that made it (``made_by``; the grid's commit a2fc0c8 had a constant lr, no dual-clip, the arithmetic
turn ratio, a fixed CTN λ of 1 with plain k3 and a 32-update auto-CTN wait, and no stuck-warm-start retry:
``A2FC0C8``). The check compares ``reward_mean``, ``clip_frac``, ``entropy`` and ``kl_old_k3`` step by
step with the committed run: a run *reproduces* when every value agrees to 1e-4 (the corpus stores float32).
Only reproduced runs carry the committed labels over. Runs already finished under ``--out`` are kept.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

import duckdb
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT, ROOT / "experiments"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from make_corpus import finished, run_one  # noqa: E402

A2FC0C8 = {
    "anneal_lr": False,
    "dual_clip": None,
    "turn_ratio": "mean",
    "ctn_coef": 1.0,
    "ctn_target_clip": None,
    "ctn_kl_cap": None,
    "ctn_quiet_updates": 32,
    "warmstart_stuck_nll": None,
}
"""Today's ``TrainConfig`` fields whose defaults differed at a2fc0c8 (where the field did not exist yet: the
behaviour of that commit)."""
COMPARED = ("reward_mean", "clip_frac", "entropy", "kl_old_k3")
TOLERANCE = 1e-4


def job_of(run_dir: Path, out: str) -> tuple[str, str, dict, int, int]:
    info = json.loads((run_dir / "run.json").read_text())
    config = dict(info["config"])
    seed, iterations = int(config.pop("seed")), int(config.pop("iterations"))
    overrides = {**(A2FC0C8 if "a2fc0c8" in info.get("made_by", "") else {}), **config}
    setting = run_dir.name.rsplit("-s", 1)[0]
    return out, setting, overrides, seed, iterations


def compare(committed: Path, rebuilt: Path) -> float:
    """Largest difference over ``COMPARED`` and steps (inf when the steps differ)."""
    sql = "SELECT step, {} FROM read_parquet('{}/steps/*/*.parquet') ORDER BY step"
    a = duckdb.sql(sql.format(", ".join(COMPARED), committed)).fetchnumpy()
    b = duckdb.sql(sql.format(", ".join(COMPARED), rebuilt)).fetchnumpy()
    if len(a["step"]) != len(b["step"]) or (a["step"] != b["step"]).any():
        return float("inf")
    worst = 0.0
    for column in COMPARED:
        x, y = np.asarray(a[column], float), np.asarray(b[column], float)
        both_nan = np.isnan(x) & np.isnan(y)
        worst = max(worst, float(np.nanmax(np.where(both_nan, 0.0, np.abs(x - y)), initial=0.0)))
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=ROOT / "experiments" / "corpus")
    parser.add_argument("--out", default="sweep_runs/corpus_full")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--check-only", action="store_true", help="train nothing: compare what is under --out"
    )
    args = parser.parse_args()
    runs = sorted(p for p in args.corpus.iterdir() if (p / "run.json").is_file())
    todo = [job_of(p, args.out) for p in runs if not finished(Path(args.out) / p.name)]
    todo.sort(key=lambda job: -job[2].get("epochs", 1) * job[4])  # the longest first
    if todo and not args.check_only:
        print(f"{len(todo)} runs to train, {args.jobs} at a time", flush=True)
        started = time.perf_counter()
        with mp.get_context("spawn").Pool(args.jobs) as pool:
            for done, (name, seconds, status) in enumerate(pool.imap_unordered(run_one, todo), 1):
                print(f"[{done}/{len(todo)}] {name}: {status} ({seconds:.0f} s; "
                      f"{time.perf_counter() - started:.0f} s in all)", flush=True)  # fmt: skip
    reproduced, differ, missing = [], [], []
    for run in runs:
        rebuilt = Path(args.out) / run.name
        if not finished(rebuilt):
            missing.append(run.name)
            continue
        worst = compare(run, rebuilt)
        (reproduced if worst <= TOLERANCE else differ).append((run.name, worst))
    print(f"reproduced {len(reproduced)} of {len(runs)}; differ {len(differ)}; not rebuilt {len(missing)}")
    for name, worst in differ:
        print(f"  differs: {name} (largest difference {worst:.3g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
