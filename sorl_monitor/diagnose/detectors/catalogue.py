"""The catalogue: every named detector, its family, the signals it reads and its value as SQL."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sorl_monitor.diagnose.detectors.blocks import BELOW_PEAK, KNOWN, fall_share, fold, peak_fraction
from sorl_monitor.diagnose.detectors.signals import SIGNALS


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


DIVERGING_FAMILIES = ("ratio", "kl", "entropy", "length", "gradient", "reward_variance")
"""The independent families ``diverging`` counts: importance ratios / clipping, KL (to the behaviour or the
reference policy), entropy (up or down), length or truncation, grad norm, reward variance. Not ``reward`` (the
collapse label's own series) and not ``blowup`` (non-finite values are critical on their own)."""

_BASE_DETECTORS: tuple[Detector, ...] = (
    Detector(
        name="clip_rise", family="ratio",
        description="Token clip fraction (clip_frac, or the share where the clip binds: verl pg_clipfrac, TRL"
        " clip_ratio) ÷ its quiet level, floored at clip_floor.",
        signals=("clip",), value=fold("clip", "$clip_floor", before_history=True),
        message="token clip fraction %.3g× its quiet level (threshold %.3g×)",
    ),
    Detector(
        name="turn_clip_rise", family="ratio",
        description="Share of turns whose turn-level ratio w̄_k = mean_{t∈k} r_t lies outside the trust region"
        " (clip_frac_turn) ÷ its quiet level, floored at clip_floor.",
        signals=("turn_clip",), value=fold("turn_clip", "$clip_floor", before_history=True),
        message="share of turns outside the trust region %.3g× its quiet level (threshold %.3g×)",
    ),
    Detector(
        name="kl_rise", family="kl",
        description="KL to the behaviour policy (k3, k2, the trainer's own estimator, or |k1|) ÷ its quiet level,"
        " floored at kl_floor (about the KL at the trust-region edge).",
        signals=("kl_to_old",), value=fold("kl_to_old", "$kl_floor", before_history=True),
        message="KL to the behaviour policy %.3g× its quiet level (threshold %.3g×)",
    ),
    Detector(
        name="kl_ref_rise", family="kl",
        description="KL to the reference policy ÷ its quiet level, floored at kl_floor.",
        signals=("kl_to_ref",), value=fold("kl_to_ref", "$kl_floor"),
        message="KL to the reference policy %.3g× its quiet level (threshold %.3g×)",
    ),
    Detector(
        name="ratio_tail_rise", family="ratio",
        description="ln of the token ratio's 99th percentile ÷ its quiet level, floored at ln 1.2 (the trust"
        " region's edge).",
        signals=("ratio_tail",), value=fold("ratio_tail", "0.1823"),
        message="token-ratio tail (ln p99) %.3g× its quiet level (threshold %.3g×)",
    ),
    Detector(
        name="entropy_rise", family="entropy",
        description="Entropy ÷ its quiet level, floored at entropy_floor: the policy turning random.",
        signals=("token_entropy",), value=fold("token_entropy", "$entropy_floor"),
        message="entropy %.3g× its quiet level (threshold %.3g×)",
    ),
    Detector(
        name="entropy_collapse", family="entropy",
        description="Entropy drop: 1 − entropy ÷ its high level over the history.",
        signals=("token_entropy",), value=peak_fraction("token_entropy_s"),
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
        value=f"CASE WHEN {BELOW_PEAK} THEN {peak_fraction('reward_spread_s')} END",
        message="reward std fell by %3$.0f %% of its high level (threshold %4$.0f %%)",
    ),
    Detector(
        name="length_rise", family="length",
        description="Mean response (or completion) length ÷ its quiet level.",
        signals=("length",), value=fold("length", "1"),
        message="responses %.3g× as long as their quiet level (threshold %.3g×)",
    ),
    Detector(
        name="truncation_rise", family="length",
        description="Share of completions that hit the length limit ÷ its quiet level, floored at truncation_floor.",
        signals=("truncation",), value=fold("truncation", "$truncation_floor"),
        message="share of truncated completions %.3g× its quiet level (threshold %.3g×)",
    ),
    Detector(
        name="length_collapse", family="length",
        description="Answers shrinking: 1 − mean response (or completion) length ÷ its high level over the history,"
        " while the reward is below echo_below_peak × its running peak (short answers that keep the score are a"
        " policy learning to be brief, as on multiple-choice tasks).",
        signals=("length", "reward"), value=f"CASE WHEN {BELOW_PEAK} THEN {peak_fraction('length_s')} END",
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
                THEN {fall_share('reward_ma')} END""",
        message="the score fell by %3$.0f %% of its scale while the optimized reward held (threshold %4$.0f %%)",
    ),
    Detector(
        name="kl_runaway", family="divergence",
        description="KL to the reference ÷ its quiet level (floored at kl_floor), while truncation is"
        " runaway_truncation_rise × its quiet level or the length runaway_length_rise × its own: the reference drift"
        " of a run that is diverging, judged block by block (row by row early in a run).",
        signals=("kl_to_ref", "truncation", "length"),
        value=f"""CASE WHEN {fold('truncation', '$truncation_floor')} >= $runaway_truncation_rise
                      OR {fold('length', '1')} >= $runaway_length_rise
                 THEN {fold('kl_to_ref', '$kl_floor')} END""",
        message="KL to the reference %.3g× its quiet level as completions lengthen (threshold %.3g×)",
    ),
    Detector(
        name="reward_drop", family="reward",
        description="Reward drop: (max R̄ − R̄) ÷ (max R̄ − floor) over the history (the floor: 0, −1 for a signed"
        " score, else its low), R̄ the reward's moving average over reward_ma_steps steps (fewer early in a run).",
        signals=("reward",),
        value=f"CASE WHEN {KNOWN} THEN {fall_share('reward_ma')} END",
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
DETECTOR_FAMILY = {d.name: d.family for d in DETECTORS}
"""Each detector's family (``Detector.family``)."""


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
