"""The post-mortem's settings (``PostmortemConfig``), and reading them with the detectors' from one TOML file."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sorl_monitor.diagnose.detectors.config import DetectorConfig, config_from_mapping
from sorl_monitor.settings import check_settings, parse_assignments, read_toml, replace_settings


@dataclass(frozen=True)
class PostmortemConfig:
    """The collapse label's and the root cause's settings (the detectors' own: ``DetectorConfig``).

    Windows count optimizer steps; the rules that use the thresholds: docs/detectors.md ("Collapse label, verdict,
    root cause").
    """

    # ---- collapse label (evaluation, not an alert)
    collapse_ma_steps: int = 32
    """Reward moving average of the collapse label, over this many steps once the detectors' blocks span
    ``smooth_steps``; early in a run, in proportion to its shorter blocks (4 steps while they span one)."""
    collapse_fraction: float = 0.5
    """Collapse: the reward moving average falls below this share of its running peak…"""
    collapse_recovery_steps: int = 64
    """…and is not back above it within this many steps (or the loss turns non-finite)…"""
    collapse_min_tail_steps: int = 16
    """…or the log ends below it at least this many steps after the drop ("the log ends collapsed")."""
    collapse_min_peak: float = 0.0
    """The running peak must exceed this for a drop to count (rewards near zero are noise)."""
    peak_band: float = 0.1
    """The moving average is *at its peak* within this share of its running peak: a fall starts where it leaves
    this band for the last time before the collapse, and a dip ends where it comes back into it."""
    end_detectors: tuple[str, ...] = (
        "entropy_rise", "entropy_collapse", "length_collapse", "reward_hacking", "nonfinite"
    )  # fmt: skip
    """Critical alerts of these in the log's last ``end_blocks`` blocks mean it ends in a collapse under way (the
    policy turning random or deterministic, answers shrinking to nothing, the score falling while the optimized
    reward climbs, non-finite values); KL and length blowing up count through ``diverging``."""
    end_blocks: int = 2
    """The end of a log: its last this many blocks. A log whose reward moving average ends below
    ``collapse_fraction`` of its peak, or with an ``end_detectors`` critical alert in them, is ``collapsing`` (not yet a confirmed
    collapse); with ``diverging`` critical there and the reward still up, ``diverging``."""
    # ---- root cause
    root_cause_steps: int = 128
    """The post-mortem's evidence window: this many steps up to the collapse (or the run's end)."""
    turn_ratio_eps: float = 0.2
    """ε of the post-mortem's turn-tail evidence: share of turns with |w̄_k − 1| > ε."""
    mismatch_clip_ratio: float = 2.0
    """Granularity mismatch: token clip fraction at least this many times the turn clip fraction…"""
    mismatch_min_clip: float = 0.1
    """…and at least this high (a tenth of the tokens outside the trust region)…"""
    mismatch_tail_ratio: float = 2.0
    """…or token-ratio tail (log p99) at least this many times as wide as the turn-ratio tail."""
    off_policy_min_slope: float = 0.02
    """Off-policy variance: clip fraction grows by at least this per update of policy lag in the window…"""
    off_policy_growth: float = 2.0
    """…and at least this many times as fast as over the run's first root_cause_steps steps."""
    off_policy_min_lag: int = 8
    """Or stale / reused rollouts (the behaviour policy at least this many updates old in the window)…"""
    off_policy_clip_growth: float = 1.5
    """…whose token clip fraction grew to this many times its level over the run's first root_cause_steps steps."""
    degenerate_length_rise: float = 1.25
    """Entropy blow-up with degenerate generations: completions grew to this many times their early length…"""
    degenerate_truncation: float = 0.5
    """…or at least this share of them hits the length limit."""
    turn_level_algorithms: tuple[str, ...] = ("turn_ppo", "st_ppo", "so_ppo", "so_grpo")
    """Algorithms that already use turn-level IS: granularity mismatch is not blamed on them."""

    def __post_init__(self) -> None:
        check_settings(self, "post-mortem setting")

    def replace(self, **changes: Any) -> PostmortemConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_configs(
    toml_path: str | Path | None = None, overrides: Iterable[str] = ()
) -> tuple[DetectorConfig, PostmortemConfig]:
    """The detectors' and the post-mortem's settings: defaults, then the TOML file (top level or a
    ``[detectors]`` table), then ``name=value``s; each name goes to the dataclass that has it."""
    detectors, settings = DetectorConfig(), PostmortemConfig()
    own = PostmortemConfig.__dataclass_fields__
    known = sorted({*DetectorConfig.__dataclass_fields__, *own})
    for values in (
        _without_log_tables(read_toml(toml_path, "detectors")) if toml_path is not None else {},
        parse_assignments(overrides),
    ):
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"unknown detector setting {unknown[0]!r}; known settings: {', '.join(known)}")
        detectors = config_from_mapping({k: v for k, v in values.items() if k not in own}, detectors)
        settings = replace_settings(
            settings, {k: v for k, v in values.items() if k in own}, "post-mortem setting"
        )
    return detectors, settings


def _without_log_tables(values: dict) -> dict:
    """A config's top level less the tables the log readers take (``[map]``, ``[logs]``: ``logs.options``)."""
    return {k: v for k, v in values.items() if k not in ("map", "logs")}
