"""The verl policy-loss wrapper, called as verl's engine calls a registered loss (verl need not be installed;
``make test-verl`` runs them against verl 0.9)."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

from sorl_monitor import MonitorWarning, WriterConfig
from sorl_monitor.integrations.verl import VERL_LOSS_PARAMETERS, MonitoredPolicyLoss, register_monitored_loss
from sorl_monitor.read.query import open_runs
from tests.helpers.verl_calls import (
    TURN_PATTERN,
    call_as_verl_actor,
    micro_batch,
    optimizer_step,
    real_actor_config,
)
from tests.helpers.verl_reference import ActorConfigStandIn, compute_policy_loss_vanilla


def rows(log_dir, sql: str):
    with open_runs(log_dir) as runs:
        return runs.sql(sql).to_pylist()


def test_the_wrapper_has_verls_policy_loss_signature():
    wrapper = inspect.signature(MonitoredPolicyLoss.__call__)
    reference = inspect.signature(compute_policy_loss_vanilla)
    assert tuple(wrapper.parameters)[1:] == tuple(reference.parameters) == VERL_LOSS_PARAMETERS
    for name in ("loss_agg_mode", "config", "rollout_is_weights"):
        assert wrapper.parameters[name].default == reference.parameters[name].default


def test_the_wrapped_loss_and_its_metrics_come_back_unchanged(tmp_path):
    batch, config = micro_batch(0, 10), ActorConfigStandIn()
    loss = MonitoredPolicyLoss(compute_policy_loss_vanilla, log_dir=tmp_path, run_name="same")
    got_loss, got_metrics = call_as_verl_actor(loss, batch, config)
    want_loss, want_metrics = call_as_verl_actor(compute_policy_loss_vanilla, batch, config)
    loss.close()
    assert torch.equal(got_loss, want_loss) and got_metrics == want_metrics


@pytest.mark.parametrize("counts", [[2, 2, 2], [3, 1, 2]], ids=["fixed", "dynamic"])
def test_the_micro_batches_between_two_optimizer_steps_become_one_row(tmp_path, counts):
    config = ActorConfigStandIn(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2)
    loss = MonitoredPolicyLoss(
        compute_policy_loss_vanilla,
        log_dir=tmp_path,
        run_name="acc",
        writer=WriterConfig(flush_interval_s=0.05),
    )
    lengths = iter([10, 14, 12, 10, 14, 12])
    updates = []
    for seed, count in enumerate(counts):
        updates.append([micro_batch(10 * seed + i, next(lengths)) for i in range(count)])
        for batch in updates[-1]:
            call_as_verl_actor(loss, batch, config)
        optimizer_step()
    loss.close()
    steps = rows(
        tmp_path,
        "SELECT step, n_tokens, clip_frac_active, kl_old_k1, dual_clip_frac FROM steps ORDER BY step",
    )
    assert [r["step"] for r in steps] == [1, 2, 3]
    for row, update in zip(steps, updates, strict=True):
        width = max(b["log_prob"].shape[1] for b in update)
        joined = {k: torch.cat([F.pad(b[k], (0, width - b[k].shape[1])) for b in update]) for k in update[0]}
        _, whole = compute_policy_loss_vanilla(**joined, config=config)
        assert row["n_tokens"] == sum(b["response_mask"].sum().item() for b in update)
        assert row["clip_frac_active"] == pytest.approx(whole["actor/pg_clipfrac"], abs=1e-6)
        assert row["kl_old_k1"] == pytest.approx(whole["actor/ppo_kl"], abs=1e-6)
        per_micro = [
            compute_policy_loss_vanilla(**b, config=config)[1]["actor/pg_clipfrac_lower"] for b in update
        ]
        assert row["dual_clip_frac"] == pytest.approx(sum(per_micro) / len(per_micro))


def test_close_stops_following_optimizer_steps(tmp_path):
    loss = MonitoredPolicyLoss(compute_policy_loss_vanilla, log_dir=tmp_path, run_name="closed")
    call_as_verl_actor(loss, micro_batch(0, 10), ActorConfigStandIn())
    loss.close()
    optimizer_step()
    assert loss.updates == 1 and loss._hook is None


def test_synthetic_dual_clip_fraction_counts_ratios_above_clip_ratio_c_on_negative_advantages(tmp_path):
    old = torch.zeros(1, 4)
    batch = {
        "old_log_prob": old,
        "log_prob": torch.log(torch.tensor([[4.0, 4.0, 0.5, 1.0]])),
        "advantages": torch.tensor([[-1.0, 1.0, -1.0, -1.0]]),
        "response_mask": torch.ones(1, 4),
    }
    loss = MonitoredPolicyLoss(compute_policy_loss_vanilla, log_dir=tmp_path, run_name="dual", accumulate=1)
    call_as_verl_actor(loss, batch, ActorConfigStandIn(clip_ratio_c=3.0))
    loss.close()
    row = rows(tmp_path, "SELECT dual_clip_frac, clip_frac_low, clip_frac_high FROM steps")[0]
    assert row == {"dual_clip_frac": 0.25, "clip_frac_low": 0.25, "clip_frac_high": 0.5}


def test_turns_are_the_runs_of_ones_in_response_mask(tmp_path):
    loss = MonitoredPolicyLoss(compute_policy_loss_vanilla, log_dir=tmp_path, run_name="agent", accumulate=1)
    call_as_verl_actor(loss, micro_batch(3, 10), ActorConfigStandIn())
    loss.close()
    turns = rows(tmp_path, "SELECT sample_id, turn_idx, n_tokens FROM turns ORDER BY sample_id, turn_idx")
    assert [(r["sample_id"], r["turn_idx"], r["n_tokens"]) for r in turns] == [
        (sample, turn, size) for sample in (0, 1) for turn, size in enumerate([3, 2, 2])
    ]


def test_clip_bounds_come_from_the_actor_config(tmp_path):
    batch = {
        "old_log_prob": torch.zeros(1, 4),
        "log_prob": torch.log(torch.tensor([[0.85, 1.15, 1.25, 1.35]])),
        "advantages": torch.ones(1, 4),
        "response_mask": torch.ones(1, 4),
    }
    config = ActorConfigStandIn(clip_ratio_low=0.1, clip_ratio_high=0.3)
    loss = MonitoredPolicyLoss(compute_policy_loss_vanilla, log_dir=tmp_path, run_name="eps", accumulate=1)
    call_as_verl_actor(loss, batch, config)
    loss.close()
    row = rows(tmp_path, "SELECT clip_frac_low, clip_frac_high FROM steps")[0]
    assert row == {"clip_frac_low": 0.25, "clip_frac_high": 0.25}


def test_a_tap_failure_warns_once_and_the_loss_still_comes_back(tmp_path):
    def per_sample_loss(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode="token-mean",
        config=None,
        rollout_is_weights=None,
    ):
        return -(advantages * response_mask).sum(-1), {}  # a vector: the tap cannot read it as pg_loss

    loss = MonitoredPolicyLoss(per_sample_loss, log_dir=tmp_path, run_name="tapfail", accumulate=1)
    with pytest.warns(MonitorWarning, match="verl loss tap failed"):
        value, _ = call_as_verl_actor(loss, micro_batch(0, 10), ActorConfigStandIn())
    call_as_verl_actor(loss, micro_batch(1, 10), ActorConfigStandIn())
    loss.close()
    assert value.shape == (2,)


def test_registered_with_real_verl_when_it_is_installed(tmp_path):
    pytest.importorskip("verl", reason="verl is not installed (make test-verl runs these against verl 0.9)")
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla as verl_vanilla
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    assert tuple(inspect.signature(verl_vanilla).parameters) == VERL_LOSS_PARAMETERS
    registered = register_monitored_loss("sorl_test", "vanilla", log_dir=tmp_path, run_name="real")
    assert get_policy_loss_fn("sorl_test") is registered
    config = real_actor_config(clip_ratio_high=0.28)
    for seed in range(3):
        batch = micro_batch(seed, 10)
        got, got_metrics = call_as_verl_actor(get_policy_loss_fn("sorl_test"), batch, config)
        want, want_metrics = call_as_verl_actor(verl_vanilla, batch, config)
        assert torch.equal(got, want) and got_metrics == want_metrics
    optimizer_step()
    registered.close()
    row = rows(tmp_path, "SELECT step, n_tokens FROM steps")
    assert row == [{"step": 1, "n_tokens": 3 * 2 * sum(TURN_PATTERN)}]


def test_register_monitored_loss_puts_the_wrapper_in_verls_registry(tmp_path, verl_modules_installed):
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    registered = register_monitored_loss("sorl_registry_test", "vanilla", log_dir=tmp_path, run_name="reg")
    assert get_policy_loss_fn("sorl_registry_test") is registered
    for seed in range(2):  # one optimizer step of 2 micro-batches
        call_as_verl_actor(
            get_policy_loss_fn("sorl_registry_test"), micro_batch(seed, 10), ActorConfigStandIn()
        )
    optimizer_step()
    registered.close()
    assert rows(tmp_path, "SELECT count(*) AS n FROM steps") == [{"n": 1}]
