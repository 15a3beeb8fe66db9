"""A test's own S3-compatible server (SeaweedFS's ``weed``), for tests that stop and start it: the shared session
server (``tests/conftest.py``'s ``s3_server``) must stay up for the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from sorl_monitor.local_s3 import S3Server, SeaweedUnavailable, start_server


def own_server(folder: Path, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """A server with its data in ``folder / "weed"``, its credentials in the environment and a local cache in
    ``folder / "cache"`` for this test; skips, with the reason, where the binary cannot run. The caller stops it."""
    try:
        server = start_server(folder / "weed")
    except SeaweedUnavailable as reason:
        pytest.skip(str(reason))
    for key, value in server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SORL_CACHE_DIR", str(folder / "cache"))
    return server
