"""What is said about runs in object storage names them by their URI, never by this machine's cache of
them. A real S3 server (SeaweedFS on 127.0.0.1); the run is the bundled trainer's ``sample_logs/token-ppo``."""

from __future__ import annotations

import warnings

import pyarrow.fs as pafs

from sorl_monitor.read.query import CorruptPartWarning, open_runs
from sorl_monitor.storage import cache_root
from tests.helpers.s3_upload import upload_sample_run


def test_a_damaged_part_and_run_json_in_s3_are_named_by_their_uri(s3_server, s3_root):
    fs = s3_server.filesystem()
    run = upload_sample_run("token-ppo", f"{s3_root}/token-ppo", fs)
    listed = fs.get_file_info(pafs.FileSelector(f"{run.removeprefix('s3://')}/turns", recursive=True))
    part = next(info.path for info in listed if info.path.endswith(".parquet"))
    with fs.open_output_stream(part) as f:
        f.write(b"PAR1 not a part PAR1")
    with fs.open_output_stream(f"{run.removeprefix('s3://')}/run.json") as f:
        f.write(b'{"status": 5}')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with open_runs(s3_root) as runs:
            runs.sql("SELECT count(*) FROM turns")
            runs.sql("SELECT * FROM runs")
    said = [str(w.message) for w in caught if issubclass(w.category, CorruptPartWarning)]
    assert any(f"s3://{part}" in m for m in said), said
    assert any(f"{run}/run.json: status is 5" in m for m in said), said
    assert not any(str(cache_root()) in m for m in said), (
        said
    )  # guards against naming the local cache instead of the URI
