"""``postmortem()``: label, time and explain one run, from the label, the alert summary and the evidence."""

from __future__ import annotations

import json
from typing import Any

from sorl_monitor.diagnose.detectors.assembly import detect_params
from sorl_monitor.diagnose.detectors.config import DetectorConfig
from sorl_monitor.diagnose.postmortem.alert_summary import (
    divergence,
    first_firing,
    streak_alarm,
    streak_gap,
    summarise_alerts,
)
from sorl_monitor.diagnose.postmortem.causes import (
    CAUSES,
    attribute,
    degeneration_note,
    remedy_for,
    trainer_family,
)
from sorl_monitor.diagnose.postmortem.config import PostmortemConfig
from sorl_monitor.diagnose.postmortem.evidence import count_run_rows, gather_evidence, run_inputs
from sorl_monitor.diagnose.postmortem.label import SHARED_BLOCKS_SQL, label_collapse
from sorl_monitor.diagnose.postmortem.verdict import Verdict
from sorl_monitor.read.query import QueryError, RunSet

CTN_SWITCHES_SQL = "SELECT count(*) AS n FROM alerts WHERE run_id = $run_id AND kind = 'action'"
"""How many CTN switches (and λ changes) the trainer logged: guard actions in ``alerts``."""


def postmortem(
    runs: RunSet,
    run_id: str,
    config: DetectorConfig | None = None,
    postmortem_config: PostmortemConfig | None = None,
) -> Verdict:
    """Label, time, and (for a collapse) explain one run (docs/detectors.md) with the detectors'
    ``config`` and the post-mortem's own settings."""
    config = config or DetectorConfig()
    settings = postmortem_config or PostmortemConfig()
    record = _run_record(runs, run_id)
    algorithm = record["algorithm"]
    judged_by = _run_config(record).get("judged")
    label_row, summary, run_rows = _label_and_alerts(runs, run_id, config, settings)
    collapse_step = label_row["collapse_step"]
    judged = collapse_step is not None or run_rows["n"] > 0
    inputs, not_evaluated = run_inputs(runs, run_id)
    end_signs = [] if collapse_step is not None else _end_signs(label_row, summary, settings)
    divergence_step, diverging_score, rising, diverging_at_end = divergence(
        summary, label_row, inputs, config
    )
    status = _status(collapse_step, end_signs, diverging_at_end, judged)
    fall_step = collapse_step if collapse_step is not None else (
        label_row["ending_fall_step"] if status == "collapsing" else None
    )  # fmt: skip
    end = fall_step if fall_step is not None else label_row["last_step"]
    evidence = _evidence(runs, run_id, end, label_row, run_rows["first_step"], settings)
    cause = explanation = remedy = None
    if status in ("collapsed", "collapsing"):
        cause = attribute(
            _streak(summary),
            evidence,
            end if status == "collapsed" else label_row["last_step"],
            _turn_level(algorithm, settings),
            settings,
            during=label_row["confirmed_step"] or label_row["last_step"],
        )
        explanation = CAUSES[cause][0]
        remedy = remedy_for(cause, trainer_family(algorithm, _run_config(record)))
        notes = _collapse_notes(label_row, status, cause, end_signs, evidence, not_evaluated, settings)
    else:
        notes = _other_notes(summary, evidence, label_row, judged, judged_by, settings)
    if diverging_score is not None:
        notes.append(f"diverging: {diverging_score}")
    alarm = streak_alarm(summary, label_row["recovered_step"], fall_step, streak_gap(label_row, config))
    warned_by, before_fall = _alarms(summary, alarm, fall_step)
    return Verdict(
        run_id=run_id,
        algorithm=algorithm,
        updates=label_row["updates"],
        last_step=label_row["last_step"],
        status=status,
        collapse_step=collapse_step,
        collapse_reason=label_row["collapse_reason"],
        ends_collapsed=bool(label_row["ends_collapsed"]),
        first_warning=first_firing(summary, None),
        first_critical=first_firing(summary, None, critical=True),
        lead_time=fall_step - alarm if alarm is not None and fall_step is not None else None,
        root_cause=cause,
        explanation=explanation,
        remedy=remedy,
        evidence=evidence,
        notes=notes,
        inputs=inputs,
        not_evaluated=not_evaluated,
        top_alerts=[
            {k: v for k, v in row.items() if k not in ("recent_steps", "steps_to_fall", "criticals_to_fall")}
            for row in summary[:10]
        ],
        confirmed_step=label_row["confirmed_step"],
        fall_step=fall_step,
        streak_first_critical=alarm,
        divergence_step=divergence_step,
        diverging_score=diverging_score,
        families_rising=rising,
        end_signs=end_signs,
        came_back_step=label_row["came_back_step"] if status == "collapsed" else None,
        warned_by=warned_by,
        last_critical_before_fall=before_fall,
        judged_by=judged_by if isinstance(judged_by, dict) else None,
    )


def _run_record(runs: RunSet, run_id: str) -> dict[str, Any]:
    """The run's ``runs`` row (``algorithm``, ``config``); ``QueryError`` naming the runs there when it has none."""
    rows = runs.sql(
        "SELECT algorithm, config FROM runs WHERE run_id = $run_id", {"run_id": run_id}
    ).to_pylist()
    if not rows:
        known = [r["run_id"] for r in runs.sql("SELECT run_id FROM runs ORDER BY run_id").to_pylist()]
        raise QueryError(f"no run {run_id!r} here (runs: {', '.join(known[:8])})")
    return rows[0]


def _run_config(record: dict[str, Any]) -> dict[str, Any]:
    """The trainer's settings the run stored (``run.json``'s ``config``), or ``{}``."""
    try:
        config = json.loads(record.get("config") or "{}")
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def _label_and_alerts(
    runs: RunSet, run_id: str, config: DetectorConfig, settings: PostmortemConfig
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """The run's collapse label, its alert summary and its rows with a reward, from one block aggregation."""
    shared = detect_params(SHARED_BLOCKS_SQL, config, run_id)
    with runs.scratch_table(SHARED_BLOCKS_SQL, shared) as blocks:
        label = label_collapse(runs, config, run_id, settings, blocks=blocks).to_pylist()
        if not label:
            raise QueryError(f"run {run_id!r} has no steps logged yet")
        label_row = label[0]
        fall_guess = (
            label_row["collapse_step"]
            if label_row["collapse_step"] is not None
            else label_row["ending_fall_step"]
        )
        summary = summarise_alerts(
            runs, run_id, config, label_row["recovered_step"], fall_guess, blocks=blocks
        )
        return label_row, summary, count_run_rows(runs, run_id, blocks)


def _status(collapse_step: int | None, end_signs: list[str], diverging_at_end: bool, judged: bool) -> str:
    """``collapsed`` (the label confirmed), ``collapsing`` (the log ends in a fall), ``diverging``, ``not_judged``
    (no reward to judge by) or ``healthy``."""
    if collapse_step is not None:
        return "collapsed"
    if end_signs:
        return "collapsing"
    if diverging_at_end:
        return "diverging"
    if not judged:
        return "not_judged"
    return "healthy"


def _evidence(
    runs: RunSet,
    run_id: str,
    end: int,
    label_row: dict[str, Any],
    first_step: int | None,
    settings: PostmortemConfig,
) -> dict[str, Any]:
    """The evidence over the ``root_cause_steps`` before ``end``, with the label's reward levels and the count of
    CTN switches."""
    evidence = gather_evidence(
        runs, run_id, max(0, end - settings.root_cause_steps), end, settings, first_step
    )
    for key in ("reward_peak", "reward_at_collapse", "deepest_dip", "deepest_dip_step", "end_reward_share"):
        evidence[key] = label_row[key]
    evidence["ctn_switches"] = runs.sql(CTN_SWITCHES_SQL, {"run_id": run_id}).to_pylist()[0]["n"]
    return evidence


def _turn_level(algorithm: str | None, settings: PostmortemConfig) -> bool:
    """Whether the run's algorithm already uses turn-level IS (granularity mismatch is not blamed on it)."""
    return algorithm is not None and algorithm.lower().replace("-", "_") in settings.turn_level_algorithms


def _streak(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The alert summary of the streak that runs into the fall, not of a dip the run recovered from."""
    return [
        {**row, "first_step": row["streak_first_step"], "first_critical_step": row["streak_critical_step"]}
        for row in summary
        if row["streak_first_step"] is not None
    ]


def _collapse_notes(
    label_row: dict[str, Any],
    status: str,
    cause: str,
    end_signs: list[str],
    evidence: dict[str, Any],
    not_evaluated: list[str],
    settings: PostmortemConfig,
) -> list[str]:
    """What a collapse's verdict adds: a comeback, the log's end, the generations of an entropy blow-up, the
    inputs an unexplained one lacked."""
    notes = []
    if status == "collapsed" and label_row["came_back_step"] is not None:
        notes.append(
            f"recovered: back within {settings.peak_band:.0%} of the peak it fell from "
            f"({label_row['reward_peak']:.3g}) from step {label_row['came_back_step']}, ending at "
            f"{label_row['end_reward']:.3g} (came_back_step)"
        )
    if label_row["ends_collapsed"]:
        notes.append(
            f"the log ends collapsed, {label_row['last_step'] - label_row['confirmed_step']} steps after"
            " the label was confirmed"
        )
    if status == "collapsing":
        notes.append("the log ends in a fall, too soon to confirm a collapse: " + "; ".join(end_signs))
    if cause == "entropy_blowup":
        notes.append(degeneration_note(evidence, settings))
    if cause == "unexplained" and not_evaluated:
        notes.append(f"this run logs no input for {', '.join(not_evaluated)}")
    return notes


def _other_notes(
    summary: list[dict[str, Any]],
    evidence: dict[str, Any],
    label_row: dict[str, Any],
    judged: bool,
    judged_by: Any,
    settings: PostmortemConfig,
) -> list[str]:
    """What a run that did not collapse showed: why it was not judged, its critical alerts, a deep dip it came
    back from, a log that ends out of its peak band."""
    notes = _healthy_notes(summary, evidence, settings)
    if not judged:
        candidates = (judged_by or {}).get("candidates")
        named = f"; columns it does log: {', '.join(candidates)} (--map reward=NAME)" if candidates else ""
        notes.insert(
            0, f"not judged: no row has a reward (reward_mean), which the collapse label needs{named}"
        )
    share, falling = label_row["end_reward_share"], label_row["ending_fall_step"]
    if falling is not None and share is not None:
        notes.append(
            f"the log ends with the reward moving average at {share:.0%} of its running peak, out of its peak"
            f" band since step {falling}: not yet low enough to call it collapsing"
        )
    return notes


def _healthy_notes(
    summary: list[dict[str, Any]], evidence: dict[str, Any], config: PostmortemConfig
) -> list[str]:
    """What a healthy run showed: its critical alerts, and a deep dip it came back from."""
    notes = [
        f"{row['detector']} critical from step {row['first_critical_step']} ({row['message']})"
        for row in summary
        if row["first_critical_step"] is not None
    ]
    dip = evidence.get("deepest_dip")
    if dip is not None and dip < config.collapse_fraction:
        notes.append(
            f"the reward moving average dipped to {dip:.0%} of its running peak at step "
            f"{evidence.get('deepest_dip_step')} and recovered"
        )
    return notes


def _end_signs(
    label_row: dict[str, Any], summary: list[dict[str, Any]], settings: PostmortemConfig
) -> list[str]:
    """Why a log ends in a fall: its reward moving average far below its peak, ``end_detectors`` critical in its
    last ``end_blocks`` blocks."""
    signs = []
    if label_row["ends_below"]:
        share = label_row["end_reward_share"]
        signs.append(
            f"the reward moving average ends at {share:.0%} of its running peak"
            if share is not None
            else "the reward moving average ends below half its running peak"
        )
    end = label_row["end_step"]
    signs += [
        f"{row['detector']} critical at the end ({row['message']})"
        for row in summary
        if row["detector"] in settings.end_detectors and row["last_critical_step"] is not None
        and end is not None and row["last_critical_step"] >= end
    ]  # fmt: skip
    return signs


def _alarms(
    summary: list[dict[str, Any]], alarm: int | None, fall_step: int | None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``warned_by`` (the alert at ``alarm``, the lead time's start) and ``last_critical_before_fall`` (the last
    critical alert at or before the fall's start): ``detector``, ``step``, ``message`` each."""
    warned_by = next(
        (
            {"detector": row["detector"], "step": alarm, "message": row["message"]}
            for row in summary
            if alarm is not None and alarm in (row["criticals_to_fall"] or [])
        ),
        None,
    )
    before_fall = max(
        (
            {"detector": row["detector"], "step": row["criticals_to_fall"][0], "message": row["message"]}
            for row in summary
            if fall_step is not None and row["criticals_to_fall"]
        ),
        key=lambda alert: alert["step"],
        default=None,
    )
    return warned_by, before_fall
