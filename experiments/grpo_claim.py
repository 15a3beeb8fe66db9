"""The paper's GRPO claim in the bundled trainer, as one pre-registered procedure (not a test).

    python experiments/grpo_claim.py [--jobs 16] [--log-dir sweep_runs/grpo31/claim] [--stop-after 560]
        [--out claim]

Phase 1 (tuning, seeds ``TUNING_SEEDS``): every setting of ``CANDIDATES`` × {GRPO, SO-GRPO + auto-CTN}.
The rule below picks one setting from phase 1 alone; phase 2 (evaluation, seeds ``EVAL_SEEDS``, never used
by any earlier result) runs both variants there. If no candidate qualifies, phase 2 probes ``FALLBACK``
on the tuning seeds instead, and nothing is evaluated.

Rule (written before any run of it; ``pick``):

* a setting qualifies when, on every tuning seed, GRPO is labelled collapsed (the post-mortem's label)
  and SO-GRPO + auto-CTN is not labelled collapsed and holds (lowest 5-iteration MA ≥ 0.7 × its running
  peak after iteration 10: ``collapse_sweep.hold_ratio``);
* if none does, a setting qualifies when GRPO is labelled collapsed on at least one tuning seed and
  SO-GRPO + auto-CTN holds, not collapsed, on every one;
* among the qualifying settings: the highest worst SO-GRPO hold; ties go to the earlier candidate.

The claim is shown iff, at the picked setting over ``EVAL_SEEDS``, GRPO is labelled collapsed in ≥ 6 of 8
and SO-GRPO + auto-CTN is not labelled collapsed and holds in 8 of 8. Runs still training at
``--stop-after`` seconds are stopped and left out (the report says so); runs that finished are read back
by a later call with the same ``--log-dir`` instead of retrained. ``--out`` gets ``rows.jsonl`` (one row
per finished run, as it finishes) and ``report.md``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from collapse_sweep import HOLD_FRACTION, parse_setting, run_one, table  # noqa: E402

COMMON = "staleness=8,anneal_lr=false"
CANDIDATES = (
    "stale16:staleness=16,anneal_lr=false",
    f"cliphigh:{COMMON},clip_eps_high=0.28",
    f"lr8e-4:{COMMON},lr=8e-4",
    "stale16nodc:staleness=16,anneal_lr=false,dual_clip=none",
)
FALLBACK = (
    "stale16lr8e-4:staleness=16,anneal_lr=false,lr=8e-4",
    f"reuse12:{COMMON},epochs=12",
    "stale24:staleness=24,anneal_lr=false",
    f"group4:{COMMON},group_size=4",
)
VARIANTS = ("grpo", "so_grpo+auto")
TUNING_SEEDS = (0, 1)
EVAL_SEEDS = tuple(range(200, 208))
ITERATIONS = 100


def holds(row: dict) -> bool:
    return not row["collapsed"] and row["hold"] >= HOLD_FRACTION


def pick(rows: list[dict], settings: list[str]) -> tuple[str | None, str]:
    """The rule of the module docstring: ``(setting or None, why)`` from phase 1's rows."""
    by = {
        s: {v: [r for r in rows if r["setting"] == s and r["variant"] == v] for v in VARIANTS}
        for s in settings
    }
    complete = [s for s in settings if all(len(by[s][v]) == len(TUNING_SEEDS) for v in VARIANTS)]
    strict = [s for s in complete
              if all(r["collapsed"] for r in by[s]["grpo"]) and all(holds(r) for r in by[s]["so_grpo+auto"])]  # fmt: skip
    relaxed = [s for s in complete
               if any(r["collapsed"] for r in by[s]["grpo"]) and all(holds(r) for r in by[s]["so_grpo+auto"])]  # fmt: skip
    for kind, chosen in (("strict", strict), ("relaxed", relaxed)):
        if chosen:
            best = max(
                chosen, key=lambda s: (min(r["hold"] for r in by[s]["so_grpo+auto"]), -settings.index(s))
            )
            return best, f"{kind}: qualifying {', '.join(chosen)}; picked the highest worst SO-GRPO hold"
    missing = [s for s in settings if s not in complete]
    return None, "no candidate qualifies" + (f" (unfinished: {', '.join(missing)})" if missing else "")


def run_phase(jobs: list[tuple], pool, deadline: float, sink) -> list[dict]:
    rows, pending = [], [pool.apply_async(run_one, (job,)) for job in jobs]
    while pending and time.monotonic() < deadline:
        time.sleep(1.0)
        for result in [p for p in pending if p.ready()]:
            pending.remove(result)
            try:
                row = result.get()
            except Exception as error:  # one broken run is reported, not fatal
                print(f"run failed: {error!r}", flush=True)
                continue
            rows.append(row)
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            state = f"COLLAPSED at {row['collapse_step']}" if row["collapsed"] else "stable"
            print(f"{time.strftime('%H:%M:%S')} {row['setting']:>14} {row['variant']:>12} s{row['seed']}: "
                  f"{state:<18} final {row['final']:.2f} hold {row['hold']:.2f} ({row['seconds']:.0f} s)", flush=True)  # fmt: skip
    return rows


def jobs_for(settings: list[str], seeds, log_dir: str, iterations: int) -> list[tuple]:
    parsed = [parse_setting(text) for text in settings]
    return [
        (v, name, fields, s, iterations, log_dir) for name, fields in parsed for s in seeds for v in VARIANTS
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--log-dir", default="sweep_runs/grpo31/claim")
    parser.add_argument(
        "--stop-after", type=float, default=560.0, help="seconds; unfinished runs are left out"
    )
    parser.add_argument("--out", default="claim")
    parser.add_argument(
        "--iterations", type=int, default=ITERATIONS, help="the procedure's is 100; less: a smoke run"
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    deadline = started + args.stop_after
    names = [parse_setting(text)[0] for text in CANDIDATES]
    lines = [
        f"# GRPO claim: pre-registered procedure ({args.jobs} jobs, {args.iterations} iterations per run)",
        "",
    ]
    with mp.get_context("spawn").Pool(args.jobs) as pool, (out / "rows.jsonl").open("a") as sink:
        tuning = run_phase(
            jobs_for(list(CANDIDATES), TUNING_SEEDS, args.log_dir, args.iterations), pool, deadline, sink
        )
        chosen, why = pick(tuning, names)
        lines += [
            f"Phase 1 (tuning seeds {list(TUNING_SEEDS)}), {time.monotonic() - started:.0f} s: {why}.",
            "",
        ]
        lines += [
            line for text in CANDIDATES for line in (*table(tuning, list(VARIANTS), *parse_setting(text)), "")
        ]
        if chosen is None:
            phase2 = jobs_for(list(FALLBACK), TUNING_SEEDS, args.log_dir, args.iterations)
            label, settings = "Phase 2 (fallback probe, tuning seeds; nothing evaluated)", list(FALLBACK)
        else:
            setting = next(text for text in CANDIDATES if parse_setting(text)[0] == chosen)
            phase2 = jobs_for([setting], EVAL_SEEDS, args.log_dir + "-eval", args.iterations)
            label, settings = (
                f"Phase 2 (evaluation seeds {EVAL_SEEDS[0]}–{EVAL_SEEDS[-1]} at `{chosen}`)",
                [setting],
            )
        second = run_phase(phase2, pool, deadline, sink)
        pool.terminate()
    lines += [
        f"{label}, ended at {time.monotonic() - started:.0f} s: {len(second)} of {len(phase2)} runs finished.",
        "",
    ]
    lines += [
        line for text in settings for line in (*table(second, list(VARIANTS), *parse_setting(text)), "")
    ]
    if chosen is not None:
        grpo = [r for r in second if r["variant"] == "grpo"]
        so = [r for r in second if r["variant"] == "so_grpo+auto"]
        done = len(grpo) == len(so) == len(EVAL_SEEDS)
        shown = sum(r["collapsed"] for r in grpo) >= 6 and sum(holds(r) for r in so) == len(EVAL_SEEDS)
        verdict = ("shown" if shown else "not shown") if done else "not decided (unfinished runs)"
        lines += [f"Claim (GRPO collapsed ≥ 6/8, SO-GRPO + auto holds 8/8): **{verdict}** — GRPO collapsed "
                  f"{sum(r['collapsed'] for r in grpo)}/{len(grpo)}, SO-GRPO + auto held "
                  f"{sum(holds(r) for r in so)}/{len(so)}.", ""]  # fmt: skip
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
