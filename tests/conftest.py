"""Fixtures for every test (shared builders live in ``tests/helpers/``), SIGINT restored for child processes,
and the groups ``make test``'s two pytest-xdist workers (``-n 2 --dist loadgroup``) keep together."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.helpers.runs import write_run

# A shell without job control starts `make test &` with SIGINT ignored, and an ignored signal stays
# ignored across exec, so the Ctrl-C tests' child processes would never see theirs. A handler set here
# is reset to the default in each child instead.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


SHARED_SESSION_FIXTURES = ("ppo_logs", "s3_server")
"""Session fixtures that train or start a server: their tests run on one worker, so they are made once."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, one group per worker unit: the browser tests together (one Chromium and one
    dashboard server at a time), the tests of each shared session fixture together, else each module's tests
    together (its module-scoped fixtures are made once). A test's own ``xdist_group`` mark wins."""
    if not config.pluginmanager.has_plugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        shared = next((f for f in SHARED_SESSION_FIXTURES if f in getattr(item, "fixturenames", ())), None)
        if item.get_closest_marker("browser"):
            group = "browser"
        elif shared:
            group = shared
        else:
            group = item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run(tmp_path / "logs", "run-a")
