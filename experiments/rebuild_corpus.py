"""Retrain every corpus run with every column logged, and check it reproduces the committed one (not a test).

    python experiments/rebuild_corpus.py [--corpus experiments/corpus] [--out sweep_runs/corpus_full] [--jobs 2]
        [--check-only] [--add-columns clip_frac_active]

The committed corpus (``experiments/corpus``) keeps 21 ``steps`` columns per run (``make_corpus.EXPORT_COLUMNS``);
the trainer logs about 80 (value, advantage, return, turn-ratio, KL estimator, completion-length columns …).
Each run is retrained from its ``run.json``: the ``TrainConfig`` fields it keeps, over the defaults of the
commit that made it (``made_by``; the grid's commit a2fc0c8 had a constant lr, no dual-clip, the arithmetic
turn ratio, a fixed CTN λ of 1 with plain k3 and a 32-update auto-CTN wait, and no stuck-warm-start retry:
``A2FC0C8``). The check compares ``reward_mean``, ``clip_frac``, ``entropy`` and ``kl_old_k3`` step by
step with the committed run: a run *reproduces* when every value agrees to 1e-4 (the corpus stores float32).
Only reproduced runs carry the committed labels over. Runs already finished under ``--out`` are kept.

``--add-columns C …`` (with ``--check-only``) then writes those columns of each reproduced rebuilt run into the
committed copy (float32, joined on the step); the copy's other values are left exactly as they are, and a copy
that already has a column is left alone.
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
import pyarrow as pa

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


def add_columns(committed: Path, rebuilt: Path, columns: list[str]) -> list[str]:
    """Write ``columns`` of the ``rebuilt`` run into the ``committed`` copy's parquet, joined on the step.

    Returns the columns added (none where the copy has them all already). The copy keeps its other columns,
    its row order and its file name (``part-000000.parquet``, zstd level 19, as ``make_corpus.export``).
    """
    import pyarrow.parquet as pq

    (part,) = sorted((committed / "steps").glob("*/*.parquet"))
    table = pq.read_table(part)
    new = [c for c in columns if c not in table.column_names]
    if not new:
        return []
    rows = duckdb.sql(
        f"SELECT step, {', '.join(f'{c}::FLOAT AS {c}' for c in new)} "
        f"FROM read_parquet('{rebuilt}/steps/*/*.parquet')"
    ).fetchnumpy()
    where = {int(step): i for i, step in enumerate(rows["step"])}
    index = [where[int(step)] for step in table.column("step").to_pylist()]
    for column in new:
        table = table.append_column(column, pa.array(np.asarray(rows[column])[index], pa.float32()))
    pq.write_table(table, part, compression="zstd", compression_level=19, use_dictionary=False,
                   write_statistics=False)  # fmt: skip
    return new


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
    parser.add_argument("--add-columns", nargs="+", default=[], metavar="COLUMN",
                        help="write these columns of each reproduced run into the committed copy")  # fmt: skip
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
    if args.add_columns:
        added = [run for run, _ in reproduced
                 if add_columns(args.corpus / run, Path(args.out) / run, args.add_columns)]  # fmt: skip
        print(f"added {', '.join(args.add_columns)} to {len(added)} of {len(reproduced)} reproduced runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
