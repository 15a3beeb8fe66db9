"""``sorl postmortem|report|compare|watch`` on SYNTHETIC runs written through Monitor: exit codes, output, errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.cli.main import app
from sorl_monitor.dashboard.report import FIGURES_PER_RUN
from sorl_monitor.write.part_files import write_json_atomic
from tests.helpers.synthetic import KEYS, ONSET, collapse_reward, pattern_rows, stable_rows, write_rows

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def collapsing_rows(n: int = 420) -> list[dict]:
    """SYNTHETIC: token clip fraction 0.6 from step 250 (turn clip fraction unchanged), reward down to 0.05
    from step 300."""
    rows = stable_rows(n, run_id="collapsed")
    for row in rows[ONSET:]:
        row["clip_frac"] = 0.6
    return collapse_reward(rows, 300)


@pytest.fixture
def runs(tmp_path) -> dict[str, Path]:
    return {
        "healthy": write_rows(tmp_path / "logs", "healthy", stable_rows(300)),
        "collapsed": write_rows(tmp_path / "logs", "collapsed", collapsing_rows()),
    }


def test_postmortem_exits_0_on_a_healthy_synthetic_run_and_offers_no_cause_or_remedy(runs):
    result = invoke("postmortem", runs["healthy"])
    assert result.exit_code == 0 and "healthy" in result.output
    assert "root cause" not in result.output and "remedy" not in result.output


def test_postmortem_exits_0_on_a_healthy_synthetic_run_with_a_critical_alert_and_notes_it(tmp_path):
    run = write_rows(tmp_path, "alarmed", pattern_rows("clip_rise", 400))
    result = invoke("postmortem", run, "--json")
    verdict = json.loads(result.output)
    assert result.exit_code == 0 and verdict["status"] == "healthy"
    assert (
        verdict["first_critical"] is not None and verdict["root_cause"] is None and verdict["remedy"] is None
    )
    assert [note for note in verdict["notes"] if "clip_rise" in note], verdict["notes"]


def test_postmortem_exits_3_on_a_collapsed_synthetic_run_and_names_cause_and_remedy(runs):
    result = invoke("postmortem", runs["collapsed"])
    assert result.exit_code == 3
    assert (
        "granularity_mismatch" in result.output and "remedy" in result.output and "lead time" in result.output
    )


def test_postmortem_json_is_the_verdict(runs):
    result = invoke("postmortem", runs["collapsed"], "--json")
    verdict = json.loads(result.output)
    assert result.exit_code == 3 and verdict["status"] == "collapsed" and verdict["lead_time"] > 0


def test_postmortem_set_changes_a_threshold(runs):
    default = json.loads(invoke("postmortem", runs["collapsed"], "--json").output)
    silenced = json.loads(
        invoke("postmortem", runs["collapsed"], "--json", "--set", "clip_rise_critical=inf").output
    )
    assert "clip_rise" in [a["detector"] for a in default["top_alerts"] if a["severity"] == "critical"]
    assert "clip_rise" not in [a["detector"] for a in silenced["top_alerts"] if a["severity"] == "critical"]


def test_postmortem_picks_a_run_of_a_log_folder_with_run(runs):
    result = invoke("postmortem", runs["healthy"].parent, "--run", "collapsed", "--json")
    assert result.exit_code == 3 and json.loads(result.output)["run_id"] == "collapsed"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("postmortem", "{missing}"), "no such file"),
        (("postmortem", "{logs}"), "pick one with --run"),
        (("postmortem", "{logs}", "--run", "nope"), "no run 'nope'"),
        (("postmortem", "{run}", "--config", "{bad_toml}"), "bad TOML"),
        (("postmortem", "{run}", "--config", "{missing}"), "no such config file"),
        (("postmortem", "{run}", "--config", "stale-rollouts"), "no such config file"),
        (("postmortem", "{run}", "--set", "clip_rise_critica=4"), "unknown detector setting"),
        (("postmortem", "{run}", "--set", "clip_frac_severe=0.4"), "unknown detector setting"),
        (("postmortem", "{run}", "--set", "clip_rise_critical"), "name=value"),
        (("report", "{run}", "--html", "{logs}"), "must name a file"),
        (("compare", "{run}", "{run}"), "both arguments are run"),
        (("watch", "{missing}"), "no such file"),
    ],
)
def test_user_mistakes_get_one_line_and_exit_2(runs, tmp_path, args, message):
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("clip_rise_critical = [\n")
    names = {
        "missing": tmp_path / "missing",
        "logs": runs["healthy"].parent,
        "run": runs["healthy"],
        "bad_toml": bad_toml,
    }
    result = invoke(*(a.format(**names) for a in args))
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_report_writes_one_page_with_the_dashboards_figures_per_run_and_inline_plotly(runs, tmp_path):
    page = tmp_path / "out" / "report.html"
    result = invoke("report", runs["healthy"], runs["collapsed"], "--html", page)
    html = page.read_text()
    expected = 2 * FIGURES_PER_RUN + 1
    assert result.exit_code == 0 and f"{expected} figures" in result.output
    assert html.count('class="plotly-graph-div"') == expected
    assert html.count("<script src=") == 0 and "plotly.js v" in html


def test_compare_shows_both_runs_side_by_side(runs):
    result = invoke("compare", runs["healthy"], runs["collapsed"], "--json")
    table = json.loads(result.output)
    assert result.exit_code == 0 and set(table) == {"healthy", "collapsed"}
    assert table["healthy"]["collapse_step"] is None and table["collapsed"]["collapse_step"] >= 300
    text = invoke("compare", runs["healthy"], runs["collapsed"]).output
    assert "root_cause" in text and "granularity_mismatch" in text


def test_watch_prints_alert_onsets_of_a_finished_synthetic_run_and_returns(runs):
    result = invoke("watch", runs["collapsed"], "--interval", "0.1", "--max-seconds", "20")
    assert result.exit_code == 0
    assert "clip_rise" in result.output and "collapse" in result.output
    assert "is finished" in result.output
    assert result.output.count("clip_rise") <= 3  # onsets, not one line per firing update


def test_watch_stops_after_max_seconds_on_a_running_run(runs):
    info = json.loads((runs["healthy"] / "run.json").read_text())
    write_json_atomic(runs["healthy"] / "run.json", {**info, "status": "running"})
    started = time.monotonic()
    result = invoke("watch", runs["healthy"], "--interval", "0.2", "--max-seconds", "1")
    watched_s = time.monotonic() - started
    assert result.exit_code == 0 and "watching healthy" in result.output
    assert "run healthy is" not in result.output  # the run's status did not end it
    # it ended at the 1 s (by the command's own clock: no machine's speed makes that sooner), plus at most a
    # refresh (~0.2 s here) with room for a machine 3× slower and busy
    assert 1 <= watched_s < 1 + 9, watched_s


def _watch_process(run: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.Popen(
        [sys.executable, "-m", "sorl_monitor.cli.main", "watch", str(run), "--interval", "0.1", *extra],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


@pytest.mark.slow
def test_watch_follows_a_live_synthetic_run_and_prints_new_alerts(tmp_path):
    rows = pattern_rows("ratio_tail_rise", 300)
    lines: list[str] = []
    with Monitor(tmp_path, "live", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        for row in rows[:ONSET]:
            mon.log_scalars(row["step"], {k: v for k, v in row.items() if k not in KEYS}, names=None)
        mon.flush()
        process = _watch_process(tmp_path / "live", "--max-seconds", "60")
        reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + 30
        while not any("watching" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        for row in rows[ONSET:]:
            mon.log_scalars(row["step"], {k: v for k, v in row.items() if k not in KEYS}, names=None)
    process.wait(timeout=60)
    reader.join(timeout=5)
    output = "".join(lines)
    assert process.returncode == 0
    assert "ratio_tail_rise" in output and "is finished" in output


@pytest.mark.slow
def test_watch_exits_cleanly_on_ctrl_c(runs):
    info = json.loads((runs["healthy"] / "run.json").read_text())
    write_json_atomic(runs["healthy"] / "run.json", {**info, "status": "running"})
    process = _watch_process(runs["healthy"])
    first = process.stdout.readline()
    assert "watching" in first
    process.send_signal(signal.SIGINT)
    rest = process.communicate(timeout=30)[0]
    assert process.returncode == 0 and "stopped" in rest and "Traceback" not in rest
