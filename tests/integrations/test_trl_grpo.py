"""The GRPO token tap on a real TRL ``GRPOTrainer`` (tiny Qwen2 saved to a tmp dir, CPU, a few steps)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from sorl_monitor import Monitor  # noqa: E402
from sorl_monitor.integrations.batches import log_batch  # noqa: E402
from sorl_monitor.integrations.trl import MonitoredGRPOTrainer, tapped_batch, update_keys  # noqa: E402
from sorl_monitor.query import open_runs  # noqa: E402
from tests.integrations.tiny import char_tokenizer, save_tiny_qwen2  # noqa: E402

GENERATIONS = 4
STEPS_PER_GENERATION = 2
NUM_ITERATIONS = 2
MAX_STEPS = 4


def count_a(completions, **kwargs):
    return [float(text.count("a")) for text in completions]


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    """Train 4 updates: one generation batch, reused over 2 passes of 2 minibatches (so ratios move off 1)."""
    root = tmp_path_factory.mktemp("grpo")
    model_dir = save_tiny_qwen2(root / "model")
    args = GRPOConfig(
        output_dir=str(root / "out"),
        max_steps=MAX_STEPS,
        logging_steps=1,
        per_device_train_batch_size=GENERATIONS,
        num_generations=GENERATIONS,
        steps_per_generation=STEPS_PER_GENERATION,
        num_iterations=NUM_ITERATIONS,
        max_completion_length=8,
        beta=0.04,
        use_bias_correction_kl=False,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    data = Dataset.from_dict({"prompt": ["abc", "hello", "xyz 1", "count 2"] * 4})
    trainer = MonitoredGRPOTrainer(
        model=str(model_dir),
        processing_class=char_tokenizer(),
        reward_funcs=count_a,
        args=args,
        train_dataset=data,
        monitor=Monitor(root / "runs", "grpo", algorithm="grpo"),
    )
    trainer.train()
    history = {entry["step"]: entry for entry in trainer.state.log_history if "loss" in entry}
    with open_runs(root / "runs") as runs:
        steps = {row["step"]: row for row in runs.sql("SELECT * FROM steps").to_pylist()}
        turns = runs.sql(
            "SELECT step, count(*) AS n, sum(n_tokens) AS tokens FROM turns GROUP BY step"
        ).to_pylist()
    return history, steps, turns


@pytest.mark.slow
def test_each_grpo_update_is_one_row_keyed_by_generation_pass_and_minibatch(grpo_run):
    _, steps, _ = grpo_run
    expected = [
        (0, epoch, minibatch, epoch * STEPS_PER_GENERATION + minibatch)
        for epoch in range(NUM_ITERATIONS)
        for minibatch in range(STEPS_PER_GENERATION)
    ]
    got = [
        (r["iteration"], r["ppo_epoch"], r["minibatch"], r["policy_lag"]) for _, r in sorted(steps.items())
    ]
    assert sorted(steps) == list(range(1, MAX_STEPS + 1))
    assert got == expected


@pytest.mark.slow
def test_the_tap_measures_the_same_clip_fraction_kl_and_entropy_trl_logs(grpo_run):
    history, steps, _ = grpo_run
    for step, row in steps.items():
        assert row["clip_frac_active"] == pytest.approx(history[step]["clip_ratio/region_mean"], abs=1e-6)
        assert row["kl_ref_k3"] == pytest.approx(history[step]["kl"], rel=1e-4, abs=1e-7)
        assert row["entropy"] == pytest.approx(history[step]["entropy"], rel=1e-4)


@pytest.mark.slow
def test_reused_batches_move_token_ratios_off_one_and_the_first_pass_is_on_policy(grpo_run):
    _, steps, _ = grpo_run
    assert steps[1]["ratio_max"] == pytest.approx(1.0) and steps[1]["kl_old_k3"] == pytest.approx(0.0)
    assert all(steps[s]["ratio_max"] > 1.0 for s in range(2, MAX_STEPS + 1))


@pytest.mark.slow
def test_trl_logs_join_the_row_under_schema_names(grpo_run):
    history, steps, _ = grpo_run
    assert steps[1]["reward_mean"] == pytest.approx(history[1]["reward"])
    assert steps[1]["zero_std_group_frac"] == pytest.approx(history[1]["frac_reward_zero_std"])
    assert all(steps[s]["grad_norm"] == pytest.approx(history[s]["grad_norm"]) for s in steps)


@pytest.mark.slow
def test_single_turn_completions_give_one_turn_row_each(grpo_run):
    _, steps, turns = grpo_run
    assert {r["step"]: r["n"] for r in turns} == dict.fromkeys(steps, GENERATIONS)
    assert {r["step"]: r["tokens"] for r in turns} == {s: row["n_tokens"] for s, row in steps.items()}


def test_update_keys_follow_trls_generation_schedule():
    keys = [
        update_keys(step, steps_per_generation=4, num_iterations=3, accumulation=2)
        for step in range(0, 24, 2)
    ]
    assert [k["iteration"] for k in keys] == [0] * 6 + [1] * 6
    assert [k["ppo_epoch"] for k in keys] == [0, 0, 1, 1, 2, 2] * 2
    assert [k["minibatch"] for k in keys] == [0, 1] * 6
    assert [k["policy_lag"] for k in keys] == list(range(6)) * 2


def test_synthetic_tool_mask_splits_a_completion_into_turns(tmp_path):
    completion_mask = torch.ones(2, 10)
    tool_mask = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]])
    logp = -torch.rand(2, 10)
    inputs = {
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": torch.tensor([1.0, -1.0]),
        "old_per_token_logps": logp + 0.1,
    }
    batch = tapped_batch(inputs, logp, None, update_keys(0, 1, 1, 1))
    with Monitor(tmp_path, "tools", flush_interval_s=0.05) as mon:
        log_batch(mon, batch, step=1)
    with open_runs(tmp_path) as runs:
        rows = runs.sql(
            "SELECT sample_id, turn_idx, n_tokens FROM turns ORDER BY sample_id, turn_idx"
        ).to_pylist()
    assert [(r["sample_id"], r["turn_idx"], r["n_tokens"]) for r in rows] == [
        (0, 0, 3), (0, 1, 2), (0, 2, 2), (1, 0, 6)
    ]  # fmt: skip
