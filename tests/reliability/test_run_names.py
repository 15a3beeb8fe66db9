"""Run names are folder names: hostile ones are refused, and names like a table's are just names."""

from __future__ import annotations

import pytest
import torch

from sorl_monitor import Monitor, MonitorWarning, WriterConfig
from sorl_monitor.integrations.hf import SorlCallback
from sorl_monitor.integrations.verl import MonitoredPolicyLoss, SorlTracking
from sorl_monitor.read.query import open_runs
from sorl_monitor.schema import TABLES
from tests.helpers.verl_calls import micro_batch
from tests.helpers.verl_reference import ActorConfigStandIn, compute_policy_loss_vanilla


@pytest.mark.parametrize("name", TABLES)
def test_a_run_named_like_a_table_is_found_inside_its_log_folder(tmp_path, name):
    with Monitor(tmp_path, name, writer=WriterConfig(flush_interval_s=0.05)) as mon:
        mon.log_scalars(0, {"loss": 1.0})
    with Monitor(tmp_path, "other", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        mon.log_scalars(0, {"loss": 2.0})
    with open_runs(tmp_path) as runs:
        found = runs.sql("SELECT run_id, loss FROM steps ORDER BY run_id").to_pylist()
    assert found == sorted(
        [{"run_id": name, "loss": 1.0}, {"run_id": "other", "loss": 2.0}], key=lambda r: r["run_id"]
    )


HOSTILE_NAMES = ["../escape", "a/b", "/abs", "..", "", "x" * 200, "run\x00name"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_the_verl_tracking_adapter_refuses_a_hostile_run_name_at_construction(tmp_path, name):
    with pytest.raises(ValueError, match="not allowed"):
        SorlTracking(tmp_path / "runs", name)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_the_verl_loss_wrapper_with_a_hostile_run_name_warns_and_the_update_goes_on(tmp_path, name):
    loss = MonitoredPolicyLoss(compute_policy_loss_vanilla, log_dir=tmp_path / "runs", run_name=name)
    with pytest.warns(MonitorWarning, match="not allowed"):
        value, _ = loss(**micro_batch(0, 10), config=ActorConfigStandIn())
    assert torch.isfinite(value)
    assert not (tmp_path / "escape").exists() and not (tmp_path / "runs").exists()


def test_the_hf_callback_with_a_hostile_run_name_trains_without_monitoring(tmp_path):
    from tests.helpers.hf_trainer import make_trainer

    trainer = make_trainer(
        tmp_path, SorlCallback(log_dir=str(tmp_path / "runs"), run_name="../escape"), max_steps=2
    )
    with pytest.warns(MonitorWarning, match="monitoring is off"):
        trainer.train()
    assert trainer.state.global_step == 2 and not (tmp_path / "escape").exists()
