"""Collapse sweep of the bundled trainer (not a test): seeds × variants under one off-policy setting.

    python benchmarks/collapse_sweep.py --seeds 8 --iterations 100 [--jobs 2] [--set lr=7e-4 --set staleness=4]

A variant is ``algo[:turn_ratio][+ctn_mode]``, e.g. ``ppo``, ``so_ppo:geomean``, ``ppo+auto``. One run per
process (``--jobs`` processes, one thread each). Prints one line per run as it ends, then a table per
variant: collapse rate (the post-mortem's collapse label), final and peak reward (per rollout
iteration; final = mean of the last 5), peak clip fraction, max grad norm, updates to collapse, and
the mean lead time of the first critical alert. Runs are kept under ``--log-dir`` for
``benchmarks/detector_eval.py`` and the dashboard.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_VARIANTS = ("ppo", "turn_ppo", "s_ppo", "so_ppo", "ppo+auto", "grpo", "so_grpo", "so_ppo:geomean")


def parse_variant(variant: str) -> dict:
    name, _, ctn = variant.partition("+")
    algo, _, ratio = name.partition(":")
    out = {"algo": algo}
    if ratio:
        out["turn_ratio"] = ratio
    if ctn:
        out["ctn"] = ctn
    return out


def run_name(variant: str, seed: int) -> str:
    return f"{variant.replace(':', '-').replace('+', '-')}-s{seed}"


def measure(
    run_dir: Path, variant: str, seed: int, final: float, peak: float, seconds: float, switches: int
) -> dict:
    """The sweep's row for one finished run (collapse label and verdict from the post-mortem)."""
    from sorl_monitor.postmortem import postmortem
    from sorl_monitor.query import open_runs

    with open_runs(run_dir) as runs:
        verdict = postmortem(runs, run_dir.name)
        peaks = runs.sql("SELECT max(clip_frac), max(grad_norm) FROM steps").to_pylist()[0]
    values = list(peaks.values())
    return {"variant": variant, "seed": seed, "collapsed": verdict.collapsed, "collapse_step": verdict.collapse_step,
            "lead_time": verdict.lead_time, "root_cause": verdict.root_cause, "final": final, "peak": peak,
            "clip_max": values[0], "grad_max": values[1], "seconds": seconds, "ctn_switches": switches,
            "dip": verdict.evidence["deepest_dip"]}  # fmt: skip


def from_runs(log_dir: str, variants: list[str], seeds: range) -> list[dict]:
    """Rows of a sweep already on disk (``--summarize``)."""
    import json

    rows = []
    for variant in variants:
        for seed in seeds:
            run_dir = Path(log_dir) / run_name(variant, seed)
            info_path = run_dir / "run.json"
            if not info_path.is_file():
                continue
            info = json.loads(info_path.read_text())
            rows.append(measure(run_dir, variant, seed, info.get("final_reward", float("nan")),
                                info.get("peak_reward", float("nan")), float("nan"), 0))  # fmt: skip
    return rows


def run_one(job: tuple[str, int, int, str, dict]) -> dict:
    variant, seed, iterations, log_dir, overrides = job
    from sorl_monitor.trainer.config import TrainConfig, with_settings
    from sorl_monitor.trainer.train import train

    safe = run_name(variant, seed)[: -len(f"-s{seed}")]
    cfg = TrainConfig(seed=seed, iterations=iterations, log_dir=log_dir, run_name=f"{safe}-s{seed}",
                      log_turns="first", **parse_variant(variant))  # fmt: skip
    cfg = with_settings(cfg, [f"{key}={value}" for key, value in overrides.items()])
    result = train(cfg)
    return measure(result.run_dir, variant, seed, result.final_reward, result.peak_reward, result.seconds,
                   len(result.ctn_switches))  # fmt: skip


def mean(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.fmean(xs) if xs else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--log-dir", default="sweep_runs")
    parser.add_argument("--set", action="append", default=[], help="TrainConfig override key=value")
    parser.add_argument(
        "--summarize", action="store_true", help="only print the table of runs already in --log-dir"
    )
    args = parser.parse_args()
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = value
    if args.summarize:
        print_table(from_runs(args.log_dir, args.variants, range(args.first_seed, args.first_seed + args.seeds)),
                    args.variants, f"runs in {args.log_dir}")  # fmt: skip
        return
    jobs = [(v, s, args.iterations, args.log_dir, overrides)
            for s in range(args.first_seed, args.first_seed + args.seeds) for v in args.variants]  # fmt: skip
    print(f"{len(jobs)} runs, {args.jobs} at a time, settings {overrides or 'defaults'}", flush=True)
    started = time.perf_counter()
    rows = []
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        for row in pool.imap_unordered(run_one, jobs):
            rows.append(row)
            print(f"{row['variant']:>16} seed {row['seed']}: {'COLLAPSED at ' + str(row['collapse_step']) if row['collapsed'] else 'stable':<18}"
                  f" final {row['final']:.2f} peak {row['peak']:.2f} clip_max {row['clip_max']:.2f}"
                  f" grad_max {row['grad_max']:.1f} dip {row['dip']:.2f} cause {row['root_cause']} ({row['seconds']:.0f} s)",
                  flush=True)  # fmt: skip
    print_table(rows, args.variants, f"settings: {overrides or 'defaults'}; {args.iterations} iterations; "
                f"{time.perf_counter() - started:.0f} s")  # fmt: skip


def print_table(rows: list[dict], variants: list[str], title: str) -> None:
    print(f"\n{title}")
    print(
        "collapsed = the post-mortem's label (reward MA below half its peak for 64+ updates); "
        "ended low = final reward below half the peak; dipped = reward MA below half its running peak at "
        "some point (recovered or not); worst dip = the lowest reward MA / running peak over the seeds"
    )
    header = (f"{'variant':>16} {'collapsed':>9} {'ended low':>9} {'dipped':>9} {'worst dip':>9} {'final':>6} "
              f"{'peak':>6} {'clip_max':>8} {'grad_max':>8} {'upd→collapse':>12} {'lead':>6}")  # fmt: skip
    print(header)
    for variant in variants:
        mine = [r for r in rows if r["variant"] == variant]
        if not mine:
            continue
        n_c = sum(r["collapsed"] for r in mine)
        n_low = sum(r["final"] < 0.5 * r["peak"] for r in mine)
        n_dip = sum(r["dip"] < 0.5 for r in mine)
        print(f"{variant:>16} {n_c:>4}/{len(mine):<4} {n_low:>4}/{len(mine):<4} {n_dip:>4}/{len(mine):<4} "
              f"{min(r['dip'] for r in mine):>9.2f} {mean(r['final'] for r in mine):>6.2f} "
              f"{mean(r['peak'] for r in mine):>6.2f} {mean(r['clip_max'] for r in mine):>8.2f} "
              f"{max(r['grad_max'] for r in mine):>8.1f} {mean(r['collapse_step'] for r in mine):>12.0f} "
              f"{mean(r['lead_time'] for r in mine):>6.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
