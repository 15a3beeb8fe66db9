"""The bundled trainer at its smallest: a config of a few real updates (seconds on CPU)."""

from __future__ import annotations

from sorl_monitor.trainer.config import TrainConfig
from sorl_monitor.trainer.env import TaskConfig


def tiny(algo: str, log_dir, **kw) -> TrainConfig:
    return TrainConfig(algo=algo, seed=1, iterations=2, episodes=16, group_size=4, epochs=2, minibatches=2,
                       staleness=1, warmstart_steps=5, warmstart_cache=None, log_dir=str(log_dir),
                       run_name=algo, task=TaskConfig(max_hops=2, max_turns=3), **kw)  # fmt: skip
