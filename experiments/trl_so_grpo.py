"""The bundled agent trained through TRL's real ``GRPOTrainer``: GRPO against SO-GRPO + auto-CTN (not a test).

    python experiments/trl_so_grpo.py [--seeds 0 1] [--variants grpo so_grpo+auto] [--steps 100]
        [--set lr=1e-3 staleness=4 ...] [--log-dir runs/trl_so_grpo] [--markdown FILE]

The task is the bundled multi-turn search task (``sorl_monitor/trainer/env.py``), played turn by turn: TRL's
``rollout_func`` hook runs ``SearchEnv.play`` with the policy sampling each 4-token turn and the environment
writing each 3-token observation, and returns the whole episode as one completion with TRL's ``env_mask``
(0 on observations), which TRL treats as its ``tool_mask``. So SO-GRPO's turns (runs of 1 in
``completion_mask × tool_mask``) are the environment's turns, and the reward is the environment's scorer.
(TRL's own tool loop needs a chat template that renders and parses JSON tool calls; the task's word-level
vocabulary has none, so the rollout hook is the nearest real path: same task, same turns, tool tokens masked.)

The setting is the bundled trainer's (``TrainConfig`` fields, ``--set`` over its defaults): the same
warm-started policy for the seed (its cache key), ``episodes`` per generation batch in groups of
``group_size``, ``minibatches`` optimizer updates per batch (``steps_per_generation``), ``epochs`` passes
(``num_iterations``), ``lr`` decayed linearly to 0 (``anneal_lr``; TRL's default schedule) after an optional
warm-up (``warmup_iterations``), ``clip_eps``, ``max_grad_norm``, no KL to a reference. A ``--set`` field the
script does not map (``HONOURED``) is refused; the SO-GRPO knobs ``SORLGRPOConfig`` shares (``PASSED_TO_SORL``)
go to it when set. Staleness: TRL samples with the learner, so the rollout hook samples
with the learner as it was ``staleness`` generation batches ago and the ratio is taken against that
sampler's log-probs (``old_per_token_logps`` := the sampler's), as the bundled trainer does. TRL splits a
generation batch into its mini-batches once; the bundled trainer reshuffles each epoch.

Variants: ``grpo`` (TRL's ``loss_type="grpo"``, unchanged) and ``so_grpo+auto`` (``SORLGRPOTrainer``'s
``so_grpo`` with ``ctn="auto"``); ``name[+off|on|auto]`` in general. Every run is written by the ``Monitor``
(``--log-dir/<variant>-s<seed>``), so ``sorl postmortem`` labels it; the table's columns are
``experiments/collapse_sweep.py``'s (collapsed: the post-mortem's label; held: the 5-iteration moving
average never fell below 0.7 × its running peak after iteration 10).
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from sorl_monitor import MetricsConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT_VARIANTS = ("grpo", "so_grpo+auto")

HONOURED = (
    "seed", "threads", "episodes", "group_size", "staleness", "temperature", "epochs", "minibatches", "lr",
    "anneal_lr", "warmup_iterations", "max_grad_norm", "clip_eps", "kl_ref_coef", "warmstart_steps",
    "warmstart_error_rate", "warmstart_lr", "warmstart_stuck_nll", "warmstart_target_nll", "warmstart_cache",
)  # fmt: skip
"""The ``TrainConfig`` fields this script maps onto TRL (besides the ``task.`` and ``policy.`` tables)."""
PASSED_TO_SORL = (
    "turn_ratio", "dual_clip", "ctn_coef", "ctn_target_clip", "ctn_coef_max", "ctn_kl_cap", "ctn_quiet_updates",
    "ctn_auto_start", "ctn_guard_every",
)  # fmt: skip
"""``TrainConfig`` fields that ``SORLGRPOConfig`` has under the same name: passed on only when ``--set`` names
them, so an unset one keeps the adapter's default (``dual_clip``: TRL's None, not the bundled trainer's 3)."""


def check_assignments(assignments: list[str]) -> None:
    """``ValueError`` naming a ``--set`` field this script would not honour (silently ignoring it would mislabel
    the run: its ``run.json`` would record a setting its training never saw)."""
    from sorl_monitor.settings import parse_assignments

    for name in parse_assignments(assignments):
        table, _, key = name.rpartition(".")
        if table in ("task", "policy") or (not table and key in (*HONOURED, *PASSED_TO_SORL)):
            continue
        hint = " (use --steps)" if name == "iterations" else ""
        raise ValueError(f"--set {name}: not used by the TRL path{hint}; it takes task.*, policy.* and the "
                         "fields in HONOURED and PASSED_TO_SORL (experiments/trl_so_grpo.py)")  # fmt: skip


def lr_schedule(cfg: Any) -> dict[str, Any]:
    """``GRPOConfig``'s schedule fields for the bundled trainer's: linear decay to 0 (``anneal_lr``) or constant,
    after a linear warm-up over ``warmup_iterations`` generation batches (Hugging Face's ramps per optimizer
    step from 0; the bundled trainer's per batch from ``lr / warmup_iterations``)."""
    warmup = cfg.warmup_iterations * cfg.epochs * cfg.minibatches
    kind = "linear" if cfg.anneal_lr else ("constant_with_warmup" if warmup else "constant")
    return {"lr_scheduler_type": kind, "warmup_steps": warmup}


def sorl_fields(cfg: Any, assignments: list[str]) -> dict[str, Any]:
    """The ``PASSED_TO_SORL`` fields that ``assignments`` set, with ``cfg``'s (parsed) values."""
    from sorl_monitor.settings import parse_assignments

    return {name: getattr(cfg, name) for name in parse_assignments(assignments) if name in PASSED_TO_SORL}


def parse_variant(variant: str) -> tuple[str, str]:
    """``loss[+ctn]`` → ``(loss_type, ctn)``; ``grpo`` → ``("grpo", "off")``, ``so_grpo+auto`` → ``("so_grpo", "auto")``."""
    loss, _, ctn = variant.partition("+")
    return loss, ctn or "off"


def task_questions(env: Any, prompts: list[str]) -> Any:
    """The env's ``Questions`` behind prompt texts ``<bos> e12 r3 r0 <nil>`` (start, relations; answer via the KB)."""
    from sorl_monitor.trainer.env import Questions

    v, c = env.vocab, env.config
    ids = torch.tensor([v.encode(text) for text in prompts])
    start = ids[:, 1] - v.first_entity
    raw = ids[:, 2 : 2 + c.max_hops]
    used = raw != v.nil
    relations = torch.where(used, raw - v.first_relation, torch.full_like(raw, -1))
    answer = start.clone()
    for hop in range(c.max_hops):
        answer = torch.where(used[:, hop], env.kb[answer, relations[:, hop].clamp_min(0)], answer)
    return Questions(ids, start, relations, used.sum(1), answer)


class StaleRollout:
    """TRL's ``rollout_func``: play the search task with the learner as it was ``staleness`` batches ago.

    Returns ``rollout_fields`` of the episodes; keeps each generation batch's mean reward.
    """

    def __init__(self, env: Any, behaviour: Any, staleness: int, temperature: float, seed: int) -> None:
        self.env, self.behaviour, self.temperature = env, behaviour, temperature
        self.generator = torch.Generator().manual_seed(seed + 1)
        self.history: collections.deque[dict[str, torch.Tensor]] = collections.deque(maxlen=staleness + 1)
        self.iteration_rewards: list[float] = []

    def __call__(self, prompts: list[str], trainer: Any) -> dict[str, Any]:
        from sorl_monitor.trainer.rollout import collect

        self.history.append(copy.deepcopy(trainer.model.state_dict()))
        self.behaviour.lm.load_state_dict(self.history[0])
        questions = task_questions(self.env, prompts)
        episodes = collect(self.env, self.behaviour, questions, self.temperature, self.generator)
        self.iteration_rewards.append(float(episodes.rewards.mean()))
        return rollout_fields(self.env, episodes)


def rollout_fields(env: Any, episodes: Any) -> dict[str, Any]:
    """What TRL's ``rollout_func`` returns for played ``episodes``: per episode the prompt ids, the completion
    (agent turns and observations up to the last played turn), the sampler's log-probs (0 without them),
    ``env_mask`` (1 on agent tokens; TRL's ``tool_mask``) and ``env_reward``."""
    from sorl_monitor.trainer.env import TURN_LEN

    p = env.prompt_len
    logp = torch.zeros(episodes.tokens.shape) if episodes.logp is None else episodes.logp
    out: dict[str, Any] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
    for i in range(episodes.tokens.shape[0]):
        end = env.turn_start(int(episodes.n_turns[i]) - 1) + TURN_LEN
        out["prompt_ids"].append(episodes.tokens[i, :p].tolist())
        out["completion_ids"].append(episodes.tokens[i, p:end].tolist())
        out["logprobs"].append(logp[i, p:end].tolist())
        out["env_mask"].append(episodes.mask[i, p:end].tolist())
    out["env_reward"] = episodes.rewards.tolist()
    return out


def env_reward(completions: list[Any], env_reward: list[float], **kwargs: Any) -> list[float]:
    """The reward the environment scored each episode with (forwarded by the rollout hook)."""
    return list(env_reward)


def stale_trainer_class() -> type:
    from sorl_monitor.integrations.trl_so_grpo import SORLGRPOTrainer

    class StaleSamplerGRPOTrainer(SORLGRPOTrainer):
        """``SORLGRPOTrainer`` whose ratio is taken against the (stale) sampler's log-probs."""

        def _generate_and_score_completions(self, *args: Any, **kwargs: Any) -> Any:
            output = super()._generate_and_score_completions(*args, **kwargs)
            if self.model.training:
                output["old_per_token_logps"] = output["sampling_per_token_logps"]
            return output

    return StaleSamplerGRPOTrainer


def run_name(variant: str, seed: int) -> str:
    return f"{variant.replace('+', '-')}-s{seed}"


def iterations_logged(run_dir: Path) -> int:
    """Generation batches with at least one logged update (a run stopped early has fewer than ``--steps``)."""
    from sorl_monitor.read.query import open_runs

    with open_runs(run_dir) as runs:
        return int(runs.sql("SELECT count(DISTINCT iteration) AS n FROM steps").to_pylist()[0]["n"])


def run_config(variant: str, seed: int, steps: int, assignments: list[str]) -> dict[str, Any]:
    """What a run's ``run.json`` stores as its config: the variant, the trainer and the ``TrainConfig``."""
    from sorl_monitor.trainer.config import TrainConfig, with_settings

    cfg = with_settings(TrainConfig(seed=seed, iterations=steps), assignments)
    return json.loads(json.dumps({"variant": variant, "trainer": "trl", **cfg.to_dict()}))


def finished(run_dir: Path, config: dict[str, Any]) -> bool:
    """Whether ``run_dir`` holds a finished run trained with ``config`` (then it is read back, not retrained)."""
    try:
        info = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return False
    return info.get("status") == "finished" and info.get("config") == config


def train_one(variant: str, seed: int, steps: int, assignments: list[str], log_dir: Path) -> Path:
    """Train one run through TRL (or find it finished under ``log_dir``); return its run folder."""
    from datasets import Dataset
    from transformers import PrinterCallback

    from sorl_monitor import Monitor
    from sorl_monitor.integrations.trl_so_grpo import SORLGRPOConfig
    from sorl_monitor.trainer.config import TrainConfig, with_settings
    from sorl_monitor.trainer.env import SearchEnv
    from sorl_monitor.trainer.policy import PolicyWithValue
    from sorl_monitor.trainer.warmstart import cached_warm_start, warm_start

    name = run_name(variant, seed)
    run_dir = log_dir / name
    if finished(run_dir, run_config(variant, seed, steps, assignments)):
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)  # an unfinished or differently-set run is trained again
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    loss_type, ctn = parse_variant(variant)
    cfg = with_settings(TrainConfig(seed=seed, iterations=steps), assignments)
    cfg.check()
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    env = SearchEnv(cfg.task)
    policy = PolicyWithValue(len(env.vocab), env.seq_len, cfg.policy)
    warm_key = {"task": cfg.task, "policy": cfg.policy, "steps": cfg.warmstart_steps, "seed": cfg.seed,
                "error_rate": cfg.warmstart_error_rate, "lr": cfg.warmstart_lr, "batch": cfg.episodes, "v": 1}  # fmt: skip
    if cfg.warmstart_stuck_nll is not None:  # the bundled trainer's key: the same warm start for the seed
        warm_key.update(stuck_nll=cfg.warmstart_stuck_nll, target_nll=cfg.warmstart_target_nll)
    warm_gen = torch.Generator().manual_seed(cfg.seed + 3)
    cached_warm_start(policy, env, warm_key, cfg.warmstart_cache, lambda: warm_start(
        policy, env, cfg.warmstart_steps, cfg.warmstart_error_rate, cfg.warmstart_lr, cfg.episodes, warm_gen,
        stuck_nll=cfg.warmstart_stuck_nll, target_nll=cfg.warmstart_target_nll))  # fmt: skip
    model = policy.lm
    model.config.pad_token_id, model.config.eos_token_id = env.vocab.pad, env.vocab.eos
    model.config.bos_token_id = env.vocab.bos
    questions = env.sample_questions(
        steps * cfg.episodes // cfg.group_size, torch.Generator().manual_seed(seed)
    )
    data = Dataset.from_dict({"prompt": [env.vocab.decode(ids) for ids in questions.prompts]})
    rollout = StaleRollout(
        env, copy.deepcopy(policy).requires_grad_(False), cfg.staleness, cfg.temperature, seed
    )
    args = SORLGRPOConfig(
        output_dir=str(log_dir / ".trl" / name), max_steps=steps * cfg.epochs * cfg.minibatches,
        per_device_train_batch_size=cfg.episodes // cfg.minibatches, steps_per_generation=cfg.minibatches,
        gradient_accumulation_steps=1, num_iterations=cfg.epochs, num_generations=cfg.group_size,
        max_completion_length=env.seq_len, learning_rate=cfg.lr, **lr_schedule(cfg), **sorl_fields(cfg, assignments),
        max_grad_norm=cfg.max_grad_norm, epsilon=cfg.clip_eps, beta=cfg.kl_ref_coef, temperature=cfg.temperature,
        loss_type=loss_type, ctn=ctn, seed=seed, data_seed=seed, use_cpu=True, report_to=[], save_strategy="no",
        logging_steps=cfg.epochs * cfg.minibatches, disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    monitor = Monitor(log_dir, name, config=run_config(variant, seed, steps, assignments),
                      algorithm=loss_type, seed=seed,
                      metrics=MetricsConfig(clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps))  # fmt: skip
    trainer = stale_trainer_class()(
        model=model, reward_funcs=env_reward, args=args, train_dataset=data,
        processing_class=env.vocab.hf_tokenizer(), rollout_func=rollout, monitor=monitor,
    )  # fmt: skip
    trainer.remove_callback(PrinterCallback)  # TRL's metrics go to the run's steps rows, not stdout
    status = "failed"
    try:
        trainer.train()
        status = "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        rewards = rollout.iteration_rewards
        tail = rewards[-5:]
        monitor.update_run_info(final_reward=sum(tail) / len(tail) if tail else float("nan"),
                                peak_reward=max(rewards, default=float("nan")), iterations_done=len(rewards))  # fmt: skip
        monitor.close(status=status)
    return run_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS))
    parser.add_argument("--steps", type=int, default=100, help="generation batches (rollout iterations)")
    parser.add_argument("--set", nargs="*", default=[], dest="assignments", help="TrainConfig field=value")
    parser.add_argument("--log-dir", default="runs/trl_so_grpo")
    parser.add_argument("--markdown", help="write the table as Markdown to this file")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: the table of the runs under --log-dir as they are",
    )
    opts = parser.parse_args(argv)
    from collapse_sweep import measure, table

    from sorl_monitor.trainer.config import TrainConfig, with_settings

    try:
        check_assignments(opts.assignments)
        with_settings(TrainConfig(), opts.assignments).check()
        for variant in opts.variants:
            loss, ctn = parse_variant(variant)
            if loss not in ("grpo", "bnpo", "dr_grpo", "dapo", "so_grpo") or ctn not in ("off", "on", "auto"):
                raise ValueError(
                    f"bad variant {variant!r}: want loss[+off|on|auto], loss one of grpo, so_grpo, …"
                )
        if opts.steps < 1:
            raise ValueError(f"--steps must be at least 1, not {opts.steps}")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    log_dir = Path(opts.log_dir)
    rows = []
    for seed in opts.seeds:
        for variant in opts.variants:
            started = time.perf_counter()
            if opts.report_only:
                run_dir = log_dir / run_name(variant, seed)
                if not (run_dir / "run.json").is_file():
                    continue
            else:
                run_dir = train_one(variant, seed, opts.steps, opts.assignments, log_dir)
            row = measure(run_dir, variant, "trl", seed, time.perf_counter() - started)
            row["iterations"] = iterations_logged(run_dir)
            row["coef_max"] = float("nan") if row["coef_max"] is None else row["coef_max"]  # no CTN column
            rows.append(row)
            state = f"COLLAPSED at {row['collapse_step']}" if row["collapsed"] else "stable"
            print(f"{variant:>14} seed {seed:>3}: {state:<18} final {row['final']:.2f} peak {row['peak']:.2f} "
                  f"hold {row['hold']:.2f} clip max {row['clip_max']:.2f} "
                  f"({row['iterations']} batches, {row['seconds']:.0f} s)", flush=True)  # fmt: skip
    fields = dict(item.split("=", 1) for item in opts.assignments)
    lines = table(rows, opts.variants, "trl", fields)
    print("\n".join(lines))
    if opts.markdown:
        Path(opts.markdown).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
