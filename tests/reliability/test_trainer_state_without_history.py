"""A ``trainer_state.json`` without ``log_history`` (issue 27, item 8) is an error naming the file, exit 2:
on one line it was read as a one-row JSON-lines log (``global_step``, ``epoch``) and judged. Synthetic file."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sorl_monitor.cli.main import app

runner = CliRunner()


@pytest.mark.parametrize("command", ["summary", "postmortem", "runs"])
@pytest.mark.parametrize("text", ['{"global_step": 10, "epoch": 1.0}\n', '{\n  "global_step": 10\n}\n'])
def test_a_trainer_state_without_log_history_is_one_error_line(tmp_path, command, text):
    state = tmp_path / "trainer_state.json"
    state.write_text(text)
    result = runner.invoke(app, [command, str(state)])
    lines = result.output.strip().splitlines()
    assert (result.exit_code, len(lines)) == (2, 1), result.output
    assert lines[0].startswith("error: ") and "trainer_state.json" in lines[0]
    assert "log_history" in lines[0]
