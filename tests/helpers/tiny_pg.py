"""A tiny real multi-turn policy-gradient loop (token-level PPO) logged through the real ``Monitor``.

Not the bundled trainer: a small stand-in with real learning dynamics, used to test the detectors'
evaluation and the post-mortem on real (not synthetic) metric streams, and to size the benchmark.

Task: each episode gets a query ``q``; in each of ``TURNS`` turns the policy writes ``TURN_LEN``
tokens, and the environment answers with one observation token (mask 0) saying whether the turn was
right (the share of its tokens that match the hidden target of ``(q, turn)``). Reward = mean of
those shares over the turns. Episodes
come in GRPO groups of ``GROUP`` with the same query; advantage = group-normalised reward, broadcast
to the episode's tokens. Loss: token-level PPO clip, ``epochs`` × ``minibatches`` reuse of each rollout.
A high learning rate with much reuse pushes it into a real collapse (a deterministic wrong policy, zero
reward variance, no gradient left); a low one learns stably.

    python -m tests.helpers.tiny_pg OUT_DIR --lr 0.01 --lr-end 1.0 --epochs 4 --iterations 100
    python -m tests.helpers.tiny_pg OUT_DIR --sweep 3 --iterations 100     # the SWEEP grid, 3 seeds
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

from sorl_monitor import MetricsConfig, Monitor

QUERIES, TURNS, TURN_LEN, VOCAB, GROUP = 8, 3, 3, 6, 4
SEQ = TURNS * TURN_LEN + (TURNS - 1)
FEATURES = QUERIES + TURNS + TURN_LEN + TURNS
CLIP_EPS = 0.2


class TinyPolicy(nn.Module):
    """MLP over (query, turn, position in turn, feedback so far) → token logits."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, hidden), nn.Tanh())
        self.head = nn.Linear(hidden, VOCAB)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(features))


def turn_features(query: torch.Tensor, turn: int, feedback: torch.Tensor) -> torch.Tensor:
    """Features of the ``TURN_LEN`` positions of ``turn``: shape (B, TURN_LEN, FEATURES)."""
    batch = query.shape[0]
    q = nn.functional.one_hot(query, QUERIES).float()
    k = nn.functional.one_hot(torch.tensor(turn), TURNS).float().expand(batch, TURNS)
    fb = torch.zeros(batch, TURNS)
    fb[:, :turn] = feedback[:, :turn]
    head = torch.cat([q, k], 1).unsqueeze(1).expand(batch, TURN_LEN, QUERIES + TURNS)
    j = torch.eye(TURN_LEN).expand(batch, TURN_LEN, TURN_LEN)
    return torch.cat([head, j, fb.unsqueeze(1).expand(batch, TURN_LEN, TURNS)], 2)


def policy_positions() -> torch.Tensor:
    """Sequence positions of the policy tokens (the others hold the environment's answer)."""
    return torch.tensor([k * (TURN_LEN + 1) + j for k in range(TURNS) for j in range(TURN_LEN)])


def rollout(
    policy: TinyPolicy, target: torch.Tensor, batch: int, g: torch.Generator
) -> dict[str, torch.Tensor]:
    """Sample ``batch`` episodes (``batch / GROUP`` queries); features, tokens, rewards per episode."""
    query = torch.randint(0, QUERIES, (batch // GROUP,), generator=g).repeat_interleave(GROUP)
    feedback = torch.zeros(batch, TURNS)
    features, tokens = [], []
    with torch.no_grad():
        for turn in range(TURNS):
            f = turn_features(query, turn, feedback)
            probs = torch.softmax(policy(f), -1)
            t = torch.multinomial(probs.reshape(-1, VOCAB), 1, generator=g).reshape(batch, TURN_LEN)
            feedback[:, turn] = (t == target[query, turn]).float().mean(1)
            features.append(f)
            tokens.append(t)
    reward = feedback.mean(1)
    groups = reward.reshape(-1, GROUP)
    advantage = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6)).reshape(-1)
    return {
        "features": torch.cat(features, 1),
        "tokens": torch.cat(tokens, 1),
        "reward": reward,
        "advantage": advantage,
        "group": torch.arange(batch) // GROUP,
    }


def train(
    log_dir: Path,
    run_name: str,
    *,
    lr: float,
    epochs: int,
    lr_end: float | None = None,
    minibatches: int = 2,
    iterations: int = 120,
    batch: int = 64,
    seed: int = 0,
) -> Path:
    """Train one run with token-level PPO, logging every optimiser update through ``Monitor``.

    Runs on one CPU thread (the model is tiny; more threads only contend with each other).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(log_dir, run_name, lr=lr, epochs=epochs, lr_end=lr_end, minibatches=minibatches,
                      iterations=iterations, batch=batch, seed=seed)  # fmt: skip
    finally:
        torch.set_num_threads(threads)


def _train(
    log_dir: Path,
    run_name: str,
    *,
    lr: float,
    epochs: int,
    lr_end: float | None,
    minibatches: int,
    iterations: int,
    batch: int,
    seed: int,
) -> Path:
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    policy = TinyPolicy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    target = torch.randint(0, VOCAB, (QUERIES, TURNS, TURN_LEN), generator=g)
    positions = policy_positions()
    config = {"lr": lr, "lr_end": lr_end, "epochs": epochs, "minibatches": minibatches, "iterations": iterations,
              "batch": batch, "task": "tiny_pg (tests/helpers/tiny_pg.py)"}  # fmt: skip
    with Monitor(
        log_dir, run_name, config, algorithm="ppo", seed=seed, metrics=MetricsConfig(clip_eps=CLIP_EPS)
    ) as mon:
        mon.watch(policy)
        step = 0
        for iteration in range(iterations):
            lr_now = lr * (lr_end / lr) ** (iteration / max(1, iterations - 1)) if lr_end else lr
            for group in optimizer.param_groups:
                group["lr"] = lr_now
            data = rollout(policy, target, batch, g)
            with torch.no_grad():
                old_logp = torch.log_softmax(policy(data["features"]), -1).gather(
                    -1, data["tokens"].unsqueeze(-1)).squeeze(-1)  # fmt: skip
            for epoch in range(epochs):
                order = torch.randperm(batch, generator=g)
                for mb, idx in enumerate(order.chunk(minibatches)):
                    logits = policy(data["features"][idx])
                    logp = (
                        torch.log_softmax(logits, -1)
                        .gather(-1, data["tokens"][idx].unsqueeze(-1))
                        .squeeze(-1)
                    )
                    ratio = (logp - old_logp[idx]).exp()
                    adv = data["advantage"][idx].unsqueeze(1)
                    surrogate = torch.min(ratio * adv, ratio.clamp(1 - CLIP_EPS, 1 + CLIP_EPS) * adv)
                    loss = -surrogate.mean()
                    optimizer.zero_grad()
                    loss.backward()
                    full = (len(idx), SEQ)
                    seq_logp = torch.zeros(full).index_copy(1, positions, logp.detach())
                    seq_old = torch.zeros(full).index_copy(1, positions, old_logp[idx])
                    seq_logits = torch.zeros(*full, VOCAB).index_copy(1, positions, logits.detach())
                    mask = torch.zeros(full).index_fill(1, positions, 1.0)
                    mon.log_update(
                        logp=seq_logp, old_logp=seq_old, mask=mask, logits=seq_logits,
                        advantages=data["advantage"][idx], rewards=data["reward"][idx],
                        group_ids=data["group"][idx], step=step, iteration=iteration, ppo_epoch=epoch,
                        minibatch=mb, policy_lag=epoch * minibatches + mb, extra={"loss": loss, "lr": lr_now},
                    )  # fmt: skip
                    optimizer.step()
                    step += 1
    return Path(log_dir) / run_name


SWEEP = (
    {"lr": 0.01, "epochs": 2},
    {"lr": 0.003, "epochs": 4},
    {"lr": 0.01, "lr_end": 0.3, "epochs": 4},
    {"lr": 0.01, "lr_end": 1.0, "epochs": 4},
    {"lr": 0.01, "lr_end": 3.0, "epochs": 8},
)
"""The ``--sweep`` grid (run with each seed): constant low learning rates and geometric ramps to high ones."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--lr-end", type=float, default=None, help="ramp lr geometrically to this")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--minibatches", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-name", default=None)
    parser.add_argument(
        "--sweep", type=int, default=0, metavar="SEEDS", help="train the SWEEP grid × SEEDS seeds"
    )
    args = parser.parse_args()
    settings = [{"lr": args.lr, "lr_end": args.lr_end, "epochs": args.epochs, "seed": args.seed}]
    if args.sweep:
        settings = [{"lr_end": None, **grid, "seed": seed} for seed in range(args.sweep) for grid in SWEEP]
    for setting in settings:
        ramp = f"-to{setting['lr_end']:g}" if setting["lr_end"] else ""
        name = args.run_name or f"tiny-lr{setting['lr']:g}{ramp}-e{setting['epochs']}-s{setting['seed']}"
        path = train(args.out_dir, name, minibatches=args.minibatches, iterations=args.iterations, **setting)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
