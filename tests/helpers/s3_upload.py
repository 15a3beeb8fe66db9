"""Put a run of ``sample_logs/`` into the tests' S3 server."""

from __future__ import annotations

import pyarrow.fs as pafs

from tests.helpers.paths import SAMPLE_LOGS


def upload_sample_run(name: str, uri: str, filesystem: pafs.FileSystem) -> str:
    """Copy ``sample_logs/<name>`` to ``uri`` (``s3://bucket/prefix``) through ``filesystem``; returns ``uri``."""
    pafs.copy_files(
        str(SAMPLE_LOGS / name),
        uri.removeprefix("s3://"),
        source_filesystem=pafs.LocalFileSystem(),
        destination_filesystem=filesystem,
    )
    return uri
