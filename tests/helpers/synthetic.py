"""SYNTHETIC metric streams for unit tests: a noisy-but-stable run, and one labelled pattern per detector.

These are made-up numbers shaped like a PPO run's ``steps`` rows (not training): they check that
each detector's SQL fires on the pattern it is named after and stays quiet on ordinary noise.

No threshold is written down here: the stable run sits at each signal's floor (or well inside it), and
each pattern moves its signal to twice the level that crosses its detector's threshold as read from
``DetectorConfig()`` (the critical one where it is finite, else the warning), so the patterns follow the
thresholds wherever they are calibrated to.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.diagnose.detectors import DetectorConfig, get_detectors
from sorl_monitor.diagnose.postmortem import postmortem
from sorl_monitor.read.query import open_runs

ONSET = 250
"""Step at which a pattern starts."""

GRAD_LOG_SD = 0.2
"""Spread of ln(grad norm) in the stable run."""


def defaults() -> DetectorConfig:
    return DetectorConfig()


def firing_level(detector: str, config: DetectorConfig | None = None) -> float:
    """The threshold a pattern must cross: ``<detector>_critical`` where finite, else ``<detector>_warning``."""
    config = config or defaults()
    found = get_detectors([detector])[0]
    critical = getattr(config, found.critical_key)
    return critical if math.isfinite(critical) else getattr(config, found.warning_key)


def firing_severity(detector: str, config: DetectorConfig | None = None) -> str:
    """The severity a pattern reaches: ``critical`` where the detector has a finite critical threshold."""
    config = config or defaults()
    return (
        "critical" if math.isfinite(getattr(config, get_detectors([detector])[0].critical_key)) else "warning"
    )


def stable_rows(n: int = 400, seed: int = 0, run_id: str = "synthetic-stable") -> list[dict]:
    """A noisy-but-stable run: clip fraction and truncation at their floors, KL half its floor, small ratio
    tails, slowly falling entropy, steady lengths, and a steadily rising reward."""
    config = defaults()
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
                "clip_frac": config.clip_floor * max(0.0, 1 + 0.25 * rng.standard_normal()),
                "clip_frac_turn": 0.5 * config.clip_floor * max(0.0, 1 + 0.25 * rng.standard_normal()),
                "ratio_p99": 1.3 + 0.05 * abs(rng.standard_normal()),
                "ratio_max": 2.0 * math.exp(0.15 * rng.standard_normal()),
                "turn_ratio_max": 1.3 + 0.1 * abs(rng.standard_normal()),
                "kl_old_k3": 0.5 * config.kl_floor * math.exp(0.3 * rng.standard_normal()),
                "kl_ref_k3": config.kl_floor * (0.5 + progress) * math.exp(0.1 * rng.standard_normal()),
                "grad_norm": math.exp(GRAD_LOG_SD * rng.standard_normal()),
                "entropy": 0.5 - 0.1 * progress + 0.02 * rng.standard_normal(),
                "zero_std_group_frac": float(np.clip(0.1 + 0.05 * rng.standard_normal(), 0, 1)),
                "reward_mean": 0.2 + 0.4 * progress + 0.03 * rng.standard_normal(),
                "reward_std": 0.3 + 0.03 * rng.standard_normal(),
                "response_len_mean": 200.0 * math.exp(0.05 * rng.standard_normal()),
                "completion_truncated_frac": 0.5
                * config.truncation_floor
                * max(0.0, 1 + 0.25 * rng.standard_normal()),
                "loss": 0.1 * rng.standard_normal(),
                "nonfinite_count": 0.0,
            }
        )
    return rows


def _fold(column: str, detector: str, floor: Callable[[DetectorConfig], float]) -> Callable[[dict], None]:
    """The signal at twice its detector's threshold times its quiet level (the stable value, at least its floor)."""

    def apply(row: dict) -> None:
        config = defaults()
        row[column] = 2 * firing_level(detector, config) * max(row[column], floor(config))

    return apply


def _share(column: str, detector: str, floor: Callable[[DetectorConfig], float]) -> Callable[[dict], None]:
    """``_fold`` for a share (at most 1)."""
    fold = _fold(column, detector, floor)

    def apply(row: dict) -> None:
        fold(row)
        row[column] = min(1.0, row[column])

    return apply


def _fall_below(column: str, detector: str) -> Callable[[dict], None]:
    """The signal falls to (1 − threshold) / 2 of its level: a drop of more than its detector's threshold."""

    def apply(row: dict) -> None:
        row[column] *= (1 - firing_level(detector)) / 2

    return apply


def _declining_reward(row: dict) -> None:
    row["reward_mean"] = max(0.05, 1 - 0.03 * (row["step"] - ONSET)) * row["reward_mean"]


def _ratio_tail(row: dict) -> None:
    row["ratio_p99"] = row["ratio_p99"] ** (2 * firing_level("ratio_tail_rise"))


def grad_spike() -> float:
    """A grad norm twice as many spreads of ln(grad norm) above the stable run's as grad_norm_spike needs."""
    spread = max(GRAD_LOG_SD, defaults().grad_min_log_spread)
    return math.exp(2 * firing_level("grad_norm_spike") * spread)


def _grad_spike(row: dict) -> None:
    if row["step"] == ONSET:
        row["grad_norm"] = grad_spike()


def _echo(row: dict) -> None:
    _declining_reward(row)
    row["zero_std_group_frac"] = 1.0  # every group's rewards are identical


def _reward_std(row: dict) -> None:
    _declining_reward(row)
    _fall_below("reward_std", "reward_std_collapse")(row)


def _nan_loss(row: dict) -> None:
    row["loss"] = float("nan")


def _answers_shrink(row: dict) -> None:
    _declining_reward(row)
    _fall_below("response_len_mean", "length_collapse")(row)


def _reward_hacked(row: dict) -> None:
    """The optimized reward keeps climbing (from its level before ``ONSET``) while the score falls."""
    row["reward_optimized_mean"] = 0.2 + 0.4 * row["step"] / 400 + 0.002 * (row["step"] - ONSET)
    _declining_reward(row)


def _kl_runaway(row: dict) -> None:
    config = defaults()
    _fold("kl_ref_k3", "kl_runaway", lambda c: c.kl_floor)(row)
    row["completion_truncated_frac"] = min(1.0, 2 * config.runaway_truncation_rise * config.truncation_floor)


PATTERNS: dict[str, Callable[[dict], None]] = {
    "clip_rise": _share("clip_frac", "clip_rise", lambda c: c.clip_floor),
    "turn_clip_rise": _share("clip_frac_turn", "turn_clip_rise", lambda c: c.clip_floor),
    "kl_rise": _fold("kl_old_k3", "kl_rise", lambda c: c.kl_floor),
    "kl_ref_rise": _fold("kl_ref_k3", "kl_ref_rise", lambda c: c.kl_floor),
    "ratio_tail_rise": _ratio_tail,
    "entropy_rise": _fold("entropy", "entropy_rise", lambda c: c.entropy_floor),
    "entropy_collapse": _fall_below("entropy", "entropy_collapse"),
    "grad_norm_spike": _grad_spike,
    "echo_trap": _echo,
    "reward_std_collapse": _reward_std,
    "length_rise": _fold("response_len_mean", "length_rise", lambda c: 1.0),
    "truncation_rise": _share("completion_truncated_frac", "truncation_rise", lambda c: c.truncation_floor),
    "reward_drop": _fall_below("reward_mean", "reward_drop"),
    "length_collapse": _answers_shrink,
    "reward_hacking": _reward_hacked,
    "kl_runaway": _kl_runaway,
    "nonfinite": _nan_loss,
}

RISING = ("clip_rise", "kl_rise", "entropy_rise", "length_rise", "reward_std_collapse")
"""One detector of each of five families (ratio, kl, entropy, length, reward variance), in the order
``families_rising`` raises them."""


def _above_warning(
    column: str, detector: str, floor: Callable[[DetectorConfig], float]
) -> Callable[[dict], None]:
    """The signal at 1.5 × its detector's warning level times its quiet level: out of its quiet level, under its
    critical bar (each detector of ``RISING`` has its critical above 1.5 × its warning, or none)."""

    def apply(row: dict) -> None:
        config = defaults()
        row[column] = 1.5 * getattr(config, f"{detector}_warning") * max(row[column], floor(config))

    return apply


def _reward_std_dying(row: dict) -> None:
    _declining_reward(row)
    row["reward_std"] *= (1 - defaults().reward_std_collapse_warning) / 2


RISING_PATTERNS: dict[str, Callable[[dict], None]] = {
    "clip_rise": _above_warning("clip_frac", "clip_rise", lambda c: c.clip_floor),
    "kl_rise": _above_warning("kl_old_k3", "kl_rise", lambda c: c.kl_floor),
    "entropy_rise": _above_warning("entropy", "entropy_rise", lambda c: c.entropy_floor),
    "length_rise": _above_warning("response_len_mean", "length_rise", lambda c: 1.0),
    "reward_std_collapse": _reward_std_dying,
}
"""How ``families_rising`` moves each family: above its warning level, below its critical one."""


def _families(count: int) -> Callable[[dict], None]:
    """The first ``count`` of ``RISING_PATTERNS`` at once: that many families leave their quiet levels together."""

    def apply(row: dict) -> None:
        for name in RISING[:count]:
            RISING_PATTERNS[name](row)

    return apply


PATTERNS["diverging"] = lambda row: _families(int(firing_level("diverging")) + 1)(row)
"""Each detector's SYNTHETIC pattern, applied to every row from ``ONSET`` on (``diverging``: one family more
than its threshold counts)."""


def families_rising(count: int, n: int = 400, seed: int = 0) -> list[dict]:
    """SYNTHETIC: the stable run with ``count`` families (``RISING``) leaving their quiet levels from ``ONSET``."""
    rows = stable_rows(n, seed, run_id=f"synthetic-{count}-families")
    for row in rows[ONSET:]:
        _families(count)(row)
    return rows


def pattern_rows(detector: str, n: int = 400, seed: int = 0) -> list[dict]:
    """The stable run with ``detector``'s pattern from step ``ONSET`` on."""
    rows = stable_rows(n, seed, run_id=f"synthetic-{detector}")
    for row in rows[ONSET:]:
        PATTERNS[detector](row)
    return rows


def collapse_reward(rows: list[dict], at: int, until: int | None = None, to: float = 0.05) -> list[dict]:
    """SYNTHETIC collapse: the reward falls to ``to`` from step ``at`` (back to normal from ``until``)."""
    for row in rows:
        if row["step"] >= at and (until is None or row["step"] < until):
            row["reward_mean"] = to
    return rows


def every(rows: list[dict], interval: int) -> list[dict]:
    """The rows a trainer logging every ``interval`` steps would keep (steps 0, interval, 2·interval, …)."""
    return [row for row in rows if row["step"] % interval == 0]


def as_table(rows: list[dict]) -> pa.Table:
    """Rows as a table with every key any row has (a pattern may add a column from its onset on)."""
    names = list(dict.fromkeys(name for row in rows for name in row))
    return pa.table({name: [row.get(name) for row in rows] for name in names})


KEYS = ("run_id", "rank", "step", "iteration", "ppo_epoch", "minibatch", "policy_lag")


def write_rows(log_dir: Path, run_name: str, rows: list[dict], algorithm: str = "ppo") -> Path:
    """Log SYNTHETIC ``rows`` (keys + metrics) through the real ``Monitor.log_scalars``; the run folder."""
    with Monitor(log_dir, run_name, algorithm=algorithm, writer=WriterConfig(flush_interval_s=0.05)) as mon:
        for row in rows:
            mon.log_scalars(
                row["step"], {k: v for k, v in row.items() if k not in KEYS}, iteration=row["iteration"],
                ppo_epoch=row["ppo_epoch"], minibatch=row["minibatch"], policy_lag=row["policy_lag"],
                names=None,
            )  # fmt: skip
    return Path(log_dir) / run_name


def verdict_of(tmp_path, rows, algorithm="ppo", config=None):
    """The post-mortem verdict of SYNTHETIC ``rows`` written as one run."""
    run = write_rows(tmp_path, rows[0]["run_id"], rows, algorithm)
    with open_runs(run) as runs:
        return postmortem(runs, rows[0]["run_id"], config)
