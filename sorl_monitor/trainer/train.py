"""The training loop: warm start, stale rollouts, PPO-style reuse, monitor logging and the CTN switch.

for each iteration:
    behaviour policy = the learner as it was ``staleness`` iterations ago
    play ``episodes`` episodes with it (log-probs = π_old)
    advantages from the learner's critic (or the group), once
    ``epochs`` × ``minibatches`` optimizer updates on the algorithm's loss, each logged by the monitor
    ctn=auto: the guard looks at the monitor's recent window and may switch CTN on or off

``train`` reads in that order: ``set_up`` (seeds, environment, warm-started policy, optimizer), then per
iteration ``rollout`` → ``update_on_batch`` (each update: ``update_step``, then ``log_update``) →
``adapt_ctn_coef`` and the guard → progress.
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
from torch import Tensor

from sorl_monitor.remedy.ctn import AdaptiveCtnCoef, ctn_controller
from sorl_monitor.remedy.ctn_guard import ARMED, CtnGuard, GuardDecision, guard_for
from sorl_monitor.trainer.algorithms import Algorithm, get_algorithm
from sorl_monitor.trainer.algorithms.minibatch_loss import LossSettings, LossTerms, Minibatch
from sorl_monitor.trainer.config import TrainConfig
from sorl_monitor.trainer.env import Episodes, SearchEnv
from sorl_monitor.trainer.policy import PolicyOutput, PolicyWithValue
from sorl_monitor.trainer.rollout import collect
from sorl_monitor.trainer.warmstart import cached_warm_start, warm_start
from sorl_monitor.write.monitor import Monitor
from sorl_monitor.write.update_metrics import MetricsConfig


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
        clip_eps=cfg.clip_eps,
        clip_eps_high=cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high,
        vf_coef=cfg.vf_coef,
        ent_coef=cfg.ent_coef,
        kl_ref_coef=cfg.kl_ref_coef,
        turn_ratio=cfg.turn_ratio,
        gamma=cfg.gamma,
        gae_lambda=cfg.gae_lambda,
        whiten=cfg.whiten,
        ctn_anchor=cfg.ctn_anchor,
        dual_clip=cfg.dual_clip,
        ctn_clip_level=cfg.ctn_clip_level,
        ctn_kl_cap=cfg.ctn_kl_cap,
    )


def learning_rate(cfg: TrainConfig, iteration: int) -> float:
    """``lr`` · ``min(1, (iteration + 1) / warmup_iterations)`` · (with ``anneal_lr``) ``(1 − iteration / iterations)``."""
    warmup = min(1.0, (iteration + 1) / cfg.warmup_iterations) if cfg.warmup_iterations else 1.0
    return cfg.lr * warmup * ((1.0 - iteration / cfg.iterations) if cfg.anneal_lr else 1.0)


# ---------------------------------------------------------------------------------------------- setup
@dataclass
class Learner:
    """The policy being trained and what its updates need: the frozen reference policy, the behaviour policy
    (loaded from ``history``: the learner's last ``staleness + 1`` states), the optimizer, and one random
    stream each for questions, sampling and mini-batch order."""

    env: SearchEnv
    policy: PolicyWithValue
    reference: PolicyWithValue
    behaviour: PolicyWithValue
    history: collections.deque[dict[str, Tensor]]
    optimizer: torch.optim.Optimizer
    env_gen: torch.Generator
    sample_gen: torch.Generator
    shuffle_gen: torch.Generator


def warm_start_key(cfg: TrainConfig) -> dict[str, Any]:
    """What the warm-started weights depend on: the cache entry's key."""
    key = {
        "task": cfg.task,
        "policy": cfg.policy,
        "steps": cfg.warmstart_steps,
        "seed": cfg.seed,
        "error_rate": cfg.warmstart_error_rate,
        "lr": cfg.warmstart_lr,
        "batch": cfg.episodes,
        "v": 1,
    }
    if cfg.warmstart_stuck_nll is not None:
        key.update(stuck_nll=cfg.warmstart_stuck_nll, target_nll=cfg.warmstart_target_nll)
    return key


def set_up(cfg: TrainConfig, report: Progress) -> Learner:
    """Seed everything from ``cfg.seed``, build the environment and the policy, warm-start it (cached)."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    env_gen = torch.Generator().manual_seed(cfg.seed)
    sample_gen = torch.Generator().manual_seed(cfg.seed + 1)
    shuffle_gen = torch.Generator().manual_seed(cfg.seed + 2)
    env = SearchEnv(cfg.task)
    policy = PolicyWithValue(len(env.vocab), env.seq_len, cfg.policy)
    warm_gen = torch.Generator().manual_seed(cfg.seed + 3)

    def run_warm_start() -> None:
        warm_start(
            policy,
            env,
            cfg.warmstart_steps,
            cfg.warmstart_error_rate,
            cfg.warmstart_lr,
            cfg.episodes,
            warm_gen,
            on_step=lambda s, total: report("warmup", s + 1, total, {}),
            stuck_nll=cfg.warmstart_stuck_nll,
            target_nll=cfg.warmstart_target_nll,
        )

    cached_warm_start(policy, env, warm_start_key(cfg), cfg.warmstart_cache, run_warm_start)
    return Learner(
        env=env,
        policy=policy,
        reference=copy.deepcopy(policy).eval().requires_grad_(False),
        behaviour=copy.deepcopy(policy).requires_grad_(False),
        history=collections.deque([copy.deepcopy(policy.state_dict())], maxlen=cfg.staleness + 1),
        optimizer=torch.optim.Adam(policy.parameters(), lr=cfg.lr),
        env_gen=env_gen,
        sample_gen=sample_gen,
        shuffle_gen=shuffle_gen,
    )


@dataclass
class CtnControl:
    """Whether CTN acts and with which λ: fixed by ``--ctn on|off``, switched by the guard with ``auto``;
    λ moved by its controller (``AdaptiveCtnCoef``) when ``ctn_target_clip`` is set."""

    guard: CtnGuard | None
    adaptive: AdaptiveCtnCoef | None
    active: bool
    coef: float
    """λ while CTN is on."""

    @classmethod
    def of(cls, cfg: TrainConfig) -> CtnControl:
        guard = guard_for(cfg.ctn_mode, cfg.detectors, cfg.ctn_quiet_updates, cfg.ctn_auto_start)
        adaptive = ctn_controller(cfg.ctn_mode, cfg.ctn_coef, cfg.ctn_target_clip, cfg.coef_max)
        active = cfg.ctn_mode == "on" or (guard is not None and guard.active)
        return cls(guard, adaptive, active, cfg.ctn_coef)

    @property
    def applied_coef(self) -> float:
        """The λ the loss uses now: ``coef`` while CTN is on, else 0."""
        return self.coef if self.active else 0.0


def record_switch(decision: GuardDecision, mon: Monitor, result: TrainResult) -> bool:
    """Log a CTN switch as an ``alerts`` action row and in the result; return whether CTN is on now."""
    mon.log_alert(**decision.alert_fields())
    result.ctn_switches.append((decision.step, decision.ctn_on, decision.reason))
    return decision.ctn_on


def guard_look(guard: CtnGuard, mon: Monitor, result: TrainResult, ctn_active: bool) -> bool:
    """Let ``guard`` judge the monitor's recent updates; log a switch; return whether CTN is on now."""
    decision = guard.update(mon.recent_steps())
    return ctn_active if decision is None else record_switch(decision, mon, result)


# ---------------------------------------------------------------------------------------------- rollout
@dataclass
class Batch:
    """One rollout batch and what every update on it shares: the learner's values and log-probs as the
    batch's updates begin (π_prox), the reference log-probs, advantages and returns."""

    episodes: Episodes
    mask: Tensor
    proximal: PolicyOutput
    ref_logp: Tensor
    advantages: Tensor
    returns: Tensor
    group_ids: Tensor
    lag_iterations: int
    """How many iterations older than the learner the behaviour policy is."""

    def minibatch(self, idx: Tensor) -> Minibatch:
        e = self.episodes
        return Minibatch(
            self.mask[idx],
            e.turn_ids[idx],
            e.logp[idx],
            self.ref_logp[idx],
            self.advantages[idx],
            self.returns[idx],
            self.proximal.values[idx],
            self.proximal.logp[idx],
        )


def rollout(cfg: TrainConfig, learner: Learner, algo: Algorithm, settings: LossSettings) -> Batch:
    """Play ``cfg.episodes`` episodes with the behaviour policy, then score them with the learner once."""
    learner.behaviour.load_state_dict(learner.history[0])
    questions = learner.env.sample_questions(cfg.episodes, learner.env_gen, cfg.group_size)
    episodes = collect(learner.env, learner.behaviour, questions, cfg.temperature, learner.sample_gen)
    mask = episodes.mask.float()
    group_ids = torch.arange(cfg.episodes) // cfg.group_size
    with torch.no_grad():
        proximal = learner.policy(episodes.tokens, with_values=algo.critic)
        ref_logp = learner.reference(episodes.tokens, with_values=False).logp
        advantages, returns = algo.advantages(
            episodes.rewards, proximal.values, mask, episodes.turn_ids, group_ids, settings
        )
    return Batch(episodes, mask, proximal, ref_logp, advantages, returns, group_ids, len(learner.history) - 1)


# ---------------------------------------------------------------------------------------------- update
@dataclass
class BatchUpdates:
    """What the updates on one batch left: the last logged row's scalars, whether the loss diverged, and for
    λ's controller the clip fractions and grad norms of the updates CTN acted on."""

    last_logged: dict[str, float] = field(default_factory=dict)
    diverged: bool = False
    clip_fracs: list[Tensor] = field(default_factory=list)
    grad_norms: list[Tensor] = field(default_factory=list)


def update_extras(
    terms: LossTerms, ctn: CtnControl, lr: float, episodes: Episodes, idx: Tensor
) -> dict[str, Any]:
    """The trainer's own columns of an update's ``steps`` row: loss terms, CTN's state, lr, task success."""
    return {
        "loss": terms.loss.detach(),
        "pg_loss": terms.pg_loss,
        "vf_loss": terms.vf_loss,
        "ctn_penalty": terms.ctn_penalty,
        "ctn_active": ctn.active,
        "ctn_coef": ctn.applied_coef,
        "ctn_clip_frac": terms.clip_frac,
        "ctn_pull": terms.ctn_pull,
        "dual_clip_frac": terms.dual_clip_frac,
        "lr": lr,
        "success_rate": episodes.correct[idx].float().mean(),
        "well_formed_frac": episodes.well_formed[idx].float().mean(),
    }


def update_on_batch(
    cfg: TrainConfig,
    learner: Learner,
    algo: Algorithm,
    settings: LossSettings,
    batch: Batch,
    ctn: CtnControl,
    mon: Monitor,
    result: TrainResult,
    iteration: int,
    step: int,
) -> tuple[int, BatchUpdates]:
    """``epochs × minibatches`` optimizer updates on ``batch``, each logged as one ``steps`` row; returns the
    next step and what the updates left. A non-finite loss or grad norm stops the batch before the optimizer
    steps. With ``ctn_guard_every``, the guard looks every that many updates (not after the batch's last one:
    ``train``'s look follows λ's controller)."""
    updates = BatchUpdates()
    episodes = batch.episodes
    lr = learner.optimizer.param_groups[0]["lr"]  # this iteration's, set by ``train``
    mb_size = cfg.episodes // cfg.minibatches
    steps_per_iteration = cfg.epochs * cfg.minibatches
    for epoch in range(cfg.epochs):
        order = torch.randperm(cfg.episodes, generator=learner.shuffle_gen)
        for mb in range(cfg.minibatches):
            idx = order[mb * mb_size : (mb + 1) * mb_size]
            minibatch = batch.minibatch(idx)
            out = learner.policy(episodes.tokens[idx], with_values=algo.critic)
            terms = algo.loss(out, minibatch, settings, ctn.applied_coef)
            learner.optimizer.zero_grad(set_to_none=True)
            terms.loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(learner.policy.parameters(), cfg.max_grad_norm)
            logged = mon.log_update(
                logp=out.logp.detach(),
                old_logp=minibatch.old_logp,
                mask=minibatch.mask,
                turn_ids=minibatch.turn_ids,
                ref_logp=minibatch.ref_logp,
                entropy=out.entropy.detach(),
                advantages=minibatch.advantages,
                values=out.values.detach() if algo.critic else None,
                returns=minibatch.returns if algo.critic else None,
                rewards=episodes.rewards[idx],
                group_ids=batch.group_ids[idx],
                grad_norm=grad_norm,
                step=step,
                iteration=iteration,
                ppo_epoch=epoch,
                minibatch=mb,
                policy_lag=batch.lag_iterations * steps_per_iteration + epoch * cfg.minibatches + mb,
                extra=update_extras(terms, ctn, lr, episodes, idx),
                log_turns=cfg.log_turns == "all" or (cfg.log_turns == "first" and epoch == 0 and mb == 0),
            )
            updates.last_logged = logged or updates.last_logged
            step += 1
            if ctn.active:  # what λ's controller judges: the updates CTN acted on
                updates.clip_fracs.append(terms.clip_frac)
                updates.grad_norms.append(grad_norm)
            if not torch.isfinite(terms.loss) or not torch.isfinite(grad_norm):
                updates.diverged = True
                return step, updates
            learner.optimizer.step()
            last_of_batch = epoch == cfg.epochs - 1 and mb == cfg.minibatches - 1
            every = cfg.ctn_guard_every
            if ctn.guard is not None and every is not None and step % every == 0 and not last_of_batch:
                ctn.active = guard_look(ctn.guard, mon, result, ctn.active)  # mid-batch
    return step, updates


def adapt_ctn_coef(cfg: TrainConfig, ctn: CtnControl, updates: BatchUpdates, mon: Monitor, step: int) -> None:
    """Let λ's controller judge the batch's mean clip fraction (of the updates CTN acted on); log a change."""
    if ctn.adaptive is None or not ctn.active or not updates.clip_fracs:
        return
    mean_clip = float(torch.stack(updates.clip_fracs).mean())
    unclipped = float(torch.stack(updates.grad_norms).mean()) <= cfg.max_grad_norm
    if ctn.adaptive.update(mean_clip, may_raise=unclipped or not cfg.ctn_raise_unclipped) is None:
        return
    ctn.coef = ctn.adaptive.value
    mon.log_alert(
        "ctn_coef",
        "info",
        f"CTN λ → {ctn.coef:g}: clip fraction {mean_clip:.3f} vs target {cfg.ctn_target_clip:g}",
        value=ctn.coef,
        threshold=cfg.ctn_target_clip,
        step=step - 1,
        kind="action",
    )


def progress_fields(reward: float, updates: BatchUpdates, ctn: CtnControl) -> dict[str, Any]:
    """What ``progress`` shows after an iteration: its mean reward, the last update's clip fraction and KL."""
    last = updates.last_logged
    return {
        "reward": reward,
        "clip_frac": last.get("clip_frac", float("nan")),
        "kl": last.get("kl_old_k3", float("nan")),
        "ctn": ctn.active,
    }


# ---------------------------------------------------------------------------------------------- the loop
def train(cfg: TrainConfig, progress: Progress | None = None) -> TrainResult:
    """Train with ``cfg`` (checked first), logging through a ``Monitor`` into ``cfg.log_dir``."""
    cfg.check()
    started = time.perf_counter()
    report = progress or (lambda *a: None)
    algo = get_algorithm(cfg.algo)
    settings = loss_settings(cfg)
    learner = set_up(cfg, report)
    ctn = CtnControl.of(cfg)
    mon = Monitor(
        cfg.log_dir,
        cfg.run_name,
        config=cfg.to_dict(),
        algorithm=cfg.algo,
        seed=cfg.seed,
        metrics=MetricsConfig(clip_eps=settings.clip_eps, clip_eps_high=settings.clip_eps_high),
    ).watch(learner.policy)
    result = TrainResult(mon.run_dir, mon.run_id, "finished")
    if (
        ctn.guard is not None and ctn.guard.active
    ):  # armed: CTN on from the first update, logged like a switch
        record_switch(ARMED, mon, result)
    step = 0
    try:
        for iteration in range(cfg.iterations):
            batch = rollout(cfg, learner, algo, settings)
            for group in learner.optimizer.param_groups:
                group["lr"] = learning_rate(cfg, iteration)
            step, updates = update_on_batch(
                cfg, learner, algo, settings, batch, ctn, mon, result, iteration, step
            )
            learner.history.append(copy.deepcopy(learner.policy.state_dict()))
            reward = float(batch.episodes.rewards.mean())
            result.iteration_rewards.append(reward)
            adapt_ctn_coef(cfg, ctn, updates, mon, step)
            if ctn.guard is not None:  # after λ's controller judged the batch
                ctn.active = guard_look(ctn.guard, mon, result, ctn.active)
            report("train", iteration + 1, cfg.iterations, progress_fields(reward, updates, ctn))
            if updates.diverged:
                result.status = "diverged"
                break
    except BaseException as error:  # recorded in run.json, then re-raised
        result.status = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
        raise
    finally:
        if ctn.guard is not None:
            ctn.guard.close()
        mon.update_run_info(
            final_reward=result.final_reward,
            peak_reward=result.peak_reward,
            iterations_done=len(result.iteration_rewards),
        )
        mon.close(status=result.status)
        result.seconds = time.perf_counter() - started
    return result
