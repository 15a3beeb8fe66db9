"""Supervised warm start on generated demonstrations, so RL starts from a policy that succeeds sometimes.

The demonstrator follows the chain of searches, but in a share ``error_rate`` of episodes one turn
uses a wrong entity (like a base model that knows the format but not always the facts). Loss: token
cross-entropy on the agent tokens, plus ``½ (V(s_t) − R)²`` so the critic starts calibrated.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch

from sorl_monitor.metrics import masked_mean
from sorl_monitor.trainer.env import SearchEnv
from sorl_monitor.trainer.policy import PolicyWithValue


def warm_start(policy: PolicyWithValue, env: SearchEnv, steps: int, error_rate: float, lr: float,
               batch: int, generator: torch.Generator, on_step=None) -> float:  # fmt: skip
    """Train ``policy`` for ``steps`` batches of fresh demonstrations; return the last loss."""
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    loss_value = float("nan")
    for step in range(steps):
        questions = env.sample_questions(batch, generator)
        demos = env.play(questions, env.expert(questions, error_rate, generator))
        out = policy(demos.tokens)
        mask = demos.mask.float()
        loss = -masked_mean(out.logp, mask) + 0.5 * masked_mean(
            (out.values - demos.rewards.unsqueeze(1)) ** 2, mask
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_value = loss.item()
        if on_step is not None:
            on_step(step)
    return loss_value


def cached_warm_start(
    policy: PolicyWithValue, env: SearchEnv, key: dict, cache_dir: str | None, train
) -> bool:
    """Load the warm-started weights for ``key`` from ``cache_dir``, or ``train()`` and store them.

    Returns True on a cache hit. A broken cache file is ignored (and rewritten).
    """
    if cache_dir is None:
        train()
        return False
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    folder = Path(cache_dir).expanduser()
    path = folder / f"warmstart-{digest}.pt"
    if path.is_file():
        try:
            policy.load_state_dict(torch.load(path, weights_only=True))
            return True
        except Exception:  # noqa: BLE001 - a corrupt cache entry is rebuilt
            pass
    train()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        os.close(fd)
        torch.save(policy.state_dict(), tmp)
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs time
    return False
