"""Fixtures for every test (shared builders live in ``tests/helpers/``), SIGINT restored for child processes,
and the groups ``make test``'s two pytest-xdist workers (``-n 2 --dist loadgroup``) keep together."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from sorl_monitor.local_s3 import S3Server, SeaweedUnavailable, start_server
from tests.helpers.runs import write_run

# A shell without job control starts `make test &` with SIGINT ignored, and an ignored signal stays
# ignored across exec, so the Ctrl-C tests' child processes would never see theirs. A handler set here
# is reset to the default in each child instead.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


SHARED_SESSION_FIXTURES = ("ppo_logs", "s3_server")
"""Session fixtures that train or start a server: their tests run on one worker, so they are made once."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, one group per worker unit: the browser tests together (one Chromium and one
    dashboard server at a time), the tests of each shared session fixture together, else each module's tests
    together (its module-scoped fixtures are made once). A test's own ``xdist_group`` mark wins.

    ``tryfirst``: xdist's worker turns the marks into its ``@group`` node-id suffixes in its own hook of this
    name; run after it, the marks were never read and a module's tests were spread over both workers.

    A ``record`` test pins one machine's float bits (tests/README.md): skipped unless ``-m`` names it."""
    if "record" not in (config.getoption("markexpr") or ""):
        skip = pytest.mark.skip(
            reason="one machine's float bits: run with -m record on the machine that made it"
        )
        for item in items:
            if item.get_closest_marker("record"):
                item.add_marker(skip)
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


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3-compatible server (SeaweedFS's ``weed``, ``sorl_monitor.local_s3``) on 127.0.0.1, started once
    per session with a fresh data folder and one identity (tests that stop and restart a server start their
    own); skips, with the reason, only where the binary cannot run."""
    try:
        server = start_server(tmp_path_factory.mktemp("seaweedfs"))
    except SeaweedUnavailable as reason:
        pytest.skip(str(reason))
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    yield server
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()


@pytest.fixture
def s3_root(s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket's prefix, with this test's own local cache."""
    monkeypatch.setenv("SORL_CACHE_DIR", str(tmp_path / "cache"))
    return f"s3://{s3_server.bucket()}/runs"
