"""Fixtures for every test (shared builders live in ``tests/helpers/``), and SIGINT restored for child processes."""

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


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run(tmp_path / "logs", "run-a")
