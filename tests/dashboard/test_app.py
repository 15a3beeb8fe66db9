"""Each dashboard view rendered by Streamlit's ``AppTest`` on real runs, and the friendly messages."""

from __future__ import annotations

import re
import time

import pyarrow.compute as pc
from streamlit.testing.v1 import AppTest

from sorl_monitor import Monitor
from sorl_monitor.postmortem import postmortem
from sorl_monitor.query import open_runs
from tests.dashboard.conftest import GUARDED, STABLE, open_app, page_text
from tests.detectors.synthetic import stable_rows, write_rows


def assert_clean(app: AppTest) -> None:
    """No exception (traceback) and no error message on the page."""
    assert not app.exception, [e.value for e in app.exception]
    assert not app.error, [e.value for e in app.error]


def charts(app: AppTest) -> list:
    return list(app.get("plotly_chart"))


def last_step(log_dir, run_id: str, where: str = "true") -> int:
    with open_runs(log_dir) as runs:
        sql = f"SELECT max(step) AS s FROM steps WHERE run_id = '{run_id}' AND {where}"
        return runs.sql(sql).column("s")[0].as_py()


def test_overview_shows_the_latest_run_its_last_step_and_its_curves(monkeypatch, ppo_logs):
    app = open_app(monkeypatch, ppo_logs)
    assert_clean(app)
    assert app.multiselect(key="runs").value == [STABLE]
    assert f"**{STABLE}** · ppo · finished · step {last_step(ppo_logs, STABLE)}" in page_text(app)
    assert len(charts(app)) == 1


def test_overview_overlays_the_runs_picked(monkeypatch, ppo_logs):
    app = open_app(monkeypatch, ppo_logs, runs=[GUARDED, STABLE])
    assert_clean(app)
    text = page_text(app)
    assert f"**{GUARDED}**" in text and f"**{STABLE}**" in text
    assert len(charts(app)) == 1


def test_sidebar_lists_every_run_with_algorithm_status_and_last_step(monkeypatch, ppo_logs):
    app = open_app(monkeypatch, ppo_logs)
    sidebar = "\n".join(str(element.value) for element in app.sidebar.get("caption"))
    for run_id in (GUARDED, STABLE):
        assert f"{run_id} · ppo · finished · step {last_step(ppo_logs, run_id)}" in sidebar


def test_turn_view_draws_the_heatmap_and_the_latest_reused_rollouts_ratio_distribution(monkeypatch, ppo_logs):
    app = open_app(monkeypatch, ppo_logs, view="Turns", runs=[GUARDED])
    assert_clean(app)
    assert len(charts(app)) == 2
    text = page_text(app)
    latest_reuse = last_step(ppo_logs, GUARDED, "policy_lag > 0")
    assert f"Step {latest_reuse}: turn ratios vs token ratios" in text
    assert re.search(r"Outside it at this step: [\d.]+% of tokens, [\d.]+% of turns", text)


def test_turn_view_shows_the_step_the_viewer_picks(monkeypatch, ppo_logs):
    app = open_app(monkeypatch, ppo_logs, view="Turns", runs=[GUARDED])
    app.toggle(key="turns-follow").set_value(False).run()
    app.select_slider(key="turns-step").set_value(17).run()
    assert_clean(app)
    assert "Step 17: turn ratios vs token ratios" in page_text(app)


def test_gradient_view_draws_per_module_grad_norms(monkeypatch, ppo_logs):
    app = open_app(monkeypatch, ppo_logs, view="Gradients", runs=[GUARDED])
    assert_clean(app)
    assert len(charts(app)) == 1
    assert f"**Grad norm per module** (pre-clip) — {GUARDED}" in page_text(app)


def test_alert_view_lists_the_logged_alerts_and_ctn_actions_and_the_verdict(monkeypatch, ppo_logs):
    app = open_app(monkeypatch, ppo_logs, view="Alerts & verdict", runs=[GUARDED])
    deadline = time.monotonic() + 60
    while "Computing the post-mortem" in page_text(app) and time.monotonic() < deadline:
        time.sleep(0.5)
        app.run()
    assert_clean(app)
    with open_runs(ppo_logs) as runs:
        logged = runs.sql(f"SELECT kind FROM alerts WHERE run_id = '{GUARDED}'")
        verdict = postmortem(runs, GUARDED)
    actions = pc.sum(pc.equal(logged.column("kind"), "action")).as_py()
    switches, table = (frame.value for frame in app.dataframe[:2])
    assert len(switches) == actions and set(switches["switch"]) <= {"ctn_on", "ctn_off"}
    assert len(table) == logged.num_rows
    text = page_text(app)
    assert f"{logged.num_rows - actions} alerts, {actions} CTN actions" in text
    if verdict.status == "collapsed":
        assert "[**Root cause:" in text and "**Remedy:**" in text
    else:
        assert "[**Healthy**]" in text and "Root cause" not in text and "**Remedy:**" not in text
    assert all(note in text for note in verdict.notes), verdict.notes


def test_sql_view_runs_a_query_and_offers_its_csv(monkeypatch, ppo_logs):
    app = open_app(monkeypatch, ppo_logs, view="SQL")
    app.text_area(key="sql-text").set_value("SELECT run_id, count(*) AS n FROM steps GROUP BY run_id")
    app.button[0].click().run()
    assert_clean(app)
    assert sorted(app.dataframe[0].value["run_id"]) == [GUARDED, STABLE]
    assert "2 rows" in page_text(app)
    assert len(app.get("download_button")) == 1


def test_sql_view_explains_a_bad_or_writing_query_without_a_traceback(monkeypatch, ppo_logs):
    app = open_app(monkeypatch, ppo_logs, view="SQL")
    for query, message in (("SELEC 1", "bad SQL"), ("COPY steps TO '/tmp/x.csv'", "only read-only")):
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


def test_a_run_still_starting_is_explained_in_every_view(monkeypatch, tmp_path):
    mon = Monitor(tmp_path, "starting")
    try:
        for view in ("Overview", "Turns", "Gradients", "Alerts & verdict"):
            app = open_app(monkeypatch, tmp_path, view=view)
            assert_clean(app)
            assert "has started (live) but has not logged an update yet" in page_text(app), view
    finally:
        mon.close()


def test_a_run_without_turn_rows_is_explained_in_the_turn_view(monkeypatch, tmp_path):
    write_rows(tmp_path, "scalars-only", stable_rows(40))
    app = open_app(monkeypatch, tmp_path, view="Turns")
    assert_clean(app)
    assert "has no turn rows" in page_text(app)
