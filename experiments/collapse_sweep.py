"""Collapse sweep of the bundled trainer (not a test): off-policy settings × seeds × variants.

    python experiments/collapse_sweep.py [--seeds 8] [--iterations 100] [--jobs 2]
        [--settings default milder:lr=3e-4 harsher:staleness=8] [--variants ppo so_ppo so_ppo+auto ppo+auto]

A setting is ``name[:field=value,...]`` (``TrainConfig`` fields over the defaults; ``--set`` applies to
every setting). A variant is ``algo[:turn_ratio][+ctn_mode][@field=value,...]``, e.g. ``ppo``,
``so_ppo:mean``, ``ppo+auto``, ``ppo@dual_clip=none``. One run per process (``--jobs`` processes, one thread each); runs already finished under
``--log-dir`` with the same settings are read back instead of retrained. Prints one line per run, then a table per setting:

* collapsed: the post-mortem's label (reward below half its peak for 64+ updates, not recovered within them);
  "of them recovered": collapses the run later came back from (the verdict's ``came_back_step``);
* held: the run's reward (moving average over 5 iterations) never fell below 0.7 × its peak after its
  first 10 iterations; worst hold: the lowest such ratio over the seeds;
* final / peak: mean over the seeds of the last-5-iteration reward and of the peak (5-iteration MA);
  gap: how far the variant's mean final reward is below the best variant's in that setting;
* clip max, grad max, CTN switches, λ max: what the run did.

``--markdown FILE`` writes the tables as Markdown (the README's sweep table).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_VARIANTS = ("ppo", "ppo@dual_clip=none", "so_ppo", "so_ppo+auto", "ppo+auto")
DEFAULT_SETTINGS = ("default", "milder:lr=3e-4", "harsher:staleness=8")
HOLD_FRACTION = 0.7
HOLD_AFTER = 10  # iterations
MA = 5  # iterations
STUCK_WARM_STARTS = (28, 45)
"""The seeds of 0–47 whose default warm start ``warmstart_stuck_nll`` lengthens (docs/trainer.md); on
the others it stops at ``warmstart_steps`` with the same weights, so runs stored before the knob hold."""


def parse_variant(variant: str) -> dict:
    """``algo[:turn_ratio][+ctn][@field=value,...]`` → ``TrainConfig`` fields (values as text)."""
    variant, _, extra = variant.partition("@")
    name, _, ctn = variant.partition("+")
    algo, _, ratio = name.partition(":")
    out = {"algo": algo}
    if ratio:
        out["turn_ratio"] = ratio
    if ctn:
        out["ctn"] = ctn
    out.update(parse_setting(f"-:{extra}")[1])
    return out


def parse_setting(text: str) -> tuple[str, dict[str, str]]:
    name, _, fields = text.partition(":")
    pairs = [item.partition("=") for item in fields.split(",") if item]
    return name, {key: value for key, _, value in pairs}


def run_name(variant: str, seed: int) -> str:
    for mark in ":+@,":
        variant = variant.replace(mark, "-")
    return f"{variant.replace('=', '')}-s{seed}"


def hold_ratio(rewards: list[float]) -> tuple[float, float]:
    """``(lowest MA / running peak after HOLD_AFTER iterations, peak MA)`` of per-iteration rewards.

    MA is the mean of the last ``MA`` iterations, counted only where a full window exists: a 1–4
    iteration "average" at the start is one noisy batch of the warm start and set the peak by chance.
    """
    ma = [statistics.fmean(rewards[i - MA + 1 : i + 1]) for i in range(MA - 1, len(rewards))]
    peak, worst = 0.0, math.inf
    for i, value in enumerate(ma, start=MA - 1):
        peak = max(peak, value)
        if i >= HOLD_AFTER and peak > 0:
            worst = min(worst, value / peak)
    return (worst if worst < math.inf else float("nan")), peak


def measure(run_dir: Path, variant: str, setting: str, seed: int, seconds: float) -> dict:
    """The sweep's row for one finished run (collapse label from the post-mortem, rewards per iteration)."""
    from sorl_monitor.diagnose.postmortem import postmortem
    from sorl_monitor.read.query import open_runs

    with open_runs(run_dir) as runs:
        verdict = postmortem(runs, run_dir.name)
        peaks = runs.sql("SELECT max(clip_frac), max(grad_norm), max(ctn_coef) FROM steps").to_pylist()[0]
        rewards = runs.sql("SELECT avg(reward_mean) FROM steps GROUP BY iteration ORDER BY iteration")
        switches = runs.sql(
            "SELECT count(*) FROM alerts WHERE kind = 'action' AND detector IN ('ctn_on', 'ctn_off')"
        )
        rewards, switches = rewards.column(0).to_pylist(), switches.column(0).to_pylist()[0]
    clip_max, grad_max, coef_max = peaks.values()
    hold, peak = hold_ratio(rewards)
    tail = rewards[-5:]
    return {"variant": variant, "setting": setting, "seed": seed, "collapsed": verdict.collapsed,
            "recovered": verdict.came_back_step is not None, "came_back_step": verdict.came_back_step,
            "collapse_step": verdict.collapse_step, "root_cause": verdict.root_cause,
            "final": statistics.fmean(tail) if tail else float("nan"), "peak": peak, "hold": hold,
            "clip_max": clip_max, "grad_max": grad_max, "coef_max": coef_max, "switches": switches,
            "seconds": seconds}  # fmt: skip


IGNORED_FIELDS = ("log_dir", "run_name", "threads", "warmstart_cache", "log_turns")
"""Fields that do not change what a run learns: a finished run differing only in these is read back."""


def predates_knob_alike(key: str, value, stored: dict) -> bool:
    """Whether a run stored before knob ``key`` existed trained as ``value`` makes a run train now."""
    if key in ("ctn_guard_every", "ctn_auto_start"):
        from sorl_monitor.trainer.algorithms import get_algorithm

        if (stored.get("ctn") or get_algorithm(stored["algo"]).default_ctn) != "auto":
            return True  # the auto-CTN knobs change nothing without auto-CTN
        if key == "ctn_guard_every":  # before it, the guard looked once per rollout batch
            return value in (None, stored["epochs"] * stored["minibatches"])
        return value == "off"  # before it, auto-CTN waited for the detectors' first warning
    if key == "ctn_raise_unclipped":  # before it, λ's controller raised λ whatever the gradient norm
        return not value
    if key in ("warmstart_stuck_nll", "warmstart_target_nll"):  # before them: exactly warmstart_steps
        if key == "warmstart_target_nll" or value is None:
            return True  # the target acts only through the stuck rule
        from sorl_monitor.trainer.config import TrainConfig

        default = json.loads(json.dumps(TrainConfig().to_dict()))
        warm = ("warmstart_steps", "warmstart_error_rate", "warmstart_lr", "episodes", "task", "policy")
        return (all(stored.get(name) == default[name] for name in warm)
                and stored["seed"] in range(48) and stored["seed"] not in STUCK_WARM_STARTS)  # fmt: skip
    return True  # later knobs whose default keeps the old behaviour


def reusable(run_dir: Path, config: dict) -> bool:
    """True when ``run_dir`` finished with the same settings as ``config`` (a ``TrainConfig.to_dict()``).

    A field the stored config lacks (a knob added later) counts as equal when the run trained as the
    knob's value would make it (``predates_knob_alike``); any other difference, e.g. a changed default,
    means the run is trained again.
    """
    try:
        info = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return False
    stored = info.get("config") or {}
    if info.get("status") not in ("finished", "diverged"):
        return False
    as_stored = json.loads(json.dumps(config))  # the config as run.json holds it (tuples as lists, …)
    return all(stored[key] == value if key in stored else predates_knob_alike(key, value, stored)
               for key, value in as_stored.items() if key not in IGNORED_FIELDS)  # fmt: skip


def run_one(job: tuple[str, str, dict, int, int, str]) -> dict:
    variant, setting, overrides, seed, iterations, log_dir = job
    folder = Path(log_dir) / setting
    name = run_name(variant, seed)
    from sorl_monitor.trainer.config import TrainConfig, with_settings

    cfg = TrainConfig(seed=seed, iterations=iterations, log_dir=str(folder), run_name=name, log_turns="first")
    fields = {**overrides, **parse_variant(variant)}
    cfg = with_settings(cfg, [f"{key}={value}" for key, value in fields.items()])
    if reusable(folder / name, cfg.to_dict()):
        return measure(folder / name, variant, setting, seed, float("nan"))
    import shutil

    from sorl_monitor.trainer.train import train

    shutil.rmtree(folder / name, ignore_errors=True)  # an unfinished or differently-set run is trained again
    result = train(cfg)
    return measure(result.run_dir, variant, setting, seed, result.seconds)


def mean(xs) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.fmean(xs) if xs else float("nan")


def table(rows: list[dict], variants: list[str], setting: str, fields: dict) -> list[str]:
    """Markdown lines of one setting's table."""
    mine = [r for r in rows if r["setting"] == setting]
    finals = {v: mean(r["final"] for r in mine if r["variant"] == v) for v in variants}
    best = max((f for f in finals.values() if not math.isnan(f)), default=float("nan"))
    described = ", ".join(f"{k}={v}" for k, v in fields.items()) or "the trainer's defaults"
    lines = [f"**{setting}** ({described})", "",
             "| variant | collapsed | of them recovered | held ≥ 0.7 × peak | worst hold | final | peak | gap to best | clip max | grad max | CTN switches | λ max |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for variant in variants:
        runs = [r for r in mine if r["variant"] == variant]
        if not runs:
            continue
        n = len(runs)
        held = sum(r["hold"] >= HOLD_FRACTION for r in runs)
        lines.append(
            f"| {variant} | {sum(r['collapsed'] for r in runs)}/{n} | {sum(r.get('recovered', False) for r in runs)} "
            f"| {held}/{n} | {min(r['hold'] for r in runs):.2f} "
            f"| {finals[variant]:.2f} | {mean(r['peak'] for r in runs):.2f} | {best - finals[variant]:.2f} "
            f"| {mean(r['clip_max'] for r in runs):.2f} | {max(r['grad_max'] for r in runs):.0f} "
            f"| {mean(r['switches'] for r in runs):.1f} | {max(r['coef_max'] for r in runs):g} |"
        )  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS))
    parser.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--log-dir", default="sweep_runs")
    parser.add_argument("--set", action="append", default=[], help="TrainConfig override for every setting")
    parser.add_argument("--markdown", help="also write the tables to this Markdown file")
    args = parser.parse_args()
    common = dict(item.partition("=")[::2] for item in args.set)
    settings = dict(parse_setting(text) for text in args.settings)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    jobs = [(v, name, {**common, **fields}, s, args.iterations, args.log_dir)
            for name, fields in settings.items() for s in seeds for v in args.variants]  # fmt: skip
    print(f"{len(jobs)} runs, {args.jobs} at a time", flush=True)
    started = time.perf_counter()
    rows = []
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        for row in pool.imap_unordered(run_one, jobs):
            rows.append(row)
            state = f"COLLAPSED at {row['collapse_step']}" if row["collapsed"] else "stable"
            if row["recovered"]:
                state += f", recovered from {row['came_back_step']}"
            print(f"{row['setting']:>8} {row['variant']:>12} s{row['seed']}: {state:<17} final {row['final']:.2f} "
                  f"peak {row['peak']:.2f} hold {row['hold']:.2f} grad_max {row['grad_max']:.0f} "
                  f"({row['seconds']:.0f} s)", flush=True)  # fmt: skip
    lines = [f"Collapse sweep: {args.seeds} seeds × {len(settings)} settings, {args.iterations} iterations each, "
             f"common overrides {common or 'none'}; {time.perf_counter() - started:.0f} s on {args.jobs} jobs.", ""]  # fmt: skip
    for name, fields in settings.items():
        lines += [*table(rows, args.variants, name, {**common, **fields}), ""]
    text = "\n".join(lines)
    print("\n" + text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")


if __name__ == "__main__":
    main()
