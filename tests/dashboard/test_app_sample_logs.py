"""Every dashboard view on the committed REAL runs of the bundled trainer (``sample_logs/``), via ``AppTest``.

Skipped until the trainer's ``sample_logs/`` is on this branch. No run name is assumed: each run found
is opened in each view; a collapsed run must show its collapse step and the verdict's root cause.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sorl_monitor.diagnose.postmortem import label_collapse
from sorl_monitor.read.query import open_runs
from tests.helpers.dashboard_app import charts, open_app, page_text, wait_for_verdicts

SAMPLE_LOGS = Path(__file__).resolve().parents[2] / "sample_logs"
VIEWS = ("Overview", "Turns", "Gradients", "Alerts & verdict")


def collapse_steps() -> dict[str, int | None]:
    with open_runs(SAMPLE_LOGS) as runs:
        return {row["run_id"]: row["collapse_step"] for row in label_collapse(runs).to_pylist()}


@pytest.mark.parametrize("view", VIEWS)
def test_every_sample_run_renders_alone_and_all_of_them_overlaid_in_each_view(monkeypatch, view):
    runs = collapse_steps()
    assert runs, "sample_logs/ holds no run with steps"
    for picked in [*([run_id] for run_id in runs), list(runs)]:
        app = open_app(monkeypatch, SAMPLE_LOGS, view=view, runs=picked)
        assert not app.exception, (picked, [e.value for e in app.exception])
        assert not app.error, (picked, [e.value for e in app.error])


def test_a_collapsed_sample_run_shows_its_collapse_and_root_cause(monkeypatch):
    collapsed = {run_id: step for run_id, step in collapse_steps().items() if step is not None}
    assert set(collapsed) == {"token-ppo"}, collapsed  # the sample logs' README: only token PPO collapses
    run_id, step = next(iter(collapsed.items()))
    overview = wait_for_verdicts(open_app(monkeypatch, SAMPLE_LOGS, runs=[run_id]))  # as slow as the machine
    assert f"collapsed at step {step}" in page_text(overview)
    assert f"collapse at {step}" in [a["text"] for a in charts(overview)["overview"]["layout"]["annotations"]]
    alerts = wait_for_verdicts(open_app(monkeypatch, SAMPLE_LOGS, view="Alerts & verdict", runs=[run_id]))
    assert "[**Root cause:" in page_text(alerts)
    assert alerts.metric[0].value == f"step {step}"


def test_a_healthy_sample_run_shows_healthy_without_a_root_cause(monkeypatch):
    healthy = [run_id for run_id, step in collapse_steps().items() if step is None]
    alerts = wait_for_verdicts(open_app(monkeypatch, SAMPLE_LOGS, view="Alerts & verdict", runs=[healthy[0]]))
    text = page_text(alerts)
    assert "[**Healthy**]" in text and "Root cause" not in text and "**Remedy:**" not in text


def test_a_run_removed_from_the_picker_stays_removed(monkeypatch):
    """The first page's run (or a link's) is a choice the viewer can undo: picking another run replaces it."""
    app = open_app(monkeypatch, SAMPLE_LOGS)
    first = app.multiselect(key="runs").value
    other = next(run_id for run_id in app.multiselect(key="runs").options if run_id not in first)
    app.multiselect(key="runs").set_value([other]).run()
    assert app.multiselect(key="runs").value == [other]
    app.run()
    assert app.multiselect(key="runs").value == [other]
