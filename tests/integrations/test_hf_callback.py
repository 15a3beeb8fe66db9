"""``SorlCallback`` on a real ``transformers.Trainer`` (tiny Qwen2 built from config, CPU)."""

from __future__ import annotations

import json
import math

import pytest
from transformers import Trainer

from sorl_monitor import Monitor, MonitorWarning
from sorl_monitor.integrations.hf import SorlCallback
from sorl_monitor.read.query import open_runs
from tests.helpers.hf_trainer import make_trainer


def logged(trainer: Trainer, key: str) -> dict[int, float]:
    return {entry["step"]: entry[key] for entry in trainer.state.log_history if key in entry}


def test_each_update_is_one_row_holding_the_trainers_logs_with_eval_merged_in(tmp_path):
    trainer = make_trainer(
        tmp_path, SorlCallback(Monitor(tmp_path / "runs", "hf")), eval_strategy="steps", eval_steps=3
    )
    trainer.train()
    with open_runs(tmp_path / "runs") as runs:
        rows = runs.sql("SELECT step, loss, lr, eval_loss, epoch FROM steps ORDER BY step").to_pylist()
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert {r["step"]: r["loss"] for r in rows} == pytest.approx(logged(trainer, "loss"))
    assert {r["step"]: r["lr"] for r in rows} == pytest.approx(logged(trainer, "learning_rate"))
    assert {r["step"]: r["eval_loss"] for r in rows if r["eval_loss"] is not None} == pytest.approx(
        logged(trainer, "eval_loss")
    )
    assert sorted(logged(trainer, "eval_loss")) == [3, 6]


def test_module_grad_norms_are_rescaled_to_the_pre_clip_norm_the_trainer_logs(tmp_path):
    trainer = make_trainer(tmp_path, SorlCallback(Monitor(tmp_path / "runs", "clip")), max_grad_norm=1e-3)
    trainer.train()
    with open_runs(tmp_path / "runs") as runs:
        total = runs.sql(
            "SELECT step, sqrt(sum(grad_norm * grad_norm)) AS norm, count(*) AS modules FROM modules GROUP BY step"
        ).to_pylist()
        steps = runs.sql("SELECT step, grad_norm, grad_norm_clipped FROM steps").to_pylist()
    pre_clip = logged(trainer, "grad_norm")
    assert all(norm > 1e-3 for norm in pre_clip.values())  # the clip did bind
    assert {r["step"]: r["norm"] for r in total} == pytest.approx(pre_clip, rel=1e-4)
    assert {r["modules"] for r in total} == {5}  # embeddings, 2 blocks, final norm, head
    assert all(r["grad_norm_clipped"] == pytest.approx(1e-3, rel=1e-3) for r in steps)


def test_run_json_holds_trainer_arguments_model_config_and_end_summary(tmp_path):
    trainer = make_trainer(
        tmp_path, SorlCallback(log_dir=str(tmp_path / "runs"), run_name="meta"), max_steps=2
    )
    trainer.train()
    meta = json.loads((tmp_path / "runs" / "meta" / "run.json").read_text())
    assert meta["status"] == "finished"
    assert meta["config"]["learning_rate"] == meta["trainer_args"]["learning_rate"] == 1e-3
    assert meta["seed"] == 42 and meta["model_config"]["hidden_size"] == 16
    assert meta["train_summary"]["train_loss"] == pytest.approx(trainer.state.log_history[-1]["train_loss"])


def test_a_critical_alert_from_the_detector_stops_training_at_that_step(tmp_path):
    def loss_watch(window):
        return [
            {"step": row["step"], "detector": "synthetic_step_limit", "severity": "critical", "value": row["step"],
             "threshold": 3, "message": "step reached 3"}
            for row in window.to_pylist() if row["step"] >= 3
        ]  # fmt: skip

    callback = SorlCallback(Monitor(tmp_path / "runs", "stop"), detect=loss_watch, stop_on_critical=True)
    trainer = make_trainer(tmp_path, callback)
    trainer.train()
    assert trainer.state.global_step == 3
    with open_runs(tmp_path / "runs") as runs:
        alerts = runs.sql("SELECT step, kind, detector FROM alerts ORDER BY kind").to_pylist()
        last = runs.sql("SELECT max(step) FROM steps").column(0)[0].as_py()
    assert alerts == [
        {"step": 3, "kind": "action", "detector": "stop_training"},
        {"step": 3, "kind": "alert", "detector": "synthetic_step_limit"},
    ]
    assert last == 3
    meta = json.loads((tmp_path / "runs" / "stop" / "run.json").read_text())
    assert meta["status"] == "stopped" and "synthetic_step_limit" in meta["stopped_by"]


def test_a_failing_detector_warns_once_and_training_finishes(tmp_path):
    def broken(window):
        raise RuntimeError("detector bug")

    trainer = make_trainer(tmp_path, SorlCallback(Monitor(tmp_path / "runs", "broken"), detect=broken))
    with pytest.warns(MonitorWarning, match="detector bug"):
        trainer.train()
    assert trainer.state.global_step == 6
    with open_runs(tmp_path / "runs") as runs:
        assert runs.sql("SELECT count(*) FROM steps").column(0)[0].as_py() == 6


def test_a_log_dir_that_cannot_be_created_turns_monitoring_off_not_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the log folder should go")
    trainer = make_trainer(tmp_path, SorlCallback(log_dir=str(blocker / "runs")), max_steps=2)
    with pytest.warns(MonitorWarning, match="monitoring is off"):
        trainer.train()
    assert trainer.state.global_step == 2
    assert not math.isnan(trainer.state.log_history[-1]["train_loss"])
