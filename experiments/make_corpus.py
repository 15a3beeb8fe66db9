"""The labelled corpus the detectors are evaluated on: bundled-trainer runs over a grid of settings.

    python experiments/make_corpus.py [--out corpus_runs] [--jobs 2] [--seeds 2] [--iterations 80]

Grid (every combination; a *setting* is one cell, its seeds are replicates):

* algorithm: ppo, turn_ppo, s_ppo, so_ppo, grpo, so_grpo
* reuse: ``1x4`` (one epoch over 4 mini-batches) or ``4x4`` (4 epochs × 4 mini-batches per rollout batch)
* staleness: rollouts 0 or 4 iterations old
* learning rate: 3e-4, 1e-3, 3e-3

6 × 2 × 2 × 3 = 72 settings × 2 seeds = 144 runs (about 50 min with 2 jobs on 2 cores). ``--failures``
makes instead the ``FAILURE_SETTINGS``, aimed at the real ways runs fail without a KL penalty (entropy and
length blowing up, reward variance dying, responses collapsing to a few tokens), each a plain change of the
trainer's knobs (``temperature``, ``ent_coef``, ``lr``, ``warmup_iterations``), one rollout batch of 4 updates
at a constant lr (or one warmed up), 80 iterations (60 for the warmed-up lr); 5 of their 12 runs collapsed
(docs/detectors.md: which, and why the rest are kept). Nothing is
injected: each run is real training of the bundled trainer, logged by the monitor (``log_turns=first`` to
keep the folders small). Runs already finished in ``--out`` are kept, so an interrupted build resumes.
``experiments/detector_eval.py`` labels and scores them; ``--export DIR`` then writes the compact copy
kept in the repository (``steps`` only, the columns the detectors and the label read).
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ALGORITHMS = ("ppo", "turn_ppo", "s_ppo", "so_ppo", "grpo", "so_grpo")
REUSE = {"1x4": (1, 4), "4x4": (4, 4)}
STALENESS = (0, 4)
LEARNING_RATES = (3e-4, 1e-3, 3e-3)


FAILURE_SETTINGS: dict[str, dict] = {
    # no KL penalty, a high constant lr and a sampling temperature above 1 (a probe at temperature 1.0 ran its
    # responses to the turn cap and lost its reward at iteration 10): both seeds learned
    "ppo-hot-t1.1-lr1e-3": {"algo": "ppo", "lr": 1e-3, "temperature": 1.1},
    # GRPO sampling cold (temperature 0.5) at a high lr: groups turn all-equal and give no gradient, the Echo
    # Trap: seed 0 lost its reward within 8 iterations (every group zero-variance); seed 1 dipped and recovered
    "grpo-cold-t0.5-lr2e-3": {"algo": "grpo", "lr": 2e-3, "temperature": 0.5},
    # an entropy bonus (at lr 3e-3, 0.05 ran the entropy to its maximum and every response to one 4-token turn
    # within 2 iterations): at lr 1e-3 all four runs learned
    "grpo-entropy-e0.03-lr1e-3": {"algo": "grpo", "lr": 1e-3, "ent_coef": 0.03},
    "grpo-entropy-e0.05-lr1e-3": {"algo": "grpo", "lr": 1e-3, "ent_coef": 0.05},
    # the same bonus with the lr warmed up to 3e-3 over 40 iterations: the run learns while the lr is low, then
    # (all four runs, GRPO and PPO, between iterations 28 and 54) the entropy runs to its maximum and every
    # response to one 4-token turn: the entropy blow-up and responses collapsing to a few tokens, after a
    # healthy phase
    "grpo-entwarm-e0.05-lr3e-3": {
        "algo": "grpo",
        "lr": 3e-3,
        "ent_coef": 0.05,
        "warmup_iterations": 40,
        "iterations": 60,
    },
    "ppo-entwarm-e0.05-lr3e-3": {
        "algo": "ppo",
        "lr": 3e-3,
        "ent_coef": 0.05,
        "warmup_iterations": 40,
        "iterations": 60,
    },
}
"""Settings aimed at the ways real runs fail, outside the reuse grid (``--failures``); all without a KL penalty
(``kl_ref_coef`` 0, the trainer's default)."""
FAILURE_BASE = {"epochs": 1, "minibatches": 4, "staleness": 0, "anneal_lr": False}


def setting_name(algo: str, reuse: str, staleness: int, lr: float) -> str:
    return f"{algo}-r{reuse}-st{staleness}-lr{lr:.0e}".replace("e-0", "e-")


def grid() -> list[dict]:
    """Every setting of the grid, with its ``TrainConfig`` overrides."""
    cells = []
    for algo, reuse, staleness, lr in itertools.product(ALGORITHMS, REUSE, STALENESS, LEARNING_RATES):
        epochs, minibatches = REUSE[reuse]
        cells.append({"setting": setting_name(algo, reuse, staleness, lr),
                      "config": {"algo": algo, "epochs": epochs, "minibatches": minibatches,
                                 "staleness": staleness, "lr": lr}})  # fmt: skip
    return cells


def failure_grid() -> list[dict]:
    """The ``FAILURE_SETTINGS`` with their ``TrainConfig`` overrides."""
    return [
        {"setting": name, "config": {**FAILURE_BASE, **knobs}} for name, knobs in FAILURE_SETTINGS.items()
    ]


def run_one(job: tuple[str, str, dict, int, int]) -> tuple[str, float, str]:
    out, setting, overrides, seed, iterations = job
    from sorl_monitor.trainer.config import TrainConfig
    from sorl_monitor.trainer.train import train

    name = f"{setting}-s{seed}"
    started = time.perf_counter()
    cfg = TrainConfig(
        **{
            "seed": seed,
            "iterations": iterations,
            "log_dir": out,
            "run_name": name,
            "log_turns": "first",
            **overrides,
        }
    )  # fmt: skip (a setting's own iterations win)
    result = train(cfg)
    return name, time.perf_counter() - started, result.status


def finished(run_dir: Path) -> bool:
    try:
        return json.loads((run_dir / "run.json").read_text()).get("status") not in (None, "running")
    except (OSError, ValueError):
        return False


EXPORT_COLUMNS = (
    "run_id", "step", "ppo_epoch", "policy_lag", "loss", "ratio_max", "ratio_p99", "turn_ratio_max", "clip_frac",
    "clip_frac_turn", "kl_old_k3", "kl_ref_k3", "entropy", "grad_norm", "reward_mean", "reward_std",
    "zero_std_group_frac", "response_len_mean", "nonfinite_count", "ctn_active", "clip_frac_active",
)  # fmt: skip
"""What the compact copy keeps of each run's ``steps`` (metrics as float32): every column a detector, the
collapse label, the root-cause rules or a baseline reads."""


CONFIG_KEPT = ("algo", "epochs", "minibatches", "staleness", "lr", "iterations", "ctn", "dual_clip", "seed",
               "anneal_lr", "warmup_iterations", "temperature", "ent_coef", "kl_ref_coef")  # fmt: skip
"""The config knobs a compact copy's ``run.json`` keeps (the ones that make a setting)."""


def export(runs_dir: Path, target: Path, name: Callable[[dict], str | None] | None = None) -> list[str]:
    """Write each run of ``runs_dir`` as ``target/<run>/{run.json, steps/rank=0/part-0.parquet}`` (zstd).

    ``name(run)`` (``run``: its ``runs`` row, ``config`` parsed) gives the copy's run id, or None to leave
    the run out; by default the run keeps its own. A run whose copy already exists is not written again.
    Returns the run ids written.
    """
    import pyarrow.parquet as pq

    from sorl_monitor.read.query import open_runs

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()  # fmt: skip
    written = []
    with open_runs(runs_dir) as runs:
        have = set(runs.columns("steps"))
        columns = ", ".join(
            "$name AS run_id" if c == "run_id"
            else c if c in ("step", "ppo_epoch", "policy_lag", "ctn_active") else f"{c}::FLOAT AS {c}"
            for c in EXPORT_COLUMNS
            if c in have
        )  # fmt: skip
        for run in runs.sql(
            "SELECT run_id, algorithm, seed, status, config FROM runs ORDER BY run_id"
        ).to_pylist():
            run["config"] = json.loads(run["config"])
            new_id = run["run_id"] if name is None else name(run)
            if new_id is None or (target / new_id / "run.json").exists():
                continue
            steps = runs.sql(
                f"SELECT {columns} FROM steps WHERE run_id = $r ORDER BY step",
                {"r": run["run_id"], "name": new_id},
            )
            folder = target / new_id / "steps" / "rank=0"
            folder.mkdir(parents=True, exist_ok=True)
            pq.write_table(steps, folder / "part-000000.parquet", compression="zstd", compression_level=19,
                           use_dictionary=False, write_statistics=False)  # fmt: skip
            config = run["config"]
            info = {"run_id": new_id, "algorithm": run["algorithm"], "seed": run["seed"],
                    "status": run["status"], "schema_version": 1,
                    "config": {k: config.get(k) for k in CONFIG_KEPT if k in config},
                    "setting": new_id.rsplit("-s", 1)[0], "made_by": f"experiments/make_corpus.py @ {commit}"}  # fmt: skip
            (target / new_id / "run.json").write_text(json.dumps(info, indent=1) + "\n")
            written.append(new_id)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="corpus_runs", help="where the full runs go")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=80)
    parser.add_argument(
        "--failures", action="store_true", help="make the FAILURE_SETTINGS instead of the grid"
    )
    parser.add_argument("--export", type=Path, help="write the compact copy of --out's runs here and stop")
    args = parser.parse_args()
    if args.export:
        export(Path(args.out), args.export)
        print(f"exported {args.out} → {args.export}")
        return
    jobs = [(args.out, cell["setting"], cell["config"], seed, args.iterations)
            for seed in range(args.first_seed, args.first_seed + args.seeds)
            for cell in (failure_grid() if args.failures else grid())
            if not finished(Path(args.out) / f"{cell['setting']}-s{seed}")]  # fmt: skip
    print(f"{len(jobs)} runs to make, {args.jobs} at a time", flush=True)
    started = time.perf_counter()
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        for done, (name, seconds, status) in enumerate(pool.imap_unordered(run_one, jobs), 1):
            print(f"[{done}/{len(jobs)}] {name}: {status} ({seconds:.0f} s; {time.perf_counter() - started:.0f} s in all)",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
