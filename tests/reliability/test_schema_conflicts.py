"""A part that stores a known column as another kind of value (text in ``loss``) is skipped with a warning
naming the file and the column; before, every post-mortem over it failed with ``isfinite(VARCHAR)``."""

from __future__ import annotations

import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from sorl_monitor.cli.main import app
from sorl_monitor.read.query import CorruptPartWarning, open_runs
from tests.helpers.runs import write_run


@pytest.fixture
def logs(tmp_path):
    logs = tmp_path / "logs"
    damaged = write_run(logs, "a", updates=3)
    write_run(logs, "b", updates=3)
    text_loss = pa.table({"run_id": ["a"], "rank": pa.array([0], pa.int32()), "step": [10], "loss": ["oops"]})
    pq.write_table(text_loss, damaged / "steps" / "rank=0" / "part-000900.parquet")
    return logs


def test_the_part_is_skipped_naming_file_and_column_and_everything_else_reads(logs):
    with pytest.warns(CorruptPartWarning, match=r"part-000900\.parquet: loss is string, not double"):
        runs = open_runs(logs)
    with runs:
        assert [p.reason for p in runs.skipped_parts("a")] == ["loss is string, not double"]
        counts = runs.sql("SELECT run_id, count(*) AS n FROM steps GROUP BY 1 ORDER BY 1").to_pylist()
        assert counts == [{"run_id": "a", "n": 3}, {"run_id": "b", "n": 3}]
        assert runs.sql("SELECT count(*) FROM steps WHERE isfinite(loss) OR loss IS NULL").num_rows == 1


@pytest.mark.filterwarnings("ignore::sorl_monitor.read.query.CorruptPartWarning")
@pytest.mark.parametrize("run", ["a", "b"])
def test_the_post_mortem_of_every_run_still_works(logs, run):
    result = CliRunner().invoke(app, ["postmortem", str(logs), "--run", run, "--json"])
    assert result.exit_code in (0, 3), result.output


def test_narrower_numbers_of_an_older_schema_are_no_conflict(tmp_path):
    run = write_run(tmp_path, "old", updates=1)
    older = pa.table({"run_id": ["old"], "rank": pa.array([0], pa.int64()), "step": pa.array([5], pa.int32()),
                      "ctn_active": [1.0], "loss": pa.array([1], pa.int16())})  # fmt: skip
    pq.write_table(older, run / "steps" / "rank=0" / "part-000900.parquet")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorruptPartWarning)
        with open_runs(run) as runs:
            assert runs.sql("SELECT max(step) AS s, max(loss) AS l FROM steps").to_pylist() == [
                {"s": 5, "l": 1.0}
            ]
