"""A real S3-compatible server for the object-storage tests (``sorl_monitor.local_s3``: SeaweedFS's ``weed``).

Started once per test session on 127.0.0.1 with a fresh data folder and one identity; the tests that stop
and restart a server start their own. Skips, with the reason, only where the binary cannot run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sorl_monitor.local_s3 import S3Server, SeaweedUnavailable, start_server


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
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
