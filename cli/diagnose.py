"""``sorl postmortem``, ``sorl report``, ``sorl compare``, ``sorl watch``: diagnose runs with the detectors.

Exit status of ``sorl postmortem`` (for CI gates): 0 healthy, 3 collapsed, 4 collapsing when the log ends, 5 diverging
when the log ends, 2 user error.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Annotated, Any

import pyarrow as pa
import typer

from sorl_monitor.cli.console import (
    RUN_PATH_HELP,
    LogFormatOption,
    LoggingStepsOption,
    MapOption,
    console,
    fail,
    log_options,
    open_or_fail,
    print_table,
    require,
    user_errors,
)
from sorl_monitor.diagnose.detectors import DetectorConfig
from sorl_monitor.diagnose.live import LiveRuns
from sorl_monitor.diagnose.postmortem import PostmortemConfig, Verdict, load_configs
from sorl_monitor.diagnose.postmortem import postmortem as run_postmortem
from sorl_monitor.logs import LogOptions
from sorl_monitor.notify import Notifier, alert_text, collapse_text
from sorl_monitor.read.query import RunSet

EXIT_HEALTHY = 0
"""``sorl postmortem``: healthy, no collapse labelled (alerts may still be listed as notes)."""
EXIT_COLLAPSE = 3
"""``sorl postmortem``: the run collapsed (the label is confirmed)."""
EXIT_COLLAPSING = 4
"""``sorl postmortem``: the log ends in a fall not yet confirmed as a collapse (status ``collapsing``)."""
EXIT_DIVERGING = 5
"""``sorl postmortem``: the log ends with several families above their quiet levels (status ``diverging``)."""
EXIT_NOT_JUDGED = 6
"""``sorl postmortem``: the run logs no reward, so no collapse could be judged (never called healthy)."""
EXIT_CODES = {"healthy": EXIT_HEALTHY, "collapsed": EXIT_COLLAPSE, "collapsing": EXIT_COLLAPSING,
              "diverging": EXIT_DIVERGING, "not_judged": EXIT_NOT_JUDGED}  # fmt: skip
"""``sorl postmortem``'s exit status for each verdict status."""

RunPath = Annotated[str, typer.Argument(help=RUN_PATH_HELP)]
RunOption = Annotated[str | None, typer.Option("--run", help="Run id, when the folder holds several runs.")]
ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="TOML file of detector and post-mortem settings (top level or a \\[detectors] table).",
    ),
]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override one detector or post-mortem setting: name=value (repeatable)."),
]


def _configs(
    config_file: Path | None, overrides: list[str] | None
) -> tuple[DetectorConfig, PostmortemConfig]:
    return load_configs(config_file, overrides or ())


def _run_ids(run_set: RunSet) -> list[str]:
    return [r["run_id"] for r in run_set.sql("SELECT run_id FROM runs ORDER BY run_id").to_pylist()]


def pick_run(run_set: RunSet, path: str, run_id: str | None) -> str:
    """The one run ``path`` means: ``run_id`` if given, else its only run."""
    run_ids = _run_ids(run_set)
    if run_id is None:
        if len(run_ids) > 1:
            fail(f"{path} holds {len(run_ids)} runs; pick one with --run ({', '.join(run_ids[:5])}…)")
        return run_ids[0]
    if run_id not in run_ids:
        fail(f"no run {run_id!r} in {path}")
    return run_id


def _or_dash(value: Any) -> str:
    return "—" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


KEY_EVIDENCE = (
    "reward_peak", "reward_at_collapse", "deepest_dip", "token_clip_frac", "turn_clip_frac", "clip_frac_growth",
    "kl_old_max", "token_ratio_p99", "turn_ratio_p99", "tail_width_ratio", "grad_norm_max", "entropy_growth",
    "length_growth", "truncated_share_max", "max_policy_lag", "ctn_on_share", "ctn_switches",
)  # fmt: skip
"""Evidence worth a line in the human-readable verdict (``--json`` has all of it)."""


def lead_words(verdict: Verdict) -> str:
    """The alert a fall was warned by, in the words ``sorl postmortem``, ``sorl demo`` and the dashboard share:
    the streak's first critical alert, else the last critical alert before the fall, else none."""
    if verdict.warned_by is not None:
        return f"critical at {verdict.warned_by['step']}: {verdict.warned_by['detector']}"
    last = verdict.last_critical_before_fall
    if last is not None:
        return (f"no critical alert ran into the fall; the last before it: {last['detector']} at step "
                f"{last['step']}, {verdict.fall_step - last['step']} steps before")  # fmt: skip
    return "no critical alert before it"


def print_verdict(verdict: Verdict) -> None:
    """The human-readable post-mortem: status, timeline, (for a collapse) cause and remedy, notes, inputs."""
    rows = "row" if verdict.updates == 1 else "rows"
    console.print(f"[bold]run {verdict.run_id}[/] ({verdict.algorithm or 'algorithm not recorded'}, "
                  f"{verdict.updates} {rows} logged, last step {_or_dash(verdict.last_step)})", highlight=False)  # fmt: skip
    if verdict.judged_by and verdict.judged_by.get("column"):
        judged = verdict.judged_by
        beside = (
            f"; the reward it optimizes, {judged['optimized']}, beside it" if judged.get("optimized") else ""
        )
        console.print(f"  judged by       {judged['column']} ({judged['why']}{beside})", highlight=False)
    if verdict.collapsed:
        reason = (
            "non-finite loss" if verdict.collapse_reason == "nonfinite_loss" else "reward below half its peak"
        )
        console.print(f"  status          [bold red]collapsed[/]: the fall starts at step {verdict.collapse_step}, "
                      f"confirmed at {verdict.confirmed_step} ({reason})", highlight=False)  # fmt: skip
    elif verdict.status == "collapsing":
        start = "" if verdict.fall_step is None else f" (the fall starts at step {verdict.fall_step})"
        console.print(f"  status          [bold red]collapsing when the log ends[/]{start}", highlight=False)
    elif verdict.status == "diverging":
        console.print(f"  status          [bold yellow]diverging when the log ends[/]: {verdict.diverging_score}",
                      highlight=False)  # fmt: skip
    elif verdict.status == "not_judged":
        console.print("  status          [yellow]not judged[/] (no reward logged)")
    else:
        console.print("  status          [green]healthy[/] (no collapse)")
    console.print(f"  first warning   {_or_dash(verdict.first_warning)}")
    console.print(f"  first critical  {_or_dash(verdict.first_critical)}")
    if verdict.fall_step is not None:
        alarm = verdict.streak_first_critical
        lead = (
            f"{verdict.lead_time} steps ({lead_words(verdict)})" if alarm is not None else lead_words(verdict)
        )
        console.print(f"  lead time       {lead}", highlight=False)
    if verdict.root_cause is not None:
        console.print(f"[bold]root cause[/]: {verdict.root_cause}: {verdict.explanation}", highlight=False)
        evidence = ", ".join(
            f"{k}={_or_dash(verdict.evidence.get(k))}"
            for k in KEY_EVIDENCE
            if verdict.evidence.get(k) is not None
        )
        console.print(f"  evidence: {evidence}", highlight=False)
        console.print(f"[bold]remedy[/]: {verdict.remedy}", highlight=False)
    for note in verdict.notes:
        console.print(f"  note: {note}", highlight=False)
    have = [f"{family} ({', '.join(columns)})" for family, columns in verdict.inputs.items() if columns]
    console.print(f"  inputs: {'; '.join(have) or 'none'}", highlight=False)
    blind = [family for family, columns in verdict.inputs.items() if not columns]
    if blind:
        console.print(f"  no input at all for the {', '.join(blind)} detectors", highlight=False)
    if verdict.not_evaluated:
        console.print(f"  not evaluated (no input): {', '.join(verdict.not_evaluated)}", highlight=False)
    if verdict.top_alerts:
        console.print("[bold]alerts[/] (detector, first step, first critical step, firings, strongest):")
        for a in verdict.top_alerts:
            color = "red" if a["severity"] == "critical" else "yellow"
            console.print(
                f"  [{color}]{a['detector']:<19}[/] {a['first_step']:>7} {_or_dash(a['first_critical_step']):>7} "
                f"{a['count']:>6}  {a['message']}",
                highlight=False,
            )


@user_errors
def postmortem(
    run: RunPath,
    run_id: RunOption = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the verdict as JSON.")] = False,
    config_file: ConfigOption = None,
    set_: SetOption = None,
    fmt: LogFormatOption = None,
    map_: MapOption = None,
    logging_steps: LoggingStepsOption = None,
) -> None:
    """Timeline, collapse, lead time, and for a collapse its root cause and remedy, of one run or log.

    Exit status: 0 healthy, 3 collapsed, 4 collapsing when the log ends, 5 diverging when the log ends,
    6 not judged (no reward logged), 2 user error.
    """
    configs = _configs(config_file, set_)
    with open_or_fail(run, fmt, options=log_options(map_, logging_steps, config_file)) as run_set:
        verdict = run_postmortem(run_set, pick_run(run_set, run, run_id), *configs)
    if json_:
        typer.echo(json.dumps(verdict.to_dict()))
    else:
        print_verdict(verdict)
    raise typer.Exit(EXIT_CODES[verdict.status])


@user_errors
def report(
    runs: Annotated[list[str], typer.Argument(help="Run folders, folders of runs, or logs (docs/logs.md).")],
    html_path: Annotated[Path, typer.Option("--html", help="Where to write the HTML page.")],
    config_file: ConfigOption = None,
    set_: SetOption = None,
    fmt: LogFormatOption = None,
    map_: MapOption = None,
    logging_steps: LoggingStepsOption = None,
) -> None:
    """One self-contained HTML page (opens offline) with the curves, alerts and verdict of each run."""
    require("plotly", "dashboard")
    from sorl_monitor.dashboard.report import build_report

    configs = _configs(config_file, set_)
    if html_path.is_dir():
        fail(f"--html must name a file, not the folder {html_path}")
    with open_or_fail(runs, fmt, options=log_options(map_, logging_steps, config_file)) as run_set:
        run_ids = _run_ids(run_set)
        page, count = build_report(run_set, run_ids, *configs)
    try:
        html_path.parent.mkdir(parents=True, exist_ok=True)
        html_path.write_text(page, encoding="utf-8")
    except OSError as error:
        fail(f"cannot write {html_path}: {error.strerror or error}")
    console.print(f"wrote {html_path} ({len(run_ids)} runs, {count} figures)", highlight=False)


COMPARE_SQL = """
SELECT run_id, count(*) AS updates,
       max(reward_mean) AS reward_max, arg_max(reward_mean, step) AS reward_last,
       avg(clip_frac) AS clip_frac_mean, max(clip_frac) AS clip_frac_max, max(clip_frac_turn) AS clip_frac_turn_max,
       max(ratio_max) AS token_ratio_max, max(turn_ratio_max) AS turn_ratio_max,
       max(kl_old_k3) AS kl_old_max, max(grad_norm) AS grad_norm_max,
       avg(CASE WHEN ctn_active THEN 1.0 WHEN ctn_active IS NOT NULL THEN 0.0 END) AS ctn_on_share
FROM steps WHERE run_id = $run_id GROUP BY run_id
"""
"""Key metrics of one run for ``sorl compare``."""


@user_errors
def compare(
    run_a: Annotated[str, typer.Argument(help="First run folder (or log).")],
    run_b: Annotated[str, typer.Argument(help="Second run folder (or log).")],
    json_: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    config_file: ConfigOption = None,
    set_: SetOption = None,
    fmt: LogFormatOption = None,
    map_: MapOption = None,
    logging_steps: LoggingStepsOption = None,
) -> None:
    """Side-by-side key metrics and verdicts of two runs."""
    configs = _configs(config_file, set_)
    options = log_options(map_, logging_steps, config_file)
    columns: dict[str, dict[str, Any]] = {}
    for path in (run_a, run_b):
        with open_or_fail(path, fmt, options=options) as run_set:
            run_id = pick_run(run_set, path, None)
            if run_id in columns:
                fail(f"both arguments are run {run_id!r}")
            metrics = run_set.sql(COMPARE_SQL, {"run_id": run_id}).to_pylist()
            if not metrics:
                fail(f"run {run_id!r} has no steps logged yet")
            verdict = run_postmortem(run_set, run_id, *configs)
        columns[run_id] = {
            **{k: v for k, v in metrics[0].items() if k != "run_id"},
            "algorithm": verdict.algorithm,
            "collapse_step": verdict.collapse_step,
            "first_warning": verdict.first_warning,
            "first_critical": verdict.first_critical,
            "lead_time": verdict.lead_time,
            "root_cause": verdict.root_cause,
        }
    if json_:
        typer.echo(json.dumps(columns, default=str))
        return
    names = list(columns)
    keys = list(next(iter(columns.values())))
    rows = [{"metric": key, **{name: _or_dash(columns[name][key]) for name in names}} for key in keys]
    print_table(pa.Table.from_pylist(rows), title=f"{names[0]} vs {names[1]}")


def _alert_line(row: dict[str, Any]) -> str:
    color = "red" if row["severity"] == "critical" else "yellow"
    return f"step {row['step']:>7}  [{color}]{row['severity']:<8}[/] {row['detector']:<20} {row['message']}"


@user_errors
def watch(
    run: RunPath,
    run_id: RunOption = None,
    interval: Annotated[float, typer.Option("--interval", min=0.05, help="Seconds between refreshes.")] = 2.0,
    max_seconds: Annotated[
        float | None, typer.Option("--max-seconds", min=0, help="Stop after this many seconds.")
    ] = None,
    config_file: ConfigOption = None,
    set_: SetOption = None,
    fmt: LogFormatOption = None,
    map_: MapOption = None,
    logging_steps: LoggingStepsOption = None,
    notify: Annotated[
        str | None,
        typer.Option(
            "--notify", help="Also post each event to this webhook URL (Slack- or Discord-compatible)."
        ),
    ] = None,
) -> None:
    """Follow a live run and print alerts as they start (and CTN switches, and a labelled collapse).

    Stops on Ctrl-C, after --max-seconds, or when the run is marked finished, failed, interrupted or terminated.
    """
    configs = _configs(config_file, set_)
    notifier = Notifier(notify) if notify else None
    try:
        options = log_options(map_, logging_steps, config_file)
        _watch(run, run_id, interval, max_seconds, configs, fmt, notifier, options)
    finally:
        if notifier is not None:
            notifier.close()


def _watch(
    run: str,
    run_id: str | None,
    interval: float,
    max_seconds: float | None,
    configs: tuple[DetectorConfig, PostmortemConfig],
    fmt: LogFormatOption,
    notifier: Notifier | None,
    options: LogOptions | None = None,
) -> None:
    started = time.monotonic()
    with open_or_fail(run, fmt, options=options) as run_set:
        run_id = pick_run(run_set, run, run_id)
        live = LiveRuns(run_set, detector_config=configs[0], postmortem_config=configs[1], min_refresh_s=0)
        printed: set[tuple[int, str, str]] = set()
        collapse_shown = False
        try:
            console.print(f"watching {run_id} (Ctrl-C to stop)")
            while True:
                live.refresh()
                # the status as of this refresh: a finished run's parts were all on disk before it
                info = live.run_state(run_id)
                logged = live.alerts(run_id).to_pylist()
                events = [
                    (r["step"], r["detector"], r["severity"], _alert_line(r), alert_text(run_id, r))
                    for r in live.timeline(run_id).onsets
                ]
                events += [
                    (
                        a["step"],
                        a["detector"],
                        "action",
                        f"step {a['step']:>7}  [cyan]{a['detector']:<8}[/] {a['message']}",
                        alert_text(run_id, a),
                    )
                    for a in logged
                    if a["kind"] == "action"
                ]
                for step, name, kind, line, text in sorted(events):
                    if (step, name, kind) not in printed:
                        printed.add((step, name, kind))
                        console.print(line, highlight=False)
                        if notifier is not None:
                            notifier.send(text)
                label = live.collapse_label(run_id)
                if not collapse_shown and label and label["collapse_step"] is not None:
                    collapse_shown = True
                    console.print(
                        f"[bold red]collapse[/] at step {label['collapse_step']} ({label['collapse_reason']})"
                    )
                    if notifier is not None:
                        notifier.send(collapse_text(run_id, label["collapse_step"], label["collapse_reason"]))
                if info is not None and info.status in ("finished", "failed", "interrupted", "terminated"):
                    console.print(f"run {run_id} is {info.status}")
                    return
                if max_seconds is not None and time.monotonic() - started >= max_seconds:
                    return
                remaining = math.inf if max_seconds is None else max_seconds - (time.monotonic() - started)
                time.sleep(min(interval, remaining))
        except KeyboardInterrupt:
            console.print("stopped")
        finally:
            live.close()
