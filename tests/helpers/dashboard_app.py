"""The dashboard opened with Streamlit's ``AppTest`` (no browser), and what the tests read off its page."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from sorl_monitor.dashboard.launch_settings import LOG_DIR_ENV, REFRESH_ENV
from sorl_monitor.dashboard.view_parts import CHOICES_SHOWN
from tests.helpers.paths import ROOT

APP = ROOT / "dashboard" / "app.py"
GUARDED, STABLE = "ppo-guarded", "ppo-stable"
"""The two runs of the dashboard tests' session log folder (``ppo_logs``)."""


def open_app(
    monkeypatch: pytest.MonkeyPatch,
    log_dir: Path | None,
    view: str | None = None,
    runs: list[str] | None = None,
    drawn: bool = True,
) -> AppTest:
    """The dashboard on ``log_dir`` after its first run, at ``view`` with ``runs`` picked (as in its URL);
    ``drawn``: then as the browser's chart reports its first draw (``chart_drawn``)."""
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
    app.run()
    return chart_drawn(app) if drawn else app


def chart_drawn(app: AppTest) -> AppTest:
    """The page after its first chart reported being drawn, as a browser's chart does (``AppTest`` runs no
    JavaScript): a session's first page leaves the sidebar's widgets out while its chart is on the way
    (``view_parts.CHOICES_SHOWN``); the page is run again with them."""
    if CHOICES_SHOWN in app.session_state and not app.session_state[CHOICES_SHOWN]:
        app.session_state[CHOICES_SHOWN] = True
        app.run()
    return app


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
    """Rerun the page until no post-mortem is still being computed (the Alerts view's "Computing the
    post-mortem …", the Overview's "verdict: computing the post-mortem…")."""
    deadline = time.monotonic() + timeout_s
    while "computing the post-mortem" in page_text(app).lower() and time.monotonic() < deadline:
        time.sleep(0.5)
        app.run()
    return app
