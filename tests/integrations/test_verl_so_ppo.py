"""The SO-PPO / SO-GRPO verl losses against verl's own ``vanilla`` and hand computations, called as verl's
actor calls a registered loss (verl need not be installed; ``make test-verl`` runs them inside verl 0.9.1)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from sorl_monitor import WriterConfig
from sorl_monitor.diagnose.detectors import DetectorConfig
from sorl_monitor.integrations.verl import VERL_LOSS_PARAMETERS
from sorl_monitor.integrations.verl_so_ppo import LOSS_NAMES, SorlPolicyLoss, register_sorl_loss
from sorl_monitor.read.query import open_runs
from tests.helpers.verl_calls import call_as_verl_actor, micro_batch, optimizer_step, real_actor_config
from tests.helpers.verl_reference import ActorConfigStandIn, compute_policy_loss_vanilla


def loss_of(**settings) -> SorlPolicyLoss:
    return SorlPolicyLoss(monitor=None, **settings)


def test_the_loss_has_verls_policy_loss_signature():
    parameters = inspect.signature(SorlPolicyLoss.objective).parameters
    assert tuple(parameters)[1:] == VERL_LOSS_PARAMETERS


@pytest.mark.parametrize("weights", [False, True], ids=["plain", "rollout_is_weights"])
def test_token_level_without_ctn_is_verls_vanilla_dual_clip_included(weights):
    """Synthetic micro-batches with ratios up to e^±2.4: token PPO with dual-clip c = 3, as verl computes it."""
    config = ActorConfigStandIn(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    for seed in range(4):
        batch = micro_batch(seed, 10, rows=4)
        batch["log_prob"] = batch["old_log_prob"] + 3 * (batch["log_prob"] - batch["old_log_prob"])
        is_weights = torch.rand(4, 10, generator=torch.Generator().manual_seed(seed)) if weights else None
        ours, our_metrics = loss_of(turn_is=False, ctn="off").objective(
            **batch, loss_agg_mode="token-mean", config=config, rollout_is_weights=is_weights
        )
        verls, verl_metrics = compute_policy_loss_vanilla(
            **batch, loss_agg_mode="token-mean", config=config, rollout_is_weights=is_weights
        )
        assert ours.item() == pytest.approx(verls.item(), rel=1e-6)
        for name in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"):
            assert our_metrics[name] == pytest.approx(verl_metrics[name], abs=1e-6), name
    assert verl_metrics["actor/pg_clipfrac_lower"] > 0 or seed < 3  # dual-clip bit somewhere


def test_token_ppo_at_ratio_one_is_minus_the_mean_advantage():
    batch = micro_batch(0, 10)
    batch["log_prob"] = batch["old_log_prob"].clone()
    loss, _ = loss_of(turn_is=True, ctn="on").objective(**batch, config=ActorConfigStandIn())
    mask = batch["response_mask"]
    assert loss.item() == pytest.approx(-(batch["advantages"] * mask).sum().item() / mask.sum().item())


def test_the_turn_ratio_of_a_known_mask():
    """One row: turns of 3, 2 and 2 LLM tokens between tool outputs (``response_mask`` 0); A = +1."""
    mask = torch.tensor([[1.0, 1, 1, 0, 0, 1, 1, 0, 1, 1]])
    log_r = torch.log(torch.tensor([[1.1, 1.1, 1.1, 9, 9, 2.0, 0.5, 9, 1.5, 1.5]]))
    config = ActorConfigStandIn(clip_ratio_low=0.2, clip_ratio_high=0.2)
    loss, _ = loss_of(turn_is=True, ctn="off").objective(
        torch.zeros(1, 10), log_r, torch.ones(1, 10), mask, config=config
    )
    # w̄: 1.1 (inside), exp(mean(ln 2, ln 0.5)) = 1 (inside), 1.5 → clipped to 1.2 (A > 0)
    assert loss.item() == pytest.approx(-(3 * 1.1 + 2 * 1.0 + 2 * 1.2) / 7)
    arithmetic, _ = loss_of(turn_is=True, turn_ratio="mean", ctn="off").objective(
        torch.zeros(1, 10), log_r, torch.ones(1, 10), mask, config=config
    )
    assert arithmetic.item() == pytest.approx(-(3 * 1.1 + 2 * 1.2 + 2 * 1.2) / 7)  # mean(2, 0.5) = 1.25


def test_the_ctn_term_is_lambda_times_the_clip_fraction_times_the_capped_k3():
    batch, config = micro_batch(3, 10), ActorConfigStandIn()
    off, _ = loss_of(ctn="off").objective(**batch, config=config)
    on_loss = loss_of(ctn="on", ctn_coef=8.0, ctn_target_clip=None, ctn_kl_cap=None)
    on, _ = on_loss.objective(**batch, config=config)
    mask = batch["response_mask"]
    log_r = batch["log_prob"] - batch["old_log_prob"]
    k3 = ((log_r.exp() - 1 - log_r) * mask).sum() / mask.sum()
    frac = on_loss._columns["ctn_clip_frac"]
    assert 0 < frac < 1
    assert (on - off).item() == pytest.approx(8.0 * frac * k3.item(), rel=1e-5)


def test_register_sorl_loss_puts_both_names_in_verls_registry(verl_modules_installed):
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    loss = register_sorl_loss(ctn="on", monitor=None)
    assert all(get_policy_loss_fn(name) is loss for name in LOSS_NAMES)


def test_inside_real_verl_the_token_level_loss_is_vanilla_under_every_aggregation(tmp_path):
    pytest.importorskip("verl", reason="verl is not installed (make test-verl runs this against verl 0.9.1)")
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla as verl_vanilla
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    loss = register_sorl_loss(names=("so_ppo_token_test",), turn_is=False, ctn="off", log_dir=tmp_path)
    config = real_actor_config(clip_ratio_high=0.28)
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        batch = micro_batch(7, 10)
        got, got_metrics = get_policy_loss_fn("so_ppo_token_test")(**batch, loss_agg_mode=mode, config=config)
        want, want_metrics = verl_vanilla(**batch, loss_agg_mode=mode, config=config)
        assert got.item() == pytest.approx(want.item(), rel=1e-6), mode
        assert got_metrics["actor/pg_clipfrac"] == pytest.approx(want_metrics["actor/pg_clipfrac"])
    loss.close()


@pytest.mark.parametrize(("loss_mode", "bound"), [("so_grpo", 32.0), ("so_ppo", 128.0)])
def test_inside_real_verl_lambdas_bound_follows_the_actor_configs_loss_mode(loss_mode, bound):
    pytest.importorskip("verl", reason="verl is not installed (make test-verl runs this against verl 0.9.1)")
    from verl.workers.config import PolicyLossConfig

    config = real_actor_config(policy_loss=PolicyLossConfig(loss_mode=loss_mode))
    loss = SorlPolicyLoss(ctn="on", monitor=None)
    old = -torch.rand(2, 6)
    loss.objective(old, old + 0.1, torch.ones(2, 6), torch.ones(2, 6), config=config)
    assert loss.controller.high == bound


def test_synthetic_drift_switches_auto_ctn_on_and_the_rows_and_alerts_show_it(tmp_path):
    """Synthetic log-probs: 12 updates with a tiny ratio spread, then 12 with a wide one; the guard (blocks of 4
    updates) reads the rank's own rows every 4 updates."""
    loss = SorlPolicyLoss(
        ctn="auto",
        ctn_auto_start="off",
        judge_every=4,
        log_dir=tmp_path,
        run_name="auto",
        detectors=DetectorConfig(smooth_steps=4, min_history_steps=8),
        writer=WriterConfig(flush_interval_s=0.05),
    )
    config = ActorConfigStandIn()
    for update in range(24):
        batch = micro_batch(update, 10)
        spread = 0.02 if update < 12 else 0.6
        batch["log_prob"] = batch["old_log_prob"] + spread * torch.randn(
            2, 10, generator=torch.Generator().manual_seed(update)
        )
        call_as_verl_actor(loss, batch, config)
        optimizer_step()
    loss.close()
    with open_runs(tmp_path) as runs:
        steps = runs.sql(
            "SELECT step, ctn_active, ctn_coef, ctn_clip_frac, ctn_pull FROM steps ORDER BY step"
        ).to_pylist()
        alerts = runs.sql("SELECT step, detector FROM alerts WHERE kind = 'action' ORDER BY step").to_pylist()
    assert [row["step"] for row in steps] == list(range(1, 25))
    switch = [a["step"] for a in alerts if a["detector"] == "ctn_on"]
    assert len(switch) == 1 and 12 < switch[0] <= 24, alerts
    on_from = next(row["step"] for row in steps if row["ctn_active"])
    assert on_from > switch[0] and all(row["ctn_active"] for row in steps if row["step"] >= on_from)
    assert all(row["ctn_coef"] == 0 for row in steps if not row["ctn_active"])
    assert not math.isnan(steps[-1]["ctn_clip_frac"])
    assert all(row["ctn_pull"] == 0 for row in steps if not row["ctn_active"])
    assert all(0 < row["ctn_pull"] < 1 for row in steps if row["ctn_active"])


@pytest.mark.parametrize("field, value", [("ctn", "maybe"), ("turn_ratio", "median"), ("judge_every", 0)])
def test_bad_settings_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        SorlPolicyLoss(**{field: value})


def test_inside_verls_engine_ppo_loss_so_ppo_runs_with_its_bool_mask_and_global_batch_info(tmp_path):
    """verl 0.9.1's ``workers.utils.losses.ppo_loss`` (the engine workers' actor loss) selects ``so_ppo`` from
    ``policy_loss.loss_mode``, pads the model output and sets ``global_batch_info``; synthetic tensors."""
    pytest.importorskip("verl", reason="verl is not installed (make test-verl runs this against verl 0.9.1)")
    from tensordict import TensorDict
    from verl.workers.config.actor import PolicyLossConfig
    from verl.workers.utils.losses import ppo_loss

    loss = register_sorl_loss(names=("so_ppo",), ctn="on", ctn_target_clip=None, log_dir=tmp_path)
    rows, prompt, response = 2, 3, 10
    batch = micro_batch(0, response, rows=rows)
    flat = torch.zeros(rows, prompt + response)
    flat[:, prompt - 1 : prompt + response - 1] = batch["log_prob"]  # position t scores token t + 1
    config = real_actor_config(policy_loss=PolicyLossConfig(loss_mode="so_ppo"))
    results = []
    for num_tokens in (None, 2 * int(batch["response_mask"].sum())):
        data = TensorDict(
            {
                "prompts": torch.ones(rows, prompt, dtype=torch.long),
                "responses": torch.ones(rows, response, dtype=torch.long),
                "attention_mask": torch.ones(rows, prompt + response, dtype=torch.long),
                "response_mask": batch["response_mask"],
                "old_log_probs": batch["old_log_prob"],
                "advantages": batch["advantages"],
            },
            batch_size=[rows],
        )
        for key, value in {"dp_size": 1, "batch_num_tokens": num_tokens, "global_batch_size": None}.items():
            data.set_non_tensor(key, value)
        value, metrics = ppo_loss(config, {"log_probs": flat.flatten()}, data)
        results.append((value.item(), metrics["actor/ctn_penalty"].values[0]))
    loss.close()
    direct, _ = SorlPolicyLoss(ctn="on", ctn_target_clip=None, monitor=None).objective(
        **batch, config=ActorConfigStandIn()
    )
    assert results[0][0] == pytest.approx(direct.item(), rel=1e-6) and results[0][1] > 0
    assert results[1][0] == pytest.approx(direct.item() / 2, rel=1e-6)  # both terms over the global tokens
