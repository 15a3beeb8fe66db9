"""Runs for the dashboard tests and helpers to open the app with Streamlit's ``AppTest``.

The runs are real: a small PPO loop with the live CTN guard (``ppo_loop``) and a stable tiny PPO run
(``tests.helpers.tiny_pg``), both logged through the real ``Monitor`` into a temporary log folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import streamlit as st

from tests.helpers import ppo_loop, tiny_pg
from tests.helpers.browser import ARGS, CHROMIUM
from tests.helpers.dashboard_app import GUARDED, STABLE


@pytest.fixture(scope="session", autouse=True)
def release_dashboard_resources() -> Iterator[None]:
    """Close the ``LiveRuns`` the app cached (their DuckDB connections) when the tests end."""
    yield
    st.cache_resource.clear()


@pytest.fixture(scope="session")
def ppo_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log folder with two real runs: ``ppo-guarded`` (drifts off, CTN switched by the guard) and ``ppo-stable``."""
    log_dir = tmp_path_factory.mktemp("dashboard") / "logs"
    ppo_loop.train(log_dir, GUARDED, iterations=24)
    tiny_pg.train(log_dir, STABLE, lr=0.003, epochs=2, iterations=12)
    return log_dir


@pytest.fixture(scope="module")
def browser() -> Iterator:
    """A headless Chromium (Debian's) driven by playwright; skips where either is missing."""
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed at /usr/bin/chromium")
    playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright (python) is not installed")
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        yield chromium
        chromium.close()
