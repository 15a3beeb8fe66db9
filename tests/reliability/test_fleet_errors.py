"""``sorl fleet`` and ``--watch``: one line and exit 2 for every store or path error, nothing written but a
regular file, a root without runs named as an error, runs in sub-folders found at any depth. The runs are
the bundled trainer's real runs in ``sample_logs/``; stores are a real S3 server (SeaweedFS)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from types import SimpleNamespace

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from sorl_monitor.cli import fleet as fleet_cli
from sorl_monitor.cli.main import app
from sorl_monitor.storage import set_default_storage_options
from tests.helpers.own_s3 import own_server
from tests.helpers.paths import ROOT, SAMPLE_LOGS
from tests.helpers.s3_upload import upload_sample_run


@pytest.fixture(autouse=True)
def no_storage_options():
    yield
    set_default_storage_options({})  # what a --storage-option of one test left for the next


def fleet(*args: str):
    return CliRunner().invoke(app, ["fleet", "--jobs", "1", *args])


def one_line_exit_2(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output and result.output.count("error:") == 1, result.output
    return " ".join(result.output.split())


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(SAMPLE_LOGS / "token-ppo", root / "token-ppo")
    return root


def test_a_wrong_key_is_one_line_and_exit_2(s3_server, s3_root):
    upload_sample_run("token-ppo", f"{s3_root}/token-ppo", s3_server.filesystem())
    result = CliRunner().invoke(
        app, ["--storage-option", "access_key=nope", "--storage-option", "secret_key=no", "fleet", s3_root]
    )
    assert "ACCESS_DENIED" in one_line_exit_2(result) or "INVALID_ACCESS_KEY" in result.output


def test_an_unreachable_endpoint_is_one_line_and_exit_2(s3_root):
    result = CliRunner().invoke(
        app,
        [
            "--storage-option",
            "endpoint_override=127.0.0.1:1",
            "--storage-option",
            "scheme=http",
            "fleet",
            s3_root,
        ],
    )
    assert s3_root in one_line_exit_2(result)


@pytest.mark.slow
def test_watch_exits_2_in_one_line_on_the_round_after_the_store_goes_down(tmp_path, monkeypatch):
    server = own_server(tmp_path, monkeypatch)
    root = f"s3://{server.bucket()}/runs"
    upload_sample_run("so-ppo-auto-ctn", f"{root}/so-ppo-auto-ctn", server.filesystem())
    rounds = []

    def store_goes_down(seconds: float) -> None:  # the wait between rounds
        rounds.append(seconds)
        server.stop()

    monkeypatch.setattr(fleet_cli, "time", SimpleNamespace(strftime=time.strftime, sleep=store_goes_down))
    try:
        result = fleet(root, "--watch", "1")
    finally:
        server.stop()
    assert rounds == [1.0] and "NETWORK_CONNECTION" in one_line_exit_2(result)


def test_a_run_named_verdicts_parquet_is_one_line_and_nothing_is_left_behind(runs):
    shutil.copytree(SAMPLE_LOGS / "grpo", runs / "verdicts.parquet")
    before = sorted(p.name for p in runs.rglob("*"))
    assert "is a folder" in one_line_exit_2(fleet(str(runs)))
    assert sorted(p.name for p in runs.rglob("*")) == before  # no *.tmp


def test_out_a_folder_is_one_line_and_nothing_is_left_behind(runs, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    assert "is a folder" in one_line_exit_2(fleet(str(runs), "--out", str(folder)))
    assert list(folder.iterdir()) == [] and not list(tmp_path.glob("*.tmp"))


def test_out_a_device_node_is_never_replaced(runs, tmp_path):
    node = tmp_path / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of our own
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD")
    assert "not a regular file" in one_line_exit_2(fleet(str(runs), "--out", str(node)))
    assert stat.S_ISCHR(node.stat().st_mode)  # guards against replacing a device with a regular file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null", "runs"]


def test_out_a_fifo_is_refused_at_once(runs, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    command = [
        sys.executable,
        "-m",
        "sorl_monitor.cli.main",
        "fleet",
        str(runs),
        "--jobs",
        "1",
        "--out",
        str(fifo),
    ]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("sorl fleet --out FIFO hangs")  # guards against blocking in open()
    assert done.returncode == 2 and "not a regular file" in done.stderr and "Traceback" not in done.stderr
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_prefix_with_a_typo_is_an_error_naming_it_and_nothing_is_written(s3_server, s3_root):
    upload_sample_run("token-ppo", f"{s3_root}/token-ppo", s3_server.filesystem())
    typo = s3_root.replace("/runs", "/typo-prefix")
    assert f"no runs found under {typo}" in one_line_exit_2(fleet(typo))
    listed = s3_server.filesystem().get_file_info(
        pafs.FileSelector(typo.removeprefix("s3://"), allow_not_found=True)
    )
    assert listed == []  # guards against an empty prefix judged as 0 runs


def test_an_empty_folder_is_an_error_naming_it(tmp_path):
    assert f"no runs found under {tmp_path}" in one_line_exit_2(fleet(str(tmp_path)))
    assert list(tmp_path.iterdir()) == []


def test_runs_in_sub_folders_are_found_at_any_depth_named_by_their_path(tmp_path):
    root = tmp_path / "experiments"
    shutil.copytree(SAMPLE_LOGS / "token-ppo", root / "exp1" / "run")
    shutil.copytree(SAMPLE_LOGS / "so-ppo-auto-ctn", root / "exp2" / "run")
    shutil.copytree(SAMPLE_LOGS / "grpo", root / "sweep" / "lr" / "1e-3")
    result = fleet(str(root))
    assert result.exit_code == 3, result.output  # the token-PPO run collapsed
    table = {row["run_id"]: row for row in pq.read_table(root / "verdicts.parquet").to_pylist()}
    assert set(table) == {"exp1/run", "exp2/run", "sweep/lr/1e-3"}
    assert table["exp1/run"]["status"] == "collapsed" and table["exp2/run"]["status"] == "healthy"
    assert table["exp1/run"]["path"] == str((root / "exp1" / "run").resolve())


def test_runs_in_sub_folders_of_a_prefix_are_found_at_any_depth(s3_server, s3_root):
    upload_sample_run("token-ppo", f"{s3_root}/exp1/run", s3_server.filesystem())
    upload_sample_run("so-ppo-auto-ctn", f"{s3_root}/exp2/deeper/run", s3_server.filesystem())
    assert fleet(s3_root).exit_code == 3
    with s3_server.filesystem().open_input_file(f"{s3_root.removeprefix('s3://')}/verdicts.parquet") as f:
        table = {row["run_id"]: row["status"] for row in pq.read_table(f).to_pylist()}
    assert table == {"exp1/run": "collapsed", "exp2/deeper/run": "healthy"}


def test_a_part_with_corrupt_page_headers_is_named_in_its_row(runs):
    victim = sorted((runs / "token-ppo" / "steps").rglob("part-*.parquet"))[0]
    data = bytearray(victim.read_bytes())
    first_page = pq.read_metadata(victim).row_group(0).column(0).data_page_offset
    data[first_page : first_page + 12] = b"\xff" * 12  # the page header no longer reads; the footer does
    victim.write_bytes(bytes(data))
    fleet(str(runs))
    (row,) = pq.read_table(runs / "verdicts.parquet").to_pylist()
    assert str(victim) in (row["error"] or ""), row  # guards against an error that names no file
