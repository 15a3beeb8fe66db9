"""The detectors' settings: windows, floors and thresholds (``DetectorConfig``), from TOML and ``--set``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sorl_monitor.settings import check_settings, parse_assignments, read_toml, replace_settings


@dataclass(frozen=True)
class DetectorConfig:
    """Windows, floors and thresholds of the detectors (the post-mortem's own: ``postmortem.PostmortemConfig``).

    ``<detector>_warning`` raises a warning, ``<detector>_critical`` a critical alert; ``inf`` (TOML:
    ``inf``) silences that level. Windows count optimizer steps (the ``step`` column), not rows.
    """

    # ---- time (optimizer steps)
    smooth_steps: int = 8
    """Longest block: every signal is averaged over blocks of at most this many steps, and each detector judges
    each block (a block still being written, on its rows so far)."""
    smooth_growth_steps: int = 32
    """Blocks grow with the run (its own clock): a block at step ``s`` spans ``2^⌊log2(s / smooth_growth_steps)⌋``
    steps (at least 1, at most ``smooth_steps``): single steps before step 64, 8 steps from step 256. A block
    never holds less than one logged row, so a short log is judged row by row; 1 = ``smooth_steps`` from the start."""
    history_steps: int = 256
    """Look-back of every baseline: the quiet level, running peaks, robust z-scores (a short run: all of it)."""
    min_history_steps: int = 4
    """A baseline must span this many steps before a detector that uses it may fire…"""
    min_history_blocks: int = 2
    """…and hold this many blocks with logged rows: a baseline is counted in logged rows, not steps."""

    # ---- floors: the smallest quiet level a fold divides by, in each signal's natural unit
    clip_floor: float = 0.02
    """Share of tokens (token and turn clip fractions): changes below 2% of tokens are noise."""
    kl_floor: float = 0.02
    """Nats per token: about the k3 KL of a ratio at the trust-region edge (1.2 − 1 − ln 1.2 = 0.018)."""
    entropy_floor: float = 0.01
    """Nats per token."""
    truncation_floor: float = 0.05
    """Share of completions that hit the length limit."""
    grad_min_log_spread: float = 0.25
    """grad_norm_spike: the spread (std) of ln(grad norm) is floored here (a run whose grad norm barely
    moves would otherwise turn a 30% bump into a spike)."""

    # ---- clip_rise: token clip fraction ÷ its quiet level
    clip_rise_warning: float = 3.0
    clip_rise_critical: float = 5.0
    """Fitted on the bundled trainer's corpus (experiments/detector_eval.py), as are the next two criticals."""
    # ---- turn_clip_rise: share of turns with w̄_k outside the trust region ÷ its quiet level
    turn_clip_rise_warning: float = 4.0
    turn_clip_rise_critical: float = 10.0
    # ---- kl_rise: KL to the behaviour policy ÷ its quiet level
    kl_rise_warning: float = 5.0
    kl_rise_critical: float = math.inf
    """Off: on the corpus no KL threshold up to 100× added a detection without false alarms (it still warns,
    trips the CTN guard and counts for the root cause)."""
    # ---- kl_ref_rise: KL to the reference policy ÷ its quiet level (drifting from the reference is the point
    # of fine-tuning, so it only warns)
    kl_ref_rise_warning: float = 10.0
    kl_ref_rise_critical: float = math.inf
    # ---- ratio_tail_rise: ln(token ratio p99) ÷ its quiet level (floored at ln 1.2, the trust region's edge)
    ratio_tail_rise_warning: float = 4.0
    ratio_tail_rise_critical: float = math.inf
    # ---- entropy_rise: entropy ÷ its quiet level; entropy_collapse: 1 − entropy ÷ its high level
    entropy_rise_warning: float = 3.0
    entropy_rise_critical: float = 16.0
    """Four doublings above the run's own low. On the real dev set (experiments/real_fit.py) 8× alarmed two
    healthy hand-written loops whose per-step entropy is noisy (14×, 12×); 16× alarms none and keeps the shared 9B
    collapse (32×) flagged before its fall; no level there flags a collapse in time that the rest of the verdict
    misses. The corpus has no entropy-driven collapse (docs/detectors.md)."""
    entropy_collapse_warning: float = 0.8
    entropy_collapse_critical: float = math.inf
    """A learning policy lowers its entropy; a collapse of it is a warning sign, not proof."""
    # ---- grad_norm_spike: robust z of ln(grad norm) over the history (exact zeros are no-gradient batches, skipped)
    grad_norm_spike_warning: float = 6.0
    grad_norm_spike_critical: float = math.inf
    """Off: with stale rollouts healthy runs spike routinely (docs/detectors.md)."""
    # ---- echo_trap / reward_std_collapse: reward variance dying while the reward is below its peak
    echo_below_peak: float = 0.9
    """Echo-Trap signals count only while the reward moving average is below this share of its running peak."""
    echo_trap_rise: float = 0.3
    echo_trap_warning: float = 0.5
    echo_trap_critical: float = math.inf
    reward_std_collapse_warning: float = 0.8
    reward_std_collapse_critical: float = math.inf
    # ---- length_rise, truncation_rise: completions growing / hitting the length limit
    length_rise_warning: float = 2.0
    length_rise_critical: float = math.inf
    truncation_rise_warning: float = 3.0
    truncation_rise_critical: float = math.inf
    # ---- length_collapse: 1 − response length ÷ its high level (answers shrinking to a few tokens)
    length_collapse_warning: float = 0.7
    length_collapse_critical: float = math.inf
    """Off: fitted on the real dev set (experiments/real_fit.py), a tenth of the longest answer also alarmed a
    healthy multiple-choice run whose answers shrank to its letter (it warns, and names the root cause)."""
    # ---- reward_hacking: the score falls while the reward the trainer optimizes holds
    reward_hacking_warning: float = 0.3
    reward_hacking_critical: float = 0.5
    """The score has lost half its scale above its floor while the optimized reward stays in the top quarter of
    its range (kept by the real dev set's fit: no healthy run passes it there, docs/detectors.md)."""
    hacking_reward_high: float = 0.75
    """reward_hacking counts only while the optimized reward is at least this far up its range over the history."""
    # ---- kl_runaway: KL to the reference accelerating while completions lengthen or hit the length limit
    kl_runaway_warning: float = 3.0
    kl_runaway_critical: float = math.inf
    """Off: on the real dev set its one run with this pattern is healthy (KL spikes to 197 while completions grow
    3×, ../shared/real_logs/more/samyakshrestha…), and it holds no diverging run to fit a level on. A level set
    here makes the verdict ``diverging`` where it is critical at the log's end (docs/detectors.md)."""
    runaway_truncation_rise: float = 2.0
    runaway_length_rise: float = 1.5
    """kl_runaway counts only while truncation is this many times its quiet level, or lengths this many times."""
    # ---- reward_drop: 1 − the block's mean reward ÷ its running peak
    reward_ma_steps: int = 32
    """reward_drop judges the reward's moving average over this many steps once blocks span ``smooth_steps`` (early
    in a run, in proportion to its shorter blocks), as the collapse label does: a noisy row is not a drop."""
    reward_drop_warning: float = 0.25
    reward_drop_critical: float = math.inf
    """Off: the collapse label is defined on the same series, so it would measure itself."""
    # ---- nonfinite: NaN/Inf inputs counted by the monitor plus non-finite loss, grad norm, KL, ratio, entropy
    nonfinite_warning: float = 0.0
    nonfinite_critical: float = 0.0
    # ---- diverging: how many independent families (DIVERGING_FAMILIES) are above their quiet levels together,
    # each family counted when one of its detectors passes its own warning level in the block
    diverging_warning: float = 2.0
    """Warns from 3 families together."""
    diverging_critical: float = 3.0
    """Critical from 4 families together (calibrated on the corpus, docs/detectors.md)."""

    def __post_init__(self) -> None:
        check_settings(self, "detector setting")

    @property
    def smooth_full_step(self) -> int:
        """The first step from which blocks span ``smooth_steps`` (before it they are shorter)."""
        return self.smooth_growth_steps * (1 << max(0, (self.smooth_steps - 1).bit_length()))

    def block_start(self, step: int, reused: bool = False) -> int:
        """The first step of the block ``step`` falls in (``block_start_sql`` in Python; ``reused``: see ``REUSED``)."""
        if reused:
            return self.smooth_steps * (step // self.smooth_steps)
        if step >= self.smooth_full_step:
            return max(self.smooth_full_step, self.smooth_steps * (step // self.smooth_steps))
        size = 1 << max(0, max(step // self.smooth_growth_steps, 1).bit_length() - 1)
        return size * (step // size)

    @property
    def lookback_steps(self) -> int:
        """Steps of history any detector reads: a live window this long gives the offline answer."""
        return self.history_steps + 2 * self.smooth_steps

    def replace(self, **changes: Any) -> DetectorConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def config_from_mapping(values: Mapping[str, Any], base: DetectorConfig | None = None) -> DetectorConfig:
    """``base`` (default: the defaults) with ``values`` applied (TOML values or ``--set`` text); ``ValueError``
    names an unknown key."""
    return replace_settings(base or DetectorConfig(), values, "detector setting")


def load_config(toml_path: str | Path | None = None, overrides: Iterable[str] = ()) -> DetectorConfig:
    """Defaults, then the TOML file's detector settings (top level or a ``[detectors]`` table), then
    ``name=value``s; any other name is an error. A file that also holds the post-mortem's settings is read
    by ``postmortem.load_configs``, which gives each name to the dataclass that has it."""
    config = DetectorConfig()
    if toml_path is not None:
        config = config_from_mapping(read_toml(toml_path, "detectors"), config)
    return config_from_mapping(parse_assignments(overrides), config)
