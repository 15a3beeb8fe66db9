"""A ``run.json`` with unexpected types: that field is read as null with a warning naming the file; every
other run, and every command, still works (before the fix one such file crashed every reader of the folder)."""

from __future__ import annotations

import json
import warnings

import pytest
from typer.testing import CliRunner

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.cli.main import app
from sorl_monitor.read.query import CorruptPartWarning, open_runs
from tests.helpers.runs import write_run

BAD = {
    "list": "[]",
    "null": "null",
    "number": "5",
    "status_number": '{"status": 5}',
    "algorithm_list": '{"algorithm": ["ppo"]}',
    "created_at_number": '{"created_at": 1732406400}',
    "seed_beyond_int64": json.dumps({"seed": 2**63 + 12345}),
    "seed_float": '{"seed": 1.5}',
    "world_size_text": '{"world_size": "2", "schema_version": true}',
    "config_list": '{"config": [1, 2]}',
    "run_id_number": '{"run_id": 7}',
    "truncated": '{"seed": ',
    "deep": "[" * 100_000,
}


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    write_run(logs, "good", updates=3)
    for name, text in BAD.items():
        (logs / name).mkdir()
        (logs / name / "run.json").write_text(text)
    with Monitor(logs, "big-seed", seed=2**63 + 12345, writer=WriterConfig(flush_interval_s=60)) as mon:
        mon.log_scalars(0, {"loss": 1.0})
    return logs


def test_each_bad_field_is_read_as_null_with_a_warning_naming_its_file(logs):
    with pytest.warns(CorruptPartWarning) as caught, open_runs(logs) as runs:
        rows = {r["path"].rsplit("/", 1)[-1]: r for r in runs.sql("SELECT * FROM runs").to_pylist()}
    messages = [str(w.message) for w in caught]
    for name in BAD:
        assert any(f"{name}/run.json" in m for m in messages), name
    assert len(rows) == len(BAD) + 2
    assert rows["good"]["seed"] == 0 and rows["good"]["status"] == "finished"
    assert rows["status_number"]["status"] == "unknown"
    assert rows["algorithm_list"]["algorithm"] is None
    assert rows["created_at_number"]["created_at"] is None
    assert rows["seed_beyond_int64"]["seed"] is None and rows["seed_float"]["seed"] is None
    assert rows["world_size_text"]["world_size"] is None and rows["world_size_text"]["schema_version"] is None
    assert rows["config_list"]["config"] is None
    assert rows["run_id_number"]["run_id"] == "run_id_number"


def test_a_seed_stored_as_text_reads_as_its_integer_where_it_fits(tmp_path):
    for name, seed in [("small", "42"), ("huge", str(2**70)), ("word", "abc")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({"seed": seed}))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorruptPartWarning)
        with open_runs(tmp_path) as runs:
            rows = runs.sql("SELECT run_id, seed FROM runs").to_pylist()
    seeds = {row["run_id"]: row["seed"] for row in rows}
    assert seeds == {"small": 42, "huge": None, "word": None}


@pytest.mark.filterwarnings("ignore::sorl_monitor.read.query.CorruptPartWarning")
@pytest.mark.parametrize(
    "args",
    [
        ["runs", "{logs}"],
        ["query", "{logs}", "SELECT count(*) AS n FROM runs"],
        ["summary", "{logs}", "--run", "good"],
        ["postmortem", "{logs}", "--run", "good"],
        ["runs", "{logs}/big-seed"],
    ],
)
def test_every_command_still_reads_the_folder(logs, args):
    result = CliRunner().invoke(app, [a.format(logs=logs) for a in args])
    assert result.exit_code in (0, 3), result.output
    assert "Traceback" not in result.output
