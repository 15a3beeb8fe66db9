"""In headless Chromium: the overview's figure asks for margins that already hold its lane's labels and its
legends, so plotly draws it in one layout pass (a margin its automargin has to widen costs a second pass,
about 40 % of a first draw). The figures are built from ``sample_logs/`` (the bundled trainer's real runs)
and drawn by the basic plotly.js bundle the dashboard serves, in a blank page."""

from __future__ import annotations

import pytest

from sorl_monitor.dashboard.live_chart import _BASIC_JS
from sorl_monitor.diagnose.live import LiveRuns
from sorl_monitor.figures.overview import OverviewOptions, overview_figure
from tests.helpers.browser import ARGS, CHROMIUM
from tests.helpers.paths import SAMPLE_LOGS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed at /usr/bin/chromium"),
]

DRAW = """async (spec) => {
    const figure = JSON.parse(spec);
    const chart = document.getElementById('chart');
    await Plotly.react(chart, figure.data, figure.layout, {responsive: true});
    const size = chart._fullLayout._size;
    return {l: size.l, r: size.r, t: size.t, b: size.b};
}"""


def test_the_overviews_margins_hold_its_labels_and_legends_without_a_second_layout_pass():
    from playwright.sync_api import sync_playwright

    live = LiveRuns(SAMPLE_LOGS)
    live.refresh()
    run_ids = live.run_ids()
    figures = {run_id: overview_figure([live.curves(run_id)], OverviewOptions()) for run_id in run_ids}
    figures["every run"] = overview_figure([live.curves(run_id) for run_id in run_ids], OverviewOptions())
    live.close()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_content('<div id="chart" style="width: 1250px"></div>')
        page.add_script_tag(path=str(_BASIC_JS))
        drawn = {name: page.evaluate(DRAW, figure.to_json()) for name, figure in figures.items()}
        browser.close()
    asked = {name: figure.layout.margin.to_plotly_json() for name, figure in figures.items()}
    assert len(drawn) == 6
    assert drawn == asked
