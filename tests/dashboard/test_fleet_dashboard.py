"""The dashboard over a fleet of 2,000 runs (issue 30, item 4): the run list comes from the verdict table of
``sorl fleet``, sorted most urgent first and filtered by status and a search, and only the runs picked are
opened. The runs are the real sample runs, replicated by hard links (``tests.helpers.fleet_runs``); the verdicts are the
real ``sorl fleet``'s. What is asserted is what was opened, not how long it took.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sorl_monitor.read import live_tables
from sorl_monitor.read.verdict_table import read_verdicts
from tests.helpers.browser import drawn_chart, start_dashboard, stop
from tests.helpers.dashboard_app import assert_clean, charts, open_app, page_text
from tests.helpers.fleet_runs import make_fleet, sample_runs

RUNS = 2_000
SAMPLES = {run.name for run in sample_runs()}

pytestmark = pytest.mark.slow  # building the fleet runs the real `sorl fleet` (~10 s on a loaded machine)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2,000 runs and their verdict table."""
    return make_fleet(tmp_path_factory.mktemp("fleet") / "runs", RUNS)


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list:
    """What the dashboard's ``LiveRuns`` asked the query layer to open, call by call."""
    calls: list = []
    real = live_tables.open_runs

    def spy(paths, *args, **kwargs):
        calls.append(paths)
        return real(paths, *args, **kwargs)

    monkeypatch.setattr(live_tables, "open_runs", spy)
    return calls


def test_the_first_page_lists_2000_runs_from_the_verdict_table_and_opens_only_the_most_urgent(
    monkeypatch, fleet, opened
):
    table = read_verdicts(fleet).to_pylist()
    first = next(row for row in table if row["status"] == "collapsed")
    app = open_app(monkeypatch, fleet)
    assert_clean(app)
    assert app.multiselect(key="runs").value == [first["run_id"]]
    assert len(app.multiselect(key="runs").options) == RUNS
    assert opened == [[first["path"]]], "only the picked run is opened, never the 2,000"
    sidebar = "\n".join(str(m.value) for m in app.sidebar.markdown)
    assert sidebar.splitlines()[0].startswith(":red[**collapsed**]")
    assert f"**{first['run_id']}**" in sidebar.splitlines()[0]
    assert f"{RUNS:,} of {RUNS:,} runs" in page_text(app)
    assert first["run_id"] in charts(app)["overview"]["data"][1]["hovertemplate"]


def test_the_run_list_filters_by_status_and_search_and_opens_a_run_picked_from_it(monkeypatch, fleet, opened):
    table = read_verdicts(fleet).to_pylist()
    healthy = [row["run_id"] for row in table if row["status"] == "healthy"]
    app = open_app(monkeypatch, fleet)
    app.sidebar.pills(key="fleet-status").set_value(["healthy"]).run()
    assert f"{len(healthy):,} of {RUNS:,} runs" in page_text(app)
    picked_before = app.multiselect(key="runs").value
    assert app.multiselect(key="runs").options == healthy + picked_before, (
        "the runs kept, then the one picked"
    )
    needle = "so-grpo-019"
    found = [run_id for run_id in healthy if needle in run_id]
    app.sidebar.text_input(key="fleet-search").input(needle).run()
    assert f"{len(found):,} of {RUNS:,} runs" in page_text(app)
    wanted = next(
        run_id for run_id in healthy if run_id in SAMPLES
    )  # a run whose rows name it (not a replica)
    app.multiselect(key="runs").set_value([wanted]).run()
    assert_clean(app)
    path = next(row["path"] for row in table if row["run_id"] == wanted)
    assert opened[-1] == [path]
    assert all(len(call) == 1 for call in opened), (
        "each picked run opened alone (a run opened before is shared)"
    )
    assert f"**{wanted}** · " in page_text(app)


@pytest.mark.browser
def test_in_chromium_the_fleet_list_shows_and_the_most_urgent_run_draws(fleet, browser, tmp_path):
    server, port = start_dashboard(fleet, tmp_path / "dash.log")
    try:
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.goto(f"http://127.0.0.1:{port}/")
        drawn_chart(page, "overview")
        sidebar = page.locator("[data-testid='stSidebar']")
        sidebar.get_by_text(f"{RUNS:,} of {RUNS:,} runs").wait_for(timeout=60_000)
        listed = sidebar.inner_text()
        page.close()
        assert re.search(r"collapsed\s+token-ppo\s", listed), "the collapsed sample run is listed as such"
        assert listed.count("token-ppo") > 1, "its replicas are listed too"
    finally:
        stop(server)
