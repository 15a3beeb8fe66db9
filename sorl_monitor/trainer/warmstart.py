"""Supervised warm start on generated demonstrations, so RL starts from a policy that succeeds sometimes.

The demonstrator follows the chain of searches, but in a share ``error_rate`` of episodes one turn
uses a wrong entity (like a base model that knows the format but not always the facts). Loss: token
cross-entropy on the agent tokens, plus ``½ (V(s_t) − R)²`` so the critic starts calibrated.

Some seeds learn slower: the cross-entropy sits on a plateau near 1.0 nats for a while before it falls
to the demonstrations' floor (≈ 0.25 at error rate 0.4). A run whose mean cross-entropy over the last
``NLL_WINDOW`` batches is still above ``stuck_nll`` at ``steps`` has not learnt the demonstrations: it
goes on (up to ``3 × steps``) until that mean is at most ``target_nll``. Every other run stops at
``steps`` exactly as it would without the rule.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import statistics
import tempfile
from pathlib import Path

import torch

from sorl_monitor.trainer.env import SearchEnv
from sorl_monitor.trainer.policy import PolicyWithValue
from sorl_monitor.write.metrics import masked_mean

NLL_WINDOW = 20
"""Batches the warm start's stopping rule averages the cross-entropy over."""
MAX_STEPS_FACTOR = 3
"""A stuck warm start runs at most this many times ``steps`` batches."""


def warm_start(policy: PolicyWithValue, env: SearchEnv, steps: int, error_rate: float, lr: float,
               batch: int, generator: torch.Generator, on_step=None, stuck_nll: float | None = None,
               target_nll: float = 0.3) -> int:  # fmt: skip
    """Train ``policy`` on fresh demonstrations for ``steps`` batches (more, see above); return the batches run.

    ``on_step(step, total)``: ``total`` is ``steps``, or ``3 × steps`` once the run goes past ``steps``.
    """
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    recent_nll: collections.deque[float] = collections.deque(maxlen=NLL_WINDOW)
    limit = steps if stuck_nll is None else MAX_STEPS_FACTOR * steps
    step = 0
    while step < limit:
        if step == steps and (not recent_nll or statistics.fmean(recent_nll) <= stuck_nll):
            break
        if step > steps and statistics.fmean(recent_nll) <= target_nll:
            break
        questions = env.sample_questions(batch, generator)
        demos = env.play(questions, env.expert(questions, error_rate, generator))
        out = policy(demos.tokens)
        mask = demos.mask.float()
        nll = -masked_mean(out.logp, mask)
        loss = nll + 0.5 * masked_mean((out.values - demos.rewards.unsqueeze(1)) ** 2, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        recent_nll.append(nll.item())
        step += 1
        if on_step is not None:
            on_step(step - 1, steps if step <= steps else limit)
    return step


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
