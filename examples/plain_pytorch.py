"""A plain PyTorch policy-gradient loop with sorl-monitor attached (the four lines marked ``# sorl``).

A tiny policy writes 3 turns of 4 tokens separated by 2 observation tokens (mask 0) and is rewarded
for tokens that match a target; each rollout is reused for a few PPO epochs, so the importance ratios
move away from 1 and the clip fraction is non-zero.

    python examples/plain_pytorch.py --updates 50 --log-dir runs
    sorl summary runs/<run id>
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from sorl_monitor import Monitor  # sorl

VOCAB, TURNS, TURN_LEN, OBS_LEN = 16, 3, 4, 2
SEQ = TURNS * (TURN_LEN + OBS_LEN)


class Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.position = nn.Embedding(SEQ, 32)
        self.body = nn.Sequential(nn.Linear(32, 64), nn.Tanh())
        self.head = nn.Linear(64, VOCAB)

    def forward(self, batch: int) -> torch.Tensor:
        positions = torch.arange(SEQ).expand(batch, SEQ)
        return self.head(self.body(self.position(positions)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--log-dir", default="runs")
    parser.add_argument("--run-name", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    policy = Policy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)
    target = torch.randint(0, VOCAB, (SEQ,))
    mask = torch.tensor(([1] * TURN_LEN + [0] * OBS_LEN) * TURNS).expand(args.batch, SEQ)
    mon = Monitor(args.log_dir, args.run_name, vars(args), algorithm="ppo", seed=args.seed).watch(
        policy
    )  # sorl

    for iteration in range(args.updates):
        with torch.no_grad():
            dist = torch.distributions.Categorical(logits=policy(args.batch))
            tokens = dist.sample()
            old_logp = dist.log_prob(tokens)
        reward = ((tokens == target) * mask).sum(1).float() / mask.sum(1)
        advantages = (reward - reward.mean()) / (reward.std() + 1e-8)
        for epoch in range(args.epochs):
            logp = torch.distributions.Categorical(logits=policy(args.batch)).log_prob(tokens)
            ratio = (logp - old_logp).exp()
            surrogate = torch.min(ratio * advantages[:, None], ratio.clamp(0.8, 1.2) * advantages[:, None])
            loss = -(surrogate * mask).sum() / mask.sum()
            optimizer.zero_grad()
            loss.backward()
            mon.log_update(logp=logp, old_logp=old_logp, mask=mask, advantages=advantages, rewards=reward,  # sorl
                           iteration=iteration, ppo_epoch=epoch, extra={"loss": loss, "lr": args.lr})  # fmt: skip
            optimizer.step()
    mon.close()  # sorl
    print(f"wrote {mon.run_dir}")


if __name__ == "__main__":
    main()
