"""The training loop: warm start, stale rollouts, PPO-style reuse, monitor logging and the CTN switch.

for each iteration:
    behaviour policy = the learner as it was ``staleness`` iterations ago
    play ``episodes`` episodes with it (log-probs = π_old)
    advantages from the learner's critic (or the group), once
    ``epochs`` × ``minibatches`` optimizer updates on the algorithm's loss, each logged by the monitor
    ctn=auto: the guard looks at the monitor's recent window and may switch CTN on or off
"""

from __future__ import annotations

import collections
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sorl_monitor.guard import ARMED, CtnGuard, GuardDecision
from sorl_monitor.monitor import Monitor
from sorl_monitor.objective import AdaptiveCtnCoef
from sorl_monitor.trainer.algorithms import get_algorithm
from sorl_monitor.trainer.algorithms.minibatch_loss import LossSettings, Minibatch
from sorl_monitor.trainer.config import TrainConfig
from sorl_monitor.trainer.env import SearchEnv
from sorl_monitor.trainer.policy import PolicyWithValue
from sorl_monitor.trainer.rollout import collect
from sorl_monitor.trainer.warmstart import cached_warm_start, warm_start


@dataclass
class TrainResult:
    run_dir: Path
    run_id: str
    status: str  # finished | diverged (non-finite loss) | interrupted | failed
    iteration_rewards: list[float] = field(default_factory=list)
    ctn_switches: list[tuple[int, bool, str]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def final_reward(self) -> float:
        tail = self.iteration_rewards[-5:]
        return sum(tail) / len(tail) if tail else float("nan")

    @property
    def peak_reward(self) -> float:
        return max(self.iteration_rewards, default=float("nan"))


Progress = Callable[[str, int, int, dict[str, Any]], None]
"""``progress(phase, done, total, fields)`` with phase ``"warmup"`` or ``"train"``."""


def loss_settings(cfg: TrainConfig) -> LossSettings:
    return LossSettings(
        clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high,
        vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef, kl_ref_coef=cfg.kl_ref_coef, turn_ratio=cfg.turn_ratio,
        gamma=cfg.gamma, gae_lambda=cfg.gae_lambda, whiten=cfg.whiten, ctn_anchor=cfg.ctn_anchor,
        dual_clip=cfg.dual_clip, ctn_clip_level=cfg.ctn_clip_level, ctn_kl_cap=cfg.ctn_kl_cap,
    )  # fmt: skip


def learning_rate(cfg: TrainConfig, iteration: int) -> float:
    """``lr`` · ``min(1, (iteration + 1) / warmup_iterations)`` · (with ``anneal_lr``) ``(1 − iteration / iterations)``."""
    warmup = min(1.0, (iteration + 1) / cfg.warmup_iterations) if cfg.warmup_iterations else 1.0
    return cfg.lr * warmup * ((1.0 - iteration / cfg.iterations) if cfg.anneal_lr else 1.0)


def record_switch(decision: GuardDecision, mon: Monitor, result: TrainResult) -> bool:
    """Log a CTN switch as an ``alerts`` action row and in the result; return whether CTN is on now."""
    mon.log_alert(**decision.alert_fields())
    result.ctn_switches.append((decision.step, decision.ctn_on, decision.reason))
    return decision.ctn_on


def guard_look(guard: CtnGuard, mon: Monitor, result: TrainResult, ctn_active: bool) -> bool:
    """Let ``guard`` judge the monitor's recent updates; log a switch; return whether CTN is on now."""
    decision = guard.update(mon.recent_steps())
    return ctn_active if decision is None else record_switch(decision, mon, result)


def train(cfg: TrainConfig, progress: Progress | None = None) -> TrainResult:
    """Train with ``cfg`` (checked first), logging through a ``Monitor`` into ``cfg.log_dir``."""
    cfg.check()
    started = time.perf_counter()
    algo = get_algorithm(cfg.algo)
    settings = loss_settings(cfg)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    env_gen = torch.Generator().manual_seed(cfg.seed)
    sample_gen = torch.Generator().manual_seed(cfg.seed + 1)
    shuffle_gen = torch.Generator().manual_seed(cfg.seed + 2)
    env = SearchEnv(cfg.task)
    policy = PolicyWithValue(len(env.vocab), env.seq_len, cfg.policy)
    report = progress or (lambda *a: None)

    warm_key = {"task": cfg.task, "policy": cfg.policy, "steps": cfg.warmstart_steps, "seed": cfg.seed,
                "error_rate": cfg.warmstart_error_rate, "lr": cfg.warmstart_lr, "batch": cfg.episodes, "v": 1}  # fmt: skip
    if cfg.warmstart_stuck_nll is not None:
        warm_key.update(stuck_nll=cfg.warmstart_stuck_nll, target_nll=cfg.warmstart_target_nll)
    warm_gen = torch.Generator().manual_seed(cfg.seed + 3)
    cached_warm_start(policy, env, warm_key, cfg.warmstart_cache, lambda: warm_start(
        policy, env, cfg.warmstart_steps, cfg.warmstart_error_rate, cfg.warmstart_lr, cfg.episodes, warm_gen,
        on_step=lambda s, total: report("warmup", s + 1, total, {}), stuck_nll=cfg.warmstart_stuck_nll,
        target_nll=cfg.warmstart_target_nll))  # fmt: skip
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    behaviour = copy.deepcopy(policy).requires_grad_(False)
    history = collections.deque([copy.deepcopy(policy.state_dict())], maxlen=cfg.staleness + 1)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)

    ctn_mode = cfg.ctn_mode
    guard = (CtnGuard(cfg.detectors, quiet_updates=cfg.ctn_quiet_updates, start_active=cfg.ctn_auto_start == "on")
             if ctn_mode == "auto" else None)  # fmt: skip
    ctn_active = ctn_mode == "on" or (guard is not None and guard.active)
    adaptive = (AdaptiveCtnCoef(cfg.ctn_coef, cfg.ctn_target_clip, cfg.ctn_coef, cfg.ctn_coef_max)
                if cfg.ctn_target_clip is not None and ctn_mode != "off" else None)  # fmt: skip
    ctn_coef = cfg.ctn_coef
    mon = Monitor(cfg.log_dir, cfg.run_name, config=cfg.to_dict(), algorithm=cfg.algo, seed=cfg.seed,
                  clip_eps=settings.clip_eps, clip_eps_high=settings.clip_eps_high).watch(policy)  # fmt: skip
    result = TrainResult(mon.run_dir, mon.run_id, "finished")
    if guard is not None and guard.active:  # armed: CTN on from the first update, logged like a switch
        record_switch(ARMED, mon, result)
    steps_per_iteration = cfg.epochs * cfg.minibatches
    mb_size = cfg.episodes // cfg.minibatches
    group_ids = torch.arange(cfg.episodes) // cfg.group_size
    step = 0
    try:
        for iteration in range(cfg.iterations):
            behaviour.load_state_dict(history[0])
            lag_iterations = len(history) - 1
            questions = env.sample_questions(cfg.episodes, env_gen, cfg.group_size)
            episodes = collect(env, behaviour, questions, cfg.temperature, sample_gen)
            mask = episodes.mask.float()
            lr = learning_rate(cfg, iteration)
            for group in optimizer.param_groups:
                group["lr"] = lr
            with torch.no_grad():
                # the learner as this batch's updates begin: the critic's values and π_prox
                proximal = policy(episodes.tokens, with_values=algo.critic)
                values = proximal.values
                ref_logp = reference(episodes.tokens, with_values=False).logp
                adv, returns = algo.advantages(
                    episodes.rewards, values, mask, episodes.turn_ids, group_ids, settings
                )
            coef = ctn_coef if ctn_active else 0.0
            batch_clip_fracs, batch_grad_norms = [], []
            last: dict[str, float] = {}
            diverged = False
            for epoch in range(cfg.epochs):
                order = torch.randperm(cfg.episodes, generator=shuffle_gen)
                for mb in range(cfg.minibatches):
                    idx = order[mb * mb_size : (mb + 1) * mb_size]
                    batch = Minibatch(mask[idx], episodes.turn_ids[idx], episodes.logp[idx], ref_logp[idx],
                                      adv[idx], returns[idx], values[idx], proximal.logp[idx])  # fmt: skip
                    out = policy(episodes.tokens[idx], with_values=algo.critic)
                    terms = algo.loss(out, batch, settings, coef)
                    optimizer.zero_grad(set_to_none=True)
                    terms.loss.backward()
                    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
                    first = epoch == 0 and mb == 0
                    last = mon.log_update(
                        logp=out.logp.detach(), old_logp=batch.old_logp, mask=batch.mask, turn_ids=batch.turn_ids,
                        ref_logp=batch.ref_logp, entropy=out.entropy.detach(), advantages=batch.advantages,
                        values=out.values.detach() if algo.critic else None,
                        returns=batch.returns if algo.critic else None, rewards=episodes.rewards[idx],
                        group_ids=group_ids[idx], grad_norm=grad_norm, step=step, iteration=iteration,
                        ppo_epoch=epoch, minibatch=mb, policy_lag=lag_iterations * steps_per_iteration + epoch * cfg.minibatches + mb,
                        extra={"loss": terms.loss.detach(), "pg_loss": terms.pg_loss, "vf_loss": terms.vf_loss,
                               "ctn_penalty": terms.ctn_penalty, "ctn_active": ctn_active, "ctn_coef": coef,
                               "ctn_clip_frac": terms.clip_frac, "dual_clip_frac": terms.dual_clip_frac,
                               "lr": lr, "success_rate": episodes.correct[idx].float().mean(),
                               "well_formed_frac": episodes.well_formed[idx].float().mean()},
                        log_turns=cfg.log_turns == "all" or (cfg.log_turns == "first" and first),
                    ) or last  # fmt: skip
                    step += 1
                    if ctn_active:  # what λ's controller judges: the updates CTN acted on
                        batch_clip_fracs.append(terms.clip_frac)
                        batch_grad_norms.append(grad_norm)
                    if not torch.isfinite(terms.loss) or not torch.isfinite(grad_norm):
                        diverged = True
                        break
                    optimizer.step()
                    last_of_batch = epoch == cfg.epochs - 1 and mb == cfg.minibatches - 1
                    every = cfg.ctn_guard_every
                    if guard is not None and every is not None and step % every == 0 and not last_of_batch:
                        ctn_active = guard_look(guard, mon, result, ctn_active)  # mid-batch
                        coef = ctn_coef if ctn_active else 0.0
                if diverged:
                    break
            history.append(copy.deepcopy(policy.state_dict()))
            reward = float(episodes.rewards.mean())
            result.iteration_rewards.append(reward)
            if adaptive is not None and ctn_active and batch_clip_fracs:
                mean_clip = float(torch.stack(batch_clip_fracs).mean())
                unclipped = float(torch.stack(batch_grad_norms).mean()) <= cfg.max_grad_norm
                if adaptive.update(mean_clip, may_raise=unclipped or not cfg.ctn_raise_unclipped) is not None:
                    ctn_coef = adaptive.value
                    mon.log_alert("ctn_coef", "info", f"CTN λ → {ctn_coef:g}: clip fraction {mean_clip:.3f} "
                                  f"vs target {cfg.ctn_target_clip:g}", value=ctn_coef,
                                  threshold=cfg.ctn_target_clip, step=step - 1, kind="action")  # fmt: skip
            if guard is not None:  # after λ's controller judged the batch
                ctn_active = guard_look(guard, mon, result, ctn_active)
            report("train", iteration + 1, cfg.iterations,
                   {"reward": reward, "clip_frac": last.get("clip_frac", float("nan")),
                    "kl": last.get("kl_old_k3", float("nan")), "ctn": ctn_active})  # fmt: skip
            if diverged:
                result.status = "diverged"
                break
    except BaseException as error:  # recorded in run.json, then re-raised
        result.status = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
        raise
    finally:
        if guard is not None:
            guard.close()
        mon.update_run_info(final_reward=result.final_reward, peak_reward=result.peak_reward,
                            iterations_done=len(result.iteration_rewards))  # fmt: skip
        mon.close(status=result.status)
        result.seconds = time.perf_counter() - started
    return result
