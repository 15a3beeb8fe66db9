"""Collapse-precursor detectors: one named SQL definition each, run offline and live alike (DESIGN §4).

Each ``Detector`` computes one number per logged update (``value``) with DuckDB window functions
over the ``steps`` rows of a run; an alert is raised where ``value > <name>_warning`` (severity
``warning``) or ``value > <name>_severe`` (severity ``critical``). The same SQL runs

* offline over a ``RunSet`` (the Parquet files of finished or live runs), and
* live over an in-memory Arrow table of recent ``steps`` rows (``Monitor.recent_steps()``), which
  DuckDB reads without a copy — what the trainer's CTN guard (``sorl_monitor.guard``) does,

so a guard and a post-mortem never disagree. Every window looks back at most
``DetectorConfig.lookback_steps`` rows and never forward: an alert at step ``s`` depends only on
rows ``≤ s``, so it is the same whether computed during training or after it.

    alerts = detect(open_runs("runs/"), DetectorConfig(clip_frac_severe=0.4))
    # run_id, step, detector, severity, value, threshold, message  (one row per firing)

Thresholds live in ``DetectorConfig`` (documented defaults; ``load_config`` reads a TOML file and
``--set name=value`` overrides). Defaults are principled starting points (the PPO trust region,
robust z-scores, the paper's clip-fraction 0.5), not values fitted to any run.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from sorl_monitor.query import RunSet

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
    """Thresholds and windows of the detectors. ``*_warning`` raises a warning, ``*_severe`` a critical alert.

    Set a threshold to ``inf`` to silence that level (TOML: ``inf``). Window lengths count logged
    updates (``steps`` rows of one rank).
    """

    # ---- shared windows
    smooth_steps: int = 4
    """Trailing mean over this many updates for level detectors (clip fraction, turn tail, entropy, rewards)."""
    min_history: int = 16
    """Updates of history a baseline needs before a spike or drop detector may fire."""
    baseline_steps: int = 64
    """Look-back of the rolling median / MAD baselines (KL and grad-norm spikes)."""
    peak_steps: int = 256
    """Look-back of the running peaks / minima (entropy, reward, reward std, zero-std groups)."""

    # ---- clip_frac_level: trailing mean of the token clip fraction
    clip_frac_level_warning: float = 0.3
    clip_frac_severe: float = 0.5
    """The paper's threshold: over half the tokens outside the trust region."""

    # ---- clip_frac_trend: rise of the clip fraction over a window (OLS slope × window)
    clip_frac_trend_steps: int = 16
    clip_frac_trend_floor: float = 0.1
    """The trend only counts while the (smoothed) clip fraction is at least this."""
    clip_frac_trend_warning: float = 0.15
    clip_frac_trend_severe: float = math.inf
    """Off by default: the clip fraction also rises while a healthy run starts to learn."""

    # ---- turn_ratio_tail: trailing mean of the share of turns with w̄_k outside the trust region
    turn_ratio_tail_warning: float = 0.2
    turn_ratio_tail_severe: float = 0.4

    # ---- turn_ratio_max: largest turn-level ratio w̄_k of the update
    turn_ratio_max_warning: float = 2.0
    turn_ratio_max_severe: float = 4.0

    # ---- token_ratio_p99 / token_ratio_max: token-ratio tail blow-up
    token_ratio_p99_warning: float = 2.0
    token_ratio_p99_severe: float = 5.0
    token_ratio_max_warning: float = 10.0
    token_ratio_max_severe: float = 100.0

    # ---- kl_spike: KL(π_old‖π_θ) (k3) over its rolling median of the previous baseline_steps updates
    kl_spike_floor: float = 0.02
    """KL (nats/token) below this never counts as a spike (about the KL of ratios at the trust-region edge); the
    rolling median is floored here too, so a jump from ~0 must reach kl_spike_warning × this to count."""
    kl_spike_warning: float = 4.0
    kl_spike_severe: float = 10.0

    # ---- grad_norm_spike: robust z = (g − median) / (1.4826·MAD) over the previous baseline_steps updates
    grad_spike_min_ratio: float = 2.0
    """A spike must also be at least this many times the rolling median."""
    grad_norm_spike_warning: float = 6.0
    grad_norm_spike_severe: float = 12.0

    # ---- entropy_collapse: 1 − H / (running peak of H); entropy_rise: H / (running minimum of H)
    entropy_collapse_warning: float = 0.5
    entropy_collapse_severe: float = math.inf
    """Off by default: a policy that learns also lowers its entropy; collapse is a warning sign, not proof."""
    entropy_rise_min_nats: float = 0.1
    """A rise must also be at least this many nats above the running minimum."""
    entropy_rise_warning: float = 1.5
    entropy_rise_severe: float = 3.0

    # ---- echo_trap: share of GRPO groups with zero reward std, after rising by echo_trap_rise
    echo_below_peak: float = 0.9
    """Echo-Trap signals count only while the reward moving average is below this share of its running
    peak: zero reward variance in a converged, successful policy is not a trap."""
    echo_trap_rise: float = 0.3
    echo_trap_warning: float = 0.5
    echo_trap_severe: float = 0.8

    # ---- reward_std_collapse: 1 − std / running peak of std, while reward is below its peak (echo_below_peak)
    reward_std_collapse_warning: float = 0.8
    reward_std_collapse_severe: float = math.inf

    # ---- reward_drop: 1 − reward moving average / its running peak
    reward_ma_steps: int = 8
    reward_drop_warning: float = 0.25
    reward_drop_severe: float = math.inf
    """Off by default: the collapse label is defined on the same series, so it would measure itself."""

    # ---- nonfinite: NaN/Inf inputs counted by the monitor plus non-finite loss, grad norm, KL, ratio, entropy
    nonfinite_warning: float = 0.0
    nonfinite_severe: float = 0.0

    # ---- collapse label (evaluation, not an alert) and post-mortem
    collapse_ma_steps: int = 32
    """Reward moving average of the collapse label (long enough that one unlucky rollout batch is not a collapse)."""
    collapse_fraction: float = 0.5
    """Collapse: the reward moving average falls below this share of its running peak…"""
    collapse_recovery_steps: int = 64
    """…and does not come back above it within this many updates (or non-finite loss)."""
    collapse_min_peak: float = 0.0
    """The running peak must exceed this for a drop to count (rewards near zero are noise)."""
    root_cause_steps: int = 128
    """The post-mortem's evidence window: this many updates up to the collapse (or the run's end)."""
    turn_ratio_eps: float = 0.2
    """ε of the post-mortem's turn-tail evidence: share of turns with |w̄_k − 1| > ε."""
    mismatch_clip_ratio: float = 2.0
    """Granularity mismatch: token clip fraction at least this many times the turn clip fraction…"""
    mismatch_tail_ratio: float = 2.0
    """…or token-ratio tail (log p99) at least this many times as wide as the turn-ratio tail."""
    off_policy_min_slope: float = 0.02
    """Off-policy variance: clip fraction grows by at least this per update of policy lag in the window…"""
    off_policy_growth: float = 2.0
    """…and at least this many times as fast as over the run's first root_cause_steps updates."""
    off_policy_min_lag: int = 8
    """Or stale / reused rollouts (the behaviour policy at least this many updates old in the window)…"""
    off_policy_clip_growth: float = 1.5
    """…whose token clip fraction grew to this many times its level over the run's first root_cause_steps
    updates (fitted on the bundled trainer's sweep, where collapsing token-PPO runs reach 1.5–2.2×)."""
    turn_level_algorithms: tuple[str, ...] = ("turn_ppo", "st_ppo", "so_ppo", "so_grpo")
    """Algorithms that already use turn-level IS: granularity mismatch is not blamed on them."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"detector setting {f.name} must be a positive integer, not {value!r}")
            if f.type == "float" and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ValueError(f"detector setting {f.name} must be a number, not {value!r}")
            if f.type == "float" and math.isnan(value):
                raise ValueError(f"detector setting {f.name} must not be NaN")

    @property
    def lookback_steps(self) -> int:
        """Rows of history any detector reads: a live window this long gives the offline answer."""
        return max(
            self.peak_steps + max(self.smooth_steps, self.reward_ma_steps),
            self.baseline_steps + 1,
            self.clip_frac_trend_steps + self.smooth_steps,
        )

    def replace(self, **changes: Any) -> DetectorConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------- loading
def _parse_setting(name: str, raw: Any) -> Any:
    kinds = {f.name: f.type for f in fields(DetectorConfig)}
    if name not in kinds:
        raise ValueError(f"unknown detector setting {name!r}; known settings: {', '.join(sorted(kinds))}")
    kind = kinds[name]
    try:
        if kind == "int":
            if isinstance(raw, str):
                return int(raw)
            if isinstance(raw, float) and raw.is_integer():
                return int(raw)
            return raw
        if kind == "float":
            return float(raw) if isinstance(raw, str) else raw
        if isinstance(raw, str):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        return tuple(raw)
    except (TypeError, ValueError):
        raise ValueError(f"detector setting {name}: cannot read {raw!r} as {kind}") from None


def config_from_mapping(values: Mapping[str, Any], base: DetectorConfig | None = None) -> DetectorConfig:
    """``base`` (default: the defaults) with ``values`` applied; ``ValueError`` names an unknown key."""
    base = base or DetectorConfig()
    return base.replace(**{name: _parse_setting(name, raw) for name, raw in values.items()})


def parse_overrides(assignments: Iterable[str]) -> dict[str, str]:
    """``["clip_frac_severe=0.4", …]`` → ``{"clip_frac_severe": "0.4", …}``."""
    parsed = {}
    for item in assignments:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--set takes name=value, not {item!r}")
        parsed[name.strip()] = value.strip()
    return parsed


PRESETS_DIR = Path(__file__).resolve().parent / "presets"
"""Bundled detector settings, by name: ``stale-rollouts`` (calibrated on the bundled trainer's sweep)."""


def preset_path(name: str) -> Path | None:
    """The bundled preset called ``name`` (e.g. ``stale-rollouts``), or ``None``."""
    path = PRESETS_DIR / f"{name}.toml"
    return path if name and "/" not in name and path.is_file() else None


def load_config(toml_path: str | Path | None = None, overrides: Iterable[str] = ()) -> DetectorConfig:
    """Defaults, then the TOML file's settings (top level or a ``[detectors]`` table), then ``name=value``s.

    ``toml_path`` may also name a bundled preset (``PRESETS_DIR``), e.g. ``"stale-rollouts"``.
    """
    config = DetectorConfig()
    if toml_path is not None:
        path = Path(toml_path)
        if not path.exists() and preset_path(str(toml_path)) is not None:
            path = preset_path(str(toml_path))
        try:
            document = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"no such config file: {path}") from None
        except IsADirectoryError:
            raise ValueError(f"config file is a directory: {path}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"bad TOML in {path}: {error}") from None
        settings = document.get("detectors", document)
        if not isinstance(settings, dict):
            raise ValueError(f"{path}: [detectors] must be a table of settings")
        config = config_from_mapping(settings, config)
    return config_from_mapping(parse_overrides(overrides), config)


# --------------------------------------------------------------------------------------- detectors
SERIES: dict[str, str] = {
    "clip_frac_smooth": "avg(clip_frac) OVER smooth",
    "clip_frac_turn_smooth": "avg(clip_frac_turn) OVER smooth",
    "clip_frac_rise": "regr_slope(clip_frac, seq) OVER trend * ($clip_frac_trend_steps - 1)",
    "clip_frac_trend_count": "count(clip_frac) OVER trend",
    "entropy_smooth": "avg(entropy) OVER smooth",
    "zero_std_smooth": "avg(zero_std_group_frac) OVER smooth",
    "reward_std_smooth": "avg(reward_std) OVER smooth",
    "reward_ma": "avg(reward_mean) OVER reward_ma",
}
"""Trailing smoothed series the detectors share (windows ``smooth``, ``trend``, ``reward_ma`` below)."""

SERIES_WINDOWS = """
    smooth AS (PARTITION BY run_id, rank ORDER BY seq ROWS BETWEEN $smooth_steps - 1 PRECEDING AND CURRENT ROW),
    trend AS (PARTITION BY run_id, rank ORDER BY seq ROWS BETWEEN $clip_frac_trend_steps - 1 PRECEDING AND CURRENT ROW),
    reward_ma AS (PARTITION BY run_id, rank ORDER BY seq ROWS BETWEEN $reward_ma_steps - 1 PRECEDING AND CURRENT ROW)"""
VALUE_WINDOWS = """
    baseline AS (PARTITION BY run_id, rank ORDER BY seq ROWS BETWEEN $baseline_steps PRECEDING AND 1 PRECEDING),
    peak AS (PARTITION BY run_id, rank ORDER BY seq ROWS BETWEEN $peak_steps PRECEDING AND 1 PRECEDING)"""
"""Detector values may use ``OVER baseline`` (rolling median/MAD) and ``OVER peak`` (running peaks): both
look back only, never at the current row."""


@dataclass(frozen=True)
class Detector:
    """One named detector: a SQL expression ``value`` for each update, and the columns it reads.

    ``value`` may use the ``steps`` columns in ``columns``, the shared ``SERIES``, the windows
    ``baseline`` / ``peak``, and ``$``-parameters named after ``DetectorConfig`` fields; it is NULL
    where the detector does not apply. An alert is raised where ``value > $<warning>`` (critical above
    ``$<severe>``); ``message`` is a ``printf`` format taking the value and the threshold.
    """

    name: str
    description: str
    columns: tuple[str, ...]
    value: str
    message: str
    warning: str = ""
    severe: str = ""

    @property
    def warning_key(self) -> str:
        return self.warning or f"{self.name}_warning"

    @property
    def severe_key(self) -> str:
        return self.severe or f"{self.name}_severe"

    @property
    def sql(self) -> str:
        """This detector alone, as one query over ``steps`` (what ``detect(..., detectors=[name])`` runs)."""
        return detect_sql((self,))


DETECTORS: tuple[Detector, ...] = (
    Detector(
        "clip_frac_level",
        "Token clip fraction (share of tokens with r_t outside [1−ε, 1+ε]), mean of the last smooth_steps updates.",
        ("clip_frac",),
        "clip_frac_smooth",
        "token clip fraction %.3g above %.3g",
        warning="clip_frac_level_warning",
        severe="clip_frac_severe",
    ),
    Detector(
        "clip_frac_trend",
        "Rise of the token clip fraction over the last clip_frac_trend_steps updates (OLS slope × (window − 1)),"
        " while the smoothed clip fraction is at least clip_frac_trend_floor.",
        ("clip_frac",),
        """CASE WHEN clip_frac_trend_count >= $clip_frac_trend_steps AND clip_frac_smooth >= $clip_frac_trend_floor
                THEN clip_frac_rise END""",
        "token clip fraction rose by %.3g over the trend window (threshold %.3g)",
    ),
    Detector(
        "turn_ratio_tail",
        "Share of turns whose turn-level ratio w̄_k = mean_{t∈k} r_t lies outside the trust region"
        " (clip_frac_turn), mean of the last smooth_steps updates.",
        ("clip_frac_turn",),
        "clip_frac_turn_smooth",
        "%.3g of turns have a turn ratio outside the trust region (threshold %.3g)",
    ),
    Detector(
        "turn_ratio_max",
        "Largest turn-level ratio w̄_k of the update.",
        ("turn_ratio_max",),
        "turn_ratio_max",
        "max turn ratio %.3g above %.3g",
    ),
    Detector(
        "token_ratio_p99",
        "99th percentile of the token ratio r_t = π_θ/π_old of the update.",
        ("ratio_p99",),
        "ratio_p99",
        "token ratio p99 %.3g above %.3g",
    ),
    Detector(
        "token_ratio_max",
        "Largest token ratio r_t of the update.",
        ("ratio_max",),
        "ratio_max",
        "max token ratio %.3g above %.3g",
    ),
    Detector(
        "kl_spike",
        "KL(π_old‖π_θ) (k3 estimator) over its median of the previous baseline_steps updates, the median"
        " floored at kl_spike_floor; only when KL ≥ kl_spike_floor and min_history updates are known.",
        ("kl_old_k3",),
        """CASE WHEN count(kl_old_k3) OVER baseline >= $min_history AND kl_old_k3 >= $kl_spike_floor
                THEN kl_old_k3 / greatest(median(kl_old_k3) OVER baseline, $kl_spike_floor) END""",
        "KL(old) %.3g× its rolling median (threshold %.3g×)",
    ),
    Detector(
        "grad_norm_spike",
        "Robust z-score of the pre-clip grad norm: (g − median) / (1.4826·MAD) over the previous"
        " baseline_steps updates (MAD floored at 1% of the median); only when g ≥ grad_spike_min_ratio ×"
        " median and the median is positive (a policy with no gradient left is not spiking).",
        ("grad_norm",),
        """CASE WHEN count(grad_norm) OVER baseline >= $min_history AND median(grad_norm) OVER baseline > 0
                 AND grad_norm >= $grad_spike_min_ratio * median(grad_norm) OVER baseline
                THEN (grad_norm - median(grad_norm) OVER baseline)
                     / greatest(1.4826 * mad(grad_norm) OVER baseline, 0.01 * median(grad_norm) OVER baseline) END""",
        "grad norm spike: robust z = %.3g (threshold %.3g)",
    ),
    Detector(
        "entropy_collapse",
        "Entropy drop: 1 − H̄ / max(H̄ over the previous peak_steps updates), H̄ the smoothed entropy.",
        ("entropy",),
        """CASE WHEN count(entropy_smooth) OVER peak >= $min_history AND max(entropy_smooth) OVER peak > 0
                THEN 1 - entropy_smooth / max(entropy_smooth) OVER peak END""",
        "entropy fell by %.3g of its running peak (threshold %.3g)",
    ),
    Detector(
        "entropy_rise",
        "Entropy surge: H̄ / min(H̄ over the previous peak_steps updates), when H̄ is also"
        " entropy_rise_min_nats above that minimum.",
        ("entropy",),
        """CASE WHEN count(entropy_smooth) OVER peak >= $min_history
                 AND entropy_smooth - min(entropy_smooth) OVER peak >= $entropy_rise_min_nats
                THEN entropy_smooth / greatest(min(entropy_smooth) OVER peak, 1e-9) END""",
        "entropy rose to %.3g× its running minimum (threshold %.3g×)",
    ),
    Detector(
        "echo_trap",
        "Echo Trap: smoothed share of GRPO groups whose rewards are all equal (zero_std_group_frac),"
        " once it has risen by echo_trap_rise above its minimum of the previous peak_steps updates, while"
        " the reward moving average is below echo_below_peak × its running peak (not a converged policy).",
        ("zero_std_group_frac", "reward_mean"),
        """CASE WHEN count(zero_std_smooth) OVER peak >= $min_history
                 AND zero_std_smooth - min(zero_std_smooth) OVER peak >= $echo_trap_rise
                 AND reward_ma < $echo_below_peak * max(reward_ma) OVER peak
                THEN zero_std_smooth END""",
        "%.3g of reward groups have zero reward std (threshold %.3g)",
    ),
    Detector(
        "reward_std_collapse",
        "Reward std drop: 1 − σ̄ / max(σ̄ over the previous peak_steps updates), while the reward moving"
        " average is below echo_below_peak × its running peak (so not a converged policy).",
        ("reward_std", "reward_mean"),
        """CASE WHEN count(reward_std_smooth) OVER peak >= $min_history AND max(reward_std_smooth) OVER peak > 0
                 AND reward_ma < $echo_below_peak * max(reward_ma) OVER peak
                THEN 1 - reward_std_smooth / max(reward_std_smooth) OVER peak END""",
        "reward std fell by %.3g of its running peak (threshold %.3g)",
    ),
    Detector(
        "reward_drop",
        "Reward drop: 1 − R̄ / max(R̄ over the previous peak_steps updates), R̄ the reward moving average"
        " over reward_ma_steps; only when that peak is positive.",
        ("reward_mean",),
        """CASE WHEN count(reward_ma) OVER peak >= $min_history AND max(reward_ma) OVER peak > 0
                THEN 1 - reward_ma / max(reward_ma) OVER peak END""",
        "reward moving average fell by %.3g of its running peak (threshold %.3g)",
    ),
    Detector(
        "nonfinite",
        "Non-finite values: the monitor's nonfinite_count plus one for each of loss, pg_loss, grad_norm,"
        " kl_old_k3, ratio_max, entropy that is NaN or ±Inf.",
        ("nonfinite_count", "loss", "pg_loss", "grad_norm", "kl_old_k3", "ratio_max", "entropy"),
        """coalesce(nonfinite_count, 0)
           + (CASE WHEN isfinite(loss) OR loss IS NULL THEN 0 ELSE 1 END)
           + (CASE WHEN isfinite(pg_loss) OR pg_loss IS NULL THEN 0 ELSE 1 END)
           + (CASE WHEN isfinite(grad_norm) OR grad_norm IS NULL THEN 0 ELSE 1 END)
           + (CASE WHEN isfinite(kl_old_k3) OR kl_old_k3 IS NULL THEN 0 ELSE 1 END)
           + (CASE WHEN isfinite(ratio_max) OR ratio_max IS NULL THEN 0 ELSE 1 END)
           + (CASE WHEN isfinite(entropy) OR entropy IS NULL THEN 0 ELSE 1 END)""",
        "%.0f non-finite values (threshold %.0f)",
    ),
)
"""Every detector, in the order alerts are listed."""

DETECTOR_NAMES = tuple(d.name for d in DETECTORS)
_BY_NAME = {d.name: d for d in DETECTORS}

DETECT_SQL = """
WITH run_steps AS (
    SELECT *, row_number() OVER (PARTITION BY run_id, rank ORDER BY step) AS seq
    FROM (SELECT run_id, rank, step, {aggregates} FROM steps
          WHERE ($run_id::VARCHAR IS NULL OR run_id = $run_id) AND step > $after_step - $lookback
          GROUP BY run_id, rank, step)
),
series AS (
    SELECT *{series} FROM run_steps
    WINDOW {series_windows}
),
detector_values AS (
    SELECT run_id, rank, step, {values} FROM series
    WINDOW {value_windows}
),
fired AS (
    SELECT run_id, step, detector, value,
           CASE WHEN value > severe THEN 'critical' ELSE 'warning' END AS severity,
           CASE WHEN value > severe THEN severe ELSE warning END AS threshold, message
    FROM (UNPIVOT detector_values ON {names} INTO NAME detector VALUE value)
    JOIN (VALUES {thresholds}) AS limits(detector, warning, severe, message) USING (detector)
    WHERE value > warning AND NOT isnan(value) AND step > $after_step
)
SELECT run_id, step, detector, severity, value, threshold, printf(message, value, threshold) AS message
FROM fired
QUALIFY row_number() OVER (PARTITION BY run_id, step, detector
                           ORDER BY severity = 'critical' DESC, value DESC) = 1
ORDER BY run_id, step, detector
"""
"""All selected detectors in one pass. Rows of one (run, rank, step) are merged first (a trainer may
log extra scalars of a step in a second row); ranks are merged last (the most severe firing wins).
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


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def detect_sql(detectors: Sequence[Detector] = DETECTORS) -> str:
    """The one query that runs ``detectors`` over a relation called ``steps``."""
    if not detectors:
        raise ValueError("no detectors selected")
    columns = required_columns(detectors)
    return DETECT_SQL.format(
        aggregates=", ".join(f"avg({c}) AS {c}" for c in columns),
        series="".join(f", {SERIES[name]} AS {name}" for name in used_series(detectors)),
        series_windows=SERIES_WINDOWS.strip(),
        values=", ".join(f"({d.value}) AS {d.name}" for d in detectors),
        value_windows=VALUE_WINDOWS.strip(),
        names=", ".join(d.name for d in detectors),
        thresholds=", ".join(
            f"({_quote(d.name)}, ${d.warning_key}::DOUBLE, ${d.severe_key}::DOUBLE, {_quote(d.message)})"
            for d in detectors
        ),
    )  # fmt: skip


_PARAMETER = re.compile(r"\$([a-z_][a-z0-9_]*)")


def detect_params(
    sql: str, config: DetectorConfig, run_id: str | None = None, after_step: int | None = None
) -> dict[str, Any]:
    """The named parameters ``sql`` uses, from ``config`` (plus run filter and step range)."""
    values = config.to_dict()
    values["run_id"] = run_id
    if after_step is None:
        values["after_step"] = -(2**62)
        values["lookback"] = 0
    else:
        values["after_step"] = after_step
        values["lookback"] = config.lookback_steps
    return {name: values[name] for name in sorted(set(_PARAMETER.findall(sql)))}


def required_columns(detectors: Sequence[Detector] = DETECTORS) -> tuple[str, ...]:
    """``steps`` columns the detectors read (besides the keys ``run_id, rank, step``)."""
    return tuple(sorted({c for d in detectors for c in d.columns}))


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

    Keeps the compiled SQL and the connection between calls (the live path). A call costs about
    DuckDB's fixed per-query cost, barely more on a 512-row window than on 50 rows.
    """

    config: DetectorConfig = field(default_factory=DetectorConfig)
    detectors: tuple[Detector, ...] = DETECTORS

    def __post_init__(self) -> None:
        self.sql = detect_sql(self.detectors)
        self.columns = required_columns(self.detectors)
        self._con = duckdb.connect(config={"threads": 1})

    def __call__(self, steps: pa.Table, run_id: str | None = None, after_step: int | None = None) -> pa.Table:
        if steps.num_rows == 0 or "step" not in steps.column_names:
            return ALERT_COLUMNS.empty_table()
        self._con.register("steps", with_columns(steps, self.columns))
        try:
            rows = self._con.execute(
                self.sql, detect_params(self.sql, self.config, run_id, after_step)
            ).fetchall()
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
