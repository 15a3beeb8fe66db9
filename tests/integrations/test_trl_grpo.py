"""The GRPO token tap on a real TRL ``GRPOTrainer`` (tiny Qwen2 saved to a tmp dir, CPU, a few steps)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from sorl_monitor import (
    Monitor,  # noqa: E402
    WriterConfig,
)
from sorl_monitor.integrations.batches import TokenBatch, log_batch  # noqa: E402
from sorl_monitor.integrations.trl import (  # noqa: E402
    MonitoredGRPOTrainer,
    clip_region,
    tapped_batch,
    update_keys,
)
from sorl_monitor.read.query import open_runs  # noqa: E402
from tests.helpers.tiny_lm import char_tokenizer, save_tiny_qwen2  # noqa: E402

GENERATIONS = 4
STEPS_PER_GENERATION = 2
NUM_ITERATIONS = 2
MAX_STEPS = 4


def char_code_reward(completions, **kwargs):
    """A reward that differs between completions, so groups have spread and advantages are not all zero."""
    return [float(sum(map(ord, text)) % 7) for text in completions]


def train(root, **settings):
    """A tiny GRPO run of ``MAX_STEPS`` updates: one generation batch, 2 passes of 2 minibatches."""
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
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        **settings,
    )
    data = Dataset.from_dict({"prompt": ["abc", "hello", "xyz 1", "count 2"] * 4})
    trainer = MonitoredGRPOTrainer(
        model=str(model_dir),
        processing_class=char_tokenizer(),
        reward_funcs=char_code_reward,
        args=args,
        train_dataset=data,
        monitor=Monitor(root / "runs", "grpo", algorithm="grpo"),
    )
    trainer.train()
    history = {entry["step"]: entry for entry in trainer.state.log_history if "loss" in entry}
    with open_runs(root / "runs") as runs:
        steps = {row["step"]: row for row in runs.sql("SELECT * FROM steps").to_pylist()}
        turns = runs.sql("SELECT * FROM turns ORDER BY step, sample_id, turn_idx").to_pylist()
    return trainer, history, steps, turns


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    """Token-level GRPO with a KL term; the generation batch is reused, so ratios move off 1."""
    _, history, steps, turns = train(
        tmp_path_factory.mktemp("grpo"), beta=0.04, use_bias_correction_kl=False, learning_rate=1e-2
    )
    per_step = {}
    for row in turns:
        per_step.setdefault(row["step"], []).append(row["n_tokens"])
    turns = [{"step": step, "n": len(sizes), "tokens": sum(sizes)} for step, sizes in per_step.items()]
    return history, steps, turns


CLIP_SETTINGS = {
    "dapo": {"loss_type": "dapo", "epsilon": 0.1, "epsilon_high": 0.28},
    "gspo": {
        "loss_type": "grpo",
        "importance_sampling_level": "sequence",
        "epsilon": 3e-3,
        "epsilon_high": 4e-3,
    },
}


@pytest.fixture(scope="module", params=sorted(CLIP_SETTINGS))
def clip_run(request, tmp_path_factory):
    """A run with clip bounds other than 0.2 (DAPO's), or sequence-level importance sampling (GSPO)."""
    settings = CLIP_SETTINGS[request.param]
    return request.param, train(tmp_path_factory.mktemp(request.param), learning_rate=5e-2, **settings)


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
    with Monitor(tmp_path, "tools", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        log_batch(mon, batch, step=1)
    with open_runs(tmp_path) as runs:
        rows = runs.sql(
            "SELECT sample_id, turn_idx, n_tokens FROM turns ORDER BY sample_id, turn_idx"
        ).to_pylist()
    assert [(r["sample_id"], r["turn_idx"], r["n_tokens"]) for r in rows] == [
        (0, 0, 3), (0, 1, 2), (0, 2, 2), (1, 0, 6)
    ]  # fmt: skip


@pytest.mark.slow
def test_clip_fractions_use_trls_bounds_and_level_and_agree_with_trls_own(clip_run):
    name, (trainer, history, steps, _) = clip_run
    settings = CLIP_SETTINGS[name]
    monitor = trainer.sorl_callback.monitor
    clip = monitor.metrics_config
    assert (clip.clip_eps, clip.clip_eps_high) == (settings["epsilon"], settings["epsilon_high"])
    for step, row in steps.items():
        for side in ("region", "low", "high"):
            column = "clip_frac_active" if side == "region" else f"clip_frac_active_{side}"
            assert row[column] == pytest.approx(history[step][f"clip_ratio/{side}_mean"], abs=1e-6), (
                step,
                side,
            )
    assert max(row["clip_frac_active"] for row in steps.values()) > 0  # the check compares something


@pytest.mark.slow
def test_every_row_carries_its_generation_batchs_reward_and_each_turn_its_episodes(clip_run):
    _, (trainer, history, steps, turns) = clip_run
    generation = list(trainer._logs["rewards"]["char_code_reward"])  # the one generation batch, in order
    groups = torch.tensor(generation).view(-1, GENERATIONS)
    for row in steps.values():
        assert row["reward_mean"] == pytest.approx(history[1]["reward"])
        assert row["reward_std"] == pytest.approx(history[1]["reward_std"])
        assert row["group_reward_std"] == pytest.approx(groups.std(dim=1, unbiased=False).mean().item())
        assert row["zero_std_group_frac"] == pytest.approx(history[1]["frac_reward_zero_std"])
    first_pass = [t["reward"] for t in turns if steps[t["step"]]["ppo_epoch"] == 0]
    assert sorted(first_pass) == sorted(generation)


def test_sequence_level_clipping_counts_sequences_whose_mean_ratio_leaves_the_region():
    batch = TokenBatch(
        logp=torch.log(torch.tensor([[1.5, 1.5, 1.0], [0.5, 2.0, 1.0], [0.5, 0.5, 1.0]])),
        old_logp=torch.zeros(3, 3),
        mask=torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]),
        advantages=torch.tensor([1.0, 1.0, -1.0]),
    )
    token = clip_region(batch, 0.2, 0.2, "token", "grpo")
    sequence = clip_region(batch, 0.2, 0.2, "sequence", "grpo")
    assert token["clip_frac_active"].item() == pytest.approx(5 / 7)  # 1.5, 1.5, 2.0 high; 0.5, 0.5 low
    # sequence ratios exp(mean log r): 1.5 (high, A>0), 1.0 (inside), 0.63 (low, A<0)
    assert sequence["clip_frac_active"].item() == pytest.approx(2 / 3)
    assert clip_region(batch, 0.2, 0.2, "token", "cispo")["clip_frac_active"] is None
