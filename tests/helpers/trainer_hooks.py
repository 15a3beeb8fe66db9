"""Stand-ins for the logging hooks of OpenRLHF, ROLL, SkyRL and prime-rl (none installs on CPU here).

Each is written from the hook's signature and call pattern as read in the trainer's source (docs/attach.md
names repository and commit): only what the adapters touch, calling them the way the trainer does.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest


class RecordingLogger:
    """A logger of the trainer's own (W&B, TensorBoard, console): keeps what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any]] = []

    def log_train(self, global_step, logs_dict):
        self.calls.append(("train", global_step, dict(logs_dict)))

    def log_eval(self, global_step, logs_dict):
        self.calls.append(("eval", global_step, dict(logs_dict)))

    def log(self, data, step, commit=False):
        self.calls.append(("log", step, dict(data)))

    def close(self):
        self.calls.append(("close", None, None))

    finish = close


class BasePPOTrainer:
    """OpenRLHF's PPO trainer: two logger slots, ``log_train`` at each logged step, ``close`` at the end."""

    def __init__(self, args: dict) -> None:
        self.args = args
        self.wandb_logger = None
        self.tensorboard_logger = RecordingLogger() if args.get("tensorboard_dir") else None

    def save_logs_and_checkpoints(self, global_step: int, logs_dict: dict) -> None:
        if self.wandb_logger:
            self.wandb_logger.log_train(global_step, logs_dict)
        if self.tensorboard_logger:
            self.tensorboard_logger.log_train(global_step, logs_dict)

    def evaluate(self, global_step: int, logs: dict) -> None:
        if self.tensorboard_logger:
            self.tensorboard_logger.log_eval(global_step, logs)

    def end_of_fit(self) -> None:
        if self.tensorboard_logger:
            self.tensorboard_logger.close()


def roll_tracking() -> types.ModuleType:
    """ROLL's tracker registry and ``create_tracker``."""
    module = types.ModuleType("roll.utils.tracking")
    module.tracker_registry = {}

    def create_tracker(tracker_name, config, **kwargs):
        return module.tracker_registry[tracker_name](config, **kwargs)

    module.create_tracker = create_tracker
    return module


class BasePPOExp:
    """SkyRL's experiment: ``get_tracker`` builds the trainer's ``Tracking``."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def get_tracker(self) -> RecordingLogger:
        return RecordingLogger()


def prime_rl_monitors() -> types.ModuleType:
    """prime-rl's monitor registry: ``setup`` registers, ``log``/``finalize`` fan out and never raise."""
    module = types.ModuleType("prime_rl.monitors")
    module.MONITORS = []

    async def setup(wandb=None, prime=None, file=None, *, output_dir, run_config=None, **kwargs):
        assert not module.MONITORS, "Monitors already set up"

    async def log(data, step, kind="train", subset="effective"):
        for monitor in module.MONITORS:
            try:
                await monitor.log(data, step=step, kind=kind, subset=subset)
            except Exception:  # noqa: BLE001 - as prime-rl: a monitor failure is only logged
                pass

    async def finalize():
        for monitor in module.MONITORS:
            await monitor.finalize()

    module.setup, module.log, module.finalize = setup, log, finalize
    return module


def install(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import openrlhf…``, ``roll…``, ``skyrl…``, ``prime_rl…`` give the stand-ins (undone after the test)."""
    ppo_trainer = types.ModuleType("openrlhf.trainer.ppo_trainer")
    ppo_trainer.BasePPOTrainer = type("BasePPOTrainer", (BasePPOTrainer,), {})  # a fresh class per test
    main_base = types.ModuleType("skyrl.train.entrypoints.main_base")
    main_base.BasePPOExp = BasePPOExp
    monitors = prime_rl_monitors()
    prime_rl = types.ModuleType("prime_rl")
    prime_rl.monitors = monitors
    leaves = {
        "openrlhf.trainer.ppo_trainer": ppo_trainer,
        "roll.utils.tracking": roll_tracking(),
        "skyrl.train.entrypoints.main_base": main_base,
        "prime_rl.monitors": monitors,
        "prime_rl": prime_rl,
    }
    for name, module in leaves.items():
        parts = name.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in leaves and parent not in sys.modules:
                monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))
        monkeypatch.setitem(sys.modules, name, module)
