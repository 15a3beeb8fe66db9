"""Runs written to a real S3 server (SeaweedFS on 127.0.0.1) lose no row silently: a resumed run keeps both
sessions' rows, a second writer found late keeps its rows apart and says so, and a store that cannot work is
said while training runs, not at ``close()``."""

from __future__ import annotations

import socket
import threading
import time
import uuid
import warnings

import pyarrow.fs as pafs
import pytest
from typer.testing import CliRunner

from sorl_monitor import Monitor, MonitorWarning, WriterConfig
from sorl_monitor.cli.main import app
from sorl_monitor.local_s3 import start_server
from sorl_monitor.read.query import open_runs
from tests.helpers.own_s3 import own_server


def steps_in(root: str) -> list[int]:
    with open_runs(root) as runs:
        return runs.sql("SELECT step FROM steps ORDER BY step").column(0).to_pylist()


def log_steps(monitor: Monitor, steps: range) -> None:
    for step in steps:
        monitor.log_scalars(step, {"loss": float(step), "reward": 0.5})


def test_a_run_resumed_in_s3_continues_its_part_numbers_and_keeps_both_sessions_rows(s3_root):
    for session in range(2):
        mon = Monitor(s3_root, "resumed", writer=WriterConfig(flush_interval_s=0.05, compact=session == 0))
        for step in range(session * 40, session * 40 + 40):
            log_steps(mon, range(step, step + 1))
            if step % 10 == 9:
                mon.flush()  # several parts per session
        mon.close()
    assert steps_in(s3_root) == list(range(80))  # guards against a resumed session overwriting part-000000


@pytest.fixture
def restartable_server(tmp_path, monkeypatch):
    server = own_server(tmp_path, monkeypatch)
    yield server
    server.stop()


@pytest.mark.slow
def test_two_writers_started_while_the_store_is_down_one_uploads_the_other_keeps_its_rows_apart(
    restartable_server, tmp_path
):
    root = f"s3://{restartable_server.bucket()}/runs"
    restartable_server.stop()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        writers = [Monitor(root, "shared", writer=WriterConfig(flush_interval_s=0.05)) for _ in range(2)]
        assert not any(w._writer.refused for w in writers)  # the store could not say
        for index, mon in enumerate(writers):
            log_steps(mon, range(index * 100, index * 100 + 60))
            mon.flush()
        server = start_server(restartable_server.data, restartable_server.ports)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not any(w.upload_stats().refused for w in writers):
                time.sleep(0.1)
            for mon in writers:
                mon.close()
            stats = [w.upload_stats() for w in writers]
            uploaded = steps_in(root)
        finally:
            server.stop()
    refused = [i for i, s in enumerate(stats) if s.refused]
    assert len(refused) == 1, stats  # guards against two writers both uploading
    loser, winner = refused[0], 1 - refused[0]
    assert uploaded == list(range(winner * 100, winner * 100 + 60))
    assert stats[loser].pending > 0 and "being written by" in stats[loser].refused
    assert steps_in(str(writers[loser].log_dir)) == list(range(loser * 100, loser * 100 + 60))  # kept apart
    said = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    assert any("kept apart" in m and str(writers[loser].run_dir) in m for m in said), said


def warned_within(make, seconds: float) -> tuple[Monitor, list[str], float]:
    """A monitor made and logging for ``seconds``: the MonitorWarnings it gave and when the first came."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        started = time.monotonic()
        mon = make()
        first = None
        while time.monotonic() - started < seconds:
            log_steps(mon, range(mon.last_step + 1, mon.last_step + 2))
            if first is None and any(issubclass(w.category, MonitorWarning) for w in caught):
                first = time.monotonic() - started
            time.sleep(0.05)
        messages = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    return mon, messages, first if first is not None else float("inf")


def closed_in(mon: Monitor) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        started = time.monotonic()
        mon.close()
        return time.monotonic() - started


def test_a_wrong_key_is_said_while_training_runs_and_close_does_not_wait_for_it(s3_server, s3_root):
    bad = {"access_key": "not-a-key", "secret_key": "nope"}
    mon, said, first = warned_within(
        lambda: Monitor(s3_root, "bad-key", writer=WriterConfig(storage_options=bad)), 1.0
    )
    assert first < 5 and any(s3_root in m and "ACCESS_DENIED" in m for m in said), said
    assert closed_in(mon) < 5  # guards against a close that waits out the store's retries


def test_a_bucket_that_does_not_exist_is_said_and_never_made(s3_server, tmp_path, monkeypatch):
    monkeypatch.setenv("SORL_CACHE_DIR", str(tmp_path / "cache"))
    bucket = f"sorl-missing-{uuid.uuid4().hex[:8]}"
    mon, said, first = warned_within(lambda: Monitor(f"s3://{bucket}/runs", "no-bucket"), 1.0)
    assert first < 5 and any(f"no such bucket: {bucket}" in m for m in said), said
    assert closed_in(mon) < 5
    assert s3_server.filesystem().get_file_info(bucket).type == pafs.FileType.NotFound


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_endpoint_where_nothing_listens_is_said_at_once(s3_server, tmp_path, monkeypatch):
    monkeypatch.setenv("SORL_CACHE_DIR", str(tmp_path / "cache"))
    options = {"endpoint_override": f"127.0.0.1:{free_port()}", "scheme": "http"}
    mon, said, first = warned_within(
        lambda: Monitor("s3://bucket/runs", "refused", writer=WriterConfig(storage_options=options)), 1
    )
    assert first < 5 and any("NETWORK_CONNECTION" in m for m in said), said
    assert closed_in(mon) < 5


def test_an_endpoint_that_never_answers_is_said_within_5_s_and_training_never_waits(tmp_path, monkeypatch):
    monkeypatch.setenv("SORL_CACHE_DIR", str(tmp_path / "cache"))
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # takes connections, never answers
    held = []
    threading.Thread(target=lambda: held.extend(silent.accept() for _ in range(16)), daemon=True).start()
    options = {"endpoint_override": f"127.0.0.1:{silent.getsockname()[1]}", "scheme": "http"}
    started = time.monotonic()
    mon, said, first = warned_within(
        lambda: Monitor("s3://bucket/runs", "silent", writer=WriterConfig(storage_options=options)), 4.5
    )
    assert first < 5 and any("has not answered" in m for m in said), said
    assert closed_in(mon) < 6 and time.monotonic() - started < 12
    silent.close()


@pytest.mark.parametrize(
    "uri",
    [
        "s3://bucket/x/../y",
        "s3://bucket/./runs",
        "s3://bucket/q?x=1/runs",
        "s3://bucket/runs#frag",
        "s3://b//x",
    ],
)
def test_a_uri_that_is_not_a_bucket_and_plain_prefix_is_refused(uri, tmp_path, monkeypatch):
    monkeypatch.setenv("SORL_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="object-store"):
        Monitor(uri, "x")
    result = CliRunner().invoke(app, ["runs", uri])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_an_unknown_storage_option_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SORL_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="unknown storage option 'bogus'"):
        Monitor("s3://bucket/runs", "x", writer=WriterConfig(storage_options={"bogus": "1"}))
    result = CliRunner().invoke(app, ["--storage-option", "bogus=1", "runs", "s3://bucket/runs"])
    assert result.exit_code == 2 and "unknown storage option 'bogus'" in result.output
