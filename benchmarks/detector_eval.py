"""How early and how reliably the detectors see collapse coming, next to two baselines, on a folder of runs.

    python benchmarks/detector_eval.py SWEEP_DIR [--config detectors.toml] [--set name=value] [--json out.json]

Each run is labelled with the post-mortem's collapse label (reward moving average below half its
running peak without recovery, or non-finite loss; ``sorl_monitor.postmortem.COLLAPSE_SQL``), which
no detector sees. A method *alarms* at its first critical alert. On a collapsing run it counts as a
detection when that alarm is at or before the collapse step (lead time = collapse step − alarm step,
in logged updates); on a stable run any alarm is a false alarm. Methods:

* each detector alone, and ``combined`` (the first critical alert of any detector);
* ``baseline_grad_spike``: OLMo-core-style grad-norm spike rule, ``g > mean + 6σ`` of the previous 128
  updates (from ``min_history`` updates on);
* ``baseline_loss_spike``: llm-foundry-style rule, loss ≥ 2 × its running mean over the previous 100
  updates for 5 consecutive updates (their ``KillLossSpike`` defaults), and the same rule mirrored on
  the reward (≤ ½ × its running mean), since an RL loss can be negative or flat while reward dies.

Prints per-method recall, false-alarm rate, median and minimum lead time, the confusion table of each
method, and a per-run table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sorl_monitor.detectors import DETECTOR_NAMES, DetectorConfig, detect, load_config  # noqa: E402
from sorl_monitor.postmortem import label_collapse  # noqa: E402
from sorl_monitor.query import QueryError, RunSet, open_runs  # noqa: E402

OLMO_GRAD_SPIKE_SQL = """
SELECT run_id, min(step) AS alarm_step FROM (
    SELECT run_id, step, grad_norm,
           avg(grad_norm) OVER prev AS mean, stddev_pop(grad_norm) OVER prev AS sd,
           count(grad_norm) OVER prev AS n
    FROM (SELECT run_id, step, avg(grad_norm) AS grad_norm FROM steps GROUP BY run_id, step)
    WINDOW prev AS (PARTITION BY run_id ORDER BY step ROWS BETWEEN $olmo_window PRECEDING AND 1 PRECEDING)
)
WHERE n >= $min_history AND grad_norm > mean + $olmo_sigmas * sd
GROUP BY run_id
"""
"""OLMo-core-style spike rule on the pre-clip grad norm: first step with ``g > mean + 6σ`` of the previous 128."""

FOUNDRY_SPIKE_SQL = """
WITH per_step AS (
    SELECT run_id, step, avg(loss) AS loss, avg(reward_mean) FILTER (WHERE isfinite(reward_mean)) AS reward
    FROM steps GROUP BY run_id, step
),
flagged AS (
    SELECT run_id, step,
           count(loss) OVER prev = $foundry_window AND avg(loss) OVER prev > 0
               AND loss >= $foundry_multiplier * avg(loss) OVER prev AS loss_outlier,
           count(reward) OVER prev = $foundry_window AND avg(reward) OVER prev > 0
               AND reward <= avg(reward) OVER prev / $foundry_multiplier AS reward_outlier
    FROM per_step
    WINDOW prev AS (PARTITION BY run_id ORDER BY step ROWS BETWEEN $foundry_window PRECEDING AND 1 PRECEDING)
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
"""llm-foundry-style rule (``KillLossSpike``): ≥ 2 × the running mean of the previous 100 updates for 5
consecutive updates, on the loss and (mirrored) on the reward."""

BASELINE_PARAMS = {
    "olmo_window": 128,
    "olmo_sigmas": 6.0,
    "foundry_window": 100,
    "foundry_multiplier": 2.0,
    "foundry_patience": 4,
}
"""The baselines' settings: OLMo-core's 6σ over 128 steps; llm-foundry's window 100, ×2, patience 4."""


@dataclass
class MethodScore:
    """One method's detection record over the sweep."""

    method: str
    collapsing: int
    stable: int
    detected: int
    late: int
    missed: int
    false_alarms: int
    lead_times: list[int] = field(default_factory=list)

    @property
    def recall(self) -> float | None:
        return self.detected / self.collapsing if self.collapsing else None

    @property
    def false_alarm_rate(self) -> float | None:
        return self.false_alarms / self.stable if self.stable else None

    @property
    def median_lead(self) -> float | None:
        return statistics.median(self.lead_times) if self.lead_times else None

    @property
    def min_lead(self) -> int | None:
        return min(self.lead_times) if self.lead_times else None

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "recall": self.recall,
            "false_alarm_rate": self.false_alarm_rate,
            "median_lead": self.median_lead,
            "min_lead": self.min_lead,
        }


@dataclass
class Evaluation:
    """Labels, each method's first alarm per run, and the scores."""

    labels: dict[str, int | None]
    alarms: dict[str, dict[str, int | None]]
    scores: list[MethodScore]


def first_alarms(runs: RunSet, config: DetectorConfig) -> dict[str, dict[str, int]]:
    """Method → run → first alarm step (critical alerts of each detector, any detector, and the baselines)."""
    alarms: dict[str, dict[str, int]] = {name: {} for name in (*DETECTOR_NAMES, "combined")}
    for row in detect(runs, config).to_pylist():
        if row["severity"] != "critical":
            continue
        for method in (row["detector"], "combined"):
            alarms[method].setdefault(row["run_id"], row["step"])
    params = {**BASELINE_PARAMS, "min_history": config.min_history}
    for method, sql in (
        ("baseline_grad_spike", OLMO_GRAD_SPIKE_SQL),
        ("baseline_loss_spike", FOUNDRY_SPIKE_SQL),
    ):
        used = {k: v for k, v in params.items() if f"${k}" in sql}
        alarms[method] = {r["run_id"]: r["alarm_step"] for r in runs.sql(sql, used).to_pylist()}
    return alarms


def score(method: str, labels: dict[str, int | None], alarms: dict[str, int]) -> MethodScore:
    """Detections, misses, late alarms, false alarms and lead times of one method."""
    result = MethodScore(method, 0, 0, 0, 0, 0, 0)
    for run_id, collapse_step in labels.items():
        alarm = alarms.get(run_id)
        if collapse_step is None:
            result.stable += 1
            result.false_alarms += alarm is not None
            continue
        result.collapsing += 1
        if alarm is not None and alarm <= collapse_step:
            result.detected += 1
            result.lead_times.append(collapse_step - alarm)
        elif alarm is not None:
            result.late += 1
        else:
            result.missed += 1
    return result


def evaluate(runs: RunSet, config: DetectorConfig | None = None) -> Evaluation:
    """Label every run, find each method's first alarm, score every method."""
    config = config or DetectorConfig()
    labels = {r["run_id"]: r["collapse_step"] for r in label_collapse(runs, config).to_pylist()}
    alarms = first_alarms(runs, config)
    return Evaluation(labels, alarms, [score(method, labels, found) for method, found in alarms.items()])


def _cell(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_report(evaluation: Evaluation) -> str:
    """Score table, confusion tables of the combined detectors and the baselines, and per-run alarms."""
    collapsing = sum(step is not None for step in evaluation.labels.values())
    lines = [
        f"runs: {len(evaluation.labels)} ({collapsing} collapsing, {len(evaluation.labels) - collapsing} stable "
        "by the collapse label); alarm = first critical alert; lead time in logged updates",
        "",
        "| method | recall | false-alarm rate | median lead | min lead | detected | late | missed | false alarms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in evaluation.scores:
        lines.append(
            f"| {s.method} | {_cell(s.recall)} | {_cell(s.false_alarm_rate)} | {_cell(s.median_lead, 1)} | "
            f"{_cell(s.min_lead)} | {s.detected}/{s.collapsing} | {s.late} | {s.missed} | {s.false_alarms}/{s.stable} |"
        )
    for s in evaluation.scores:
        if s.method not in ("combined", "baseline_grad_spike", "baseline_loss_spike"):
            continue
        lines += [
            "",
            f"confusion ({s.method}): rows = label, columns = alarm at or before collapse / none (or late)",
            "",
            "| | alarm | no alarm |",
            "|---|---|---|",
            f"| collapse | {s.detected} | {s.missed + s.late} |",
            f"| stable | {s.false_alarms} | {s.stable - s.false_alarms} |",
        ]
    lines += [
        "",
        "| run | collapse step | combined | grad-spike baseline | loss-spike baseline |",
        "|---|---|---|---|---|",
    ]
    for run_id, step in sorted(evaluation.labels.items()):
        found = [
            evaluation.alarms[m].get(run_id)
            for m in ("combined", "baseline_grad_spike", "baseline_loss_spike")
        ]
        lines.append(f"| {run_id} | {_cell(step)} | " + " | ".join(_cell(f) for f in found) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="folders of runs (a sweep)")
    parser.add_argument("--config", type=Path, default=None, help="TOML file of detector settings")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="name=value")
    parser.add_argument("--json", type=Path, default=None, help="also write the scores and alarms as JSON")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
        started = time.perf_counter()
        with open_runs(args.runs) as runs:
            evaluation = evaluate(runs, config)
        elapsed = time.perf_counter() - started
    except (QueryError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(markdown_report(evaluation))
    print(f"\nevaluated in {elapsed:.2f} s")
    if args.json is not None:
        payload = {
            "labels": evaluation.labels,
            "alarms": evaluation.alarms,
            "scores": [s.to_dict() for s in evaluation.scores],
            "config": config.to_dict(),
            "baselines": BASELINE_PARAMS,
        }
        args.json.write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
