"""The OpenRLHF, ROLL, SkyRL and prime-rl adapters, called through stand-ins of their hooks."""

from __future__ import annotations

import asyncio

import pytest

from sorl_monitor import MonitorWarning
from sorl_monitor.integrations.trackers import (
    OpenRLHFLogger,
    PrimeRLMonitor,
    RollTracker,
    SkyRLTracking,
    install_openrlhf_logger,
    install_prime_rl_monitor,
)
from sorl_monitor.read.query import open_runs
from tests.helpers import trainer_hooks


@pytest.fixture(autouse=True)
def hooks(monkeypatch):
    trainer_hooks.install(monkeypatch)


def steps(log_dir, columns="*"):
    with open_runs(log_dir) as runs:
        return runs.sql(f"SELECT {columns} FROM steps ORDER BY step").to_pylist()


def test_openrlhf_logger_sits_beside_openrlhfs_own_and_maps_its_names(tmp_path):
    from openrlhf.trainer.ppo_trainer import BasePPOTrainer

    install_openrlhf_logger(BasePPOTrainer, tmp_path, "exp1")
    install_openrlhf_logger(BasePPOTrainer, tmp_path, "exp1")  # once
    trainer = BasePPOTrainer({"tensorboard_dir": "tb"})
    own = trainer.tensorboard_logger.loggers[0]
    for step in (1, 2):
        logs = {
            "policy_loss": 0.1 * step,
            "ppo_clip_ratio": 0.2,
            "kl": 0.01,
            "generated_samples": ["text", 1.0],
        }
        trainer.save_logs_and_checkpoints(step, logs)
    trainer.evaluate(2, {"eval_pass1": 0.5})
    trainer.end_of_fit()
    assert [call[:2] for call in own.calls] == [("train", 1), ("train", 2), ("eval", 2), ("close", None)]
    rows = steps(tmp_path, "step, pg_loss, clip_frac_active, kl_ref")
    assert rows == [
        {"step": 1, "pg_loss": 0.1, "clip_frac_active": 0.2, "kl_ref": 0.01},
        {"step": 2, "pg_loss": 0.2, "clip_frac_active": 0.2, "kl_ref": 0.01},
    ]


def test_openrlhf_logger_also_fills_an_empty_slot(tmp_path):
    from openrlhf.trainer.ppo_trainer import BasePPOTrainer

    install_openrlhf_logger(BasePPOTrainer, tmp_path, "no-tb")
    trainer = BasePPOTrainer({})
    trainer.save_logs_and_checkpoints(1, {"policy_loss": 0.5})
    trainer.end_of_fit()
    assert steps(tmp_path, "step, pg_loss") == [{"step": 1, "pg_loss": 0.5}]


def test_roll_tracker_is_built_by_rolls_registry_and_strips_reducer_tags(tmp_path):
    from roll.utils.tracking import create_tracker, tracker_registry

    tracker_registry["sorl"] = RollTracker
    tracker = create_tracker("sorl", {"exp_name": "e"}, log_dir=tmp_path, run_name="roll")
    tracker.log(values={"actor/pg_loss@sum": 0.3, "critic/score/mean": 1.0, "system/step": 1}, step=1)
    tracker.log(values={"actor/pg_loss@sum": 0.2}, step=2)
    tracker.finish()
    assert steps(tmp_path, "step, actor_pg_loss, critic_score_mean") == [
        {"step": 1, "actor_pg_loss": 0.3, "critic_score_mean": 1.0},
        {"step": 2, "actor_pg_loss": 0.2, "critic_score_mean": None},
    ]


def test_skyrl_tracking_merges_a_steps_dicts_into_the_committed_row_and_forwards_the_rest(tmp_path):
    tracking = SkyRLTracking(trainer_hooks.RecordingLogger(), tmp_path, "sky")
    tracking.log({"policy/loss": 1.0}, step=1, commit=False)
    tracking.log({"timing/step": 2.0}, step=1, commit=True)
    tracking.log({"policy/loss": 0.5}, step=2, commit=True)
    tracking.log_train(3, {})  # an attribute of SkyRL's own Tracking, forwarded
    tracking.finish()
    assert steps(tmp_path, "step, policy_loss, timing_step") == [
        {"step": 1, "policy_loss": 1.0, "timing_step": 2.0},
        {"step": 2, "policy_loss": 0.5, "timing_step": None},
    ]
    assert [call[0] for call in tracking.tracking.calls] == ["log", "log", "log", "train", "close"]


def test_prime_rl_monitor_is_registered_by_setup_and_writes_one_row_per_step(tmp_path, monkeypatch):
    from prime_rl import monitors

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("DP_RANK", raising=False)
    install_prime_rl_monitor(monitors, tmp_path, "prime")

    async def train() -> None:
        await monitors.setup(output_dir=tmp_path, run_config={"lr": 1e-6})
        for step in (1, 2):
            await monitors.log({"optim/grad_norm": 0.5 * step, "optim/lr": 1e-6}, step=step)
            await monitors.log({"entropy/all/mean": 2.0, "mismatch_kl/all/mean": 0.01}, step=step)
            await monitors.log(["an episode"], step, "train", "effective")
        await monitors.finalize()

    asyncio.run(train())
    assert steps(tmp_path, "step, grad_norm, lr, entropy, kl_old_k3") == [
        {"step": 1, "grad_norm": 0.5, "lr": 1e-6, "entropy": 2.0, "kl_old_k3": 0.01},
        {"step": 2, "grad_norm": 1.0, "lr": 1e-6, "entropy": 2.0, "kl_old_k3": 0.01},
    ]


def test_prime_rl_monitor_is_added_on_rank_0_only(tmp_path, monkeypatch):
    from prime_rl import monitors

    monkeypatch.setenv("RANK", "1")
    install_prime_rl_monitor(monitors, tmp_path, "prime")
    asyncio.run(monitors.setup(output_dir=tmp_path))
    assert monitors.MONITORS == []


@pytest.mark.parametrize("adapter", [OpenRLHFLogger, RollTracker, PrimeRLMonitor])
def test_a_failing_monitor_warns_once_and_never_raises(tmp_path, adapter):
    run = (
        adapter(log_dir=tmp_path, run_name="broken")
        if adapter is not RollTracker
        else adapter(None, tmp_path, "broken")
    )
    run.monitor.log_scalars = None  # every write now fails inside the adapter
    with pytest.warns(MonitorWarning, match="cannot log") as warned:
        for step in range(3):
            run.add(step, {"loss": 1.0})
        run.close()
    assert len(warned) == 1
