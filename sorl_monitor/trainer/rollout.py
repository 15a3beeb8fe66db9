"""Rollouts: the policy writes each turn token by token (batched sampling), the environment answers."""

from __future__ import annotations

import torch
from torch import Tensor

from sorl_monitor.trainer.env import TURN_LEN, Actor, Episodes, Questions, SearchEnv
from sorl_monitor.trainer.policy import PolicyWithValue


def sampler(policy: PolicyWithValue, temperature: float, generator: torch.Generator) -> Actor:
    """An actor that samples ``TURN_LEN`` tokens per turn from ``softmax(logits / temperature)``.

    The returned log-probs are those of the sampling distribution (the behaviour policy π_old).
    """

    @torch.no_grad()
    def act(tokens: Tensor, turn: int) -> tuple[Tensor, Tensor]:
        actions, logps = [], []
        for _ in range(TURN_LEN):
            logits = policy.next_token_logits(tokens).float() / temperature
            log_probs = torch.log_softmax(logits, dim=-1)
            token = torch.multinomial(log_probs.exp(), 1, generator=generator)
            actions.append(token)
            logps.append(log_probs.gather(1, token))
            tokens = torch.cat([tokens, token], dim=1)
        return torch.cat(actions, dim=1), torch.cat(logps, dim=1)

    return act


def collect(env: SearchEnv, policy: PolicyWithValue, questions: Questions, temperature: float,
            generator: torch.Generator) -> Episodes:  # fmt: skip
    """Play ``questions`` with ``policy`` (in eval mode) and return the episodes with behaviour log-probs."""
    was_training = policy.training
    policy.eval()
    try:
        return env.play(questions, sampler(policy, temperature, generator))
    finally:
        policy.train(was_training)
