"""Headless Chromium against ``sorl dashboard`` started by the real CLI: start, wait, read, screenshot."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.helpers.paths import ARTIFACTS, ROOT

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]  # fmt: skip


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


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def start_dashboard(log_dir: Path, log: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    server = start(
        ["-m", "sorl_monitor.cli.main", "dashboard", str(log_dir), "--port", str(port), *extra], log
    )
    wait_until(lambda: listening(port) or server.poll() is not None, 120, f"the dashboard on port {port}")
    assert server.poll() is None, log.read_text()
    return server, port


def drawn_chart(page, key: str, timeout_s: float = 120):
    """The frame of the live chart ``key`` once plotly drew it."""
    page.frame_locator(CHART.format(key=key)).locator(".main-svg").first.wait_for(timeout=timeout_s * 1000)
    return page.frame_locator(CHART.format(key=key))


def main_text(page) -> str:
    """The text of the page's main area (the sidebar's run list refreshes more slowly)."""
    return page.locator("[data-testid='stMain']").inner_text()


def screenshot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.wait_for_timeout(800)
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)


CHART = ".st-key-{key} iframe"
"""The iframe of the live chart called ``key``."""
