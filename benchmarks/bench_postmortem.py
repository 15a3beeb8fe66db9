"""Detector cost: post-mortem over ~10 M turn rows (a real run's parts replicated), and the live guard.

    python benchmarks/bench_postmortem.py [--run RUN_DIR] [--turn-rows 10000000] [--repeats 3]

The source is a real run: ``--run``, else the bundled trainer's collapsing sample run when
``sample_logs/`` has one, else a run of the tiny PPO loop (``tests/detectors/tiny_pg.py``) trained here
first. Its ``steps``, ``turns``, ``modules`` and ``alerts`` parts are copied ``k`` times with the steps
shifted (copy ``i`` holds steps ``i·(last+1)…``) until the turns table reaches ``--turn-rows``; the
copies are real rows, the concatenated run is not a real run. DuckDB is pinned to 2 cores
(``sched_setaffinity``). Prints the post-mortem time (cold: first open; warm: views already open),
rows/s, and, for scale, one full scan of the turns table (the report's turn × step heatmap). Then the
live path: ``CtnGuard.update`` and all detectors over a 512-row Arrow window of the source run's
``steps`` (what ``Monitor.recent_steps()`` returns), median per call, single-threaded DuckDB.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sorl_monitor.detectors import ArrowDetector  # noqa: E402
from sorl_monitor.guard import CtnGuard  # noqa: E402
from sorl_monitor.postmortem import postmortem  # noqa: E402
from sorl_monitor.query import open_runs  # noqa: E402
from sorl_monitor.report import HEATMAP_SQL  # noqa: E402
from sorl_monitor.schema import RUN_FILE, TABLES  # noqa: E402

SAMPLE_LOGS = ROOT / "sample_logs"


def source_run(given: Path | None, scratch: Path) -> tuple[Path, str]:
    """The run to replicate, and where it came from (for the printout)."""
    if given is not None:
        return given, f"given run {given}"
    if SAMPLE_LOGS.is_dir():
        candidates = sorted(p for p in SAMPLE_LOGS.iterdir() if (p / "turns").is_dir() and "ppo" in p.name)
        if candidates:
            return candidates[0], f"bundled trainer sample run {candidates[0].name}"
    from tests.detectors.tiny_pg import train

    run = train(scratch / "source", "tiny-ramped", lr=0.01, lr_end=1.0, epochs=4, iterations=100, batch=128)
    return run, "tiny PPO loop run trained just now (tests/detectors/tiny_pg.py, lr ramped 0.01→1)"


def read_table(run: Path, table: str) -> pa.Table | None:
    parts = sorted((run / table).glob("rank=*/part-*.parquet"))
    if not parts:
        return None
    return pa.concat_tables([pq.read_table(p) for p in parts], promote_options="permissive")


def replicate(run: Path, target: Path, turn_rows: int) -> tuple[int, int, int]:
    """Copy ``run``'s parts into ``target`` with shifted steps until the turns reach ``turn_rows``.

    Returns (copies, turn rows written, steps rows written).
    """
    tables = {name: read_table(run, name) for name in TABLES}
    if tables["turns"] is None or tables["turns"].num_rows == 0:
        raise SystemExit(f"{run} has no turns rows to replicate")
    span = pc.max(tables["steps"].column("step")).as_py() + 1
    copies = -(-turn_rows // tables["turns"].num_rows)
    target.mkdir(parents=True)
    shutil.copy(run / RUN_FILE, target / RUN_FILE)
    for name, data in tables.items():
        if data is None:
            continue
        folder = target / name / "rank=0"
        folder.mkdir(parents=True)
        data = data.drop_columns([c for c in ("rank",) if c in data.column_names])
        for copy in range(copies):
            shifted = data
            for key in ("step", "iteration"):
                index = shifted.schema.get_field_index(key)
                shifted = shifted.set_column(index, key, pc.add(shifted.column(key), copy * span))
            pq.write_table(shifted, folder / f"part-{copy:06d}.parquet", compression="zstd")
    return copies, copies * tables["turns"].num_rows, copies * tables["steps"].num_rows


def timed(function, repeats: int) -> tuple[float, object]:
    durations, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = function()
        durations.append(time.perf_counter() - started)
    return statistics.median(durations), result


def live_costs(steps: pa.Table, window: int = 512) -> dict[str, float]:
    """Median ms per call of the guard and of all detectors, each call one new row on a ``window``-row window."""
    ends = range(window, steps.num_rows + 1)
    guard, every = CtnGuard(), ArrowDetector()
    costs = {}
    for name, call in (
        ("guard", lambda w: guard.update(w)),
        ("all detectors", lambda w: every(w, after_step=w.column("step")[-2].as_py())),
    ):
        durations = []
        for end in ends:
            table = steps.slice(end - window, window)
            started = time.perf_counter()
            call(table)
            durations.append(time.perf_counter() - started)
        costs[name] = statistics.median(durations) * 1e3
    guard.close()
    every.close()
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None, help="a real run folder to replicate")
    parser.add_argument("--turn-rows", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        run, origin = source_run(args.run, scratch)
        run_id = run.name
        replica = scratch / "replicated" / run_id
        started = time.perf_counter()
        copies, turn_rows, step_rows = replicate(run, replica, args.turn_rows)
        print(f"source: {origin}")
        print(
            f"replicated {copies}× (steps shifted per copy; real rows, synthetic concatenation): "
            f"{turn_rows:,} turn rows, {step_rows:,} steps rows ({time.perf_counter() - started:.1f} s to write)"
        )
        print(f"cores: {cores}")

        started = time.perf_counter()
        with open_runs(replica) as runs:
            verdict = postmortem(runs, run_id)
            cold = time.perf_counter() - started
            warm, _ = timed(lambda: postmortem(runs, run_id), args.repeats)
            scan, _ = timed(
                lambda: runs.sql(HEATMAP_SQL, {"run_id": run_id, "width": 1, "max_turns": 32}), args.repeats
            )
        print(
            f"post-mortem, cold (open + footers + all queries): {cold:.2f} s ({turn_rows / cold:,.0f} turn rows/s)"
        )
        print(
            f"post-mortem, warm (median of {args.repeats}): {warm:.2f} s ({turn_rows / warm:,.0f} turn rows/s)"
        )
        print(f"full turns scan (heatmap aggregate): {scan:.2f} s ({turn_rows / scan:,.0f} rows/s)")
        print(
            f"verdict: collapse step {verdict.collapse_step}, first critical {verdict.first_critical}, "
            f"root cause {verdict.root_cause}"
        )
        print(f"goal ≤ 2 s on 2 cores: {'met' if max(cold, warm) <= 2.0 else 'NOT met'}")
        steps = read_table(run, "steps").sort_by("step")
        if steps.num_rows > 512:
            costs = live_costs(steps.slice(0, min(steps.num_rows, 512 + 200)))
            print(
                f"live, 512-row window, one new update per call (median of {min(steps.num_rows, 712) - 511}): "
                + ", ".join(f"{name} {ms:.1f} ms" for name, ms in costs.items())
            )


if __name__ == "__main__":
    main()
