"""Runs written straight to a real S3 server (SeaweedFS on 127.0.0.1) read back as they do from a disk."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from sorl_monitor import WriterConfig
from sorl_monitor.cli.main import app
from sorl_monitor.diagnose import fleet
from sorl_monitor.diagnose.fleet import UNREAD_TABLES, fleet_verdicts
from sorl_monitor.local_s3 import start_server
from sorl_monitor.read.query import QueryError, open_runs
from sorl_monitor.read.ranks import rank_skew
from sorl_monitor.storage import mirror_down
from tests.helpers.own_s3 import own_server
from tests.helpers.s3_ranks import log_updates
from tests.helpers.s3_upload import upload_sample_run

ROOT = Path(__file__).resolve().parents[2]
TABLES = ("steps", "turns", "modules", "alerts")
TIMINGS = {"wall_time", "monitor_ms"}
"""Columns that time the run itself: they differ between any two runs."""
SAMPLE_LOGS = ROOT / "sample_logs"


def table_rows(path: str, table: str) -> list[dict]:
    with open_runs(path) as runs:
        columns = [c for c in runs.columns(table) if c not in TIMINGS]
        quoted = ", ".join(f'"{c}"' for c in columns)
        rows = runs.sql(f"SELECT {quoted} FROM {table} ORDER BY ALL").to_pylist()
    return [
        {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()} for row in rows
    ]


def test_a_two_rank_run_in_s3_reads_back_identical_to_the_same_run_on_disk(s3_root, tmp_path):
    for rank in (0, 1):
        log_updates(s3_root, "two-ranks", rank=rank, world_size=2, updates=12)
        log_updates(str(tmp_path / "disk"), "two-ranks", rank=rank, world_size=2, updates=12)
    for table in TABLES:
        assert table_rows(s3_root, table) == table_rows(str(tmp_path / "disk"), table), table
    with open_runs(s3_root) as remote, open_runs(tmp_path / "disk") as local:
        skew = rank_skew(remote, "ratio_mean").to_pylist()
        assert len(skew) == 2  # means summed by DuckDB's threads: equal to the last few bits
        for got, want in zip(skew, rank_skew(local, "ratio_mean").to_pylist(), strict=True):
            assert got == {
                k: pytest.approx(v, rel=1e-12) if isinstance(v, float) else v for k, v in want.items()
            }
    with open_runs(s3_root) as runs:
        assert runs.sql("SELECT count(DISTINCT rank) AS n FROM steps").to_pylist() == [{"n": 2}]
        assert runs.sql("SELECT status FROM runs").to_pylist() == [{"status": "finished"}]


def test_a_second_writer_on_the_same_run_and_rank_is_refused_and_overwrites_nothing(s3_server, s3_root):
    from sorl_monitor import Monitor

    first = Monitor(s3_root, "shared", algorithm="ppo", writer=WriterConfig(flush_interval_s=0.05))
    second = Monitor(s3_root, "shared", algorithm="ppo", writer=WriterConfig(flush_interval_s=0.05))
    assert not first._writer.refused and "being written by" in second._writer.refused
    first.log_scalars(0, {"loss": 1.0, "reward": 0.5})
    second.log_scalars(0, {"loss": 99.0, "reward": -1.0})
    second.close()
    first.close()
    with open_runs(s3_root) as runs:
        assert runs.sql("SELECT loss FROM steps").to_pylist() == [{"loss": 1.0}]
    assert second.writer_stats().rows_dropped == 1


def test_a_writer_killed_mid_write_leaves_only_whole_objects(s3_server, s3_root):
    child = subprocess.Popen([sys.executable, "-m", "tests.helpers.s3_child", s3_root], cwd=ROOT)
    fs = s3_server.filesystem()
    bucket_prefix = s3_root.removeprefix("s3://")
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:  # until several parts are up
            parts = [
                i.path
                for i in fs.get_file_info(
                    pafs.FileSelector(bucket_prefix, recursive=True, allow_not_found=True)
                )
                if i.path.endswith(".parquet")
            ]
            if len(parts) >= 6:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the child wrote no parts within 120 s")
    finally:
        child.kill()
        child.wait(30)
    for path in parts:  # every object listed is a whole Parquet file
        with fs.open_input_file(path) as f:
            assert pq.read_metadata(f).num_rows > 0
    with open_runs(s3_root) as runs:
        assert runs.sql("SELECT count(*) AS n FROM steps").to_pylist()[0]["n"] > 0
        assert runs.skipped_parts() == []


@pytest.mark.slow
def test_a_server_down_mid_run_never_blocks_training_and_loses_no_row(tmp_path, monkeypatch):
    from sorl_monitor import Monitor

    server = own_server(tmp_path, monkeypatch)
    root = f"s3://{server.bucket()}/runs"
    mon = Monitor(root, "outage", algorithm="ppo", writer=WriterConfig(flush_interval_s=0.05))
    try:
        for step in range(20):
            mon.log_scalars(step, {"loss": 1.0, "reward": step / 100})
        mon.flush()
        server.stop()  # the store goes away mid-run
        for step in range(20, 60):
            mon.log_scalars(step, {"loss": 1.0, "reward": step / 100})
        mon.flush()
        deadline = time.monotonic() + 120
        while mon.upload_stats().failed_rounds == 0 and time.monotonic() < deadline:
            time.sleep(0.2)  # an upload round under way when the server went times out first
        assert mon.upload_stats().failed_rounds > 0
        server = start_server(server.data, server.ports)  # and comes back
        for step in range(60, 80):
            mon.log_scalars(step, {"loss": 1.0, "reward": step / 100})
        mon.close()
        assert mon.writer_stats().rows_dropped == 0 and mon.upload_stats().pending == 0
        with open_runs(root) as runs:
            steps = runs.sql("SELECT step FROM steps ORDER BY step").column(0).to_pylist()
        assert steps == list(range(80))
    finally:
        server.stop()


def test_fleet_over_s3_gives_the_table_it_gives_on_disk(s3_server, s3_root, tmp_path):
    fs = s3_server.filesystem()
    for name in ("token-ppo", "so-ppo-auto-ctn"):
        upload_sample_run(name, f"{s3_root}/{name}", fs)
    compared = ["run_id", "status", "collapse_step", "first_critical", "root_cause", "last_step"]
    remote = fleet_verdicts(s3_root, jobs=1).select(compared).to_pylist()
    local_root = tmp_path / "local"
    for name in ("token-ppo", "so-ppo-auto-ctn"):
        pafs.copy_files(str(SAMPLE_LOGS / name), str(local_root / name))
    assert remote == fleet_verdicts(local_root, jobs=1).select(compared).to_pylist()
    result = CliRunner().invoke(app, ["fleet", s3_root, "--out", str(tmp_path / "v.parquet"), "--jobs", "1"])
    assert result.exit_code == 3 and "token-ppo" in result.output


def test_a_missing_bucket_is_one_line_and_exit_2(s3_server, tmp_path, monkeypatch):
    monkeypatch.setenv("SORL_CACHE_DIR", str(tmp_path / "cache"))
    result = CliRunner().invoke(app, ["runs", "s3://no-such-bucket-here/runs"])
    assert result.exit_code == 2 and "no such bucket" in result.output


def test_a_fleet_download_leaves_out_the_tables_it_does_not_read_and_keeps_their_local_copies(
    s3_server, s3_root
):
    fs = s3_server.filesystem()
    uri = upload_sample_run("grpo", f"{s3_root}/grpo", fs)
    remote = uri.removeprefix("s3://")

    def local_files(folder: Path) -> set[str]:
        return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}

    every = local_files(SAMPLE_LOGS / "grpo")
    folder = mirror_down(uri, skip_folders=UNREAD_TABLES)
    assert local_files(folder) == {f for f in every if not f.startswith("modules/")}
    assert local_files(mirror_down(uri)) == every
    assert local_files(mirror_down(uri, skip_folders=UNREAD_TABLES)) == every  # not removed, only not fetched
    part = next(f for f in every if f.startswith("steps/"))
    fs.delete_file(f"{remote}/{part}")
    assert local_files(mirror_down(uri, skip_folders=UNREAD_TABLES)) == every - {part}


def test_a_fleet_task_fetches_the_objects_the_fleets_listing_names_and_lists_again_when_one_is_gone(
    s3_server, s3_root
):
    fs = s3_server.filesystem()
    remote = upload_sample_run("grpo", f"{s3_root}/listed/grpo", fs).removeprefix("s3://")
    (run,) = fleet.find_targets(f"{s3_root}/listed")
    assert {key for key, _, _ in run.objects} == {
        p.relative_to(SAMPLE_LOGS / "grpo").as_posix()
        for p in (SAMPLE_LOGS / "grpo").rglob("*")
        if p.is_file() and p.relative_to(SAMPLE_LOGS / "grpo").parts[0] not in UNREAD_TABLES
    }
    # the task fetches what the listing names, no more (it lists nothing of its own)
    without_turns = tuple(o for o in run.objects if not o[0].startswith("turns/"))
    folder = mirror_down(run.path, skip_folders=UNREAD_TABLES, listing=without_turns)
    assert not (folder / "turns").exists() and (folder / "run.json").is_file()
    # compacted away since the listing: the task lists the run again and mirrors it as it is now
    turns = next(key for key, _, _ in run.objects if key.startswith("turns/"))
    fs.delete_file(f"{remote}/{turns}")
    folder = mirror_down(run.path, skip_folders=UNREAD_TABLES, listing=run.objects)
    fetched = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert fetched == {key for key, _, _ in run.objects} - {turns}


def test_one_object_is_mirrored_as_one_file(s3_server, s3_root):
    source = SAMPLE_LOGS / "grpo" / "run.json"
    with s3_server.filesystem().open_output_stream(f"{s3_root.removeprefix('s3://')}/one/run.json") as sink:
        sink.write(source.read_bytes())
    copy = mirror_down(f"{s3_root}/one/run.json")
    assert copy.name == "run.json" and copy.read_bytes() == source.read_bytes()


def test_an_error_row_of_a_run_in_object_storage_names_its_uri_not_its_local_copy(
    s3_server, s3_root, monkeypatch
):
    """A post-mortem that fails naming the folder it opened (here made to fail: SYNTHETIC error) is reported
    under the run's s3:// URI: the local copy's path means nothing to the user."""
    upload_sample_run("grpo", f"{s3_root}/grpo", s3_server.filesystem())

    def failing_judge(path, *_):
        raise QueryError(f"{path}/steps: unreadable")

    monkeypatch.setattr(fleet, "_judge", failing_judge)
    (row,) = fleet_verdicts(s3_root, jobs=1).to_pylist()
    assert row["status"] == "error"
    assert row["error"] == f"QueryError: {s3_root}/grpo/steps: unreadable"
