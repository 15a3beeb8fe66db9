"""A small real PPO loop with the live CTN guard, logged through the real ``Monitor``: runs for the dashboard.

Not the bundled trainer: the tiny multi-turn task of ``tests.helpers.tiny_pg`` (3 turns of 3 policy
tokens, an environment token between turns), token-level PPO with ``epochs × minibatches`` reuse and a
learning rate ramped up until the policy drifts off. The guard (``CtnGuard``) runs over
``Monitor.recent_steps()`` after every rollout's updates; when it trips, CTN adds ``λ · clip_frac · KL_k3`` to
the loss, and every switch is an ``alerts`` row of kind ``action``; the detectors' new firings are
logged as ``alert`` rows, as a trainer's guard loop would.

    python -m tests.helpers.ppo_loop LOG_DIR --run-name live --iterations 400 --pause 0.2
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from sorl_monitor import CtnGuard, MetricsConfig, Monitor, WriterConfig
from sorl_monitor.diagnose.detectors import ArrowDetector
from tests.helpers.tiny_pg import CLIP_EPS, SEQ, VOCAB, TinyPolicy, policy_positions, rollout

CTN_COEF = 1.0


def train(
    log_dir: Path,
    run_name: str,
    *,
    iterations: int = 40,
    epochs: int = 4,
    minibatches: int = 2,
    batch: int = 32,
    lr: float = 0.01,
    lr_end: float = 1.0,
    seed: int = 0,
    pause_s: float = 0.0,
) -> Path:
    """Train ``iterations`` rollouts, logging every update, the guard's CTN switches and new alerts."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    policy = TinyPolicy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    target = torch.randint(0, VOCAB, (8, 3, 3), generator=g)
    positions = policy_positions()
    guard, detector = CtnGuard(), ArrowDetector()
    ctn_on = False
    config = {"lr": lr, "lr_end": lr_end, "epochs": epochs, "clip_eps": CLIP_EPS, "ctn": "auto",
              "task": "tests/helpers/ppo_loop.py"}  # fmt: skip
    with Monitor(
        log_dir,
        run_name,
        config,
        algorithm="ppo",
        seed=seed,
        writer=WriterConfig(flush_interval_s=0.2),
        metrics=MetricsConfig(clip_eps=CLIP_EPS),
    ) as mon:
        mon.watch(policy)
        step, checked = 0, -1
        for iteration in range(iterations):
            lr_now = lr * (lr_end / lr) ** (iteration / max(1, iterations - 1))
            for group in optimizer.param_groups:
                group["lr"] = lr_now
            data = rollout(policy, target, batch, g)
            with torch.no_grad():
                old_logp = _token_logp(policy(data["features"]), data["tokens"])
            for epoch in range(epochs):
                for mb, idx in enumerate(torch.randperm(batch, generator=g).chunk(minibatches)):
                    logits = policy(data["features"][idx])
                    logp = _token_logp(logits, data["tokens"][idx])
                    log_ratio = logp - old_logp[idx]
                    ratio = log_ratio.exp()
                    adv = data["advantage"][idx].unsqueeze(1)
                    ppo = -torch.min(ratio * adv, ratio.clamp(1 - CLIP_EPS, 1 + CLIP_EPS) * adv).mean()
                    clip_frac = ((ratio - 1).abs() > CLIP_EPS).float().mean()
                    kl_k3 = (ratio - 1 - log_ratio).mean()
                    penalty = CTN_COEF * clip_frac.detach() * kl_k3 if ctn_on else torch.zeros(())
                    loss = ppo + penalty
                    optimizer.zero_grad()
                    loss.backward()
                    full = (len(idx), SEQ)
                    mon.log_update(
                        logp=torch.zeros(full).index_copy(1, positions, logp.detach()),
                        old_logp=torch.zeros(full).index_copy(1, positions, old_logp[idx]),
                        mask=torch.zeros(full).index_fill(1, positions, 1.0),
                        logits=torch.zeros(*full, VOCAB).index_copy(1, positions, logits.detach()),
                        advantages=data["advantage"][idx], rewards=data["reward"][idx],
                        group_ids=data["group"][idx], step=step, iteration=iteration, ppo_epoch=epoch,
                        minibatch=mb, policy_lag=epoch * minibatches + mb,
                        extra={"loss": loss, "pg_loss": ppo, "lr": lr_now, "ctn_active": ctn_on,
                               "ctn_coef": CTN_COEF, "ctn_penalty": penalty},
                    )  # fmt: skip
                    optimizer.step()
                    step += 1
                    if pause_s:
                        time.sleep(pause_s)
            recent = mon.recent_steps()
            for alert in detector(recent, after_step=checked).to_pylist():
                mon.log_alert(alert["detector"], alert["severity"], alert["message"],
                              value=alert["value"], threshold=alert["threshold"], step=alert["step"])  # fmt: skip
            checked = step - 1
            decision = guard.update(recent)
            if decision is not None:
                ctn_on = decision.ctn_on
                mon.log_alert(**decision.alert_fields())
    guard.close()
    detector.close()
    return Path(log_dir) / run_name


def _token_logp(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log_dir", type=Path)
    parser.add_argument("--run-name", default="ppo-guard")
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--lr-end", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds to sleep after each update")
    args = parser.parse_args()
    path = train(args.log_dir, args.run_name, iterations=args.iterations, lr_end=args.lr_end,
                 seed=args.seed, pause_s=args.pause)  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
