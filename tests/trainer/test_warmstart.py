"""The warm start's stopping rule: exactly ``steps`` batches unless it is stuck above ``stuck_nll`` there."""

from __future__ import annotations

import torch

from sorl_monitor.trainer.env import SearchEnv, TaskConfig
from sorl_monitor.trainer.policy import PolicyConfig, PolicyWithValue
from sorl_monitor.trainer.warmstart import MAX_STEPS_FACTOR, warm_start


def run(
    steps: int, stuck_nll: float | None, target_nll: float = 0.3
) -> tuple[int, dict, list[tuple[int, int]]]:
    torch.manual_seed(0)
    env = SearchEnv(TaskConfig(max_hops=2, max_turns=3))
    policy = PolicyWithValue(
        len(env.vocab), env.seq_len, PolicyConfig(hidden_size=16, layers=1, heads=2, intermediate_size=32)
    )
    calls: list[tuple[int, int]] = []
    ran = warm_start(policy, env, steps, 0.4, 3e-3, 8, torch.Generator().manual_seed(1),
                     on_step=lambda step, total: calls.append((step, total)), stuck_nll=stuck_nll,
                     target_nll=target_nll)  # fmt: skip
    return ran, policy.state_dict(), calls


def test_without_a_target_it_runs_exactly_steps():
    ran, _, calls = run(4, None)
    assert ran == 4 and calls == [(0, 4), (1, 4), (2, 4), (3, 4)]


def test_a_run_not_stuck_changes_nothing():
    """A run whose cross-entropy is under ``stuck_nll`` at ``steps`` stops there, bit for bit as without the rule."""
    ran, weights, _ = run(4, 100.0)
    plain_ran, plain_weights, _ = run(4, None)
    assert ran == plain_ran == 4
    assert all(torch.equal(weights[name], plain_weights[name]) for name in plain_weights)


def test_a_stuck_run_goes_on_to_the_target_or_the_cap_and_reports_the_new_total():
    """An untrained policy's cross-entropy is several nats: stuck above 0.5, and a target of 0.01 is never met."""
    ran, _, calls = run(4, 0.5, target_nll=0.01)
    assert ran == MAX_STEPS_FACTOR * 4
    assert calls[3] == (3, 4) and calls[4] == (4, 12) and calls[-1] == (11, 12)


def test_a_stuck_run_stops_once_it_reaches_the_target():
    """With the target just under the cross-entropy at ``steps``, one or a few batches more reach it."""
    first, _, _ = run(4, 0.5, target_nll=100.0)
    assert first == 5  # stuck at 4 (several nats > 0.5), at most 100 after one batch more
