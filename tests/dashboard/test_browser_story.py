"""In headless Chromium, as a new user reads the page (``sorl dashboard`` started by the real CLI):

* links hold their runs: the runs, view, x axis and options of a URL survive a reload, a second visit and a
  tab click (Streamlit's own binding dropped a parameter equal to the widget's default);
* the Overview says why: each run's status line carries its verdict in words;
* a foreign log is shown true to its data (the 9B TRL GRPO collapse of ``real_logs``, when present): no
  "longer completions" when the length fell, exact zeros on a log axis named as gaps;
* a screenshot of each view with one and with two runs is kept in ``test-artifacts/``.

The runs are real: ``sample_logs/`` (the bundled trainer) and a real TRL log, never injected numbers.
Every wait is on a condition, generous enough for a loaded machine.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from urllib.parse import parse_qs, urlparse

import pytest

from tests.helpers.browser import (
    CHROMIUM,
    drawn_chart,
    main_text,
    screenshot,
    start_dashboard,
    stop,
    wait_until,
)
from tests.helpers.paths import NINE_B, SAMPLE_LOGS

VIEWS = (("Overview", "overview"), ("Turns", "turn-heatmap"), ("Gradients", "module-norms"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed at /usr/bin/chromium"),
]


@pytest.fixture(scope="module")
def sample_url(tmp_path_factory) -> Iterator[str]:
    """``sorl dashboard sample_logs/`` (a copy); its base URL."""
    if not SAMPLE_LOGS.is_dir():
        pytest.skip("sample_logs/ is not on this branch")
    folder = tmp_path_factory.mktemp("story") / "logs"
    shutil.copytree(SAMPLE_LOGS, folder)
    server, port = start_dashboard(folder, folder.parent / "dash.log")
    yield f"http://127.0.0.1:{port}/"
    stop(server)


def params(page) -> dict[str, list[str]]:
    return parse_qs(urlparse(page.url).query)


def chosen_runs(page) -> list[str]:
    """The runs picked in the sidebar's multiselect (its chips)."""
    picker = page.locator("[data-testid='stSidebar'] [data-testid='stMultiSelect']").first
    return [
        tag.get_attribute("aria-label") for tag in picker.locator(".react-aria-ComboBox [data-tag]").all()
    ]


def open_tab(page) -> str:
    return page.locator("[role='tab'][aria-selected='true']").first.inner_text().strip()


def wait_settled(page, runs: list[str], view: str, what: str) -> None:
    try:
        wait_until(lambda: settled(page, runs, view), 60, what)
    except AssertionError as error:
        raise AssertionError(
            f"{error}: URL {page.url}, runs {chosen_runs(page)}, tab {open_tab(page)}"
        ) from None


def settled(page, runs: list[str], view: str) -> bool:
    """The page shows ``runs`` at ``view`` and its URL says so."""
    query = params(page)
    return (
        query.get("runs") == runs
        and query.get("view") == [view]
        and chosen_runs(page) == runs
        and (open_tab(page) == view)
    )


def test_a_link_holds_its_runs_view_and_options_through_a_reload_a_second_visit_and_a_tab_click(
    sample_url, browser
):
    runs = ["token-ppo", "so-ppo-auto-ctn"]
    link = f"{sample_url}?runs=token-ppo&runs=so-ppo-auto-ctn&view=Turns&x=iteration&smooth=32"
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(link)
    drawn_chart(page, "turn-heatmap")
    wait_settled(page, runs, "Turns", "the link's runs and view")
    page.wait_for_timeout(2000)  # Streamlit's binding rewrote the URL within a second: it must hold
    first = params(page)
    page.reload()
    drawn_chart(page, "turn-heatmap")
    wait_settled(page, runs, "Turns", "the runs and view after a reload")
    after_reload = params(page)

    again = browser.new_page(viewport={"width": 1600, "height": 1000})
    again.goto(link)
    drawn_chart(again, "turn-heatmap")
    wait_settled(again, runs, "Turns", "the runs and view on a second visit")
    second_visit = params(again)
    again.close()

    page.bring_to_front()
    page.get_by_role("tab", name="Gradients").click()
    drawn_chart(page, "module-norms")
    wait_settled(page, runs, "Gradients", "the view in the URL after a tab click")
    page.reload()
    drawn_chart(page, "module-norms")
    wait_settled(page, runs, "Gradients", "the clicked view after a reload")
    clicked = params(page)
    page.close()

    for query in (first, after_reload, second_visit):
        assert query == {"runs": runs, "view": ["Turns"], "x": ["iteration"], "smooth": ["32"]}
    assert clicked == {"runs": runs, "view": ["Gradients"], "x": ["iteration"], "smooth": ["32"]}


def test_a_bare_address_opens_on_the_most_urgent_run_and_names_it_in_the_url(sample_url, browser):
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(sample_url)
    drawn_chart(page, "overview")
    wait_until(lambda: params(page).get("runs") is not None, 60, "the runs in the URL")
    wait_until(lambda: chosen_runs(page), 60, "the sidebar's run picker (drawn after the views)")
    shown, query = chosen_runs(page), params(page)
    page.close()
    assert shown == ["token-ppo"], "the one run of sample_logs/ that collapsed opens first"
    assert query == {"runs": ["token-ppo"], "view": ["Overview"]}


def test_the_status_line_says_the_verdict_in_words(sample_url, browser):
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(f"{sample_url}?runs=token-ppo&runs=so-ppo-auto-ctn")
    drawn_chart(page, "overview")
    wait_until(lambda: main_text(page).count("↳") == 2, 120, "both runs' verdicts on their status lines")
    text = main_text(page)
    page.close()
    collapsed = next(line for line in text.splitlines() if "collapsed at step" in line)
    held = next(line for line in text.splitlines() if line.startswith("↳") and "healthy" in line)
    # the post-mortem's story (Verdict.warned_by, last_critical_before_fall), as the CLI and sorl demo tell it
    warned = r"first critical: \w+ at step \d+ \(\d+ steps before"
    last_before = r"no critical alert ran into it; the last before it: \w+ at step \d+ \(\d+ steps before"
    assert re.search(rf"collapsed at step \d+ · ({warned}|{last_before})", collapsed), collapsed
    assert "root cause: " in collapsed
    assert "root cause" not in held


@pytest.mark.parametrize("runs", [["token-ppo"], ["token-ppo", "so-ppo-auto-ctn"]], ids=["one", "two"])
def test_each_view_is_kept_as_a_screenshot(sample_url, browser, runs):
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    query = "&".join(f"runs={run}" for run in runs)
    name = "one-run" if len(runs) == 1 else "two-runs"
    for view, key in VIEWS:
        page.goto(f"{sample_url}?{query}&view={view}")
        drawn_chart(page, key)
        if view == "Overview":
            wait_until(lambda: main_text(page).count("↳") == len(runs), 120, "the verdicts")
        screenshot(page, f"{name}-{view.lower()}")
    page.goto(f"{sample_url}?{query}&view=Alerts+%26+verdict")
    page.get_by_text("Verdict:").first.wait_for(timeout=120_000)
    wait_until(lambda: "Computing the post-mortem" not in main_text(page), 120, "every verdict")
    screenshot(page, f"{name}-alerts")
    text = page.inner_text("body")
    page.close()
    assert "Traceback" not in text and "failed (" not in text


@pytest.fixture(scope="module")
def nine_b_url(tmp_path_factory) -> Iterator[str]:
    """``sorl dashboard`` on a folder holding the 9B TRL GRPO log that collapsed; its base URL."""
    if not NINE_B.is_file():
        pytest.skip(f"the real log {NINE_B.name} is not on this machine")
    folder = tmp_path_factory.mktemp("nine-b") / "logs"
    folder.mkdir()
    shutil.copy(NINE_B, folder / NINE_B.name)
    server, port = start_dashboard(folder, folder.parent / "dash.log")
    yield f"http://127.0.0.1:{port}/"
    stop(server)


def test_a_foreign_collapse_is_told_as_its_log_shows_it(nine_b_url, browser):
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(nine_b_url)
    drawn_chart(page, "overview")
    wait_until(lambda: "↳" in main_text(page), 120, "the verdict on the status line")
    wait_until(lambda: "across the collapse" in main_text(page), 60, "the notes under the chart (drawn last)")
    overview = main_text(page)
    screenshot(page, "foreign-9b-overview")
    page.get_by_role("tab", name="Alerts & verdict").click()
    page.get_by_text("Verdict:").first.wait_for(timeout=120_000)
    wait_until(lambda: "Root cause" in main_text(page), 120, "the root cause")
    verdict = main_text(page)
    screenshot(page, "foreign-9b-alerts")
    page.get_by_role("tab", name="Turns").click()
    page.get_by_text("has no turn rows").first.wait_for(timeout=60_000)
    turns = main_text(page)
    page.close()

    assert "longer completions" not in overview + verdict, "its completions got shorter in the collapse"
    assert re.search(r"length fell across the collapse", overview), "the length fell, said as it is"
    assert re.search(r"grad norm \(pre-clip\): \d+ of 40 values are exactly 0", overview), "zeros named"
    assert "algorithm not logged" not in overview and "algorithm ?" not in overview
    assert "Monitor.log_update" not in turns
    assert not re.search(r"\b1 of (its|reward)", verdict), "fractions as percentages"
    assert "None" not in verdict
