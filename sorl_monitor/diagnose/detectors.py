"""Collapse-precursor detectors: one named SQL definition each, run offline and live alike (docs/detectors.md).

Each ``Detector`` computes one number per logged step (``value``) with DuckDB window functions over
the ``steps`` rows of a run; an alert is raised where ``value > <name>_warning`` (severity
``warning``) or ``value > <name>_critical`` (severity ``critical``). The same SQL runs

* offline over a ``RunSet`` (the Parquet files of finished or live runs, or a foreign trainer's log), and
* live over an in-memory Arrow table of recent ``steps`` rows (``Monitor.recent_steps()``), which
  DuckDB reads without a copy — what the trainer's CTN guard (``sorl_monitor.remedy.ctn_guard``) does,

so a guard and a post-mortem never disagree.

Time is counted in optimizer steps, not rows: every window is a ``RANGE`` over ``step``, so a run
logged every step and the same run logged every 5 steps see the same windows, and gaps are gaps.
Each signal is judged against the run's own history, never against a fixed scale: a *fold*
detector divides the signal's smoothed level by its quiet level (its running low over the previous
``history_steps`` steps), floored at a small value in the signal's natural unit (the KL at the
trust-region edge, a share of tokens), so a toy at clip fraction 0.15 and a 7B run at 0.003 are
judged alike. A window looks back at most ``DetectorConfig.lookback_steps`` steps and never
forward: an alert at step ``s`` depends only on rows ``≤ s``.

    alerts = detect(open_runs("runs/"), DetectorConfig(kl_rise_critical=20))
    # run_id, step, detector, severity, value, threshold, message  (one row per firing)

Thresholds live in ``DetectorConfig`` (``load_config`` reads a TOML file, ``--set name=value``
overrides; the post-mortem's own settings are ``postmortem.PostmortemConfig``). The critical thresholds of
the fold detectors are the ones ``experiments/detector_eval.py`` fits on the bundled trainer's corpus (scored
leave-one-setting-out); see docs/detectors.md.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from sorl_monitor.read.query import RunSet
from sorl_monitor.settings import check_settings, parse_assignments, read_toml, replace_settings
from sorl_monitor.warn import warn

ALERT_COLUMNS = pa.schema(
    [
        pa.field("run_id", pa.string()),
        pa.field("step", pa.int64()),
        pa.field("detector", pa.string()),
        pa.field("severity", pa.string()),
        pa.field("value", pa.float64()),
        pa.field("threshold", pa.float64()),
        pa.field("message", pa.string()),
    ]
)
"""Columns of ``detect``'s result: one row per (run, step, detector) that fired."""


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
        """The first step of the block ``step`` falls in (``block_sql`` in Python; ``reused``: see ``REUSED``)."""
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


# --------------------------------------------------------------------------------------- loading
OLD_NAMES = {
    f"{name.removesuffix('_critical')}_severe": name
    for name in DetectorConfig.__dataclass_fields__
    if name.endswith("_critical")
}
"""``<detector>_severe``, the critical thresholds' old names, read as ``<detector>_critical`` with a note. Not
``clip_frac_severe``: an absolute clip fraction, where ``clip_rise_critical`` is a multiple of the quiet level."""


def current_names(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with each old name (``OLD_NAMES``) replaced by its new one, and a deprecation note for it."""
    renamed = {OLD_NAMES.get(name, name): value for name, value in values.items()}
    for old in sorted(set(values) & set(OLD_NAMES)):
        if OLD_NAMES[old] in values:
            raise ValueError(
                f"detector setting {OLD_NAMES[old]} is given twice: also as {old} (its old name)"
            )
        warn(f"detector setting {old} is deprecated: read as {OLD_NAMES[old]}", 3, FutureWarning)
    return renamed


def config_from_mapping(values: Mapping[str, Any], base: DetectorConfig | None = None) -> DetectorConfig:
    """``base`` (default: the defaults) with ``values`` applied (TOML values or ``--set`` text; old names
    allowed, ``current_names``); ``ValueError`` names an unknown key."""
    return replace_settings(base or DetectorConfig(), current_names(values), "detector setting")


def load_config(toml_path: str | Path | None = None, overrides: Iterable[str] = ()) -> DetectorConfig:
    """Defaults, then the TOML file's detector settings (top level or a ``[detectors]`` table), then
    ``name=value``s; any other name is an error. A file that also holds the post-mortem's settings is read
    by ``postmortem.load_configs``, which gives each name to the dataclass that has it."""
    config = DetectorConfig()
    if toml_path is not None:
        config = config_from_mapping(read_toml(toml_path, "detectors"), config)
    return config_from_mapping(parse_assignments(overrides), config)


# --------------------------------------------------------------------------------------- detectors
def _finite(expression: str) -> str:
    return f"CASE WHEN isfinite({expression}) THEN {expression} END"


@dataclass(frozen=True)
class Signal:
    """One quantity a run logs, from whichever of its ``columns`` it has (first non-null wins)."""

    expression: str
    columns: tuple[str, ...]


OPTIONAL_SIGNALS = ("optimized",)
"""Signals only some logs can carry (a task score beside the reward the trainer optimizes): a detector that reads
one is not counted as lacking inputs where the log does not have it."""

NONFINITE_COLUMNS = ("loss", "pg_loss", "grad_norm", "kl_old_k3", "ratio_max", "entropy")

SIGNALS: dict[str, Signal] = {
    "clip": Signal(_finite("coalesce(clip_frac, clip_frac_active)"), ("clip_frac", "clip_frac_active")),
    "turn_clip": Signal(_finite("clip_frac_turn"), ("clip_frac_turn",)),
    "kl_to_old": Signal(
        _finite("nullif(coalesce(kl_old_k3, kl_old_k2, kl_old, abs(kl_old_k1)), 0)"),
        ("kl_old_k3", "kl_old_k2", "kl_old", "kl_old_k1"),
    ),
    "kl_to_ref": Signal(
        _finite("nullif(coalesce(kl_ref_k3, kl_ref_k2, kl_ref, abs(kl_ref_k1)), 0)"),
        ("kl_ref_k3", "kl_ref_k2", "kl_ref", "kl_ref_k1"),
    ),
    "ratio_tail": Signal(_finite("ln(greatest(ratio_p99, 1))"), ("ratio_p99",)),
    "token_entropy": Signal(_finite("entropy"), ("entropy",)),
    "grad_log": Signal(_finite("ln(nullif(grad_norm, 0))"), ("grad_norm",)),
    "zero_std": Signal(_finite("zero_std_group_frac"), ("zero_std_group_frac",)),
    "reward": Signal(_finite("reward_mean"), ("reward_mean",)),
    "optimized": Signal(_finite("reward_optimized_mean"), ("reward_optimized_mean",)),
    "reward_spread": Signal(_finite("reward_std"), ("reward_std",)),
    "length": Signal(
        _finite("coalesce(response_len_mean, completion_len_mean)"),
        ("response_len_mean", "completion_len_mean"),
    ),
    "truncation": Signal(_finite("completion_truncated_frac"), ("completion_truncated_frac",)),
    "nonfinite": Signal(
        "coalesce(nonfinite_count, 0) + "
        + " + ".join(
            f"(CASE WHEN isfinite({c}) OR {c} IS NULL THEN 0 ELSE 1 END)" for c in NONFINITE_COLUMNS
        ),
        ("nonfinite_count", *NONFINITE_COLUMNS),
    ),
}
"""What the detectors read. A signal takes the first non-null of its columns (``clip``: our token clip
fraction, or the share where the clip binds as verl's ``pg_clipfrac`` / TRL's ``clip_ratio/region_mean``
report it; ``kl_to_old``: k3, k2, the trainer's own estimator, |k1|); non-finite values are left out (the
``nonfinite`` detector counts them), and so are exact zeros of the grad norm (no-gradient batches) and
of the KL (an update on its own rollout)."""


def _growing_size_sql(step: str) -> str:
    """SQL: ``2^⌊log2(step / smooth_growth_steps)⌋`` (at least 1), a block's length before ``smooth_full_step``."""
    return f"(1::BIGINT << floor(log2(greatest(({step}) // $smooth_growth_steps, 1)))::BIGINT)"


def block_size_sql(block: str) -> str:
    """SQL: how many steps the block starting at step ``block`` spans (``block_sql``'s stages)."""
    return (
        f"(CASE WHEN ({block}) >= $smooth_full_step THEN $smooth_steps ELSE {_growing_size_sql(block)} END)"
    )


def ma_span_sql(block: str, steps: str) -> str:
    """SQL: a moving average's ``RANGE`` look-back at the block starting at ``block``: ``steps`` once blocks are
    full length, in proportion to the block's length before (4 steps for a one-step block when ``steps`` is 32)."""
    return f"(greatest(1, {steps} * {block_size_sql(block)} // $smooth_steps) - 1)"


SERIES: dict[str, tuple[str, str]] = {
    **{f"{name}_s": (name, f"avg({name})") for name in SIGNALS if name != "grad_log"},
    "grad_log_max": ("grad_log", "max(grad_log)"),
    "reward_ma": (
        "reward",
        "avg(avg(reward)) OVER (PARTITION BY run_id, rank ORDER BY block RANGE BETWEEN "
        + ma_span_sql("block", "$reward_ma_steps")
        + " PRECEDING AND CURRENT ROW)",
    ),
    "nonfinite_n": ("nonfinite", "sum(nonfinite)"),
}
"""What a block keeps of each signal: name → (the signal, its aggregate over the block's rows). ``<signal>_s``
is the block mean (the smoothed signal); ``grad_log_max`` the block's largest ln(grad norm); ``reward_ma`` the
reward's moving average over ``reward_ma_steps`` steps (scaled down with the blocks early in a run, as the collapse
label's)."""


REUSED = """
    SELECT run_id, coalesce(max(greatest(coalesce(ppo_epoch, 0), coalesce(policy_lag, 0))) > 0, false) AS reused
    FROM steps WHERE $run_id::VARCHAR IS NULL OR run_id = $run_id GROUP BY run_id"""
"""SQL, one row per run: ``reused``, the run logs one row per update of reused rollouts (a PPO epoch or a policy
lag above 0). Such a log's rows cycle with each rollout (the clip fraction climbs with each reuse), so its blocks
span ``smooth_steps`` from the start: a block never judges part of a rollout's updates against another part.
(Read over the whole run, or the live window: a property of the trainer's settings, seen from its second update
on.)"""

REUSE_COLUMNS = ("ppo_epoch", "policy_lag")
"""The columns ``REUSED`` reads."""


def block_sql(step: str) -> str:
    """SQL: the first step of the block ``step`` falls in (``DetectorConfig.block_start``; ``reused``, the column
    of ``REUSED``, must be in scope). Blocks grow with the run, doubling from single steps at step
    ``2·smooth_growth_steps`` up to ``smooth_steps`` steps; each stage starts on a multiple of its block length, so
    blocks never overlap and a block's id is a step. A log of reused rollouts' updates has ``smooth_steps`` blocks
    throughout."""
    size = _growing_size_sql(step)
    return (
        f"(CASE WHEN reused THEN $smooth_steps * (({step}) // $smooth_steps)"
        f" WHEN ({step}) >= $smooth_full_step"
        f" THEN greatest($smooth_full_step, $smooth_steps * (({step}) // $smooth_steps))"
        f" ELSE {size} * (({step}) // {size}) END)"
    )


HISTORY_BLOCKS = """count(*) OVER (PARTITION BY run_id, rank ORDER BY block
                    RANGE BETWEEN $history_steps PRECEDING AND CURRENT ROW EXCLUDE CURRENT ROW)"""
"""How many blocks a block's history holds: the blocks of the previous ``history_steps`` steps (a block's id is its
first step), never the current one. (``EXCLUDE CURRENT ROW``: DuckDB evaluates a ``RANGE`` frame ending
``1 PRECEDING`` far slower.)"""

HISTORY_WINDOW = """
    history AS (PARTITION BY run_id, rank ORDER BY block ROWS BETWEEN history_blocks PRECEDING AND 1 PRECEDING)"""
"""Detector values may use ``OVER history``: the ``history_blocks`` blocks before this one (``HISTORY_BLOCKS``:
those of the previous ``history_steps`` steps, never the current one). The same rows as the ``RANGE`` frame that
counts them (blocks are unique and ordered in a rank): counted once, then each aggregate's frame is found by
position, which costs DuckDB ~25 % less than a ``RANGE`` frame per aggregate (docs/detectors.md, Cost)."""


KNOWN = (
    "(history_blocks >= $min_history_blocks AND step - first_value(step) OVER history >= $min_history_steps)"
)
"""The run's history is long enough to judge against (``min_history_steps``, ``min_history_blocks``; a history's
first block has its smallest step: ``first_value``, not a ``min`` aggregate)."""


def _fold(signal: str, floor: str, *, before_history: bool = False) -> str:
    """``<signal>_s ÷ max(quiet level, floor)``: the smoothed signal over its own running low. With
    ``before_history``, a run too young to have a quiet level is judged against the floor alone (where the
    floor is a natural unit: the trust region's KL, a share of tokens); otherwise it is not judged yet."""
    series = f"{signal}_s"
    quiet = f"greatest(min({series}) OVER history, {floor})"
    if before_history:
        return f"{series} / CASE WHEN {KNOWN} THEN {quiet} ELSE {floor} END"
    return f"CASE WHEN {KNOWN} THEN {series} / {quiet} END"


def _peak_fraction(series: str) -> str:
    """``1 − series ÷ its high level`` (its running maximum over the history)."""
    return (f"CASE WHEN {KNOWN} AND max({series}) OVER history > 0 "
            f"THEN 1 - {series} / max({series}) OVER history END")  # fmt: skip


def floor_sql(series: str) -> str:
    """SQL: the floor of ``series``'s scale over the history and this block: 0 for a series never negative, −1 for
    one within [−1, 1] (a signed score), else its lowest value (as the collapse label's ``floors``)."""
    low = f"least(min({series}) OVER history, {series})"
    high = f"greatest(max({series}) OVER history, {series})"
    return f"(CASE WHEN {low} >= 0 THEN 0 WHEN {low} >= -1 AND {high} <= 1 THEN -1 ELSE {low} END)"


def _fall_share(series: str) -> str:
    """SQL: how far ``series`` has fallen from its running high, as a share of its scale above its floor
    (``floor_sql``); NULL while the high is at the floor."""
    high, floor = f"max({series}) OVER history", floor_sql(series)
    return f"(CASE WHEN {high} > {floor} THEN ({high} - {series}) / ({high} - {floor}) END)"


BELOW_PEAK = f"reward_s - {floor_sql('reward_s')} < $echo_below_peak * (max(reward_s) OVER history - {floor_sql('reward_s')})"
"""The reward is below its running peak (above its floor): reward variance dying there is not a converged policy."""


@dataclass(frozen=True, kw_only=True)
class Detector:
    """One named detector: a SQL expression ``value`` for each step, and the signals it reads.

    ``value`` may use the ``SIGNALS`` (per step), their smoothed ``SERIES`` (``<signal>_s``), the
    window ``history``, and ``$``-parameters named after ``DetectorConfig`` fields; it is NULL where the
    detector does not apply. An alert is raised where ``value > $<name>_warning`` (critical above
    ``$<name>_critical``); ``message`` is a ``printf`` format taking the value and the threshold (and, as
    ``%3$`` and ``%4$``, both × 100, for fractions printed as percentages).
    ``family`` groups detectors by what went wrong (the post-mortem reasons about families). A *joint* detector
    (``reads``) combines other detectors' values in the same block (its ``value`` names them and their
    ``$<name>_warning``), and is computed after them.
    """

    name: str
    family: str
    description: str
    signals: tuple[str, ...]
    value: str
    message: str
    reads: tuple[str, ...] = ()

    @property
    def warning_key(self) -> str:
        return f"{self.name}_warning"

    @property
    def critical_key(self) -> str:
        return f"{self.name}_critical"

    @property
    def columns(self) -> tuple[str, ...]:
        """The ``steps`` columns that carry this detector's inputs (of a signal's columns, any one will do; a
        joint detector's: those of the detectors it reads)."""
        signals = [*self.signals, *(s for name in self.reads for s in _BY_NAME[name].signals)]
        return tuple(dict.fromkeys(c for s in signals for c in SIGNALS[s].columns))

    @property
    def sql(self) -> str:
        """This detector alone, as one query over ``steps`` (what ``detect(..., detectors=[name])`` runs)."""
        return detect_sql((self,))


DIVERGING_FAMILIES = ("ratio", "kl", "entropy", "length", "gradient", "reward_variance")
"""The independent families ``diverging`` counts: importance ratios / clipping, KL (to the behaviour or the
reference policy), entropy (up or down), length or truncation, grad norm, reward variance. Not ``reward`` (the
collapse label's own series) and not ``blowup`` (non-finite values are critical on their own)."""

_BASE_DETECTORS: tuple[Detector, ...] = (
    Detector(
        name="clip_rise", family="ratio",
        description="Token clip fraction (clip_frac, or the share where the clip binds: verl pg_clipfrac, TRL"
        " clip_ratio) ÷ its quiet level, floored at clip_floor.",
        signals=("clip",), value=_fold("clip", "$clip_floor", before_history=True),
        message="token clip fraction %.3g× its quiet level (threshold %.3g×)",
    ),
    Detector(
        name="turn_clip_rise", family="ratio",
        description="Share of turns whose turn-level ratio w̄_k = mean_{t∈k} r_t lies outside the trust region"
        " (clip_frac_turn) ÷ its quiet level, floored at clip_floor.",
        signals=("turn_clip",), value=_fold("turn_clip", "$clip_floor", before_history=True),
        message="share of turns outside the trust region %.3g× its quiet level (threshold %.3g×)",
    ),
    Detector(
        name="kl_rise", family="kl",
        description="KL to the behaviour policy (k3, k2, the trainer's own estimator, or |k1|) ÷ its quiet level,"
        " floored at kl_floor (about the KL at the trust-region edge).",
        signals=("kl_to_old",), value=_fold("kl_to_old", "$kl_floor", before_history=True),
        message="KL to the behaviour policy %.3g× its quiet level (threshold %.3g×)",
    ),
    Detector(
        name="kl_ref_rise", family="kl",
        description="KL to the reference policy ÷ its quiet level, floored at kl_floor.",
        signals=("kl_to_ref",), value=_fold("kl_to_ref", "$kl_floor"),
        message="KL to the reference policy %.3g× its quiet level (threshold %.3g×)",
    ),
    Detector(
        name="ratio_tail_rise", family="ratio",
        description="ln of the token ratio's 99th percentile ÷ its quiet level, floored at ln 1.2 (the trust"
        " region's edge).",
        signals=("ratio_tail",), value=_fold("ratio_tail", "0.1823"),
        message="token-ratio tail (ln p99) %.3g× its quiet level (threshold %.3g×)",
    ),
    Detector(
        name="entropy_rise", family="entropy",
        description="Entropy ÷ its quiet level, floored at entropy_floor: the policy turning random.",
        signals=("token_entropy",), value=_fold("token_entropy", "$entropy_floor"),
        message="entropy %.3g× its quiet level (threshold %.3g×)",
    ),
    Detector(
        name="entropy_collapse", family="entropy",
        description="Entropy drop: 1 − entropy ÷ its high level over the history.",
        signals=("token_entropy",), value=_peak_fraction("token_entropy_s"),
        message="entropy fell by %3$.0f %% of its high level (threshold %4$.0f %%)",
    ),
    Detector(
        name="grad_norm_spike", family="gradient",
        description="z-score of ln(grad norm) against its mean and spread over the history (spread floored at"
        " grad_min_log_spread): a spike on a log scale, as OLMo's grad-norm spike rule on the raw norm;"
        " exact zeros (no-gradient batches) are skipped, not spikes.",
        signals=("grad_log",),
        value=f"""CASE WHEN grad_log_max IS NOT NULL AND {KNOWN}
                THEN (grad_log_max - avg(grad_log_max) OVER history)
                     / greatest(stddev_pop(grad_log_max) OVER history, $grad_min_log_spread) END""",
        message="grad norm spike: robust z of ln(grad norm) = %.3g (threshold %.3g)",
    ),
    Detector(
        name="echo_trap", family="reward_variance",
        description="Echo Trap: smoothed share of GRPO groups whose rewards are all equal, once it has risen by"
        " echo_trap_rise above its quiet level, while the reward is below echo_below_peak × its running peak.",
        signals=("zero_std", "reward"),
        value=f"""CASE WHEN {KNOWN}
                 AND zero_std_s - min(zero_std_s) OVER history >= $echo_trap_rise
                 AND {BELOW_PEAK} THEN zero_std_s END""",
        message="%3$.0f %% of reward groups have zero reward std (threshold %4$.0f %%)",
    ),
    Detector(
        name="reward_std_collapse", family="reward_variance",
        description="Reward std drop: 1 − σ̄ ÷ its high level, while the reward is below echo_below_peak × its"
        " running peak.",
        signals=("reward_spread", "reward"),
        value=f"CASE WHEN {BELOW_PEAK} THEN {_peak_fraction('reward_spread_s')} END",
        message="reward std fell by %3$.0f %% of its high level (threshold %4$.0f %%)",
    ),
    Detector(
        name="length_rise", family="length",
        description="Mean response (or completion) length ÷ its quiet level.",
        signals=("length",), value=_fold("length", "1"),
        message="responses %.3g× as long as their quiet level (threshold %.3g×)",
    ),
    Detector(
        name="truncation_rise", family="length",
        description="Share of completions that hit the length limit ÷ its quiet level, floored at truncation_floor.",
        signals=("truncation",), value=_fold("truncation", "$truncation_floor"),
        message="share of truncated completions %.3g× its quiet level (threshold %.3g×)",
    ),
    Detector(
        name="length_collapse", family="length",
        description="Answers shrinking: 1 − mean response (or completion) length ÷ its high level over the history,"
        " while the reward is below echo_below_peak × its running peak (short answers that keep the score are a"
        " policy learning to be brief, as on multiple-choice tasks).",
        signals=("length", "reward"), value=f"CASE WHEN {BELOW_PEAK} THEN {_peak_fraction('length_s')} END",
        message="responses fell to %3$.0f %% shorter than their longest (threshold %4$.0f %%)",
    ),
    Detector(
        name="reward_hacking", family="reward",
        description="The score the run is judged by (reward_mean) falls while the reward the trainer optimizes"
        " (reward_optimized_mean) holds: the fall of the score's moving average (reward_ma_steps) from its running"
        " peak, as a share of its scale above its floor, while the optimized reward is at least hacking_reward_high"
        " up its range over the history.",
        signals=("reward", "optimized"),
        value=f"""CASE WHEN {KNOWN}
                 AND optimized_s - min(optimized_s) OVER history
                     >= $hacking_reward_high * (max(optimized_s) OVER history - min(optimized_s) OVER history)
                THEN {_fall_share('reward_ma')} END""",
        message="the score fell by %3$.0f %% of its scale while the optimized reward held (threshold %4$.0f %%)",
    ),
    Detector(
        name="kl_runaway", family="divergence",
        description="KL to the reference ÷ its quiet level (floored at kl_floor), while truncation is"
        " runaway_truncation_rise × its quiet level or the length runaway_length_rise × its own: the reference drift"
        " of a run that is diverging, judged block by block (row by row early in a run).",
        signals=("kl_to_ref", "truncation", "length"),
        value=f"""CASE WHEN {_fold('truncation', '$truncation_floor')} >= $runaway_truncation_rise
                      OR {_fold('length', '1')} >= $runaway_length_rise
                 THEN {_fold('kl_to_ref', '$kl_floor')} END""",
        message="KL to the reference %.3g× its quiet level as completions lengthen (threshold %.3g×)",
    ),
    Detector(
        name="reward_drop", family="reward",
        description="Reward drop: (max R̄ − R̄) ÷ (max R̄ − floor) over the history (the floor: 0, −1 for a signed"
        " score, else its low), R̄ the reward's moving average over reward_ma_steps steps (fewer early in a run).",
        signals=("reward",),
        value=f"CASE WHEN {KNOWN} THEN {_fall_share('reward_ma')} END",
        message="reward moving average fell by %3$.0f %% of its running peak (threshold %4$.0f %%)",
    ),
    Detector(
        name="nonfinite", family="blowup",
        description="Non-finite values: the monitor's nonfinite_count plus one for each of loss, pg_loss,"
        " grad_norm, kl_old_k3, ratio_max, entropy that is NaN or ±Inf.",
        signals=("nonfinite",), value="nonfinite_n",
        message="%.0f non-finite values (threshold %.0f)",
    ),
)  # fmt: skip


def _family_up(family: str) -> str:
    """SQL: 1 when one of ``family``'s detectors is above its own warning level in this block, else 0."""
    members = [d for d in _BASE_DETECTORS if d.family == family]
    above = " OR ".join(f"{d.name} > ${d.warning_key}" for d in members)
    return f"(CASE WHEN coalesce({above}, false) THEN 1 ELSE 0 END)"


DIVERGING = Detector(
    name="diverging", family="divergence",
    description="How many independent families (DIVERGING_FAMILIES) are above their quiet levels in the same"
    " block, a family counting when one of its detectors passes its own warning level.",
    signals=(), value=" + ".join(_family_up(f) for f in DIVERGING_FAMILIES),
    message="%.0f families above their quiet levels together (threshold %.0f)",
    reads=tuple(d.name for d in _BASE_DETECTORS if d.family in DIVERGING_FAMILIES),
)  # fmt: skip

DETECTORS: tuple[Detector, ...] = (*_BASE_DETECTORS, DIVERGING)
"""Every detector, in the order alerts are listed."""

DETECTOR_NAMES = tuple(d.name for d in DETECTORS)
_BY_NAME = {d.name: d for d in DETECTORS}
FAMILY_NAMES = tuple(dict.fromkeys(d.family for d in DETECTORS))

DETECT_SQL = """
WITH reuse AS ({reused}),
signals AS (
    SELECT run_id, rank, step, reused{signals} FROM steps JOIN reuse USING (run_id)
    WHERE ($run_id::VARCHAR IS NULL OR run_id = $run_id) AND {block_of_step} > {block_of_start}
),
blocks AS (
    SELECT run_id, rank, reused, {block_of_step} AS block, max(step) AS step{series},
           {history_blocks} AS history_blocks  -- (one window operator, one sort with the series' windows)
    FROM signals GROUP BY run_id, rank, reused, block
),
base_values AS (
    SELECT run_id, rank, step, {values} FROM blocks
    WINDOW {history_window}
),
detector_values AS (SELECT *{joint_values} FROM base_values),
firing AS (  -- a value above its warning level, else NULL (dropped by the unpivot): only firings meet the limits
    SELECT run_id, rank, step, {firing_values} FROM detector_values
),
fired AS (
    SELECT run_id, step, detector, value,
           CASE WHEN value > critical THEN 'critical' ELSE 'warning' END AS severity,
           CASE WHEN value > critical THEN critical ELSE warning END AS threshold, message
    FROM (UNPIVOT firing ON {names} INTO NAME detector VALUE value)
    JOIN (VALUES {thresholds}) AS limits(detector, warning, critical, message) USING (detector)
    WHERE value > warning AND NOT isnan(value) AND step > $after_step
)
SELECT run_id, step, detector, severity, value, threshold, printf(message, value, threshold, 100 * value, 100 * threshold) AS message
FROM fired
QUALIFY row_number() OVER (PARTITION BY run_id, step, detector
                           ORDER BY severity = 'critical' DESC, value DESC) = 1
ORDER BY run_id, step, detector
"""
"""All selected detectors in one pass. Each rank's rows are averaged per block (``block_sql``: up to
``smooth_steps`` steps; rows a trainer splits one step's scalars over are averaged with the rest); joint
detectors combine the others' values in the same block; each block's firing is reported at its last logged
step; ranks are merged last (the most severe firing wins). ``firing`` keeps a block's value only where it passes
its warning level (the ``fired`` filter, unchanged), so the ``limits`` join meets the firings, not every block's
value of every detector (docs/detectors.md, Cost).
This template is the only place detector SQL is put together."""


def get_detectors(names: Iterable[str] | None = None) -> tuple[Detector, ...]:
    """The detectors called ``names`` (all when ``None``); ``ValueError`` names an unknown one."""
    if names is None:
        return DETECTORS
    chosen = []
    for name in names:
        if name not in _BY_NAME:
            raise ValueError(f"unknown detector {name!r}; known detectors: {', '.join(DETECTOR_NAMES)}")
        chosen.append(_BY_NAME[name])
    return tuple(chosen)


def used_series(detectors: Sequence[Detector]) -> list[str]:
    """The ``SERIES`` the detectors' values refer to."""
    return [name for name in SERIES if any(re.search(rf"\b{name}\b", d.value) for d in detectors)]


def used_signals(detectors: Sequence[Detector]) -> list[str]:
    """The ``SIGNALS`` the detectors and their series read."""
    wanted = {s for d in detectors for s in d.signals} | {SERIES[name][0] for name in used_series(detectors)}
    return [name for name in SIGNALS if name in wanted]


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def detect_sql(detectors: Sequence[Detector] = DETECTORS) -> str:
    """The one query that runs ``detectors`` over a relation called ``steps``."""
    if not detectors:
        raise ValueError("no detectors selected")
    joint = [d for d in detectors if d.reads]
    wanted = {d.name for d in detectors if not d.reads} | {name for d in joint for name in d.reads}
    base = [d for d in DETECTORS if d.name in wanted]
    return DETECT_SQL.format(
        signals="".join(f", {SIGNALS[name].expression} AS {name}" for name in used_signals(base)),
        series="".join(f", {SERIES[name][1]} AS {name}" for name in used_series(base)),
        values=", ".join(f"({d.value}) AS {d.name}" for d in base),
        joint_values="".join(f", ({d.value})::DOUBLE AS {d.name}" for d in joint),
        reused=REUSED.strip(),
        block_of_step=block_sql("step"),
        block_of_start=block_sql("$after_step - $lookback"),
        history_blocks=HISTORY_BLOCKS,
        history_window=HISTORY_WINDOW.strip(),
        names=", ".join(d.name for d in detectors),
        firing_values=", ".join(
            f"CASE WHEN {d.name} > ${d.warning_key} THEN {d.name} END AS {d.name}" for d in detectors
        ),
        thresholds=", ".join(
            f"({_quote(d.name)}, ${d.warning_key}::DOUBLE, ${d.critical_key}::DOUBLE, {_quote(d.message)})"
            for d in detectors
        ),
    )  # fmt: skip


FIRED_END = "\nSELECT run_id, step, detector, severity, value, threshold, printf("
"""Where ``DETECT_SQL``'s final ``SELECT`` (ranks merged, messages formatted, rows ordered) begins."""


def fired_sql(detectors: Sequence[Detector] = DETECTORS) -> str:
    """``detect_sql(detectors)``'s ``WITH`` clause, up to ``fired``: one row per firing of each rank, its message a
    ``printf`` format not yet applied (for a summary that merges ranks and formats one message per detector)."""
    head, found, _ = detect_sql(detectors).rpartition(FIRED_END)
    if not found:
        raise AssertionError("DETECT_SQL's final SELECT no longer starts with FIRED_END")
    return head


BLOCKS_START, BLOCKS_END = "WITH reuse AS (", "\nbase_values AS ("
"""Where ``DETECT_SQL``'s block aggregation (``reuse``, ``signals``, ``blocks``) begins and ends."""
BLOCK_STEP = "max(step) AS step"
"""The ``blocks`` column after which ``blocks_sql`` adds its extra aggregates."""


def blocks_sql(detectors: Sequence[Detector] = DETECTORS, extra: str = "") -> str:
    """``detect_sql(detectors)``'s block aggregation alone: its ``blocks`` rows (one per run, rank and block, with
    ``reused``, ``step`` and the series), plus ``extra`` (``, <aggregate over signals' rows> AS <name>``…), for a
    reader that runs several queries over the same blocks (``over_blocks``; the post-mortem)."""
    head, found, _ = detect_sql(detectors).partition(BLOCKS_END)
    if not found or head.count(BLOCK_STEP) != 1 or not head.lstrip().startswith(BLOCKS_START):
        raise AssertionError("DETECT_SQL's block aggregation is no longer where blocks_sql cuts it")
    return head.rstrip().rstrip(",").replace(BLOCK_STEP, BLOCK_STEP + extra) + "\nSELECT * FROM blocks"


def over_blocks(sql: str, table: str) -> str:
    """``sql`` (``detect_sql``'s or ``fired_sql``'s text, or a query around it) reading its blocks from ``table``
    (what ``blocks_sql`` computed, with the same detectors, parameters and run) instead of aggregating ``steps``."""
    start, end = sql.find(BLOCKS_START), sql.find(BLOCKS_END)
    if start < 0 or end < start:
        raise AssertionError("over_blocks takes a query around DETECT_SQL's block aggregation")
    return f"{sql[:start]}WITH blocks AS (SELECT * FROM {table}),{sql[end:]}"


_PARAMETER = re.compile(r"\$([a-z_][a-z0-9_]*)")


def detect_params(
    sql: str,
    config: DetectorConfig,
    run_id: str | None = None,
    after_step: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The named parameters ``sql`` uses, from ``config`` (plus run filter, step range and ``extra`` values)."""
    values = {**config.to_dict(), **(extra or {})}
    values["smooth_full_step"] = config.smooth_full_step
    values.update(_window_params(config, run_id, after_step))
    return bind(sql, values)


def bind(sql: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The named parameters (``$name``) ``sql`` uses, taken from ``values``."""
    return {name: values[name] for name in sorted(set(_PARAMETER.findall(sql)))}


def _window_params(config: DetectorConfig, run_id: str | None, after_step: int | None) -> dict[str, Any]:
    """The run filter and the step range: every block after ``after_step`` (all when ``None``)."""
    if after_step is None:
        return {"run_id": run_id, "after_step": -(2**60), "lookback": 0}
    return {"run_id": run_id, "after_step": after_step, "lookback": config.lookback_steps}


def required_columns(detectors: Sequence[Detector] = DETECTORS) -> tuple[str, ...]:
    """``steps`` columns the detectors read (besides the keys ``run_id, rank, step``)."""
    return tuple(sorted({c for d in detectors for c in d.columns} | {c for s in used_signals(detectors)
                                                                      for c in SIGNALS[s].columns}
                        | set(REUSE_COLUMNS)))  # fmt: skip


def with_columns(steps: pa.Table, columns: Iterable[str], run_id: str = "live") -> pa.Table:
    """``steps`` with every key and ``columns`` present (missing ones as null doubles / defaults)."""
    table = steps
    if "run_id" not in table.column_names:
        table = table.append_column("run_id", pa.array([run_id] * table.num_rows, pa.string()))
    if "rank" not in table.column_names:
        table = table.append_column("rank", pa.array([0] * table.num_rows, pa.int32()))
    for name in columns:
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, pa.float64()))
        elif not pa.types.is_floating(table.schema.field(name).type):
            table = table.set_column(
                table.schema.get_field_index(name), name, table.column(name).cast(pa.float64())
            )
    return table


@dataclass
class ArrowDetector:
    """Runs a fixed set of detectors over Arrow tables of ``steps`` rows, on its own DuckDB connection.

    Keeps the compiled SQL, its parameters and the connection between calls (the live path). A call costs
    about DuckDB's fixed per-query cost, barely more on a 512-row window than on 50 rows. With
    ``optimize=False`` (what the CTN guard uses) DuckDB's query optimizer is off: on a window of a few
    hundred rows planning costs more than it saves, and the answer is the same. The few alert rows come
    back as Python rows on purpose: DuckDB's Arrow result on this cursor warns of an extra copy (a warning
    that ``-W error`` would raise into training), and its relational ``sql(...).to_arrow_table()`` took
    11.9 ms per guard call against 7.2 ms (interleaved, 512-row window).
    """

    config: DetectorConfig = field(default_factory=DetectorConfig)
    detectors: tuple[Detector, ...] = DETECTORS
    optimize: bool = True

    def __post_init__(self) -> None:
        self.sql = detect_sql(self.detectors)
        self.columns = required_columns(self.detectors)
        self._params = detect_params(self.sql, self.config)
        self._con = duckdb.connect(config={"threads": 1})
        if not self.optimize:
            self._con.execute("PRAGMA disable_optimizer")

    def __call__(self, steps: pa.Table, run_id: str | None = None, after_step: int | None = None) -> pa.Table:
        if steps.num_rows == 0 or "step" not in steps.column_names:
            return ALERT_COLUMNS.empty_table()
        wanted = [c for c in ("run_id", "rank", "step", *self.columns) if c in steps.column_names]
        self._con.register("steps", with_columns(steps.select(wanted), self.columns))
        params = {**self._params, **_window_params(self.config, run_id, after_step)}
        try:
            rows = self._con.execute(self.sql, {k: params[k] for k in self._params}).fetchall()
            columns = list(zip(*rows, strict=True)) if rows else [()] * len(ALERT_COLUMNS)
            return pa.Table.from_arrays(
                [pa.array(column, f.type) for column, f in zip(columns, ALERT_COLUMNS, strict=True)],
                schema=ALERT_COLUMNS,
            )
        finally:
            self._con.unregister("steps")

    def close(self) -> None:
        self._con.close()


def detect(
    source: RunSet | pa.Table,
    config: DetectorConfig | None = None,
    run_id: str | None = None,
    *,
    detectors: Iterable[str] | None = None,
) -> pa.Table:
    """Run the detectors over ``source`` (a ``RunSet``, or an Arrow table of ``steps`` rows).

    Returns one row per firing: ``run_id, step, detector, severity, value, threshold, message``
    (``ALERT_COLUMNS``), ordered by run and step. ``run_id`` restricts to one run; ``detectors``
    to some detectors by name.
    """
    config = config or DetectorConfig()
    chosen = get_detectors(detectors)
    if isinstance(source, pa.Table):
        runner = ArrowDetector(config, chosen)
        try:
            return runner(source, run_id)
        finally:
            runner.close()
    sql = detect_sql(chosen)
    return source.sql(sql, detect_params(sql, config, run_id)).cast(ALERT_COLUMNS)
