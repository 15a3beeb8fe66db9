"""How early and how reliably the detectors see collapse coming: a labelled corpus and real logs, apart.

    python experiments/detector_eval.py --corpus experiments/corpus [--real ../shared/real_logs] [--json out.json]

Each run is labelled by the post-mortem's collapse label (``sorl_monitor.diagnose.postmortem.label_collapse``: the
reward moving average below half its running peak without recovery, or a non-finite loss), which no
detector sees. The **collapse step** is where the fall starts, as the label gives it (``collapse_step``: the
first step after the reward moving average last stood within ``PostmortemConfig.peak_band`` of its running
peak). A method *alarms* at a critical alert; on a collapsing run the alarm is the first one of the **streak
that runs into the collapse**: at or after the run's last *recovery* before the collapse step (the label's
``recovered_step``), so an alert during a dip the run came back from earns no lead. It is a detection when it comes at or before the collapse step
(lead = collapse step − alarm, in optimizer updates; lead share = lead ÷ collapse step); on a stable run
any critical alert is a false alarm. A run that is not labelled collapsed but whose reward moving average
dipped below half its peak and recovered is counted apart (an alarm there is neither false nor a detection).

**Logging shapes** (``experiments/log_shapes.py``): every corpus run is scored as the bundled trainer logs it
(``update``: one row per optimizer update) and as real trainers log it — ``batch`` (one row per rollout
batch, the mean over its updates, written and read back as verl's file logger's JSON lines with verl's
names), ``every5`` (every 5 optimizer steps, as the Hugging Face ``Trainer`` logs, written and read back as a
``trainer_state.json`` with TRL's names) and ``cut`` (the ``batch`` log stopped at a random point during or
after the fall; stable runs stopped at random too). The truth is always the per-update run's label; alarms
are mapped back to the update after which their row exists. On ``cut`` logs the post-mortem's verdict at
the log's end counts too: a status other than ``healthy`` is an alarm at the log's last step, and a
collapsing run flagged by its log's end (critical alert or verdict) is detected, its lead negative when
that came after the fall started.

(a) **Corpus** (``experiments/make_corpus.py``: the bundled trainer over a grid of settings), scored
    leave-one-setting-out: for each setting, the critical thresholds in ``FITTED`` are chosen on the
    *other* settings' runs, in every shape at once (grid search: the best recall at a false-alarm rate ≤ 5 %
    there; ties go to fewer false alarms, the longer median lead share, then the higher thresholds), then
    applied to that setting's runs in every shape. No threshold is judged on the setting it was fitted on.
    The shipped defaults are the same fit over the whole corpus (printed, not scored). Several ``--corpus``
    folders are fitted as one corpus, and the same alarms are also scored per folder.
(b) **Held out** (``--real``: real logs, read as the files come, or bundled-trainer runs outside the corpus),
    scored with the shipped defaults, never fitted on them; each run's post-mortem verdict is printed.

Baselines on the same runs and shapes: ``olmo_grad_spike`` (OLMo-core-style, grad norm > mean + 6σ of the
previous 128 steps) and ``foundry_spike`` (llm-foundry ``KillLossSpike``-style: loss ≥ 2 × its mean over the
previous 100 steps, or reward ≤ ½ × its mean, for 5 consecutive logged rows), in each log's own steps.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import statistics
import sys
import tempfile
import textwrap
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT, ROOT / "experiments"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import log_shapes  # noqa: E402

from sorl_monitor.diagnose.detectors import DetectorConfig, detect, get_detectors, load_config  # noqa: E402
from sorl_monitor.diagnose.postmortem import PostmortemConfig, label_collapse, postmortem  # noqa: E402
from sorl_monitor.read.query import QueryError, RunSet, open_runs  # noqa: E402

FITTED: dict[str, tuple[float, ...]] = {
    "clip_rise_critical": (3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, math.inf),
    "turn_clip_rise_critical": (4.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0, 30.0, math.inf),
    "kl_rise_critical": (5.0, 8.0, 10.0, 15.0, 20.0, 30.0, 50.0, 100.0, math.inf),
    "entropy_rise_critical": (4.0, 8.0, 16.0, math.inf),
    "diverging_critical": (2.0, 3.0, 4.0, math.inf),
}
"""The critical thresholds fitted on the corpus, and the grid each is chosen from (any ``<detector>_critical``
of ``DetectorConfig`` may be added; the grid search holds every combination in memory)."""

OLMO_GRAD_SPIKE_SQL = """
SELECT run_id, list(step ORDER BY step) AS alarm_steps FROM (
    SELECT run_id, step, grad_norm,
           avg(grad_norm) OVER prev AS mean, stddev_pop(grad_norm) OVER prev AS sd,
           step - min(step) OVER prev AS span
    FROM (SELECT run_id, step, avg(grad_norm) AS grad_norm FROM steps GROUP BY run_id, step)
    WINDOW prev AS (PARTITION BY run_id ORDER BY step RANGE BETWEEN $olmo_window PRECEDING AND 1 PRECEDING)
)
WHERE span >= $min_history_steps AND grad_norm > mean + $olmo_sigmas * sd
GROUP BY run_id
"""
"""OLMo-core-style spike rule on the grad norm: steps with ``g > mean + 6σ`` of the previous 128 steps."""

FOUNDRY_SPIKE_SQL = """
WITH per_step AS (
    SELECT run_id, step, avg(loss) AS loss, avg(reward_mean) FILTER (WHERE isfinite(reward_mean)) AS reward
    FROM steps GROUP BY run_id, step
),
flagged AS (
    SELECT run_id, step,
           step - min(step) OVER prev >= $min_history_steps AND avg(loss) OVER prev > 0
               AND loss >= $foundry_multiplier * avg(loss) OVER prev AS loss_outlier,
           step - min(step) OVER prev >= $min_history_steps AND avg(reward) OVER prev > 0
               AND reward <= avg(reward) OVER prev / $foundry_multiplier AS reward_outlier
    FROM per_step
    WINDOW prev AS (PARTITION BY run_id ORDER BY step RANGE BETWEEN $foundry_window PRECEDING AND 1 PRECEDING)
),
streaks AS (
    SELECT run_id, step,
           count(*) FILTER (WHERE loss_outlier) OVER last_n AS loss_streak,
           count(*) FILTER (WHERE reward_outlier) OVER last_n AS reward_streak
    FROM flagged
    WINDOW last_n AS (PARTITION BY run_id ORDER BY step ROWS BETWEEN $foundry_patience PRECEDING AND CURRENT ROW)
)
SELECT run_id, list(step ORDER BY step) AS alarm_steps FROM streaks
WHERE loss_streak > $foundry_patience OR reward_streak > $foundry_patience
GROUP BY run_id
"""
"""llm-foundry-style rule (``KillLossSpike``): ≥ 2 × the mean of the previous 100 steps for 5 consecutive
logged rows, on the loss and (mirrored) on the reward, since an RL loss can be flat while reward dies."""

BASELINE_PARAMS = {"olmo_window": 128, "olmo_sigmas": 6.0, "foundry_window": 100, "foundry_multiplier": 2.0,
                   "foundry_patience": 4}  # fmt: skip

NEVER = math.inf


@dataclass
class Labelled:
    """One run in one logging shape: its label (steps in optimizer updates), its setting, where its alarms count.

    ``collapse_step``: where the fall starts (None: no collapse); ``label_step``: where the label confirms it;
    ``streak_from``: alerts from this step on are the streak that runs into the collapse; ``deadline``: the
    last alarm step that is a detection (the collapse step, or a cut log's last update)."""

    run_id: str
    setting: str
    collapse_step: int | None
    dipped: bool
    ends_collapsed: bool
    label_step: int | None = None
    streak_from: float = -NEVER
    shape: str = "update"
    deadline: int | None = None
    last_step: int | None = None

    def __post_init__(self) -> None:
        if self.deadline is None:
            self.deadline = self.collapse_step

    @property
    def key(self) -> tuple[str, str]:
        return self.shape, self.run_id


@dataclass
class Score:
    """One method's record over a set of runs."""

    method: str
    collapsing: int = 0
    detected: int = 0
    stable: int = 0
    false_alarms: int = 0
    dipped: int = 0
    alarmed_dips: int = 0
    leads: list[int] = field(default_factory=list)
    lead_shares: list[float] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    false: list[str] = field(default_factory=list)

    def add(self, run: Labelled, alarm: float | None, why: str | None = None) -> None:
        alarm = None if alarm is None or math.isinf(alarm) else int(alarm)
        by = f" {why}" if why and alarm is not None else ""
        if run.collapse_step is not None:
            self.collapsing += 1
            if alarm is not None and alarm <= run.deadline:
                self.detected += 1
                self.leads.append(run.collapse_step - alarm)
                self.lead_shares.append((run.collapse_step - alarm) / max(run.collapse_step, 1))
            else:
                self.missed.append(f"{run.run_id} (collapse {run.collapse_step}, alarm {alarm}{by})")
        elif run.dipped:
            self.dipped += 1
            self.alarmed_dips += alarm is not None
        else:
            self.stable += 1
            if alarm is not None:
                self.false_alarms += 1
                self.false.append(f"{run.run_id} (alarm {alarm}{by})")

    def row(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "recall": f"{self.detected}/{self.collapsing}",
            "false alarms": f"{self.false_alarms}/{self.stable}",
            "median lead": statistics.median(self.leads) if self.leads else None,
            "min lead": min(self.leads) if self.leads else None,
            "median lead share": statistics.median(self.lead_shares) if self.lead_shares else None,
            "alarms on recovered dips": f"{self.alarmed_dips}/{self.dipped}",
        }

    def goals_met(self) -> bool:
        """The issue's goals: recall ≥ 95 %, false alarms ≤ 3 %, median lead share ≥ 20 %."""
        recall = self.detected / self.collapsing if self.collapsing else 1.0
        false_rate = self.false_alarms / self.stable if self.stable else 0.0
        share = statistics.median(self.lead_shares) if self.lead_shares else 0.0
        return recall >= 0.95 and false_rate <= 0.03 and share >= 0.2


# ------------------------------------------------------------------------------------------ labels
def setting_of(run_id: str) -> str:
    """A run's setting: its run id without a trailing ``-s<seed>``."""
    return re.sub(r"-s\d+$", "", run_id)


def labels(runs: RunSet, config: DetectorConfig, label: PostmortemConfig | None = None) -> list[Labelled]:
    """Every run's label, with where its fall starts and where the alert streak into it may begin: the
    post-mortem's own (``collapse_step`` at the fall's start, ``confirmed_step``, ``recovered_step``)."""
    out, label = [], label or PostmortemConfig()
    for row in label_collapse(runs, config, postmortem_config=label).to_pylist():
        run_id, label_step = row["run_id"], row["confirmed_step"]
        dipped = label_step is None and (row["deepest_dip"] or 1.0) < label.collapse_fraction
        onset, streak_from = label_step, -NEVER
        if label_step is not None:
            onset = row["collapse_step"]
            streak_from = -NEVER if row["recovered_step"] is None else row["recovered_step"]
        out.append(Labelled(run_id, setting_of(run_id), onset, dipped, bool(row["ends_collapsed"]),
                            label_step=label_step, streak_from=streak_from, last_step=row["last_step"]))  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------ alarms
@dataclass
class Alarms:
    """What the methods raised on one shape's runs, steps in optimizer updates: per fitted detector and run,
    its (steps, values) with every other threshold off; per run, the critical alerts of the unfitted
    detectors; per baseline and run, its alarm steps."""

    fitted: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    unfitted: dict[str, np.ndarray] = field(default_factory=dict)
    baselines: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    unfitted_names: dict[str, list[str]] = field(default_factory=dict)


def collect_alarms(runs: RunSet, config: DetectorConfig, to_update=lambda run_id, step: step) -> Alarms:
    """The fitted detectors' values at every block (each threshold's crossings follow from them), the unfitted
    ones' critical alerts, and the baselines; ``to_update(run_id, step)`` maps a log's step to updates.

    Two passes. The fitted single-signal detectors run alone with warnings at 0 and criticals off, so every
    block's value is reported. Everything else runs at the configured warning levels with the fitted
    criticals off: a joint detector (``diverging``) counts the families above their own *warning* levels, so
    it must see the configured ones (with the probe's zero warnings every logged family would count)."""
    fitted_names = [key.removesuffix("_critical") for key in FITTED]
    joint = {d.name for d in get_detectors() if d.reads}
    single = [name for name in fitted_names if name not in joint]
    off = {f"{name}_critical": math.inf for name in fitted_names}
    probe = config.replace(**{f"{name}_warning": 0.0 for name in single}, **off)
    rest = config.replace(**{f"{name}_warning": 0.0 for name in fitted_names if name in joint}, **off)
    fitted: dict[str, dict[str, tuple[list, list]]] = {name: {} for name in fitted_names}
    unfitted: dict[str, list[tuple[int, str]]] = {}
    rows = detect(runs, probe, detectors=single).to_pylist() if single else []
    rows += [r for r in detect(runs, rest).to_pylist() if r["detector"] not in single]
    for row in rows:
        name, run_id, step = row["detector"], row["run_id"], to_update(row["run_id"], row["step"])
        if name in fitted:
            steps, values = fitted[name].setdefault(run_id, ([], []))
            steps.append(step)
            values.append(row["value"])
        elif row["severity"] == "critical":
            unfitted.setdefault(run_id, []).append((step, name))
    params = {**BASELINE_PARAMS, "min_history_steps": config.min_history_steps}
    baselines = {}
    for method, sql in (("olmo_grad_spike", OLMO_GRAD_SPIKE_SQL), ("foundry_spike", FOUNDRY_SPIKE_SQL)):
        used = {k: v for k, v in params.items() if f"${k}" in sql}
        baselines[method] = {
            r["run_id"]: np.array([to_update(r["run_id"], s) for s in r["alarm_steps"]], float)
            for r in runs.sql(sql, used).to_pylist()
        }
    return Alarms(
        {name: {run_id: (np.array(s, float), np.array(v, float)) for run_id, (s, v) in by_run.items()}
         for name, by_run in fitted.items()},
        {run_id: np.array(sorted(s for s, _ in found), float) for run_id, found in unfitted.items()},
        baselines,
        {run_id: [name for _, name in sorted(found)] for run_id, found in unfitted.items()},
    )  # fmt: skip


def first_from(steps: np.ndarray | None, start: float) -> float:
    """The first of the sorted ``steps`` at or after ``start`` (``inf``: none)."""
    if steps is None or not len(steps):
        return NEVER
    index = int(np.searchsorted(steps, start, side="left"))
    return float(steps[index]) if index < len(steps) else NEVER


def first_crossing(
    series: tuple[np.ndarray, np.ndarray] | None, threshold: float, start: float = -NEVER
) -> float:
    """First step ``≥ start`` whose value exceeds ``threshold`` (``inf``: none)."""
    if series is None or math.isinf(threshold):
        return NEVER
    steps, values = series
    hits = np.flatnonzero((steps >= start) & (values > threshold))
    return float(steps[hits[0]]) if len(hits) else NEVER


def combos() -> list[dict[str, float]]:
    """Every combination of the ``FITTED`` grids, in ``itertools.product`` order."""
    return [dict(zip(FITTED, values, strict=True)) for values in itertools.product(*FITTED.values())]


def alarm_matrix(runs: Sequence[Labelled], alarms: Mapping[str, Alarms]) -> np.ndarray:
    """``(runs, combos)``: each run's alarm (in updates, ``inf``: none) under each threshold combination: the
    first critical alert from its ``streak_from`` on, of the fitted detectors at the combination's thresholds
    and of the unfitted ones at the configured thresholds."""
    grids = list(FITTED.values())
    matrix = np.full((len(runs), *(len(g) for g in grids)), NEVER)
    for i, run in enumerate(runs):
        found = alarms[run.shape]
        cell = np.full([len(g) for g in grids], first_from(found.unfitted.get(run.run_id), run.streak_from))
        for axis, (key, grid) in enumerate(FITTED.items()):
            series = found.fitted[key.removesuffix("_critical")].get(run.run_id)
            crossing = np.array([first_crossing(series, threshold, run.streak_from) for threshold in grid])
            shape = [1] * len(grids)
            shape[axis] = len(grid)
            cell = np.minimum(cell, crossing.reshape(shape))
        matrix[i] = cell
    return matrix.reshape(len(runs), -1)


FALSE_ALARM_BUDGET = 0.05
"""The fit's false-alarm budget on the settings it is fitted on."""


def choose(runs: Sequence[Labelled], matrix: np.ndarray, use: np.ndarray) -> int:
    """The combination (column of ``matrix``) with the best recall on the ``use``d runs at a false-alarm
    rate within the budget; ties: fewer false alarms, longer median lead share, higher thresholds."""
    collapse = np.array([r.collapse_step if r.collapse_step is not None else -1 for r in runs], float)
    deadline = np.array([r.deadline if r.deadline is not None else -1 for r in runs], float)
    collapsing = use & (collapse >= 0)
    stable = use & (collapse < 0) & ~np.array([r.dipped for r in runs])
    detected = matrix[collapsing] <= deadline[collapsing, None]
    recall = detected.sum(0) / max(collapsing.sum(), 1)
    false_rate = np.isfinite(matrix[stable]).sum(0) / max(stable.sum(), 1)
    shares = (collapse[collapsing, None] - matrix[collapsing]) / np.maximum(collapse[collapsing, None], 1)
    with warnings.catch_warnings():  # a combination that detects nothing has no median lead
        warnings.simplefilter("ignore", RuntimeWarning)
        lead = np.nanmedian(np.where(detected, shares, np.nan), axis=0) if collapsing.any() else 0 * recall
    values = np.array([list(c.values()) for c in combos()]).T  # (keys, combos)
    keys = [*values[::-1], np.nan_to_num(lead, nan=0.0), -false_rate, np.round(recall, 9),
            false_rate <= FALSE_ALARM_BUDGET]  # fmt: skip
    return int(np.lexsort(keys)[-1])


def fit(runs: Sequence[Labelled], alarms: Mapping[str, Alarms]) -> dict[str, float]:
    """The ``FITTED`` thresholds with the best recall on ``runs`` (all shapes) within the false-alarm budget."""
    return combos()[choose(runs, alarm_matrix(runs, alarms), np.ones(len(runs), bool))]


def leave_one_setting_out(
    runs: Sequence[Labelled], alarms: Mapping[str, Alarms]
) -> tuple[dict[tuple[str, str], float], dict[str, dict[str, float]]]:
    """Each run's alarm (by ``key``) under thresholds fitted on the other settings' runs (every shape of
    them); and those thresholds, per setting."""
    matrix, grid = alarm_matrix(runs, alarms), combos()
    settings = np.array([r.setting for r in runs])
    found, fits = {}, {}
    for setting in sorted(set(settings)):
        column = choose(runs, matrix, settings != setting)
        fits[setting] = grid[column]
        for i in np.flatnonzero(settings == setting):
            found[runs[i].key] = float(matrix[i, column])
    return found, fits


def baseline_alarm(run: Labelled, alarms: Mapping[str, Alarms], method: str) -> float:
    return first_from(alarms[run.shape].baselines[method].get(run.run_id), run.streak_from)


def score_with(
    name: str,
    runs: Sequence[Labelled],
    alarms: Mapping[Any, float | None],
    why: Mapping[tuple[str, str], str] | None = None,
) -> Score:
    score = Score(name)
    for run in runs:
        score.add(run, alarms.get(run.key, alarms.get(run.run_id)), (why or {}).get(run.key))
    return score


def alarm_source(run: Labelled, alarms: Alarms, thresholds: Mapping[str, float]) -> str | None:
    """Which detector raised ``run``'s alarm at ``thresholds`` (the fitted ones) and the configured levels."""
    best, name = first_from(alarms.unfitted.get(run.run_id), run.streak_from), None
    if not math.isinf(best):
        steps = alarms.unfitted[run.run_id]
        name = alarms.unfitted_names[run.run_id][int(np.searchsorted(steps, best, side="left"))]
    for key, threshold in thresholds.items():
        detector = key.removesuffix("_critical")
        step = first_crossing(alarms.fitted[detector].get(run.run_id), threshold, run.streak_from)
        if step < best:
            best, name = step, detector
    return name


# ------------------------------------------------------------------------------------------ shapes
def shaped_logs(runs: RunSet, labelled: Sequence[Labelled], shapes: Sequence[str], folder: Path) -> dict:
    """Write every run of ``runs`` in each of ``shapes`` (other than ``update``) under ``folder/<shape>/``;
    returns ``{run_id: updates per rollout batch}``."""
    info = {r["run_id"]: r for r in runs.sql("SELECT run_id, config FROM runs").to_pylist()}
    by_id = {r.run_id: r for r in labelled}
    sizes: dict[str, list[int]] = {}
    if "iteration" in runs.columns("steps"):
        for row in runs.sql("SELECT run_id, count(*) AS n FROM steps WHERE iteration IS NOT NULL "
                            "GROUP BY run_id, iteration").to_pylist():  # fmt: skip
            sizes.setdefault(row["run_id"], []).append(row["n"])
    updates: dict[str, int] = {}
    drop = {"run_id", "rank", *log_shapes.PER_UPDATE_ONLY}
    columns = [c for c in runs.columns("steps") if c not in drop and c in _KEPT_COLUMNS]
    for shape in shapes:
        (folder / shape).mkdir(parents=True, exist_ok=True)
    for run_id, run in sorted(by_id.items()):
        rows = runs.sql(
            f"SELECT {', '.join(columns)} FROM steps WHERE run_id = $r ORDER BY step", {"r": run_id}
        )
        per_update = log_shapes.updates_per_batch(info[run_id], sizes.get(run_id, ()))
        updates[run_id] = per_update
        batches = log_shapes.per_batch(rows, per_update)
        if "batch" in shapes:
            log_shapes.write_verl(batches, folder / "batch" / f"{run_id}.jsonl")
        if "every5" in shapes:
            log_shapes.write_trainer_state(log_shapes.every_n(rows), folder / "every5", run_id)
        if "cut" in shapes:
            at = log_shapes.cut_point(
                run_id, run.last_step or 0, per_update, run.collapse_step, run.label_step
            )
            log_shapes.write_verl(
                log_shapes.cut_batches(batches, at, per_update), folder / "cut" / f"{run_id}.jsonl"
            )
    return updates


_KEPT_COLUMNS = frozenset(
    {"step", "loss", "pg_loss", "ratio_max", "ratio_p99", "turn_ratio_max", "clip_frac", "clip_frac_active",
     "clip_frac_turn", "kl_old_k3", "kl_ref_k3", "entropy", "grad_norm", "reward_mean", "reward_std",
     "zero_std_group_frac", "response_len_mean", "completion_len_mean", "completion_truncated_frac",
     "nonfinite_count"}
)  # fmt: skip
"""What the shaped logs carry: the metrics a real trainer logs a counterpart of, or a detector reads."""


def in_shape(
    labelled: Sequence[Labelled], shape: str, last_steps: Mapping[str, int] | None = None
) -> list[Labelled]:
    """The runs as scored in ``shape``: the same labels; a ``cut`` log's deadline is its last update."""
    out = []
    for run in labelled:
        copy = Labelled(**{**run.__dict__, "shape": shape})
        if shape == "cut" and last_steps is not None:
            copy.last_step = last_steps.get(run.run_id, run.last_step)
            if copy.collapse_step is not None:
                copy.deadline = max(copy.collapse_step, copy.last_step)
        out.append(copy)
    return out


def with_row_deadlines(runs: Sequence[Labelled], rows: Mapping[str, np.ndarray] | None) -> list[Labelled]:
    """``runs`` with each collapse's deadline moved to the first of its log's ``rows`` (in updates) at or after
    the collapse step, where that is later (``rows`` None: every update is a row; nothing moves)."""
    out = []
    for run in runs:
        copy = Labelled(**run.__dict__)
        at = None if rows is None or run.collapse_step is None else rows.get(run.run_id)
        if at is not None:
            later = at[at >= run.collapse_step]
            if len(later):
                copy.deadline = max(copy.deadline, int(later[0]))
        out.append(copy)
    return out


def verdict_alarms(runs: RunSet, labelled: Sequence[Labelled], config: DetectorConfig,
                   fits: Mapping[str, Mapping[str, float]], to_update) -> dict[str, float]:  # fmt: skip
    """Per cut run whose post-mortem verdict (with its setting's fitted thresholds) is not ``healthy``: the
    log's last step in updates, where that verdict is first given."""
    found = {}
    for run in labelled:
        verdict = postmortem(runs, run.run_id, config.replace(**fits.get(run.setting, {})))
        if verdict.status != "healthy" and verdict.last_step is not None:
            found[run.run_id] = float(to_update(run.run_id, verdict.last_step))
    return found


# ------------------------------------------------------------------------------------------ evaluation
def evaluate_corpus(
    path: Sequence[str],
    config: DetectorConfig,
    shapes: Sequence[str] = ("update",),
    label: PostmortemConfig | None = None,
) -> dict[str, Any]:
    """Label the corpus, score every shape leave-one-setting-out beside the baselines (see module docstring)."""
    unknown = sorted(set(shapes) - set(log_shapes.SHAPES))
    if unknown:
        raise ValueError(f"unknown logging shape {unknown[0]!r}; known: {', '.join(log_shapes.SHAPES)}")
    with tempfile.TemporaryDirectory(prefix="detector_eval-") as scratch, open_runs(path) as runs:
        base = labels(runs, config, label)
        alarms = {"update": collect_alarms(runs, config)} if "update" in shapes else {}
        updates = shaped_logs(runs, base, [s for s in shapes if s != "update"], Path(scratch))
        by_shape = {s: in_shape(base, s) for s in shapes if s not in ("update", "cut")}
        if "update" in shapes:
            by_shape = {"update": in_shape(base, "update"), **by_shape}
        cut_runs, rows_at = None, {}
        for shape in (s for s in shapes if s != "update"):

            def to_update(run_id: str, step: int, shape: str = shape) -> int:
                return log_shapes.to_update_step(shape, step, updates[run_id])

            shaped = open_runs(Path(scratch) / shape)
            alarms[shape] = collect_alarms(shaped, config, to_update)
            rows_at[shape] = {r["run_id"]: np.array(sorted(to_update(r["run_id"], s) for s in r["steps"]), float)
                              for r in shaped.sql("SELECT run_id, list(step) AS steps FROM steps GROUP BY run_id").to_pylist()}  # fmt: skip
            if shape == "cut":
                ends = {r["run_id"]: to_update(r["run_id"], r["last"])
                        for r in shaped.sql("SELECT run_id, max(step) AS last FROM steps GROUP BY run_id").to_pylist()}  # fmt: skip
                by_shape["cut"] = in_shape(base, "cut", ends)
                cut_runs = (shaped, to_update)
            else:
                shaped.close()
        everything = [run for shape in by_shape.values() for run in shape]
        found, fits = leave_one_setting_out(everything, alarms)
        verdicts = {}
        if cut_runs is not None:
            silent = [
                r for r in by_shape["cut"] if math.isinf(found[r.key])
            ]  # an alarm comes before any verdict
            verdicts = verdict_alarms(cut_runs[0], silent, config, fits, cut_runs[1])
            cut_runs[0].close()
    whole = fit(everything, alarms)
    scores: dict[str, list[Score]] = {}
    for shape, shaped_runs in by_shape.items():
        mine = {run.key: found[run.key] for run in shaped_runs}
        if shape == "cut":
            mine = {run.key: min(found[run.key], verdicts.get(run.run_id, NEVER)) for run in shaped_runs}
        name = "detectors (leave-one-setting-out)" + (" + verdict" if shape == "cut" else "")
        why = {run.key: alarm_source(run, alarms[shape], fits[run.setting]) for run in shaped_runs}
        if shape == "cut":
            why.update({run.key: "verdict" for run in shaped_runs
                        if verdicts.get(run.run_id, NEVER) < found[run.key]})  # fmt: skip
        scores[shape] = [score_with(name, shaped_runs, mine, why)] + [
            score_with(method, shaped_runs, {r.key: baseline_alarm(r, alarms, method) for r in shaped_runs})
            for method in ("olmo_grad_spike", "foundry_spike")
        ]
        judged = [
            r for r in shaped_runs if r.collapse_step is None or r.collapse_step >= config.min_history_steps
        ]
        scores[shape].append(score_with(f"{LATE_PREFIX}{config.min_history_steps}", judged, mine))
        scores[shape].append(
            score_with(ROW_DEADLINE, with_row_deadlines(shaped_runs, rows_at.get(shape)), mine)
        )
    by_folder = []
    if (
        len(path) > 1 and "update" in by_shape
    ):  # the same leave-one-setting-out alarms, scored per corpus folder
        for folder in path:
            ids = {run.parent.name for run in Path(folder).glob("*/run.json")}
            in_folder = [r for r in by_shape["update"] if r.run_id in ids]
            first_method = scores["update"][0].method
            by_folder.append(score_with(f"{first_method}, {Path(folder).name}", in_folder, found))
    early = [
        r.run_id for r in base if r.collapse_step is not None and r.collapse_step < config.min_history_steps
    ]
    return {"scores": scores[shapes[0]], "by_shape": scores, "fits": fits, "fit_on_all": whole, "runs": base,
            "early": early, "settings": len({r.setting for r in base}), "by_folder": by_folder}  # fmt: skip


def evaluate_real(path: Sequence[str], config: DetectorConfig) -> dict[str, Any]:
    """Score real logs with the shipped defaults (never fitted on them); each run's verdict too."""
    with open_runs(path) as runs:
        labelled = labels(runs, config)
        alarms = {"update": collect_alarms(runs, config)}
        verdicts = {r.run_id: postmortem(runs, r.run_id, config) for r in labelled}
    defaults = {key: getattr(config, key) for key in FITTED}
    found = {run.key: _alarm_at(run, alarms["update"], defaults) for run in labelled}
    scores = [score_with("detectors (defaults)", labelled, found)]
    scores += [score_with(m, labelled, {r.key: baseline_alarm(r, alarms, m) for r in labelled})
               for m in ("olmo_grad_spike", "foundry_spike")]  # fmt: skip
    first = {r.run_id: _alarm_at(Labelled(**{**r.__dict__, "streak_from": -NEVER}), alarms["update"], defaults)
             for r in labelled}  # fmt: skip
    return {"scores": scores, "runs": labelled, "alarms": {k: _int(v) for k, v in first.items()},
            "verdicts": {k: v.status for k, v in verdicts.items()}}  # fmt: skip


def _alarm_at(run: Labelled, alarms: Alarms, thresholds: Mapping[str, float]) -> float:
    candidates = [first_from(alarms.unfitted.get(run.run_id), run.streak_from)]
    for key, threshold in thresholds.items():
        candidates.append(first_crossing(alarms.fitted[key.removesuffix("_critical")].get(run.run_id), threshold,
                                         run.streak_from))  # fmt: skip
    return min(candidates)


def _int(value: float) -> int | None:
    return None if math.isinf(value) else int(value)


# ------------------------------------------------------------------------------------------ output
def markdown(title: str, scores: Sequence[Score]) -> str:
    rows = [s.row() for s in scores]
    keys = list(rows[0])
    lines = [f"### {title}", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row[k]) for k in keys) + " |")
    return "\n".join(lines)


def goals_table(by_shape: Mapping[str, Sequence[Score]]) -> str:
    """One line per shape and method against the goals (recall ≥ 95 %, false alarms ≤ 3 %, lead share ≥ 20 %)."""
    lines = [
        "| shape | method | recall | false alarms | median lead share | goals |",
        "|---|---|---|---|---|---|",
    ]
    for shape, scores in by_shape.items():
        for score in scores:
            row = score.row()
            lines.append(f"| {shape} | {score.method} | {_percent(score.detected, score.collapsing)} | "
                         f"{_percent(score.false_alarms, score.stable)} | {_cell(row['median lead share'])} | "
                         f"{'met' if score.goals_met() else 'not met'} |")  # fmt: skip
    return "\n".join(lines)


def _wrap(text: str) -> str:
    """``text`` broken at 80 columns (long lists of runs stay readable in a terminal or a pipe)."""
    return textwrap.fill(text, 80, break_on_hyphens=False, subsequent_indent="  ")


def _percent(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.0f} %)" if whole else "—"


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 1 else f"{value:.0f}"
    return str(value)


ROW_DEADLINE = "the same, on time up to the row that covers the fall's start"
"""The detectors' score where an alarm on the first logged row at or after the collapse step (the row whose window
holds the update the fall starts at) still counts: a log every 5 steps cannot alarm at update 8."""

LATE_PREFIX = "the same, falls from update "
"""The detectors' score on the collapses whose fall starts once a baseline can exist (``min_history_steps``)."""

SHAPE_TITLES = {
    "update": "per optimizer update (as the bundled trainer logs)",
    "batch": "per rollout batch (verl's file logger, verl's names)",
    "every5": "every 5 optimizer steps (HF Trainer / TRL trainer_state.json, TRL's names)",
    "cut": "per rollout batch, stopped during or after the fall (stable runs: at random)",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--corpus", nargs="*", default=[], help="folders of bundled-trainer runs (the corpus)"
    )
    parser.add_argument("--real", nargs="*", default=[], help="foreign logs, scored with the defaults")
    parser.add_argument("--shapes", nargs="+", default=list(log_shapes.SHAPES),
                        help=f"logging shapes to score the corpus in (default: {' '.join(log_shapes.SHAPES)})")  # fmt: skip
    parser.add_argument("--config", type=Path, default=None, help="TOML file of detector settings")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="name=value")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON")
    parser.add_argument("--fit", action="append", default=[], metavar="NAME=V,V,…",
                        help="fit this <detector>_critical over these values (inf: off) besides FITTED's; "
                             "NAME= with no values leaves it at its configured value")  # fmt: skip
    parser.add_argument("--peak-band", type=float, default=None,
                        help="label the fall's start with this peak band instead of the post-mortem's "
                             "(a sensitivity check of the label; the shipped label is the default)")  # fmt: skip
    args = parser.parse_args(argv)
    if not args.corpus and not args.real:
        parser.error("give --corpus and/or --real")
    try:
        config = load_config(args.config, args.overrides)
        for item in args.fit:
            name, _, values = item.partition("=")
            if not hasattr(config, name) or not name.endswith("_critical"):
                raise ValueError(f"--fit {item}: not a <detector>_critical setting")
            if values:
                FITTED[name] = tuple(float(v) for v in values.split(","))
            else:
                FITTED.pop(name, None)
        payload: dict[str, Any] = {"config": config.to_dict(), "baselines": BASELINE_PARAMS}
        if args.corpus:
            started = time.perf_counter()
            band = None if args.peak_band is None else PostmortemConfig(peak_band=args.peak_band)
            if band is not None:
                print(f"Label: the fall starts where the reward moving average was last within {args.peak_band:g} "
                      "of its running peak (a sensitivity check; the post-mortem ships "
                      f"{PostmortemConfig().peak_band:g})\n")  # fmt: skip
            corpus = evaluate_corpus(args.corpus, config, args.shapes, band)
            collapsing = sum(r.collapse_step is not None for r in corpus["runs"])
            print(
                _wrap(
                    f"Corpus: {len(corpus['runs'])} runs in {corpus['settings']} settings ({collapsing} "
                    f"collapsing; {len(corpus['early'])} of them falling from before step "
                    f"{config.min_history_steps}); leave-one-setting-out, thresholds fitted on the other "
                    "settings in every shape at once; leads in optimizer updates from where the fall starts"
                )
            )
            print()  # fmt: skip
            print(goals_table(corpus["by_shape"]))
            for shape, scores in corpus["by_shape"].items():
                print()
                print(markdown(f"{shape}: {SHAPE_TITLES[shape]}", scores))
                print(_wrap(f"missed: {', '.join(scores[0].missed) or 'none'}"))
                print(_wrap(f"false alarms: {', '.join(scores[0].false) or 'none'}"))
            if corpus["by_folder"]:
                print()
                print(markdown("The same alarms (update), per corpus folder", corpus["by_folder"]))
            print(f"\nfit on the whole corpus, every shape (the defaults): {corpus['fit_on_all']}")
            print(f"({time.perf_counter() - started:.1f} s)")
            payload["corpus"] = {"scores": [s.row() for s in corpus["scores"]], "fits": corpus["fits"],
                                 "by_shape": {k: [s.row() for s in v] for k, v in corpus["by_shape"].items()},
                                 "by_folder": [s.row() for s in corpus["by_folder"]],
                                 "fit_on_all": corpus["fit_on_all"], "early": corpus["early"]}  # fmt: skip
        if args.real:
            real = evaluate_real(args.real, config)
            print()
            folders = ", ".join(Path(p).name for p in args.real)
            print(markdown(f"Scored with the shipped defaults, never fitted on them ({folders}): {len(real['runs'])} runs",
                           real["scores"]))  # fmt: skip
            for run in real["runs"]:
                label = (f"collapse from {run.collapse_step} (label {run.label_step})" if run.collapse_step is not None
                         else "no collapse")  # fmt: skip
                print(_wrap(f"  {run.run_id}: {label}; first critical alert {real['alarms'].get(run.run_id)}; "
                            f"verdict {real['verdicts'][run.run_id]}"))  # fmt: skip
            payload["real"] = {"scores": [s.row() for s in real["scores"]], "alarms": real["alarms"],
                               "verdicts": real["verdicts"]}  # fmt: skip
    except (QueryError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json is not None:
        args.json.write_text(json.dumps(payload, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
