"""``sorl fleet``: one verdict table for every run under a folder, the same from the local pool and Ray.

The runs are the bundled trainer's real runs in ``sample_logs/`` (token PPO collapses at update 351; SO-PPO
with auto-CTN holds), copied, plus a run whose only part is not Parquet.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from sorl_monitor.cli.main import app
from sorl_monitor.diagnose import fleet
from sorl_monitor.diagnose.fleet import fleet_verdicts
from sorl_monitor.read.query import open_runs
from sorl_monitor.read.verdict_table import VERDICT_COLUMNS, VERDICTS_FILE, write_verdicts

SAMPLE_LOGS = Path(__file__).resolve().parents[2] / "sample_logs"
COMPARED = [
    "run_id",
    "status",
    "collapse_step",
    "first_critical",
    "lead_time",
    "root_cause",
    "last_step",
    "error",
]


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fleet")
    for name in ("token-ppo", "so-ppo-auto-ctn"):
        shutil.copytree(SAMPLE_LOGS / name, root / name)
    broken = root / "broken" / "steps" / "rank=0"
    broken.mkdir(parents=True)
    (broken / "part-000000.parquet").write_bytes(b"not parquet at all")
    return root


@pytest.fixture(scope="module")
def local_table(fleet_dir: Path):
    return fleet_verdicts(fleet_dir, engine="local", jobs=2)


def test_every_run_gets_a_row_most_urgent_first_and_a_bad_run_is_an_error_row(local_table):
    rows = {row["run_id"]: row for row in local_table.to_pylist()}
    assert set(rows) == {"token-ppo", "so-ppo-auto-ctn", "broken"}
    assert rows["broken"]["status"] == "error" and rows["broken"]["error"]
    assert rows["token-ppo"]["status"] == "collapsed" and rows["token-ppo"]["root_cause"]
    assert rows["so-ppo-auto-ctn"]["status"] == "healthy"
    assert local_table.column("run_id").to_pylist()[-1] == "so-ppo-auto-ctn"  # healthy last


def test_each_row_is_the_runs_own_postmortem(fleet_dir, local_table):
    from sorl_monitor.diagnose.postmortem import postmortem

    with open_runs(fleet_dir / "token-ppo") as runs:
        verdict = postmortem(runs, "token-ppo")
    row = next(r for r in local_table.to_pylist() if r["run_id"] == "token-ppo")
    assert (row["collapse_step"], row["first_critical"], row["root_cause"]) == (
        verdict.collapse_step,
        verdict.first_critical,
        verdict.root_cause,
    )


JUDGED = [
    name for name in VERDICT_COLUMNS.names if name not in ("path", "source_mtime", "updated_at", "error")
]


@pytest.fixture(scope="module")
def sample_fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    """Every run in ``sample_logs/`` (real runs of the bundled trainer), and what ``sorl postmortem`` says of
    each: ``open_runs`` of the run alone, default options, then ``postmortem``."""
    from sorl_monitor.diagnose.fleet import _verdict_row
    from sorl_monitor.diagnose.postmortem import postmortem

    root = tmp_path_factory.mktemp("sample_fleet")
    expected = {}
    for source in sorted(p for p in SAMPLE_LOGS.iterdir() if (p / "run.json").is_file()):
        shutil.copytree(source, root / source.name)
        with open_runs(root / source.name) as runs:
            (run_id,) = runs.sql("SELECT run_id FROM runs").column(0).to_pylist()
            expected[run_id] = {
                k: v for k, v in _verdict_row(postmortem(runs, run_id)).items() if k in JUDGED
            }
    assert len(expected) >= 5 and {row["status"] for row in expected.values()} >= {"collapsed", "healthy"}
    return root, expected


def test_each_sample_runs_row_is_what_its_own_postmortem_says(sample_fleet):
    root, expected = sample_fleet
    table = fleet_verdicts(root, engine="local", jobs=2, chunk_size=2)
    assert {row["run_id"]: row for row in table.select(JUDGED).to_pylist()} == expected


@pytest.mark.slow
def test_each_sample_runs_row_on_ray_is_what_its_own_postmortem_says(sample_fleet):
    pytest.importorskip("ray")
    root, expected = sample_fleet
    table = fleet_verdicts(root, engine="ray", jobs=2, chunk_size=2)
    assert {row["run_id"]: row for row in table.select(JUDGED).to_pylist()} == expected


def test_unchanged_runs_are_not_judged_again_and_a_changed_one_is(fleet_dir, local_table, tmp_path):
    again = fleet_verdicts(fleet_dir, engine="local", jobs=1, previous=local_table)
    stamp = {r["run_id"]: r["updated_at"] for r in again.to_pylist()}
    before = {r["run_id"]: r["updated_at"] for r in local_table.to_pylist()}
    assert stamp["token-ppo"] == before["token-ppo"] and stamp["so-ppo-auto-ctn"] == before["so-ppo-auto-ctn"]
    assert stamp["broken"] > before["broken"]  # an error is always tried again


@pytest.mark.slow
def test_the_ray_engine_gives_the_same_table(fleet_dir, local_table):
    pytest.importorskip("ray")
    on_ray = fleet_verdicts(fleet_dir, engine="ray", jobs=2)
    assert on_ray.select(COMPARED).to_pylist() == local_table.select(COMPARED).to_pylist()


def test_the_cli_writes_the_table_exits_3_and_runs_and_query_read_it(fleet_dir, tmp_path):
    runner = CliRunner()
    out = tmp_path / "v.parquet"
    result = runner.invoke(app, ["fleet", str(fleet_dir), "--jobs", "1", "--out", str(out)])
    assert result.exit_code == 3, result.output
    assert "token-ppo" in result.output and "collapsed" in result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    assert pq.read_table(out).num_rows == 3
    write_verdicts(pq.read_table(out), fleet_dir / VERDICTS_FILE)
    result = runner.invoke(
        app, ["query", str(fleet_dir), "SELECT run_id, status FROM verdicts ORDER BY run_id", "--json"]
    )
    assert result.exit_code == 0 and '"broken"' in result.output
    result = runner.invoke(app, ["runs", str(fleet_dir), "--json"])
    assert '"verdict": "collapsed"' in result.output


@pytest.mark.parametrize("args", [["--engine", "spark"], ["--address", "127.0.0.1:1"], ["--set", "nope=1"]])
def test_bad_options_are_one_line_and_exit_2(fleet_dir, tmp_path, args):
    result = CliRunner().invoke(app, ["fleet", str(fleet_dir), "--out", str(tmp_path / "v.parquet"), *args])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_a_ray_refresh_with_no_run_changed_starts_no_ray(tmp_path, monkeypatch):
    shutil.copytree(SAMPLE_LOGS / "token-ppo", tmp_path / "token-ppo")
    table = fleet_verdicts(tmp_path, engine="local", jobs=1)

    def no_ray(*_args):
        raise AssertionError("Ray started for a refresh with nothing to judge")

    monkeypatch.setattr(fleet, "_ray_session", no_ray)
    again = fleet_verdicts(tmp_path, engine="ray", jobs=2, previous=table)
    assert again.to_pylist() == table.to_pylist()
