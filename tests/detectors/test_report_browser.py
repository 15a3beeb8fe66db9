"""The HTML report renders in headless Chromium with the expected number of plots (screenshot kept)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sorl_monitor.dashboard.report import FIGURES_PER_RUN, write_report
from sorl_monitor.read.query import open_runs
from tests.helpers.synthetic import collapse_reward, pattern_rows, stable_rows, write_rows

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]  # fmt: skip

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed at /usr/bin/chromium"),
]


def test_report_of_two_synthetic_runs_renders_every_plot_in_headless_chromium(tmp_path):
    playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright (python) is not installed")
    rows = collapse_reward(pattern_rows("clip_rise", 360), 300)
    write_rows(tmp_path / "logs", "collapsed", rows)
    write_rows(tmp_path / "logs", "healthy", stable_rows(300))
    page_path = tmp_path / "report.html"
    with open_runs(tmp_path / "logs") as runs:
        expected = write_report(runs, ["collapsed", "healthy"], page_path)
    assert expected == 2 * FIGURES_PER_RUN + 1

    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(page_path.as_uri())
            page.wait_for_function(
                f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {expected}"
            )
            plots = page.locator(".js-plotly-plot").count()
            traces = page.locator(
                ".js-plotly-plot .scatterlayer .trace, .js-plotly-plot .heatmaplayer"
            ).count()
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
        finally:
            browser.close()
    assert plots == expected
    assert traces >= expected
    assert errors == []
    assert (ARTIFACTS / "report.png").stat().st_size > 10_000
