"""End to end in headless Chromium: ``sorl dashboard`` started by the real CLI on a free 127.0.0.1 port.

* a run a background process is still writing (the real PPO loop of ``ppo_loop``, real ``Monitor`` and
  CTN guard): a zoom survives three live redraws, newer steps appear without a reload, and a screenshot of
  each view is kept in ``test-artifacts/``;
* a copy of ``sample_logs/`` with a truncated part: the part is named on the page; a runaway cross join
  in one viewer's SQL tab is stopped by its time limit while a second viewer's overview draws; the server
  stops within seconds of SIGTERM while such a query runs.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.browser import (
    CHART,
    CHROMIUM,
    drawn_chart,
    main_text,
    screenshot,
    start,
    start_dashboard,
    stop,
    wait_until,
)
from tests.helpers.paths import SAMPLE_LOGS

RUN = "live-ppo"
STATUS = re.compile(rf"{RUN} · ppo · live · step (\d+)")
CROSS_JOIN = "SELECT count(*) FROM turns a, turns b, turns c"
SQL_LIMIT_S = 30
"""The SQL tab's time limit in the sample dashboard: far above the overview's drawing time on a loaded
machine (16 s seen with a load of 17 on 2 cores), so the overview draws while the cross join still runs."""

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed at /usr/bin/chromium"),
]


def chart_state(page, key: str, expression: str):
    """``expression`` evaluated on the chart ``key``'s plotly element (``chart``) inside its iframe."""
    frame = page.locator(CHART.format(key=key)).element_handle().content_frame()
    return frame.evaluate(
        f"(() => {{ const chart = document.getElementById('chart'); return {expression}; }})()"
    )


def open_view(page, view: str, key: str | None) -> None:
    page.get_by_role("tab", name=view).click()
    if key is not None:
        drawn_chart(page, key, timeout_s=60)


def test_a_zoom_survives_three_live_redraws_and_each_view_is_kept_as_a_screenshot(tmp_path, browser):
    log_dir = tmp_path / "logs"
    writer = start(
        [
            "-m",
            "tests.helpers.ppo_loop",
            str(log_dir),
            "--run-name",
            RUN,
            "--iterations",
            "500",
            "--pause",
            "0.05",
        ],
        tmp_path / "writer.log",
    )
    server = None
    try:
        wait_until(
            lambda: any((log_dir / RUN / "steps").glob("rank=*/part-*.parquet")), 120, "the first part"
        )
        server, port = start_dashboard(log_dir, tmp_path / "dash.log", "--refresh", "0.5")
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.goto(f"http://127.0.0.1:{port}/")
        drawn_chart(page, "overview")
        first = int(STATUS.search(main_text(page)).group(1))
        page.evaluate("window.sorlNotReloaded = true")

        box = (
            page.frame_locator(CHART.format(key="overview"))
            .locator(".nsewdrag[data-subplot='xy']")
            .bounding_box()
        )
        y = box["y"] + box["height"] / 2
        for _ in range(3):  # on a loaded machine a live redraw can land mid-drag and drop it: drag again
            page.mouse.move(box["x"] + 0.3 * box["width"], y)
            page.mouse.down()
            page.mouse.move(box["x"] + 0.6 * box["width"], y + 3, steps=8)
            page.mouse.up()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                zoomed = chart_state(page, "overview", "chart.layout.xaxis.range")
                if zoomed[1] - zoomed[0] < 0.5 * first:
                    break
                time.sleep(0.2)
            else:
                continue
            break
        draws = chart_state(page, "overview", "Number(chart.dataset.draws)")
        wait_until(
            lambda: chart_state(page, "overview", "Number(chart.dataset.draws)") >= draws + 3,
            60,
            "three redraws",
        )
        after = chart_state(page, "overview", "chart.layout.xaxis.range")
        newer = int(STATUS.search(main_text(page)).group(1))
        not_reloaded = page.evaluate("window.sorlNotReloaded === true")
        screenshot(page, "live-overview-zoomed")
        page.mouse.dblclick(box["x"] + 0.5 * box["width"], y)  # back to the whole run
        screenshot(page, "live-overview")
        for view, key in (
            ("Turns", "turn-heatmap"),
            ("Gradients", "module-norms"),
            ("Alerts & verdict", None),
        ):
            open_view(page, view, key)
            if key is None:
                page.get_by_text("Verdict:").first.wait_for(timeout=60_000)
            screenshot(page, f"live-{view.split()[0].lower()}")
        page.get_by_role("tab", name="SQL").click()
        page.get_by_role("button", name="Run", exact=True).click()
        page.get_by_text("Download CSV").wait_for(timeout=60_000)
        screenshot(page, "live-sql")
        text = page.inner_text("body")
        writer_running = writer.poll() is None
    finally:
        for process in (writer, server):
            if process is not None:
                stop(process)

    assert zoomed[1] - zoomed[0] < 0.5 * first, "the drag zoomed in"
    assert after == pytest.approx(zoomed), "the zoom survived three redraws with new data"
    assert newer > first and writer_running, "newer steps of the run being written appeared"
    assert not_reloaded, "the page updated in place (no reload)"
    assert "Traceback" not in text and "failed (" not in text


@pytest.fixture(scope="module")
def sample_dashboard(tmp_path_factory, browser) -> Iterator[tuple[subprocess.Popen, int, Path, Path]]:
    """``sorl dashboard`` (SQL time limit ``SQL_LIMIT_S``) on a copy of ``sample_logs/`` whose token-ppo has a
    truncated turns part; the server, its port, the truncated part and the server's log."""
    if not SAMPLE_LOGS.is_dir():
        pytest.skip("sample_logs/ is not on this branch")
    folder = tmp_path_factory.mktemp("sample") / "logs"
    shutil.copytree(SAMPLE_LOGS, folder)
    victim = sorted((folder / "token-ppo" / "turns").glob("rank=*/part-*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:4096])
    log = folder.parent / "dash.log"
    server, port = start_dashboard(folder, log, "--sql-timeout", str(SQL_LIMIT_S))
    yield server, port, victim, log
    stop(server)


def test_a_truncated_part_is_named_on_the_page_with_its_reason(sample_dashboard, browser):
    _, port, victim, _ = sample_dashboard
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(f"http://127.0.0.1:{port}/?runs=token-ppo&runs=so-ppo-auto-ctn")
    drawn_chart(page, "overview")
    warning = page.get_by_text("could not be read and is left out").first
    warning.wait_for(timeout=30_000)
    text = page.inner_text("body")
    screenshot(page, "overview-two-runs-truncated-part")
    open_view(page, "Turns", "turn-heatmap")
    screenshot(page, "turns-two-runs")
    page.close()
    assert f"token-ppo/turns/rank=0/{victim.name}" in text
    assert "has no turn rows" not in text and "has not logged an update yet" not in text


def test_a_runaway_cross_join_is_stopped_by_its_limit_while_a_second_viewer_loads_the_overview(
    sample_dashboard, browser
):
    """No tight clock: the overview must draw before the statement's time limit (``SQL_LIMIT_S``) stops it,
    and the statement must stop at that limit, not before (and not never: the wait for it is bounded)."""
    _, port, _, _ = sample_dashboard
    sql_page = browser.new_page(viewport={"width": 1400, "height": 900})
    sql_page.goto(f"http://127.0.0.1:{port}/?view=SQL")
    sql_page.get_by_role("button", name="Run", exact=True).wait_for(timeout=60_000)
    sql_page.get_by_role("textbox", name="SQL").fill(CROSS_JOIN)
    submitted = time.monotonic()
    sql_page.get_by_role("button", name="Run", exact=True).click()
    sql_page.get_by_text("running for").wait_for(timeout=30_000)

    other = browser.new_page(viewport={"width": 1600, "height": 1000})
    other.goto(f"http://127.0.0.1:{port}/?runs=grpo")
    drawn_chart(other, "overview", timeout_s=SQL_LIMIT_S + 60)
    still_running = sql_page.get_by_text("running for").count() > 0
    sql_page.get_by_text(f"time limit of {SQL_LIMIT_S} s").wait_for(timeout=(SQL_LIMIT_S + 60) * 1000)
    stopped = time.monotonic() - submitted
    screenshot(sql_page, "sql-time-limit")
    sql_page.close()
    other.close()

    assert still_running, "the second viewer's overview drew only after the cross join stopped"
    assert stopped > SQL_LIMIT_S - 0.5


def test_stop_cancels_a_query_and_the_server_stops_within_seconds_of_sigterm_while_one_runs(
    sample_dashboard, browser
):
    server, port, _, log = sample_dashboard
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(f"http://127.0.0.1:{port}/?view=SQL")
    page.get_by_role("textbox", name="SQL").fill(CROSS_JOIN)
    page.get_by_role("button", name="Run", exact=True).click()
    page.get_by_text("running for").wait_for(timeout=30_000)
    clicked = time.monotonic()
    page.get_by_role("button", name="Stop", exact=True).click()
    page.get_by_text("Stopped.").wait_for(timeout=SQL_LIMIT_S * 1000)
    stopped_in = time.monotonic() - clicked
    page.get_by_role("button", name="Run", exact=True).click()
    page.get_by_text("running for").wait_for(timeout=30_000)

    signalled = time.monotonic()
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=SQL_LIMIT_S)
    finally:
        page.close()
    # a query that ignored Stop or SIGTERM would run to its 30 s limit; a third of it is room for a browser
    # and a server on a machine 3× slower and busy (each took under 3 s and 5 s when this test was written)
    assert stopped_in < SQL_LIMIT_S / 3, stopped_in
    assert time.monotonic() - signalled < SQL_LIMIT_S / 3, log.read_text()[-2000:]
