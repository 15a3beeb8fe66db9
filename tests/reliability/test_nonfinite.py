"""NaN and ±Inf in what a trainer hands over: stored, counted, flagged, and never a crash."""

from __future__ import annotations

import math

import torch
from transformers import Trainer, TrainingArguments

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.integrations.hf import SorlCallback
from sorl_monitor.integrations.verl import ingest_verl_jsonl
from sorl_monitor.read.query import open_runs
from tests.helpers.tiny_lm import NanAfterTwoSteps, TokenSequences


def test_nonfinite_log_probs_and_rewards_are_counted_and_kept_out_of_the_statistics(tmp_path):
    logp = -torch.rand(4, 8)
    old = logp + 0.1
    logp[0, 1], old[1, 2], logp[2, 3] = math.nan, math.inf, -math.inf
    rewards = torch.tensor([1.0, math.nan, 0.5, math.inf])
    with Monitor(tmp_path, "nan", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        row = mon.log_update(logp=logp, old_logp=old, mask=torch.ones(4, 8), rewards=rewards)
    assert row["nonfinite_count"] == 3 + 2
    assert all(math.isfinite(row[k]) for k in ("ratio_mean", "ratio_max", "kl_old_k3", "reward_mean"))
    with open_runs(tmp_path) as runs:
        stored = runs.sql("SELECT nonfinite_count, n_tokens FROM steps").to_pylist()
    assert stored == [{"nonfinite_count": 5.0, "n_tokens": 4 * 8 - 3}]


def nonfinite_loss(window):
    """A stand-in for the non-finite detector: critical wherever the logged loss is NaN or ±Inf."""
    return [
        {"step": row["step"], "detector": "nonfinite", "severity": "critical", "value": row["loss"],
         "threshold": None, "message": "loss is not finite"}
        for row in window.to_pylist() if row.get("loss") is not None and not math.isfinite(row["loss"])
    ]  # fmt: skip


def test_a_trainer_whose_loss_goes_nan_is_stored_flagged_and_stopped(tmp_path):
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=8, logging_steps=1, per_device_train_batch_size=4,
        logging_nan_inf_filter=False, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    callback = SorlCallback(Monitor(tmp_path / "runs", "nan"), detect=nonfinite_loss, stop_on_critical=True)
    trainer = Trainer(
        model=NanAfterTwoSteps(), args=args, train_dataset=TokenSequences(), callbacks=[callback]
    )
    trainer.train()
    assert trainer.state.global_step == 3
    with open_runs(tmp_path / "runs") as runs:
        steps = runs.sql("SELECT step, isnan(loss) AS nan_loss FROM steps ORDER BY step").to_pylist()
        alerts = runs.sql("SELECT step, detector, kind FROM alerts WHERE kind = 'alert'").to_pylist()
    assert steps == [
        {"step": 1, "nan_loss": False},
        {"step": 2, "nan_loss": False},
        {"step": 3, "nan_loss": True},
    ]
    assert alerts == [{"step": 3, "detector": "nonfinite", "kind": "alert"}]


def test_nan_and_infinity_in_verl_file_logger_lines_are_stored(tmp_path):
    source = tmp_path / "exp.jsonl"
    source.write_text(
        '{"step": 1, "data": {"actor/grad_norm": NaN, "actor/pg_loss": Infinity, "critic/score/mean": null}}\n'
        '{"step": 2, "data": {"actor/grad_norm": 1.0, "actor/pg_loss": -Infinity, "critic/score/mean": 0.5}}\n'
        '{"step": 36893488147419103232, "data": {"actor/grad_norm": 1.0}}\n'
    )
    with Monitor(tmp_path / "runs", "exp") as mon:
        report = ingest_verl_jsonl(source, mon)
    assert report.rows == 2 and report.bad_lines == [3] and "outside" in report.first_error
    with open_runs(tmp_path / "runs") as runs:
        rows = runs.sql(
            "SELECT step, isnan(grad_norm) AS nan, pg_loss, reward_mean FROM steps ORDER BY step"
        ).to_pylist()
    assert rows == [
        {"step": 1, "nan": True, "pg_loss": math.inf, "reward_mean": None},
        {"step": 2, "nan": False, "pg_loss": -math.inf, "reward_mean": 0.5},
    ]
