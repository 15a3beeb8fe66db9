"""SYNTHETIC metric streams for unit tests: a noisy-but-stable run, and one labelled pattern per detector.

These are made-up numbers shaped like a PPO run's ``steps`` rows (not training): they check that
each detector's SQL fires on the pattern it is named after and stays quiet on ordinary noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from sorl_monitor import Monitor

ONSET = 250
"""Step at which a pattern starts."""


def stable_rows(n: int = 400, seed: int = 0, run_id: str = "synthetic-stable") -> list[dict]:
    """A noisy-but-stable run: clip fraction ~0.1, small ratio tails, KL ~0.01, steadily rising reward."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(n):
        progress = step / n
        rows.append(
            {
                "run_id": run_id,
                "rank": 0,
                "step": step,
                "iteration": step // 4,
                "ppo_epoch": step % 4 // 2,
                "minibatch": step % 2,
                "policy_lag": step % 4,
                "clip_frac": float(np.clip(0.1 + 0.03 * rng.standard_normal(), 0, 1)),
                "clip_frac_turn": float(np.clip(0.05 + 0.02 * rng.standard_normal(), 0, 1)),
                "ratio_p99": 1.3 + 0.05 * abs(rng.standard_normal()),
                "ratio_max": 2.0 * math.exp(0.15 * rng.standard_normal()),
                "turn_ratio_max": 1.3 + 0.1 * abs(rng.standard_normal()),
                "kl_old_k3": 0.01 * math.exp(0.3 * rng.standard_normal()),
                "grad_norm": 1.0 * math.exp(0.2 * rng.standard_normal()),
                "entropy": 1.5 - 0.2 * progress + 0.05 * rng.standard_normal(),
                "zero_std_group_frac": float(np.clip(0.1 + 0.05 * rng.standard_normal(), 0, 1)),
                "reward_mean": 0.2 + 0.4 * progress + 0.03 * rng.standard_normal(),
                "reward_std": 0.3 + 0.03 * rng.standard_normal(),
                "loss": 0.1 * rng.standard_normal(),
                "nonfinite_count": 0.0,
            }
        )
    return rows


def _set(column: str, value: Callable[[int], float]) -> Callable[[dict], None]:
    def apply(row: dict) -> None:
        row[column] = value(row["step"] - ONSET)

    return apply


def _declining_reward(row: dict) -> None:
    row["reward_mean"] = max(0.05, row["reward_mean"] * (1 - 0.03 * (row["step"] - ONSET)))


def _echo(row: dict) -> None:
    _declining_reward(row)
    row["zero_std_group_frac"] = 0.95


def _reward_std(row: dict) -> None:
    _declining_reward(row)
    row["reward_std"] = 0.02


PATTERNS: dict[str, Callable[[dict], None]] = {
    "clip_frac_level": _set("clip_frac", lambda t: 0.6),
    "clip_frac_trend": _set("clip_frac", lambda t: min(0.1 + 0.02 * t, 0.45)),
    "turn_ratio_tail": _set("clip_frac_turn", lambda t: 0.5),
    "turn_ratio_max": _set("turn_ratio_max", lambda t: 6.0),
    "token_ratio_p99": _set("ratio_p99", lambda t: 8.0),
    "token_ratio_max": _set("ratio_max", lambda t: 200.0),
    "kl_spike": _set("kl_old_k3", lambda t: 0.5),
    "grad_norm_spike": _set("grad_norm", lambda t: 30.0 if t == 0 else 1.0),
    "entropy_collapse": _set("entropy", lambda t: 0.3),
    "entropy_rise": _set("entropy", lambda t: 4.5),
    "echo_trap": _echo,
    "reward_std_collapse": _reward_std,
    "reward_drop": _set("reward_mean", lambda t: 0.2),
    "nonfinite": _set("loss", lambda t: float("nan")),
}
"""Each detector's pattern, applied to every row from ``ONSET`` on."""


def pattern_rows(detector: str, n: int = 400, seed: int = 0) -> list[dict]:
    """The stable run with ``detector``'s pattern from step ``ONSET`` on."""
    rows = stable_rows(n, seed, run_id=f"synthetic-{detector}")
    for row in rows[ONSET:]:
        PATTERNS[detector](row)
    return rows


def as_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows)


KEYS = ("run_id", "rank", "step", "iteration", "ppo_epoch", "minibatch", "policy_lag")


def write_rows(log_dir: Path, run_name: str, rows: list[dict], algorithm: str = "ppo") -> Path:
    """Log SYNTHETIC ``rows`` (keys + metrics) through the real ``Monitor.log_scalars``; the run folder."""
    with Monitor(log_dir, run_name, algorithm=algorithm, flush_interval_s=0.05) as mon:
        for row in rows:
            mon.log_scalars(
                row["step"], {k: v for k, v in row.items() if k not in KEYS}, iteration=row["iteration"],
                ppo_epoch=row["ppo_epoch"], minibatch=row["minibatch"], policy_lag=row["policy_lag"],
            )  # fmt: skip
    return Path(log_dir) / run_name
