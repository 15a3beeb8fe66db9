"""Each dashboard view rendered by Streamlit's ``AppTest`` on real runs, one run and two overlaid, and the
friendly messages."""

from __future__ import annotations

import re
import time

import pyarrow.compute as pc
import pytest

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.dashboard import sql_view, view_parts
from sorl_monitor.dashboard.launch_settings import SQL_TIMEOUT_ENV
from sorl_monitor.diagnose.postmortem import postmortem
from sorl_monitor.read.query import open_runs
from tests.helpers.dashboard_app import (
    GUARDED,
    STABLE,
    assert_clean,
    chart_drawn,
    charts,
    open_app,
    page_text,
    wait_for_verdicts,
)
from tests.helpers.log_writers import hf_history
from tests.helpers.synthetic import stable_rows, write_rows

BOTH = [GUARDED, STABLE]


def last_step(log_dir, run_id: str, where: str = "true") -> int:
    with open_runs(log_dir) as runs:
        sql = f"SELECT max(step) AS s FROM steps WHERE run_id = '{run_id}' AND {where}"
        return runs.sql(sql).column("s")[0].as_py()


def runs_drawn(figure: dict) -> set[str]:
    """The runs whose curves a figure draws (each curve's hover text starts with its run)."""
    hovers = [t.get("hovertemplate", "") for t in figure["data"]]
    return {hover.split("<br>")[0].split(" · ")[0] for hover in hovers if "<br>" in hover}


def test_overview_shows_the_latest_run_its_last_step_and_its_curves(monkeypatch, ppo_logs):
    app = open_app(monkeypatch, ppo_logs)
    assert_clean(app)
    assert app.multiselect(key="runs").value == [STABLE]
    assert f"**{STABLE}** · ppo · finished · step {last_step(ppo_logs, STABLE)}" in page_text(app)
    assert runs_drawn(charts(app)["overview"]) == {STABLE}


def test_overview_overlays_the_runs_picked(monkeypatch, ppo_logs):
    app = open_app(monkeypatch, ppo_logs, runs=BOTH)
    assert_clean(app)
    text = page_text(app)
    assert f"**{GUARDED}**" in text and f"**{STABLE}**" in text
    assert runs_drawn(charts(app)["overview"]) == set(BOTH)


def test_overview_options_change_the_x_axis_smoothing_log_scale_and_alert_families(monkeypatch, ppo_logs):
    app = open_app(monkeypatch, ppo_logs, runs=[GUARDED])
    app.segmented_control(key="x-axis").set_value("iteration")
    app.select_slider(key="smoothing").set_value(32)
    app.multiselect(key="log-panels").set_value(["reward"])
    next(b for b in app.get("button_group") if b.key == "families").set_value(["kl"]).run()
    assert_clean(app)
    figure = charts(app)["overview"]
    layout = figure["layout"]
    assert layout["uirevision"] == "overview/iteration"
    assert layout["yaxis"]["type"] == "log" and layout["yaxis3"].get("type") != "log"
    assert any(t.get("opacity") == 0.3 for t in figure["data"])  # raw curves kept, faint, under the smoothed
    families = {t["legendgroup"] for t in figure["data"] if t.get("legendgroup", "").startswith("alerts/")}
    assert families <= {"alerts/kl"}


def test_a_first_page_sends_its_chart_before_the_sidebars_widgets(monkeypatch, ppo_logs):
    """A session's first page leaves the run picker and chart options out until its chart reports being
    drawn (then the page runs again with them); a view without a chart draws them at once."""
    app = open_app(monkeypatch, ppo_logs, drawn=False)
    assert "overview" in charts(app)
    assert not app.multiselect and not app.sidebar.get("select_slider")
    assert app.session_state[view_parts.CHOICES_SHOWN] is False
    chart_drawn(app)
    assert_clean(app)
    assert app.multiselect(key="runs").value == [STABLE]
    assert app.select_slider(key="smoothing").value == 0
    alerts = open_app(monkeypatch, ppo_logs, view="Alerts & verdict", drawn=False)
    assert alerts.multiselect(key="runs").value == [STABLE]


def test_the_sidebars_widgets_once_shown_stay_when_a_chart_is_sent(monkeypatch, ppo_logs):
    """A first page without a chart (its link's run is not there yet) draws the widgets; the run the viewer
    then picks draws its chart with them still there, their values kept."""
    app = open_app(monkeypatch, ppo_logs, runs=["later"], drawn=False)
    app.select_slider(key="smoothing").set_value(32).run()
    app.multiselect(key="runs").set_value([STABLE]).run()
    assert_clean(app)
    assert "overview" in charts(app)
    assert app.multiselect(key="runs").value == [STABLE]
    assert app.select_slider(key="smoothing").value == 32


def test_the_sidebars_widgets_come_without_a_report_from_the_chart_after_a_while(monkeypatch, ppo_logs):
    """A browser whose chart never reports its draw still gets the widgets, ``CHOICES_WAIT_S`` after the chart
    was sent (at the view's next redraw)."""
    app = open_app(monkeypatch, ppo_logs, drawn=False)
    assert not app.multiselect
    app.session_state[view_parts.CHOICES_WAITING] -= view_parts.CHOICES_WAIT_S + 1
    app.run()
    assert_clean(app)
    assert app.multiselect(key="runs").value == [STABLE]


EMOJI_SHORTCODE = re.compile(r":(?!material/|streamlit:)[\w+-][\w_+-]*:")
"""What makes Streamlit's markdown load its emoji plugin (260 KB of script for the browser to fetch and
compile) for a text: its front end's own test of a text, as of Streamlit 1.67."""


def test_the_first_pages_texts_hold_no_emoji_shortcode(monkeypatch, ppo_logs):
    """The sidebar's "checked HH:MM:SS" read as a shortcode (``:MM:``) and loaded the emoji plugin on every
    first visit; escaped colons (``\\:``) show the same time."""
    app = open_app(monkeypatch, ppo_logs, runs=BOTH)
    texts = page_text(app).splitlines()
    assert any(re.fullmatch(r"checked \d\d\\:\d\d\\:\d\d", text) for text in texts), texts
    assert not [text for text in texts if EMOJI_SHORTCODE.search(text)]


def test_sidebar_lists_every_run_with_algorithm_status_and_last_step(monkeypatch, ppo_logs):
    app = open_app(monkeypatch, ppo_logs)
    sidebar = "\n".join(str(element.value) for element in app.sidebar.get("markdown"))
    for run_id in BOTH:
        assert re.search(
            rf"\*\*{run_id}\*\*  \n:gray\[ppo · finished · step {last_step(ppo_logs, run_id)}\]", sidebar
        )


def test_a_link_to_a_run_not_there_yet_says_so_and_keeps_the_run_asked_for(monkeypatch, tmp_path):
    write_rows(tmp_path, "first", stable_rows(40))
    app = open_app(monkeypatch, tmp_path, runs=["first", "later"])
    assert_clean(app)
    assert "(yet): later" in app.warning[0].value
    write_rows(tmp_path, "later", stable_rows(40))
    time.sleep(0.3)  # past LiveRuns' refresh throttle (the page's run list reruns it once the run appears)
    app.run()
    assert app.multiselect(key="runs").value == ["first", "later"]
    assert not app.warning


def test_turn_view_draws_each_runs_heatmap_and_its_latest_reused_rollouts_ratios(monkeypatch, ppo_logs):
    app = open_app(monkeypatch, ppo_logs, view="Turns", runs=BOTH)
    assert_clean(app)
    heatmaps = charts(app)["turn-heatmap"]["data"]
    assert [t["hovertemplate"].split("<br>")[0] for t in heatmaps] == BOTH
    text = page_text(app)
    for run_id in BOTH:
        assert f"**{run_id}**, step {last_step(ppo_logs, run_id, 'policy_lag > 0')}: PPO epoch" in text
    assert re.search(
        r"outside the trust region \[1−ε, 1\+ε\] \(green\): [\d.]+% of tokens, [\d.]+% of turns", text
    )
    rows = charts(app)["ratio-distribution"]["layout"]["yaxis"]["categoryarray"]
    assert {row.split(" · ")[0] for row in rows} == set(BOTH)


def test_turn_view_shows_the_step_the_viewer_picks(monkeypatch, ppo_logs):
    app = open_app(monkeypatch, ppo_logs, view="Turns", runs=[GUARDED])
    app.toggle(key="turns-follow").set_value(False).run()
    app.select_slider(key="turns-step").set_value(17).run()
    assert_clean(app)
    assert f"**{GUARDED}**, step 17:" in page_text(app)


def test_gradient_view_draws_a_row_of_module_norms_per_run(monkeypatch, ppo_logs):
    app = open_app(monkeypatch, ppo_logs, view="Gradients", runs=BOTH)
    assert_clean(app)
    figure = charts(app)["module-norms"]
    assert runs_drawn(figure) == set(BOTH)
    assert {t["yaxis"] for t in figure["data"]} == {"y", "y2"}


def test_alert_view_lists_every_runs_logged_alerts_and_ctn_actions_and_each_verdict(monkeypatch, ppo_logs):
    app = wait_for_verdicts(open_app(monkeypatch, ppo_logs, view="Alerts & verdict", runs=BOTH))
    assert_clean(app)
    with open_runs(ppo_logs) as runs:
        logged = runs.sql("SELECT run_id, kind FROM alerts")
        verdicts = {run_id: postmortem(runs, run_id) for run_id in BOTH}
    actions = pc.sum(pc.equal(logged.column("kind"), "action")).as_py()
    switches, table = (frame.value for frame in app.dataframe[-2:])  # below the verdicts' tables
    assert len(switches) == actions and set(switches["switch"]) <= {"ctn_on", "ctn_off"}
    assert len(table) == logged.num_rows and set(table["run"]) == set(logged.column("run_id").to_pylist())
    text = page_text(app)
    for run_id, verdict in verdicts.items():
        assert f"**Verdict: {run_id}**" in text
        assert all(note in text for note in verdict.notes), verdict.notes
    assert f"**{STABLE}**: the trainer itself logged no alerts or CTN actions (yet)" in text


def test_sql_view_runs_a_query_and_offers_its_csv(monkeypatch, ppo_logs):
    app = open_app(monkeypatch, ppo_logs, view="SQL")
    app.text_area(key="sql-text").set_value("SELECT run_id, count(*) AS n FROM steps GROUP BY run_id")
    app.button[0].click().run()
    assert_clean(app)
    assert sorted(app.dataframe[0].value["run_id"]) == sorted(BOTH)
    assert "2 rows" in page_text(app)
    assert len(app.get("download_button")) == 1


def test_sql_view_cuts_a_long_result_at_its_row_limit_and_says_so(monkeypatch, ppo_logs):
    monkeypatch.setattr(sql_view, "MAX_ROWS", 5)
    app = open_app(monkeypatch, ppo_logs, view="SQL")
    app.text_area(key="sql-text").set_value("SELECT step FROM steps")
    app.button[0].click().run()
    assert len(app.dataframe[0].value) == 5
    assert "the first 5: the statement has more" in page_text(app)


def test_sql_view_stops_a_runaway_statement_at_its_time_limit(monkeypatch, ppo_logs):
    monkeypatch.setenv(SQL_TIMEOUT_ENV, "0.5")
    app = open_app(monkeypatch, ppo_logs, view="SQL")
    app.text_area(key="sql-text").set_value(
        "SELECT sum(a.step * b.step * c.step) FROM turns a, turns b, turns c"
    )
    app.button[0].click().run()
    assert not app.exception
    assert "time limit of 0.5 s" in app.error[0].value


@pytest.mark.parametrize(
    ("query", "message"), [("SELEC 1", "bad SQL"), ("COPY steps TO '/tmp/x.csv'", "only read-only")]
)
def test_sql_view_explains_a_bad_or_writing_query_without_a_traceback(monkeypatch, ppo_logs, query, message):
    app = open_app(monkeypatch, ppo_logs, view="SQL")
    app.text_area(key="sql-text").set_value(query)
    app.button[0].click().run()
    assert not app.exception
    assert message in app.error[0].value


def test_a_missing_log_folder_is_explained(monkeypatch, tmp_path):
    app = open_app(monkeypatch, tmp_path / "nowhere")
    assert not app.exception
    assert "does not exist" in page_text(app)


def test_an_empty_log_folder_says_the_page_waits_for_runs(monkeypatch, tmp_path):
    app = open_app(monkeypatch, tmp_path)
    assert not app.exception
    assert "No runs in" in page_text(app)


def test_the_app_started_without_a_log_folder_says_how_to_start_it(monkeypatch):
    app = open_app(monkeypatch, None)
    assert not app.exception
    assert "sorl dashboard LOG_DIR" in app.error[0].value


@pytest.mark.parametrize("view", ["Overview", "Turns", "Gradients", "Alerts & verdict"])
def test_a_run_still_starting_is_explained_in_every_view(monkeypatch, tmp_path, view):
    mon = Monitor(tmp_path, "starting")
    try:
        app = open_app(monkeypatch, tmp_path, view=view)
        assert_clean(app)
        assert "has started (live) but has not logged an update yet" in page_text(app)
    finally:
        mon.close()


def test_a_run_without_turn_rows_is_explained_in_the_turn_view(monkeypatch, tmp_path):
    write_rows(tmp_path, "scalars-only", stable_rows(40))
    app = open_app(monkeypatch, tmp_path, view="Turns")
    assert_clean(app)
    assert "has no turn rows" in page_text(app)


def truncate(part) -> None:
    part.write_bytes(part.read_bytes()[:80])


@pytest.mark.parametrize("view", ["Overview", "Turns", "SQL"])
def test_a_truncated_part_is_named_with_its_reason_instead_of_a_wrong_message(monkeypatch, tmp_path, view):
    with Monitor(tmp_path, "run", writer=WriterConfig(flush_interval_s=3600, compact=False)) as mon:
        for step in range(3):
            mon.log_scalars(step, {"reward_mean": 0.5})
            mon.flush()
    victim = sorted((tmp_path / "run" / "steps" / "rank=0").glob("part-*.parquet"))[0]
    truncate(victim)

    app = open_app(monkeypatch, tmp_path, view=view, runs=["run"])
    assert not app.exception
    warning = "\n".join(w.value for w in app.warning)
    assert (
        f"**run**: 1 part file could not be read and is left out:\n- `run/steps/rank=0/{victim.name}`: "
        in warning
    )
    assert "magic bytes" in warning  # the reader's reason
    assert "has not logged an update yet" not in page_text(app)


@pytest.mark.parametrize("view", ["Overview", "Turns", "Gradients", "Alerts & verdict"])
def test_another_tools_log_with_steps_only_shows_in_every_view(monkeypatch, tmp_path, view):
    log = hf_history(tmp_path / "trainer_state.json")
    app = wait_for_verdicts(open_app(monkeypatch, log, view=view))
    assert_clean(app)
    text = page_text(app)
    expected = {
        "Overview": lambda: "overview" in charts(app),
        "Turns": lambda: "has no turn rows" in text,
        "Gradients": lambda: "logged no per-module grad norms" in text,
        "Alerts & verdict": lambda: "**Verdict: " in text and "imported" in text,
    }
    assert expected[view](), text
