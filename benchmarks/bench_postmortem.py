"""Detector cost: the post-mortem at fleet scale (a real run's parts replicated), and the live guard.

    python benchmarks/bench_postmortem.py [--run RUN_DIR] [--repeats 3] [--compare-with OTHER_CHECKOUT]

The source is a real run: ``--run``, else the bundled trainer's collapsing sample run in ``sample_logs/``
(``sample_logs/make_sample_logs.sh`` makes it again). Its parts are copied with the steps shifted (copy ``i`` holds steps ``i·(last+1)…``) into two
shapes: many updates with sparse turns (2 M steps rows, 10 M turn rows) and few updates with dense turns
(20 k steps rows, 10 M turn rows; a step's turns copied with shifted sample ids). The copies are real
rows; the concatenated run is not a real run. DuckDB is pinned to 2 cores (``sched_setaffinity``).
Prints, per shape, the post-mortem time (cold: first open, part footers, every query; warm: views
already open), wall and CPU (all threads of the process). ``--compare-with`` times another checkout of the
project on the same replica in alternation with this one (each repetition a fresh process of each, cold then
warm), so a loaded machine loads both alike. Then the live path: ``CtnGuard.update`` (with its numpy screen, and
with the detector SQL on every call, alternating call by call) and all detectors over a 512-row Arrow window
of the source run's ``steps`` (what ``Monitor.recent_steps()`` returns), median per call, one thread. The load
average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
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

from sorl_monitor.diagnose.detectors import ArrowDetector  # noqa: E402
from sorl_monitor.diagnose.postmortem import postmortem  # noqa: E402
from sorl_monitor.read.query import open_runs  # noqa: E402
from sorl_monitor.remedy.ctn_guard import CtnGuard  # noqa: E402
from sorl_monitor.schema import RUN_FILE, TABLES  # noqa: E402

SAMPLE_LOGS = ROOT / "sample_logs"


def source_run(given: Path | None) -> tuple[Path, str]:
    """The run to replicate, and where it came from (for the printout); exits 2 when there is none."""
    if given is not None:
        return given, f"given run {given}"
    collapsing = SAMPLE_LOGS / "token-ppo"
    if (collapsing / "turns").is_dir():
        return collapsing, f"bundled trainer sample run {collapsing.name} (it collapses)"
    print(
        "error: no run to replicate: pass --run RUN_DIR, or run sample_logs/make_sample_logs.sh",
        file=sys.stderr,
    )
    sys.exit(2)


def read_table(run: Path, table: str) -> pa.Table | None:
    parts = sorted((run / table).glob("rank=*/part-*.parquet"))
    if not parts:
        return None
    return pa.concat_tables([pq.read_table(p) for p in parts], promote_options="permissive")


def replicate(run: Path, target: Path, steps_rows: int, turn_rows: int) -> tuple[int, int, int]:
    """Copy ``run``'s parts into ``target`` with shifted steps: ``steps``, ``modules`` and ``alerts`` until the
    steps reach ``steps_rows``, ``turns`` until they reach ``turn_rows`` (spread over the step copies, each
    extra copy of a step's turns with shifted sample ids).

    Returns (step copies, turn rows written, steps rows written).
    """
    tables = {name: read_table(run, name) for name in TABLES}
    if tables["turns"] is None or tables["turns"].num_rows == 0:
        raise SystemExit(f"{run} has no turns rows to replicate")
    span = pc.max(tables["steps"].column("step")).as_py() + 1
    copies = -(-steps_rows // tables["steps"].num_rows)
    turn_copies = -(-turn_rows // tables["turns"].num_rows)
    samples = pc.max(tables["turns"].column("sample_id")).as_py() + 1
    target.mkdir(parents=True)
    shutil.copy(run / RUN_FILE, target / RUN_FILE)
    for name, data in tables.items():
        if data is None:
            continue
        folder = target / name / "rank=0"
        folder.mkdir(parents=True)
        data = data.drop_columns([c for c in ("rank",) if c in data.column_names])
        pending: list[pa.Table] = []
        for copy in range(copies):
            shifted = _shift(data, "step", copy * span)
            if name == "turns":
                here = turn_copies // copies + (copy < turn_copies % copies)
                pending += [_shift(shifted, "sample_id", r * samples) for r in range(here)]
            else:
                pending.append(shifted)
            if pending and (sum(t.num_rows for t in pending) >= PART_ROWS or copy == copies - 1):
                pq.write_table(
                    pa.concat_tables(pending), folder / f"part-{copy:06d}.parquet", compression="zstd"
                )
                pending = []
    return copies, turn_copies * tables["turns"].num_rows, copies * tables["steps"].num_rows


PART_ROWS = 1_000_000
"""Rows per written part: what the writer's compaction leaves a long run with (``compact_rows``)."""


def _shift(data: pa.Table, column: str, by: int) -> pa.Table:
    index = data.schema.get_field_index(column)
    return data.set_column(index, column, pc.add(data.column(column), by))


def timed(function, repeats: int) -> tuple[float, object]:
    durations, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = function()
        durations.append(time.perf_counter() - started)
    return statistics.median(durations), result


def live_costs(steps: pa.Table, window: int = 512) -> dict[str, tuple[float, float]]:
    """Median wall and CPU ms per call of the guard (screened, and SQL on every call) and of all detectors,
    each call one new row on a ``window``-row window; the three alternate call by call."""
    ends = range(window, steps.num_rows + 1)
    screened, plain, every = CtnGuard(), CtnGuard(screen=False), ArrowDetector(optimize=False)
    calls = {
        "guard": lambda w: screened.update(w),
        "guard, SQL every call": lambda w: plain.update(w),
        "all detectors": lambda w: every(w, after_step=w.column("step")[-2].as_py()),
    }
    walls: dict[str, list[float]] = {name: [] for name in calls}
    cpus: dict[str, list[float]] = {name: [] for name in calls}
    for end in ends:
        table = steps.slice(end - window, window)
        for name, call in calls.items():
            started, cpu = time.perf_counter(), time.process_time()
            call(table)
            walls[name].append(time.perf_counter() - started)
            cpus[name].append(time.process_time() - cpu)
    for closing in (screened, plain, every):
        closing.close()
    return {
        name: (statistics.median(walls[name]) * 1e3, statistics.median(cpus[name]) * 1e3) for name in calls
    }


SHAPES = {
    "many updates, sparse turns": (2_000_000, 10_000_000),
    "few updates, dense turns": (20_000, 10_000_000),
}
"""The two shapes the goal is stated for: (steps rows, turn rows)."""


CHILD = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
import sorl_monitor
from sorl_monitor import open_runs, postmortem  # the public names: the same in every checkout compared
times = {}
started, cpu = time.perf_counter(), time.process_time()
with open_runs(sys.argv[2]) as runs:
    verdict = postmortem(runs, sys.argv[3])
    times["cold"] = (time.perf_counter() - started, time.process_time() - cpu)
    started, cpu = time.perf_counter(), time.process_time()
    postmortem(runs, sys.argv[3])
    times["warm"] = (time.perf_counter() - started, time.process_time() - cpu)
print(json.dumps({"code": os.path.dirname(sorl_monitor.__file__), "status": verdict.status, **times}))
"""
"""One post-mortem, cold then warm, in a fresh process of the checkout ``argv[1]``: wall and CPU seconds."""


def compare(checkouts: dict[str, Path], replica: Path, run_id: str, repeats: int) -> None:
    """Time ``checkouts`` (name → folder) on ``replica`` in alternation; print medians and the ratio to the first."""
    found: dict[str, list[dict]] = {name: [] for name in checkouts}
    for _ in range(repeats):
        for name, folder in checkouts.items():
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(folder), str(replica), run_id],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            found[name].append(json.loads(out.stdout))
    medians = {}
    for name, rows in found.items():
        medians[name] = {
            (phase, what): statistics.median(row[phase][i] for row in rows)
            for phase in ("cold", "warm")
            for i, what in enumerate(("wall", "cpu"))
        }
        m = medians[name]
        print(
            f"  {name} ({rows[0]['code']}, {rows[0]['status']}), median of {repeats} alternating processes: "
            f"cold {m['cold', 'wall']:.2f} s wall / {m['cold', 'cpu']:.2f} s CPU, "
            f"warm {m['warm', 'wall']:.2f} s wall / {m['warm', 'cpu']:.2f} s CPU"
        )
    first, *others = checkouts
    for name in others:
        ratios = ", ".join(
            f"{phase} {what} ×{medians[name][phase, what] / medians[first][phase, what]:.2f}"
            for phase in ("cold", "warm")
            for what in ("wall", "cpu")
        )
        print(f"  {name} ÷ {first}: {ratios}")


def measure(
    run: Path, scratch: Path, shape: str, steps_rows: int, turn_rows: int, repeats: int, other: Path | None
) -> float:
    """Replicate ``run`` to one shape and time its post-mortem; print and return the slower of cold and warm."""
    run_id = run.name
    replica = scratch / shape.replace(" ", "-").replace(",", "") / run_id
    started = time.perf_counter()
    copies, turns, steps = replicate(run, replica, steps_rows, turn_rows)
    print(f"\n{shape}: {steps:,} steps rows, {turns:,} turn rows ({copies} step copies; "
          f"{time.perf_counter() - started:.1f} s to write)")  # fmt: skip
    started, cpu = time.perf_counter(), time.process_time()
    with open_runs(replica) as runs:
        verdict = postmortem(runs, run_id)
        cold, cold_cpu = time.perf_counter() - started, time.process_time() - cpu
        cpu = time.process_time()
        warm, _ = timed(lambda: postmortem(runs, run_id), repeats)
        warm_cpu = (time.process_time() - cpu) / repeats
    print(
        f"  post-mortem: cold (open + footers + every query) {cold:.2f} s ({cold_cpu:.2f} s CPU), "
        f"warm (median of {repeats}) {warm:.2f} s ({warm_cpu:.2f} s CPU, mean)"
    )
    print(f"  verdict: {verdict.status}, collapse step {verdict.collapse_step}, first critical "
          f"{verdict.first_critical}, root cause {verdict.root_cause}")  # fmt: skip
    print(f"  goal ≤ 2 s on 2 cores: {'met' if max(cold, warm) <= 2.0 else 'NOT met'} (load {_load()})")
    if other is not None:
        compare({"other": other, "this checkout": ROOT}, replica, run_id, repeats)
    shutil.rmtree(replica.parent)
    return max(cold, warm)


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None, help="a real run folder to replicate")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--compare-with",
        type=Path,
        default=None,
        help="another checkout to time in alternation with this one",
    )
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        run, origin = source_run(args.run)
        print(
            f"source: {origin}; copies hold real rows, their concatenation is not a real run; cores: {cores}; "
            f"load average {_load()}"
        )
        for shape, (steps_rows, turn_rows) in SHAPES.items():
            measure(run, scratch, shape, steps_rows, turn_rows, args.repeats, args.compare_with)
        steps = read_table(run, "steps").sort_by("step")
        if steps.num_rows > 512:
            costs = live_costs(steps.slice(0, min(steps.num_rows, 512 + 200)))
            print(
                f"\nlive, 512-row window, one new update per call (median of {min(steps.num_rows, 712) - 511}, "
                "alternating call by call): "
                + ", ".join(f"{name} {wall:.1f} ms ({cpu:.1f} ms CPU)" for name, (wall, cpu) in costs.items())
                + " (goal ≤ 5 ms)"
            )
        print(f"load average at the end: {_load()}")


if __name__ == "__main__":
    main()
