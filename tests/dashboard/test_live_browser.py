"""End to end: ``sorl dashboard`` on a run a background process is still writing, seen in headless Chromium.

The writer is the real PPO loop of ``ppo_loop`` (real ``Monitor``, real CTN guard) in its own process;
the dashboard is started by the real CLI on a free 127.0.0.1 port. The test waits until the page shows
a newer step than it first showed, without the page being reloaded, and keeps screenshots in
``test-artifacts/``.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts"
ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]  # fmt: skip
RUN = "live-ppo"
STATUS = re.compile(rf"{RUN} · ppo · live · step (\d+)")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed at /usr/bin/chromium"),
]


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def start(args: list[str], log: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen]]:
    """Processes this test starts; each is stopped (by its own pid) when the test ends."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.terminate()
    for process in started:
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def test_dashboard_shows_newer_steps_of_a_run_being_written_without_reloading(tmp_path, processes):
    playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright (python) is not installed")
    log_dir = tmp_path / "logs"
    writer = start(
        [
            "-m",
            "tests.dashboard.ppo_loop",
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
    processes.append(writer)
    wait_until(
        lambda: any((log_dir / RUN / "steps").glob("rank=*/part-*.parquet")), 120, "the first steps part"
    )
    port = free_port()
    processes.append(
        start(
            ["-m", "cli.main", "dashboard", str(log_dir), "--port", str(port), "--refresh", "1"],
            tmp_path / "dash.log",
        )
    )
    wait_until(lambda: listening(port), 120, f"the dashboard on port {port}")

    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2200})
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=120_000)
            first = int(STATUS.search(page.inner_text("body")).group(1))
            page.evaluate("window.sorlNotReloaded = true")
            page.wait_for_function(
                f"(() => {{ const m = document.body.innerText.match(/{STATUS.pattern}/);"
                f" return m && Number(m[1]) > {first}; }})()",
                timeout=60_000,
            )
            newer = int(STATUS.search(page.inner_text("body")).group(1))
            writer_running = writer.poll() is None
            not_reloaded = page.evaluate("window.sorlNotReloaded === true")
            ARTIFACTS.mkdir(exist_ok=True)
            # the overview's plots are drawn (plotly redraws at each live refresh: wait for a drawn moment)
            page.wait_for_function(PLOTS_DRAWN, timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / "dashboard-live-overview.png"))
            overview_text = page.inner_text("body")
            page.get_by_role("tab", name="Turns").click()
            page.wait_for_selector("text=turn ratios vs token ratios", timeout=60_000)
            page.wait_for_timeout(1500)
            page.screenshot(path=str(ARTIFACTS / "dashboard-live-turns.png"))
            turns_text = page.inner_text("body")
        finally:
            browser.close()

    assert newer > first
    assert writer_running, "the run was still being written when the newer step appeared"
    assert not_reloaded, "the page updated in place (no full reload)"
    for text in (overview_text, turns_text):
        assert "Traceback" not in text and "failed (" not in text
    assert (ARTIFACTS / "dashboard-live-overview.png").stat().st_size > 20_000


PANEL_TITLES = ("reward", "clip fraction", "grad norm")
PLOTS_DRAWN = (
    "(() => { const text = document.body.innerText;"
    f" return {list(PANEL_TITLES)!r}.every(title => text.includes(title)); }})()"
)
"""True once the overview's panel titles are on the page (plotly drew the figure)."""
