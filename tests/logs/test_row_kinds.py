"""JSON lines with several row kinds (synthetic rows shaped like a hand-written GRPO loop's metrics.jsonl)."""

from __future__ import annotations

import json

import pytest

from sorl_monitor.logs import detect_format, read_log


def rows():
    yield {"type": "eval", "grpo_step": 0, "optimizer_step": 0, "reward": 0.03, "answer_accuracy": 0.03}
    for step in (1, 2, 3):
        yield {
            "type": "rollout",
            "grpo_step": step,
            "reward": 0.1 * step,
            "avg_response_token_length": 300 - step,
        }
        for update in (1, 2):  # two optimizer updates per rollout batch
            yield {
                "type": "train",
                "grpo_step": step,
                "optimizer_step": 2 * (step - 1) + update,
                "loss": float(update),
                "token_entropy": 0.5 * update,
                "train_reward": 0.1 * step,
                "clip_fraction": None,
                "loss_type": "grpo_clip",
            }
        yield {
            "type": "grpo_step_summary",
            "grpo_step": step,
            "optimizer_step": 2 * step,
            "step_seconds": 20.0,
        }
        if step == 2:
            yield {"type": "eval", "grpo_step": 2, "reward": 0.5, "answer_accuracy": 0.5}


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_synthetic_row_kinds_merge_on_the_rollout_batch_without_eval_rows(tmp_path):
    path = write(tmp_path / "metrics.jsonl", rows())
    assert detect_format(path) == "jsonl"
    (run,) = read_log(path)
    assert run.family == "grpo_loop"
    assert {k: v for k, v in run.info["config"].items() if k != "judged"} == {
        "step_column": "grpo_step", "row_kinds": "rollout,train,grpo_step_summary"
    }  # fmt: skip
    table = {r["step"]: r for r in run.steps.to_pylist()}
    assert sorted(table) == [1, 2, 3]  # eval at grpo_step 0 dropped; one row per rollout batch
    assert table[2]["reward"] == pytest.approx(0.2)  # the rollout's, not the eval's 0.5
    assert table[2]["reward_mean"] == pytest.approx(0.2)  # train_reward, mapped
    assert table[2]["entropy"] == pytest.approx(0.75)  # the two updates averaged
    assert table[2]["loss"] == pytest.approx(1.5)
    assert table[2]["response_len_mean"] == pytest.approx(298)
    assert table[3]["optimizer_step"] == 6  # a step counter keeps its largest value
    assert table[1]["loss_type"] == "grpo_clip"
    assert "clip_frac" not in run.steps.column_names  # logged as null throughout
    assert "answer_accuracy" not in run.steps.column_names  # only the eval rows had it


def test_synthetic_a_name_two_kinds_log_is_kept_under_the_later_kind(tmp_path):
    records = [
        {"kind": "rollout", "iteration": 1, "loss": 9.0, "reward": 0.1},
        {"kind": "train", "iteration": 1, "loss": 0.5},
        {"kind": "validation", "iteration": 1, "loss": 7.0},
    ]
    (run,) = read_log(write(tmp_path / "m.jsonl", records))
    (row,) = run.steps.to_pylist()
    assert (row["loss"], row["train_loss"]) == (9.0, 0.5)  # train/loss, snake-cased
    assert run.info["config"]["step_column"] == "iteration"


def test_synthetic_rows_of_one_kind_read_as_before(tmp_path):
    (run,) = read_log(
        write(tmp_path / "m.jsonl", [{"step": 1, "type": "train", "loss": 1.0}, {"step": 2, "loss": 2.0}])
    )
    assert run.steps.column("step").to_pylist() == [1, 2]


def test_synthetic_row_kinds_starting_with_a_row_without_a_step_are_detected(tmp_path):
    records = [{"type": "config", "lr": 1e-5}, *rows()]
    path = write(tmp_path / "metrics.jsonl", records)
    assert detect_format(path) == "jsonl"
    (run,) = read_log(path)
    assert run.steps.column("step").to_pylist() == [1, 2, 3]
