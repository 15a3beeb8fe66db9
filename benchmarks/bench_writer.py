"""Writer throughput and per-scalar logging cost, measured in one run (not a test).

1. Turn rows/s into Parquet through ``ParquetStreamWriter`` (the ``turns`` payloads ``Monitor`` submits)
   vs a bare ``pyarrow.parquet.write_table`` of the same columns (same compression), with pyarrow's
   defaults and with the writer's encoding options (float columns without dictionary or statistics).
2. Per-scalar cost of ``Monitor.log_scalars`` (until everything is on disk) vs TensorBoard's
   ``SummaryWriter.add_scalar`` (until flushed) on the same scalars. Needs the ``bench`` extra.

    python benchmarks/bench_writer.py [--updates 400] [--turns-per-update 4096] [--steps 2000] [--scalars 40]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sorl_monitor import Monitor
from sorl_monitor.schema import TURN_FLOAT_COLUMNS, conform
from sorl_monitor.write.writer import ParquetStreamWriter


def turn_payload(rng: np.random.Generator, step: int, n: int) -> dict[str, object]:
    """One update's turn rows, shaped as ``Monitor`` submits them (numpy columns, repeated run id)."""
    columns: dict[str, object] = {
        "run_id": pa.repeat("bench", n),
        "rank": np.zeros(n, np.int32),
        "step": np.full(n, step, np.int64),
        "iteration": np.full(n, step, np.int64),
        "ppo_epoch": np.zeros(n, np.int32),
        "minibatch": np.zeros(n, np.int32),
        "policy_lag": np.zeros(n, np.int32),
        "wall_time": np.full(n, time.time()),
        "sample_id": np.arange(n, dtype=np.int64) // 4,
        "turn_idx": (np.arange(n) % 4).astype(np.int32),
        "n_tokens": np.full(n, 4, np.int32),
        "turn_clipped": rng.random(n) > 0.9,
    }
    for name in TURN_FLOAT_COLUMNS:
        columns[name] = rng.random(n)
    return columns


def bench_turn_rows(updates: int, per_update: int, root: Path) -> tuple[float, float, float]:
    rng = np.random.default_rng(0)
    payloads = [turn_payload(rng, s, per_update) for s in range(updates)]
    total = updates * per_update

    root.mkdir(parents=True)
    warm = ParquetStreamWriter(root / "warm")  # warm-up: Arrow's lazy imports
    warm.submit("turns", payloads[0], per_update)
    warm.close()
    started = time.perf_counter()
    writer = ParquetStreamWriter(root / "writer", flush_rows=1_000_000, flush_interval_s=5.0)
    for payload in payloads:
        writer.submit("turns", payload, per_update)
    writer.close()
    ours = total / (time.perf_counter() - started)
    assert writer.stats().rows_written == total, writer.stats()

    def bare(folder: Path, plain_floats: bool) -> float:
        started = time.perf_counter()
        folder.mkdir()
        chunk = max(1, 1_000_000 // per_update)
        for i in range(0, updates, chunk):
            table = pa.concat_tables([pa.table(p) for p in payloads[i : i + chunk]])
            options = {}
            if plain_floats:  # what the writer does: no dictionary and no statistics on float columns
                exact = [f.name for f in table.schema if not pa.types.is_floating(f.type)]
                options = {"use_dictionary": exact, "write_statistics": exact}
            pq.write_table(table, folder / f"part-{i:06d}.parquet", compression="snappy", **options)
        return total / (time.perf_counter() - started)

    assert conform("turns", pa.table(payloads[0])).num_rows == per_update
    return ours, bare(root / "bare", False), bare(root / "bare-plain-floats", True)


def bench_scalars(steps: int, n_scalars: int, root: Path) -> tuple[float, float | None]:
    rng = np.random.default_rng(1)
    names = [f"metric/{i:02d}_mean" for i in range(n_scalars)]
    values = rng.random((steps, n_scalars)).tolist()

    mon = Monitor(root / "mon", "scalars")
    mon.log_scalars(-1, dict(zip(names, values[0], strict=True)))  # warm-up: Arrow's lazy imports
    mon.flush()
    started = time.perf_counter()
    for step, row in enumerate(values):
        mon.log_scalars(step, dict(zip(names, row, strict=True)))
    mon.close()
    ours = (time.perf_counter() - started) / (steps * n_scalars)

    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return ours, None
    tb = SummaryWriter(str(root / "tb"))
    tb.add_scalar(names[0], values[0][0], -1)  # warm-up
    tb.flush()
    started = time.perf_counter()
    for step, row in enumerate(values):
        for name, value in zip(names, row, strict=True):
            tb.add_scalar(name, value, step)
    tb.close()
    theirs = (time.perf_counter() - started) / (steps * n_scalars)
    return ours, theirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=400)
    parser.add_argument("--turns-per-update", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--scalars", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved repetitions; medians are printed")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sorl-bench-"))
    try:
        rows = [
            bench_turn_rows(args.updates, args.turns_per_update, root / f"rows{i}")
            for i in range(args.repeat)
        ]
        ours, bare, plain = (statistics.median(r[k] for r in rows) for k in (0, 1, 2))
        total = args.updates * args.turns_per_update
        print(
            f"turn rows → Parquet ({total:,} rows, {args.turns_per_update} per update, snappy, median of {args.repeat}):"
        )
        print(f"  sorl ParquetStreamWriter                  : {ours / 1e6:6.2f} M rows/s")
        print(
            f"  bare pyarrow write_table, defaults        : {bare / 1e6:6.2f} M rows/s   (writer: {ours / bare:.0%} of it)"
        )
        print(
            f"  bare pyarrow write_table, plain floats    : {plain / 1e6:6.2f} M rows/s   (writer: {ours / plain:.0%} of it)"
        )
        costs = [bench_scalars(args.steps, args.scalars, root / f"scalars{i}") for i in range(args.repeat)]
        mine = statistics.median(c[0] for c in costs)
        print(
            f"per-scalar logging cost ({args.steps} steps × {args.scalars} scalars, until on disk, median of {args.repeat}):"
        )
        print(f"  sorl Monitor.log_scalars : {mine * 1e6:7.3f} µs/scalar")
        if costs[0][1] is None:
            print("  TensorBoard              : not installed (pip install -e '.[bench]')")
        else:
            tb = statistics.median(c[1] for c in costs)
            print(
                f"  TensorBoard add_scalar   : {tb * 1e6:7.3f} µs/scalar   (sorl is {tb / mine:.0f}× cheaper)"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
