"""Each format, written by its own writer, reads back as the same ``steps`` values that the same metrics
logged through ``Monitor.log_scalars`` give when read from Parquet."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from sorl_monitor.logs import read_log
from sorl_monitor.metric_names import guess_family
from tests.helpers.log_writers import (
    TRL_STEPS,
    VERL_STEPS,
    csv_file,
    jsonl_file,
    mlflow_store,
    tensorboard_run,
    verl_file,
)
from tests.helpers.same_steps import assert_same_steps, parquet_steps


def test_tensorboard_scalars_from_simple_values_and_tensors(tmp_path):
    (run,) = read_log(tensorboard_run(tmp_path / "tb" / "ppo"))
    assert (run.run_id, run.format, run.family) == ("ppo", "tensorboard", guess_family(TRL_STEPS[1]))
    assert "weights" not in run.steps.column_names  # histograms are not scalars
    assert run.steps.column("wall_time").null_count == 0
    assert_same_steps(run, parquet_steps(tmp_path / "ref", TRL_STEPS))


def test_jsonl_rows_of_one_step_are_merged(tmp_path):
    (run,) = read_log(jsonl_file(tmp_path / "metrics.jsonl"))
    assert (run.run_id, run.format) == ("metrics", "jsonl")
    assert_same_steps(run, parquet_steps(tmp_path / "ref", TRL_STEPS))


def test_csv_with_a_global_step_column_keeps_nan(tmp_path):
    (run,) = read_log(csv_file(tmp_path / "metrics.csv"))
    assert (run.run_id, run.format) == ("metrics", "csv")
    assert_same_steps(run, parquet_steps(tmp_path / "ref", TRL_STEPS))


def test_verl_file_logger_output(tmp_path):
    (run,) = read_log(verl_file(tmp_path / "exp.jsonl"))
    assert (run.format, run.family, run.info["algorithm"]) == ("verl", "verl", "verl")
    assert_same_steps(run, parquet_steps(tmp_path / "ref", VERL_STEPS, family="verl"))


def test_mlflow_file_store_written_by_mlflows_client(tmp_path, monkeypatch):
    store = mlflow_store(tmp_path / "mlruns", monkeypatch)
    (run,) = read_log(store)
    assert (run.run_id, run.format, run.info["algorithm"]) == ("grpo-seed-0", "mlflow", "grpo")
    assert run.info["config"] == {
        "algorithm": "grpo", "lr": "1e-06", "judged": {"column": "reward", "why": "the reward, by the trainer's name table"}
    }  # fmt: skip
    expected = {step: dict(metrics) for step, metrics in TRL_STEPS.items()}
    expected[1]["perf/tokens_per_s"] = 1000.0
    assert_same_steps(run, parquet_steps(tmp_path / "ref", expected))
    experiment = next(p for p in store.iterdir() if p.name not in {"0", ".trash"})
    assert [r.run_id for r in read_log(experiment)] == ["grpo-seed-0"]  # an experiment folder
    run_folder = next(p for p in experiment.iterdir() if p.is_dir())
    assert [r.run_id for r in read_log(run_folder)] == ["grpo-seed-0"]  # one run folder


def history_frame() -> pd.DataFrame:
    """What ``run.history()`` returns: W&B's ``_step``/``_runtime``/``_timestamp`` and the logged keys."""
    rows = [
        {"_step": i, "_runtime": 1.5 * i, "_timestamp": 1.7e9 + i, "train/global_step": 10 * step, **metrics}
        for i, (step, metrics) in enumerate(TRL_STEPS.items())
    ]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("suffix", ["csv", "json", "records.json", "jsonl"])
def test_wandb_history_dumps_use_train_global_step(tmp_path, suffix):
    path = tmp_path / f"history.{suffix}"
    frame = history_frame()
    if suffix == "csv":
        frame.to_csv(path)
    elif suffix == "json":
        frame.to_json(path)
    elif suffix == "records.json":
        frame.to_json(path, orient="records")
    else:
        frame.to_json(path, orient="records", lines=True)
    (run,) = read_log(path)
    assert run.format == "wandb"
    expected = {
        10 * step: {
            **{k: v for k, v in metrics.items() if v == v},
            "_runtime": 1.5 * i,
        }  # pandas writes NaN as null
        for i, (step, metrics) in enumerate(TRL_STEPS.items())
    }
    assert_same_steps(run, parquet_steps(tmp_path / "ref", expected))
    assert run.steps.column("wall_time").to_pylist()[0] == pytest.approx(1.7e9)


def test_a_wandb_ui_export_with_two_runs_gives_two_runs_without_min_max_bands(tmp_path):
    path = tmp_path / "wandb_export.csv"
    lines = [
        "Step,ppo - reward,ppo - reward__MIN,ppo - reward__MAX,grpo a - reward,grpo a - reward__MIN,grpo a - reward__MAX"
    ]
    lines += [f"{s},{0.1 * s},{0.1 * s - 1},{0.1 * s + 1},{0.2 * s if s % 2 else ''},," for s in range(1, 5)]
    path.write_text("\n".join(lines) + "\n")
    runs = {run.run_id: run for run in read_log(path)}
    assert sorted(runs) == ["grpo-a", "ppo"]
    assert runs["ppo"].steps.column_names == ["run_id", "rank", "step", "reward_mean"]
    assert runs["ppo"].steps.column("reward_mean").to_pylist() == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert runs["grpo-a"].steps.column("step").to_pylist() == [1, 3]


def test_trainer_state_of_a_real_trainer_run_keeps_training_rows_only(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 32, (16, 8))]
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=4,
        per_device_train_batch_size=4,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=2,
        save_steps=4,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:4])
    trainer.train()
    history = trainer.state.log_history
    assert any("eval_loss" in row for row in history) and any("train_runtime" in row for row in history)
    training = {
        row["step"]: {k: v for k, v in row.items() if k != "step"}
        for row in history
        if "eval_loss" not in row and "train_runtime" not in row
    }
    assert (tmp_path / "out" / "checkpoint-4" / "trainer_state.json").is_file()
    (run,) = read_log(tmp_path / "out")
    assert (run.run_id, run.format) == ("out", "hf")
    assert not {"eval_loss", "train_runtime", "train_loss"} & set(run.steps.column_names)
    assert_same_steps(run, parquet_steps(tmp_path / "ref", training))
    state = json.loads((tmp_path / "out" / "checkpoint-4" / "trainer_state.json").read_text())
    (bare,) = read_log(_write(tmp_path / "step_logs.json", state["log_history"]))
    assert bare.format == "hf" and bare.steps.equals(run.steps.set_column(0, "run_id", bare.steps.column(0)))


def _write(path, document):
    path.write_text(json.dumps(document))
    return path
