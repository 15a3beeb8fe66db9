"""How early and how reliably the detectors see collapse coming: a labelled corpus and real logs, apart.

    python benchmarks/detector_eval.py --corpus benchmarks/corpus [--real ../shared/real_logs] [--json out.json]

Each run is labelled by the post-mortem's collapse label (``sorl_monitor.postmortem.COLLAPSE_SQL``: the
reward moving average below half its running peak without recovery, or a non-finite loss), which no
detector sees. A method *alarms* at its first critical alert; on a collapsing run that is a detection
when it comes at or before the collapse step (lead = collapse step − alarm step, in optimizer steps),
on a stable run a false alarm. A run that is not labelled collapsed but whose reward moving average
dipped below half its peak and recovered is counted apart (an alarm there is neither false nor a
detection).

(a) **Corpus** (``benchmarks/make_corpus.py``: the bundled trainer over a grid of settings), scored
    leave-one-setting-out: for each setting, the critical thresholds in ``FITTED`` are chosen on the
    *other* settings' runs (grid search: the best recall at a false-alarm rate ≤ 5 % there; ties go to
    fewer false alarms, the longer median lead, then the higher thresholds), then applied to that setting's runs. No threshold is judged on the setting it
    was fitted on. The shipped defaults are the same fit over the whole corpus (printed, not scored). Several
    ``--corpus`` folders (e.g. ``benchmarks/corpus`` and the sweep's runs copied by ``sweep_corpus.py``) are
    fitted as one corpus, and the same alarms are also scored per folder.
(b) **Held out** (``--real``: real logs, e.g. the TRL runs in ``../shared/real_logs``, read as the files come;
    or bundled-trainer runs outside the corpus), scored with the shipped defaults, never fitted on them.

Baselines on the same runs: ``olmo_grad_spike`` (OLMo-core-style, grad norm > mean + 6σ of the previous
128 steps) and ``foundry_spike`` (llm-foundry ``KillLossSpike``-style: loss ≥ 2 × its mean over the
previous 100 steps, or reward ≤ ½ × its mean, for 5 consecutive logged rows).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sorl_monitor.detectors import DETECTOR_NAMES, DetectorConfig, detect, load_config  # noqa: E402
from sorl_monitor.postmortem import PostmortemConfig, label_collapse  # noqa: E402
from sorl_monitor.query import QueryError, RunSet, open_runs  # noqa: E402

FITTED: dict[str, tuple[float, ...]] = {
    "clip_rise_critical": (3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, math.inf),
    "turn_clip_rise_critical": (4.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0, 30.0, math.inf),
    "kl_rise_critical": (5.0, 8.0, 10.0, 15.0, 20.0, 30.0, 50.0, 100.0, math.inf),
}
"""The critical thresholds fitted on the corpus, and the grid each is chosen from."""

OLMO_GRAD_SPIKE_SQL = """
SELECT run_id, min(step) AS alarm_step FROM (
    SELECT run_id, step, grad_norm,
           avg(grad_norm) OVER prev AS mean, stddev_pop(grad_norm) OVER prev AS sd,
           step - min(step) OVER prev AS span
    FROM (SELECT run_id, step, avg(grad_norm) AS grad_norm FROM steps GROUP BY run_id, step)
    WINDOW prev AS (PARTITION BY run_id ORDER BY step RANGE BETWEEN $olmo_window PRECEDING AND 1 PRECEDING)
)
WHERE span >= $min_history_steps AND grad_norm > mean + $olmo_sigmas * sd
GROUP BY run_id
"""
"""OLMo-core-style spike rule on the grad norm: first step with ``g > mean + 6σ`` of the previous 128 steps."""

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
SELECT run_id, min(step) AS alarm_step FROM streaks
WHERE loss_streak > $foundry_patience OR reward_streak > $foundry_patience
GROUP BY run_id
"""
"""llm-foundry-style rule (``KillLossSpike``): ≥ 2 × the mean of the previous 100 steps for 5 consecutive
logged rows, on the loss and (mirrored) on the reward, since an RL loss can be flat while reward dies."""

BASELINE_PARAMS = {"olmo_window": 128, "olmo_sigmas": 6.0, "foundry_window": 100, "foundry_multiplier": 2.0,
                   "foundry_patience": 4}  # fmt: skip


@dataclass
class Labelled:
    """One run's label: collapse step (None: none), and whether it dipped below half its peak and recovered."""

    run_id: str
    setting: str
    collapse_step: int | None
    dipped: bool
    ends_collapsed: bool


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

    def add(self, run: Labelled, alarm: int | None) -> None:
        if run.collapse_step is not None:
            self.collapsing += 1
            if alarm is not None and alarm <= run.collapse_step:
                self.detected += 1
                self.leads.append(run.collapse_step - alarm)
                self.lead_shares.append((run.collapse_step - alarm) / max(run.collapse_step, 1))
            else:
                self.missed.append(f"{run.run_id} (collapse {run.collapse_step}, alarm {alarm})")
        elif run.dipped:
            self.dipped += 1
            self.alarmed_dips += alarm is not None
        else:
            self.stable += 1
            if alarm is not None:
                self.false_alarms += 1
                self.false.append(f"{run.run_id} (alarm {alarm})")

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


def labels(runs: RunSet, config: DetectorConfig) -> list[Labelled]:
    """Every run's label; its setting is its run id without a trailing ``-s<seed>``."""
    out, label = [], PostmortemConfig()
    for row in label_collapse(runs, config, postmortem_config=label).to_pylist():
        run_id = row["run_id"]
        setting = re.sub(r"-s\d+$", "", run_id)
        dipped = row["collapse_step"] is None and (row["deepest_dip"] or 1.0) < label.collapse_fraction
        out.append(Labelled(run_id, setting, row["collapse_step"], dipped, bool(row["ends_collapsed"])))
    return out


def crossings(
    runs: RunSet, config: DetectorConfig
) -> tuple[dict[str, dict[str, list]], dict[str, dict[str, int]]]:
    """Per fitted detector and run, its (steps, running max of value) to find the first crossing of any
    threshold; and per method (each detector, ``combined`` of the unfitted ones) and run, its first alarm."""
    detectors = {key.removesuffix("_critical") for key in FITTED}
    probe = config.replace(**{f"{name}_warning": 0.0 for name in detectors},
                           **{f"{name}_critical": math.inf for name in detectors})  # fmt: skip
    series: dict[str, dict[str, list]] = {name: {} for name in detectors}
    first: dict[str, dict[str, int]] = {name: {} for name in (*DETECTOR_NAMES, "unfitted")}
    for row in detect(runs, probe).to_pylist():
        name, run_id = row["detector"], row["run_id"]
        if name in detectors:
            steps, peaks = series[name].setdefault(run_id, ([], []))
            steps.append(row["step"])
            peaks.append(max(row["value"], peaks[-1]) if peaks else row["value"])
        elif row["severity"] == "critical":
            first[name].setdefault(run_id, row["step"])
            first["unfitted"].setdefault(run_id, row["step"])
    return series, first


def first_crossing(steps_peaks: tuple[list[int], list[float]] | None, threshold: float) -> int | None:
    """First step whose value exceeds ``threshold`` (its running max does, from then on)."""
    if steps_peaks is None or math.isinf(threshold):
        return None
    steps, peaks = steps_peaks
    low, high = 0, len(peaks)
    while low < high:
        middle = (low + high) // 2
        if peaks[middle] > threshold:
            high = middle
        else:
            low = middle + 1
    return steps[low] if low < len(steps) else None


def combined_alarm(run_id: str, thresholds: Mapping[str, float], series: dict, first: dict) -> int | None:
    """The first critical alert of any detector under ``thresholds`` (the fitted ones) and the defaults."""
    candidates = [first["unfitted"].get(run_id)]
    for key, threshold in thresholds.items():
        candidates.append(first_crossing(series[key.removesuffix("_critical")].get(run_id), threshold))
    found = [c for c in candidates if c is not None]
    return min(found) if found else None


FALSE_ALARM_BUDGET = 0.05
"""The fit's false-alarm budget on the settings it is fitted on (the goal's ≤ 5 %)."""


def objective(runs: Sequence[Labelled], thresholds: Mapping[str, float], series: dict, first: dict) -> tuple:
    """Sort key of a threshold choice: within the false-alarm budget first, then recall, fewer false alarms,
    longer median lead share, higher thresholds."""
    score = Score("fit")
    for run in runs:
        score.add(run, combined_alarm(run.run_id, thresholds, series, first))
    recall = score.detected / score.collapsing if score.collapsing else 0.0
    false_rate = score.false_alarms / score.stable if score.stable else 0.0
    lead = statistics.median(score.lead_shares) if score.lead_shares else 0.0
    return (false_rate <= FALSE_ALARM_BUDGET, round(recall, 9), -false_rate, lead, *thresholds.values())


def fit(runs: Sequence[Labelled], series: dict, first: dict) -> dict[str, float]:
    """The ``FITTED`` thresholds with the best recall on ``runs`` at a false-alarm rate within the budget."""
    grid = [dict(zip(FITTED, values, strict=True)) for values in itertools.product(*FITTED.values())]
    return max(grid, key=lambda thresholds: objective(runs, thresholds, series, first))


def leave_one_setting_out(
    runs: Sequence[Labelled], series: dict, first: dict
) -> tuple[Score, dict[str, dict]]:
    """Score each setting's runs with thresholds fitted on the other settings; the fits, per setting."""
    score, fits = Score("detectors (leave-one-setting-out)"), {}
    for setting in sorted({r.setting for r in runs}):
        fitted = fit([r for r in runs if r.setting != setting], series, first)
        fits[setting] = fitted
        for run in (r for r in runs if r.setting == setting):
            score.add(run, combined_alarm(run.run_id, fitted, series, first))
    return score, fits


def baseline_alarms(runs: RunSet, config: DetectorConfig) -> dict[str, dict[str, int]]:
    params = {**BASELINE_PARAMS, "min_history_steps": config.min_history_steps}
    alarms = {}
    for method, sql in (("olmo_grad_spike", OLMO_GRAD_SPIKE_SQL), ("foundry_spike", FOUNDRY_SPIKE_SQL)):
        used = {k: v for k, v in params.items() if f"${k}" in sql}
        alarms[method] = {r["run_id"]: r["alarm_step"] for r in runs.sql(sql, used).to_pylist()}
    return alarms


def score_with(name: str, runs: Sequence[Labelled], alarms: Mapping[str, int | None]) -> Score:
    score = Score(name)
    for run in runs:
        score.add(run, alarms.get(run.run_id))
    return score


def markdown(title: str, scores: Sequence[Score]) -> str:
    rows = [s.row() for s in scores]
    keys = list(rows[0])
    lines = [f"### {title}", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row[k]) for k in keys) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.2f}" if value < 1 else f"{value:.0f}"
    return str(value)


def evaluate_corpus(path: Sequence[str], config: DetectorConfig) -> dict[str, Any]:
    with open_runs(path) as runs:
        labelled = labels(runs, config)
        series, first = crossings(runs, config)
        baselines = baseline_alarms(runs, config)
    loso, fits = leave_one_setting_out(labelled, series, first)
    whole = fit(labelled, series, first)
    scores = [loso] + [score_with(name, labelled, alarms) for name, alarms in baselines.items()]
    by_folder = []
    if len(path) > 1:  # the same leave-one-setting-out alarms, scored per corpus folder
        for folder in path:
            ids = {run.parent.name for run in Path(folder).glob("*/run.json")}
            in_folder = [r for r in labelled if r.run_id in ids]
            alarms = {r.run_id: combined_alarm(r.run_id, fits[r.setting], series, first) for r in in_folder}
            by_folder.append(score_with(f"{loso.method}, {Path(folder).name}", in_folder, alarms))
    early = [
        r.run_id
        for r in labelled
        if r.collapse_step is not None and r.collapse_step < config.min_history_steps
    ]
    return {"scores": scores, "fits": fits, "fit_on_all": whole, "runs": labelled, "early": early,
            "settings": len({r.setting for r in labelled}), "by_folder": by_folder}  # fmt: skip


def evaluate_real(path: Sequence[str], config: DetectorConfig) -> dict[str, Any]:
    with open_runs(path) as runs:
        labelled = labels(runs, config)
        found: dict[str, int] = {}
        for row in detect(runs, config).to_pylist():
            if row["severity"] == "critical":
                found.setdefault(row["run_id"], row["step"])
        baselines = baseline_alarms(runs, config)
    scores = [score_with("detectors (defaults)", labelled, found)]
    scores += [score_with(name, labelled, alarms) for name, alarms in baselines.items()]
    return {"scores": scores, "runs": labelled, "alarms": found}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--corpus", nargs="*", default=[], help="folders of bundled-trainer runs (the corpus)"
    )
    parser.add_argument("--real", nargs="*", default=[], help="foreign logs, scored with the defaults")
    parser.add_argument("--config", type=Path, default=None, help="TOML file of detector settings")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="name=value")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON")
    args = parser.parse_args(argv)
    if not args.corpus and not args.real:
        parser.error("give --corpus and/or --real")
    try:
        config = load_config(args.config, args.overrides)
        payload: dict[str, Any] = {"config": config.to_dict(), "baselines": BASELINE_PARAMS}
        if args.corpus:
            started = time.perf_counter()
            corpus = evaluate_corpus(args.corpus, config)
            collapsing = sum(r.collapse_step is not None for r in corpus["runs"])
            print(markdown(
                f"Corpus: {len(corpus['runs'])} runs in {corpus['settings']} settings ({collapsing} collapsing; "
                f"{len(corpus['early'])} of them before step {config.min_history_steps}, when no baseline "
                "exists yet), leave-one-setting-out", corpus["scores"]))  # fmt: skip
            if corpus["by_folder"]:
                print()
                print(markdown("The same alarms, per corpus folder", corpus["by_folder"]))
            print(f"\nfit on the whole corpus (the defaults): {corpus['fit_on_all']}")
            for score in corpus["scores"][:1]:
                print(f"missed: {', '.join(score.missed) or 'none'}")
                print(f"false alarms: {', '.join(score.false) or 'none'}")
            print(f"({time.perf_counter() - started:.1f} s)")
            payload["corpus"] = {"scores": [s.row() for s in corpus["scores"]], "fits": corpus["fits"],
                                 "by_folder": [s.row() for s in corpus["by_folder"]],
                                 "fit_on_all": corpus["fit_on_all"], "early": corpus["early"]}  # fmt: skip
        if args.real:
            real = evaluate_real(args.real, config)
            print()
            folders = ", ".join(Path(p).name for p in args.real)
            print(markdown(f"Scored with the shipped defaults, never fitted on them ({folders}): {len(real['runs'])} runs",
                           real["scores"]))  # fmt: skip
            for run in real["runs"]:
                label = f"collapse at {run.collapse_step}" if run.collapse_step is not None else "no collapse"
                print(f"  {run.run_id}: {label}; first critical alert {real['alarms'].get(run.run_id)}")
            payload["real"] = {"scores": [s.row() for s in real["scores"]], "alarms": real["alarms"]}
    except (QueryError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json is not None:
        args.json.write_text(json.dumps(payload, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
