"""Runs for the dashboard tests and helpers to open the app with Streamlit's ``AppTest``.

The runs are real: a small PPO loop with the live CTN guard (``ppo_loop``) and a stable tiny PPO run
(``tests.detectors.tiny_pg``), both logged through the real ``Monitor`` into a temporary log folder.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from sorl_monitor.dashboard.launch_settings import LOG_DIR_ENV, REFRESH_ENV
from tests.dashboard import ppo_loop
from tests.detectors import tiny_pg

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
GUARDED, STABLE = "ppo-guarded", "ppo-stable"


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


def open_app(
    monkeypatch: pytest.MonkeyPatch,
    log_dir: Path | None,
    view: str | None = None,
    runs: list[str] | None = None,
) -> AppTest:
    """The dashboard on ``log_dir`` after its first run, at ``view`` with ``runs`` picked (as in its URL)."""
    if log_dir is None:
        monkeypatch.delenv(LOG_DIR_ENV, raising=False)
    else:
        monkeypatch.setenv(LOG_DIR_ENV, str(log_dir))
    monkeypatch.setenv(REFRESH_ENV, "2")
    app = AppTest.from_file(str(APP), default_timeout=120)
    if view is not None:
        app.query_params["view"] = view
    if runs is not None:
        app.query_params["runs"] = runs
    return app.run()


def page_text(app: AppTest) -> str:
    """Every markdown, caption, info, warning, error and success text on the page, one per line."""
    kinds = ("markdown", "caption", "info", "warning", "error", "success")
    return "\n".join(str(element.value) for kind in kinds for element in app.get(kind))


def charts(app: AppTest) -> dict[str, dict[str, Any]]:
    """The live charts on the page, by key: each one's plotly figure (``data``, ``layout``) as sent."""
    found = {}
    for element in app.get("component_instance"):
        args = json.loads(element.proto.json_args)
        if args.get("spec"):
            found[args["key"]] = json.loads(args["spec"])
    return found


def assert_clean(app: AppTest) -> None:
    """No exception (traceback) and no error message on the page."""
    assert not app.exception, [e.value for e in app.exception]
    assert not app.error, [e.value for e in app.error]


def wait_for_verdicts(app: AppTest, timeout_s: float = 120) -> AppTest:
    """Rerun the page until no post-mortem is still being computed."""
    deadline = time.monotonic() + timeout_s
    while "Computing the post-mortem" in page_text(app) and time.monotonic() < deadline:
        time.sleep(0.5)
        app.run()
    return app
