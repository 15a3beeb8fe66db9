"""Trainer metric names → ``steps`` columns: the name tables, the family guess, and values → storable scalars."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

from sorl_monitor.metric_names import (
    NAME_TABLES,
    TRL_NAMES,
    UNMAPPED,
    VERL_NAMES,
    guess_family,
    map_metrics,
    names_for,
    scalar,
    to_columns,
)
from sorl_monitor.schema import STEP_METRICS

EXTRAS = {"clip_frac_active_low", "clip_frac_active_high", "dual_clip_frac"}
"""Columns outside ``STEP_METRICS`` that a table maps to (docs/attach.md defines them)."""

# Key sets as each trainer logs them in one step, from the sources names.py cites (non-scalar and
# per-function names included: ``rewards/<func>/mean``, ``train/<env>/success``, timing keys).
REALISTIC_KEYS = {
    "trl": [
        "loss", "grad_norm", "learning_rate", "epoch", "num_tokens", "step_time",
        "completions/mean_length", "completions/min_length", "completions/max_length", "completions/clipped_ratio",
        "completions/mean_terminated_length", "completions/min_terminated_length",
        "completions/max_terminated_length", "rewards/accuracy/mean", "rewards/accuracy/std", "reward",
        "reward_std", "frac_reward_zero_std", "kl", "entropy", "clip_ratio/low_mean", "clip_ratio/low_min",
        "clip_ratio/high_mean", "clip_ratio/high_max", "clip_ratio/region_mean",
    ],
    "verl": [
        "actor/entropy", "perf/mfu/actor_infer", "actor/pg_loss", "actor/kl_loss", "actor/pg_clipfrac",
        "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/kl_coef", "actor/grad_norm", "actor/lr", "perf/mfu/actor",
        "training/global_step", "training/epoch", "critic/score/mean", "critic/score/max", "critic/score/min",
        "critic/rewards/mean", "critic/rewards/max", "critic/rewards/min", "critic/advantages/mean",
        "critic/advantages/max", "critic/advantages/min", "critic/returns/mean", "critic/returns/max",
        "critic/returns/min", "response_length/mean", "response_length/max", "response_length/min",
        "response_length/clip_ratio", "response_length_non_aborted/mean", "response_length_non_aborted/max",
        "response_length_non_aborted/min", "response_length_non_aborted/clip_ratio", "response/aborted_ratio",
        "prompt_length/mean", "prompt_length/max", "prompt_length/min", "prompt_length/clip_ratio",
        "num_turns/min", "num_turns/max", "num_turns/mean", "timing_s/gen", "timing_s/old_log_prob",
        "timing_s/adv", "timing_s/update_actor", "timing_s/step", "timing_per_token_ms/gen",
        "perf/total_num_tokens", "perf/time_per_step", "perf/throughput",
    ],
    "ragen": [
        "rollout/in_group_std", "rollout/in_group_max", "rollout/in_group_mean", "rollout/chosen_in_group_std",
        "rollout/chosen_in_group_max", "rollout/chosen_in_group_mean", "train/SimpleSokoban/success",
        "train/SimpleSokoban/num_actions", "train/SimpleSokoban/non-zero/success", "train/response_length",
        "rollout/old_log_prob", "rollout/ref_log_prob", "critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean",
        "critic/grad_norm", "critic/lr", "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl",
        "actor/pg_clipfrac_lower", "actor/entropy_loss", "actor/grad_norm", "actor/lr", "critic/score/mean",
        "critic/score/max", "critic/score/min", "critic/rewards/mean", "critic/rewards/max", "critic/rewards/min",
        "critic/advantages/mean", "critic/advantages/max", "critic/advantages/min", "critic/returns/mean",
        "critic/returns/max", "critic/returns/min", "critic/values/mean", "critic/values/max", "critic/values/min",
        "critic/vf_explained_var", "response_length/mean", "response_length/max", "response_length/min",
        "response_length/clip_ratio", "prompt_length/mean", "prompt_length/max", "prompt_length/min",
        "prompt_length/clip_ratio", "timing_s/gen", "timing_s/update_actor", "timing_s/step", "timing_s/total",
    ],
    "openrlhf": [
        "train/policy_loss", "train/actor_lr", "train/actor_grad_norm", "train/ppo_clip_ratio", "train/ppo_kl",
        "train/kl", "train/logprobs_diff", "train/reward", "train/response_clip_ratio", "train/group_reward_std",
        "train/return", "train/response_length", "train/truncated", "train/total_length", "train/critic_loss",
        "train/values", "train/critic_lr", "train/critic_grad_norm", "train/timing/make_experience",
        "train/timing/ppo_train", "train/timing/broadcast", "train/rollout/reward_mean", "train/rollout/reward_std",
        "train/rollout/response_length_mean", "train/rollout/truncated_rate", "train/rollout/num_samples",
        "train/timing/generation", "train/timing/step_total", "train/global_step",
    ],
    "prime_rl": [
        "perf/throughput", "perf/throughput_per_gpu", "perf/mfu", "perf/peak_memory", "step", "optim/lr",
        "optim/grad_norm", "entropy/all/mean", "entropy/all/std", "entropy/all/max", "loss/mean", "loss/median",
        "loss/std", "loss/min", "loss/max", "mismatch_kl/all/mean", "mismatch_kl/all/std", "mismatch_kl/all/max",
        "is_masked/mean", "is_masked/max", "is_masked_low/mean", "is_masked_high/mean", "time/step",
        "time/forward_backward", "train/agg/effective/num_total_tokens/mean",
        "train/agg/effective/num_output_tokens/mean", "train/agg/effective/num_output_tokens/max",
        "train/agg/effective/num_turns/mean", "progress/tokens", "progress/rollouts", "off_policy/mean",
    ],
    # the rollout, train and summary rows of one grpo_step merged (logs.row_kinds), ShibukiZero's metrics.jsonl
    "grpo_loop": [
        "grpo_step", "num_questions", "group_size", "num_rollouts", "reward", "format_accuracy", "answer_accuracy",
        "avg_response_token_length", "rollout_seconds", "mean_reward", "std_reward", "min_reward", "max_reward",
        "mean_advantage", "std_advantage", "num_groups", "optimizer_step", "loss", "scaled_loss", "grad_norm",
        "token_entropy", "clip_fraction", "approx_kl", "reference_kl", "kl_penalty", "train_reward",
        "train_format_accuracy", "train_answer_accuracy", "learning_rate", "loss_type", "step_seconds",
    ],
}  # fmt: skip


def test_mapped_names_become_schema_columns_and_others_are_snake_cased():
    row = to_columns({"actor/pg_clipfrac": 0.2, "timing_s/gen": 1.0, "val-core/gsm8k/acc@1": 0.5}, VERL_NAMES)
    assert row == {"clip_frac_active": 0.2, "timing_s_gen": 1.0, "val_core_gsm8k_acc_1": 0.5}


def test_a_mapped_name_wins_over_an_unmapped_one_that_snake_cases_to_the_same_column():
    assert to_columns({"clip_frac_active": 0.9, "actor/pg_clipfrac": 0.2}, VERL_NAMES) == {
        "clip_frac_active": 0.2
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.float32(0.5), 0.5),
        (np.int64(7), 7.0),
        (torch.tensor(1.5), 1.5),
        (torch.tensor([2.5]), 2.5),
        (np.array(3.0), 3.0),
        (10**400, math.inf),
        (-(10**400), -math.inf),
        (True, True),
        ("fsdp", "fsdp"),
        ([1, 2], None),
        ({"a": 1}, None),
        (torch.ones(3), None),
        (None, None),
    ],
)
def test_values_become_floats_bools_strings_or_are_left_out(value, expected):
    assert scalar(value) == expected


@pytest.mark.parametrize("family", list(NAME_TABLES))
def test_mapped_targets_are_schema_columns_or_documented_extras(family):
    assert set(NAME_TABLES[family].values()) <= set(STEP_METRICS) | EXTRAS


@pytest.mark.parametrize("family", list(NAME_TABLES))
def test_a_table_maps_no_two_names_to_one_column_and_no_schema_column_elsewhere(family):
    table = NAME_TABLES[family]
    assert len(set(table.values())) == len(table)
    assert all(table[name] == name for name in table if name in STEP_METRICS)  # re-mapping a row is a no-op


@pytest.mark.parametrize("family", list(NAME_TABLES))
def test_unmapped_names_are_not_in_the_table(family):
    assert not UNMAPPED[family] & set(NAME_TABLES[family])


@pytest.mark.parametrize("family", list(NAME_TABLES))
def test_each_family_is_guessed_from_a_step_of_its_trainer(family):
    assert guess_family(REALISTIC_KEYS[family]) == family


@pytest.mark.parametrize(
    "keys",
    [
        [],
        ["loss", "grad_norm", "entropy", "clip_frac", "reward_mean"],  # schema columns: no trainer's names
        ["actor/pg_loss", "actor/pg_clipfrac", "critic/score/mean"],  # logged by verl and RAGEN alike
        ["timing_s/gen", "perf/throughput"],  # names no table knows
    ],
)
def test_names_several_families_or_none_log_decide_nothing(keys):
    assert guess_family(keys) is None


def test_trl_names_with_the_prefix_of_transformers_loggers_are_no_evidence_for_openrlhf():
    prefixed = ["train/" + name for name in [*REALISTIC_KEYS["trl"], "global_step", "policy_loss"]]
    assert guess_family(prefixed) is None  # so log importers strip the prefix, then guess TRL
    assert guess_family(name.removeprefix("train/") for name in prefixed) == "trl"


def test_map_metrics_guesses_the_family_forces_one_or_maps_nothing():
    logs = {"learning_rate": 1e-5, "epoch": 0.5, "kl": 0.02, "completions/mean_length": 12}
    assert map_metrics(logs) == {"lr": 1e-5, "epoch": 0.5, "kl_ref": 0.02, "response_len_mean": 12.0}
    assert map_metrics({"train/kl": 0.1}, "openrlhf") == {"kl_ref": 0.1}
    assert map_metrics({"train/kl": 0.1}, {"train/kl": "kl_old"}) == {"kl_old": 0.1}
    assert map_metrics({"train/kl": 0.1}, None) == {"train_kl": 0.1}
    with pytest.raises(ValueError, match="unknown trainer family 'deepspeed_chat'"):
        names_for("deepspeed_chat")


def test_every_trl_and_transformers_name_is_logged_by_the_installed_sources():
    trl = pytest.importorskip("trl")
    import transformers.trainer

    source = inspect.getsource(trl.GRPOTrainer) + inspect.getsource(transformers.trainer)
    for name in [*TRL_NAMES, *UNMAPPED["trl"]]:
        assert f'"{name}"' in source, name
