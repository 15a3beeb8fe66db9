"""``Monitor``: what one ``log_update`` writes, and that monitoring never breaks the training loop."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from sorl_monitor import MetricsConfig, Monitor, MonitorWarning, WriterConfig
from sorl_monitor.read.query import open_runs
from sorl_monitor.write.module_tracker import module_group
from tests.helpers.runs import write_run


def test_one_update_writes_steps_turns_and_modules(tmp_path):
    run = write_run(tmp_path, "r1", updates=3)
    with open_runs(run) as runs:
        steps = runs.sql("SELECT * FROM steps ORDER BY step").to_pylist()
        turns = runs.sql("SELECT count(*) AS n, max(turn_idx) AS k FROM turns").to_pylist()[0]
        modules = runs.sql("SELECT DISTINCT module FROM modules ORDER BY module").column("module").to_pylist()
    assert [row["step"] for row in steps] == [0, 1, 2]
    assert all(row["grad_norm"] > 0 and row["param_norm"] > 0 for row in steps)
    assert turns == {"n": 3 * 4 * 3, "k": 2}  # 3 updates × 4 episodes × 3 turns
    assert modules == ["0", "1"]
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "finished" and meta["last_step"] == 2


def test_module_group_names_top_level_blocks():
    assert module_group("model.layers.3.mlp.up_proj.weight") == "model.layers.3"
    assert module_group("model.embed_tokens.weight") == "model.embed_tokens"
    assert module_group("lm_head.weight") == "lm_head"
    assert module_group("value_head.bias") == "value_head"


def test_pre_clip_grad_norm_rescales_module_norms(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    model(torch.randn(16, 4)).pow(2).sum().mul(100).backward()
    before = {n: p.grad.norm().item() for n, p in model.named_parameters()}
    pre_clip = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    x = torch.zeros(1, 3)
    with Monitor(tmp_path, "clip", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        mon.watch(model)
        row = mon.log_update(logp=x, old_logp=x, mask=torch.ones(1, 3), grad_norm=pre_clip)
    assert row["grad_norm"] == pytest.approx(float(pre_clip))
    assert row["grad_norm_clipped"] == pytest.approx(0.5, rel=1e-4)
    with open_runs(tmp_path / "clip") as runs:
        first = runs.sql("SELECT grad_norm FROM modules WHERE module = '0'").column(0)[0].as_py()
    assert first == pytest.approx(math.hypot(before["0.weight"], before["0.bias"]), rel=1e-4)


def test_bad_input_is_counted_and_warned_not_raised(tmp_path):
    with Monitor(tmp_path, "bad", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        with pytest.warns(MonitorWarning, match="log_update failed"):
            result = mon.log_update(logp=torch.zeros(2, 3), old_logp=torch.zeros(5, 7), mask=torch.ones(2, 3))
        assert result == {}
        x = torch.zeros(2, 3)
        row = mon.log_update(logp=x, old_logp=x, mask=torch.ones(2, 3))
    assert row["monitor_errors"] == 1


def test_log_scalars_without_names_snake_cases_names_and_converts_tensors(tmp_path):
    with Monitor(tmp_path, "dict", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        metrics = {"actor/pg_clipfrac": torch.tensor(0.25), "training/global_step": 7, "note": "x"}
        mon.log_scalars(7, metrics, names=None)
    with open_runs(tmp_path / "dict") as runs:
        row = runs.sql("SELECT step, actor_pg_clipfrac, training_global_step, note FROM steps").to_pylist()[0]
    assert row == {"step": 7, "actor_pg_clipfrac": 0.25, "training_global_step": 7.0, "note": "x"}
    assert mon.trainer_family is None


def test_log_scalars_maps_names_with_the_family_guessed_from_the_first_call_that_names_one(tmp_path):
    verl_step = {"actor/pg_clipfrac": 0.25, "actor/kl_loss": 0.01, "training/epoch": 0, "timing_s/x": 2.0}
    with Monitor(tmp_path, "auto", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        mon.log_scalars(0, {"loss": 1.0})  # a schema column: names no trainer
        assert mon.trainer_family is None
        mon.log_scalars(1, verl_step)
        mon.log_scalars(2, {"kl": 0.5})  # TRL's name, but this run is verl's: kept as it is
    assert mon.trainer_family == "verl"
    with open_runs(tmp_path / "auto") as runs:
        query = "SELECT loss, clip_frac_active, kl_ref, timing_s_x, kl FROM steps ORDER BY step"
        rows = runs.sql(query).to_pylist()
    assert rows == [
        {"loss": 1.0, "clip_frac_active": None, "kl_ref": None, "timing_s_x": None, "kl": None},
        {"loss": None, "clip_frac_active": 0.25, "kl_ref": 0.01, "timing_s_x": 2.0, "kl": None},
        {"loss": None, "clip_frac_active": None, "kl_ref": None, "timing_s_x": None, "kl": 0.5},
    ]


def test_log_scalars_with_a_family_or_a_mapping_maps_with_that_table(tmp_path):
    with Monitor(tmp_path, "forced", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        mon.log_scalars(0, {"kl": 0.5, "completions/clipped_ratio": 0.125}, names="trl")
        mon.log_scalars(1, {"my/kl": 0.25}, names={"my/kl": "kl_ref"})
        with pytest.warns(MonitorWarning, match="unknown trainer family 'tlr'"):
            mon.log_scalars(2, {"kl": 1.0}, names="tlr")  # counted and warned, never raised
    assert mon.trainer_family is None
    with open_runs(tmp_path / "forced") as runs:
        query = "SELECT step, kl_ref, completion_truncated_frac, monitor_errors FROM steps ORDER BY step"
        rows = runs.sql(query).to_pylist()
    assert rows == [
        {"step": 0, "kl_ref": 0.5, "completion_truncated_frac": 0.125, "monitor_errors": 0.0},
        {"step": 1, "kl_ref": 0.25, "completion_truncated_frac": None, "monitor_errors": 0.0},
    ]


def test_failed_context_marks_the_run_failed(tmp_path):
    with pytest.raises(RuntimeError), Monitor(tmp_path, "boom") as mon:
        mon.log_scalars(0, {"loss": 1.0})
        raise RuntimeError("trainer crashed")
    assert json.loads((tmp_path / "boom" / "run.json").read_text())["status"] == "failed"


@pytest.mark.parametrize("name", ["../escape", "a/b", "a\\b", "", "..", ".hidden", "x" * 200])
def test_run_names_with_path_separators_are_refused(tmp_path, name):
    with pytest.raises(ValueError, match="not allowed"):
        Monitor(tmp_path, name)
    assert list(tmp_path.iterdir()) == []


def test_recent_steps_window_holds_the_latest_rows(tmp_path):
    with Monitor(tmp_path, "win", window=3) as mon:
        for step in range(5):
            mon.log_scalars(step, {"clip_frac": step / 10})
        recent = mon.recent_steps()
    assert recent.column("step").to_pylist() == [2, 3, 4]


def test_disabled_monitor_writes_nothing(tmp_path):
    mon = Monitor(tmp_path, "off", enabled=False)
    x = torch.zeros(1, 2)
    assert mon.log_update(logp=x, old_logp=x, mask=torch.ones(1, 2)) == {}
    mon.close()
    assert not (tmp_path / "off").exists()


def test_alerts_are_validated_and_written(tmp_path):
    with Monitor(tmp_path, "al") as mon:
        mon.log_scalars(3, {"clip_frac": 0.6})
        mon.log_alert("clip_rise", "critical", "clip fraction 0.6 > 0.5", value=0.6, threshold=0.5)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mon.log_alert("x", "catastrophic", "bad severity")
        assert any("severity" in str(w.message) for w in caught)
    with open_runs(tmp_path / "al") as runs:
        alerts = runs.sql("SELECT step, detector, severity, kind FROM alerts").to_pylist()
    assert alerts == [{"step": 3, "detector": "clip_rise", "severity": "critical", "kind": "alert"}]


def test_a_user_built_monitor_records_torchs_seed_in_a_form_every_reader_takes(tmp_path):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2**64 - 5)  # torch's seeds run to 2^64 - 1: past int64
        Monitor(tmp_path, "unseeded").close()
        stored = json.loads((tmp_path / "unseeded" / "run.json").read_text())["seed"]
        assert stored == -5  # two's complement, which torch maps back to the same seed
        torch.manual_seed(stored)
        assert torch.initial_seed() == 2**64 - 5
    Monitor(tmp_path, "seeded", seed=7).close()
    with open_runs(tmp_path) as runs:
        seeds = runs.sql("SELECT run_id, seed FROM runs ORDER BY run_id").to_pylist()
    assert seeds == [{"run_id": "seeded", "seed": 7}, {"run_id": "unseeded", "seed": -5}]


def test_writer_settings_come_from_a_writer_config(tmp_path):
    config = WriterConfig(flush_interval_s=0.5, flush_rows=7, compact=False)
    with Monitor(tmp_path, "grouped", writer=config) as mon:
        assert mon.writer_config is config
        assert (mon._writer.flush_rows, mon._writer.flush_interval_s, mon._writer.compact_parts) == (
            7,
            0.5,
            0,
        )
    with Monitor(tmp_path, "defaults") as mon:
        assert mon.writer_config == WriterConfig()
        assert mon._writer.compact_parts > 0


def test_metric_settings_come_from_a_metrics_config(tmp_path):
    x, wide = torch.zeros(1, 4), torch.tensor([[0.0, 0.25, -0.25, 0.1]])
    with Monitor(tmp_path, "narrow", metrics=MetricsConfig(clip_eps=0.2)) as narrow:
        clipped_at_02 = narrow.log_update(logp=wide, old_logp=x, mask=torch.ones(1, 4))["clip_frac"]
    with Monitor(tmp_path, "broad", metrics=MetricsConfig(clip_eps=0.3)) as broad:
        clipped_at_03 = broad.log_update(logp=wide, old_logp=x, mask=torch.ones(1, 4))["clip_frac"]
    assert (clipped_at_02, clipped_at_03) == (0.5, 0.0)
    with pytest.raises(ValueError, match="clip_eps"):
        MetricsConfig(clip_eps=0)


@pytest.mark.parametrize("setting", [{"flush_interval_s": 0}, {"flush_rows": 0}, {"max_pending_rows": 1.5}])
def test_a_writer_setting_that_cannot_work_is_refused_in_a_writer_config(tmp_path, setting):
    name = next(iter(setting))
    with pytest.raises(ValueError, match=name):
        WriterConfig(**setting)
