"""SO-GRPO and auto-CTN inside TRL's real ``GRPOTrainer`` (tiny Qwen2 from config, tokenizer in code, CPU).

The CTN switch is driven by real dynamics: a high learning rate and 8 passes over each generation batch
make the token clip fraction rise within the first batch; nothing is injected.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from sorl_monitor import Monitor  # noqa: E402
from sorl_monitor.integrations.trl_so_grpo import (  # noqa: E402
    SORLGRPOConfig,
    SORLGRPOTrainer,
    SorlLossSettings,
    loss_mask,
    per_turn_advantages,
)
from sorl_monitor.read.query import open_runs  # noqa: E402
from sorl_monitor.remedy.objective import ObjectiveSettings, policy_objective, turn_ids_from_mask  # noqa: E402
from tests.helpers.tiny_lm import char_tokenizer, save_tiny_qwen2  # noqa: E402

GENERATIONS = 4
PASSES = 8  # num_iterations: updates per generation batch (steps_per_generation 1)


def char_code_reward(completions, **kwargs):
    """A reward that differs between completions, so groups have spread and advantages are not all zero."""
    return [float(sum(map(ord, text)) % 7) for text in completions]


def train(root, max_steps: int, **settings):
    model_dir = save_tiny_qwen2(root / "model")
    args = SORLGRPOConfig(
        output_dir=str(root / "out"),
        max_steps=max_steps,
        logging_steps=1,
        per_device_train_batch_size=GENERATIONS,
        num_generations=GENERATIONS,
        steps_per_generation=1,
        num_iterations=PASSES,
        max_completion_length=8,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        **settings,
    )
    data = Dataset.from_dict({"prompt": ["abc", "hello", "xyz 1", "count 2"] * 8})
    trainer = SORLGRPOTrainer(
        model=str(model_dir),
        processing_class=char_tokenizer(),
        reward_funcs=char_code_reward,
        args=args,
        train_dataset=data,
        monitor=Monitor(root / "runs", "so_grpo", algorithm="so_grpo"),
    )
    trainer.train()
    with open_runs(root / "runs") as runs:
        steps = runs.sql("SELECT * FROM steps ORDER BY step").to_pylist()
        alerts = runs.sql("SELECT * FROM alerts WHERE kind = 'action' ORDER BY step").to_pylist()
    return trainer, steps, alerts


@pytest.fixture(scope="module")
def auto_run(tmp_path_factory):
    """so_grpo, ``ctn='auto'`` waiting for the detectors (not armed), lr 5e-2, 2 generation batches × 8 passes;
    the guard's detectors judge blocks of 4 updates."""
    return train(
        tmp_path_factory.mktemp("auto"),
        2 * PASSES,
        learning_rate=5e-2,
        ctn="auto",
        ctn_auto_start="off",
        ctn_detectors={"smooth_steps": 4, "min_history_steps": 8},
    )


@pytest.mark.slow
def test_auto_ctn_switches_on_when_the_clip_fraction_rises_and_the_rows_show_it(auto_run):
    trainer, steps, alerts = auto_run
    assert [row["step"] for row in steps] == list(range(1, 2 * PASSES + 1))
    first, second = steps[:PASSES], steps[PASSES:]
    assert max(row["clip_frac"] for row in first[1:]) > 0.1  # the reuse passes drift out of the trust region
    assert not any(row["ctn_active"] for row in first) and all(row["ctn_active"] for row in second)
    assert all(row["ctn_coef"] == 0 for row in first) and all(row["ctn_coef"] == 32 for row in second)
    switch = [a for a in alerts if a["detector"] == "ctn_on"]
    assert len(switch) == 1 and switch[0]["step"] <= PASSES
    assert switch[0]["message"].split(":")[1].strip().split(" ")[0] in trainer.ctn_guard.trip_on
    assert any(row["ctn_penalty"] > 0 for row in second) and all(row["ctn_penalty"] == 0 for row in first)
    assert all(0 <= row["ctn_clip_frac"] <= 1 for row in steps)
    assert all(row["ctn_pull"] == 0 for row in first)  # CTN off: no pull of its own
    assert all(0 <= row["ctn_pull"] < 1 for row in second) and any(row["ctn_pull"] > 0 for row in second)


@pytest.mark.slow
def test_ctn_pulls_the_learner_back_towards_the_sampler(auto_run):
    """Real dynamics: the KL to the generation batch's policy on its later passes, without CTN and with it."""
    _, steps, _ = auto_run
    without = sum(row["kl_old_k3"] for row in steps[PASSES // 2 : PASSES]) / (PASSES // 2)
    with_ctn = sum(row["kl_old_k3"] for row in steps[PASSES + PASSES // 2 :]) / (PASSES // 2)
    assert with_ctn < without


@pytest.mark.slow
def test_ctn_on_with_trls_own_loss_adds_the_penalty_and_adapts_lambda(tmp_path):
    trainer, steps, alerts = train(  # λ may rise above the group advantage's default bound of 32 here
        tmp_path, 2 * PASSES, learning_rate=5e-2, loss_type="dapo", ctn="on", ctn_coef_max=128.0
    )
    assert all(row["ctn_active"] for row in steps)
    assert steps[0]["ctn_penalty"] == 0  # the first pass is on-policy: ratio 1, nothing clipped
    assert any(row["ctn_penalty"] > 0 for row in steps[1:])
    assert steps[0]["ctn_pull"] == 0 and any(0 < row["ctn_pull"] < 1 for row in steps[1:])
    changes = [a for a in alerts if a["detector"] == "ctn_coef"]  # λ judged once per generation batch
    assert [a["step"] for a in changes] == [PASSES]
    assert {row["ctn_coef"] for row in steps[:PASSES]} == {32.0}
    assert {row["ctn_coef"] for row in steps[PASSES:]} == {changes[0]["value"]} == {trainer.ctn_coef}


def test_turns_come_from_completion_mask_times_tool_mask_and_the_loss_is_the_objectives():
    """Synthetic tensors: two completions, the first with a tool output between two model turns."""
    inputs = {
        "completion_mask": torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]]),
        "tool_mask": torch.tensor([[1, 1, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]]),
    }
    mask = loss_mask(inputs)
    assert turn_ids_from_mask(mask).tolist() == [[0, 0, -1, -1, 1, 1, 1], [0, 0, 0, 0, -1, -1, -1]]
    logp = torch.log(torch.tensor([[2.0, 2.0, 1, 1, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5, 1, 1, 1]]))
    adv = torch.tensor([1.0, -1.0])
    terms = policy_objective(
        logp,
        torch.zeros_like(logp),
        adv,
        mask.float(),
        turn_level=True,
        settings=ObjectiveSettings(dual_clip=None),
    )
    # turn ratios: 2 (A=+1, clipped to 1.2), 1 (inside), 0.5 (A=−1: min(−0.5, −0.8) = −0.8)
    assert terms.pg_loss.item() == pytest.approx(-(2 * 1.2 + 3 * 1.0 + 4 * -0.8) / 9)


def test_per_turn_group_advantages_of_a_generation_batch():
    """Synthetic: one group of 4; completion 0 played 2 turns, the rest 1; this process holds rows 0-1."""
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    n_turns = torch.tensor([2, 1, 1, 1])
    local_turn_ids = torch.tensor([[0, 0, -1, 1], [0, 0, 0, -1]])
    adv = per_turn_advantages(rewards, n_turns, 4, local_turn_ids, start=0)
    z = 0.5 / (0.5 + 1e-6)  # turn 0: mean 0.5, std 0.5; turn 1: completion 0 alone → 0
    assert adv.flatten().tolist() == pytest.approx([z, z, 0, 0, -z, -z, -z, 0])


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"ctn": "sometimes"}, "ctn must be one of"),
        ({"loss_type": "cispo"}, "loss_type must be so_grpo"),
        ({"turn_ratio": "median"}, "turn_ratio must be"),
        ({"dual_clip": 0.5}, "dual_clip must be > 1"),
        ({"importance_sampling_level": "sequence"}, "does not support importance_sampling_level"),
    ],
)
def test_bad_settings_are_refused_in_one_line(tmp_path, fields, message):
    """From the config's fields; the trainer's keyword arguments go through the same check."""
    args = SORLGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], **fields)
    with pytest.raises(ValueError, match=message):
        SorlLossSettings.of(args)


def test_trainer_keyword_arguments_override_the_config_fields(tmp_path):
    args = SORLGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], ctn="off")
    assert SorlLossSettings.of(args, {"ctn": "auto", "turn_is": False}).ctn == "auto"
    plain = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], loss_type="dapo")
    assert SorlLossSettings.of(plain).ctn == "off"  # a plain GRPOConfig with TRL's loss: TRL's trainer
    assert SorlLossSettings.of(plain, {"ctn": "on"}).ctn == "on"
    with pytest.raises(ValueError, match="ctn must be one of"):
        SorlLossSettings.of(args, {"ctn": "sometimes"})
