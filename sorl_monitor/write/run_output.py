"""Where a run's rows go: ``<log_dir>/<run_id>/`` on this machine, or staged there and copied up to object storage
by a thread of its own (``uploader``); and the rank's ``ParquetStreamWriter``, refused when another writer holds
the run and rank (its lock file, or the store's lease)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from sorl_monitor.storage import StorageError, is_remote
from sorl_monitor.write.uploader import RunUploader, staging_dir
from sorl_monitor.write.writer import ParquetStreamWriter, WriterConfig


def staged_upload(
    log_dir: str | os.PathLike[str],
    run_id: str,
    rank: int,
    writer: WriterConfig,
    report: Callable[..., None],
) -> RunUploader | None:
    """For a ``log_dir`` in object storage, the uploader of this rank's run (its parts are staged locally, in
    ``uploader.staging``); ``None`` for a local folder. ``ValueError`` for a URI or option that cannot work."""
    if not is_remote(log_dir):
        return None
    try:
        return RunUploader(
            os.fspath(log_dir),
            run_id,
            rank,
            staging_dir(os.fspath(log_dir), rank) / run_id,
            interval_s=writer.flush_interval_s,
            storage_options=writer.storage_options,
            report=report,
        )
    except StorageError as error:  # a bad setting, said in one line
        raise ValueError(str(error)) from None


def open_writer(
    run_dir: Path, rank: int, writer: WriterConfig, uploader: RunUploader | None
) -> ParquetStreamWriter:
    """The rank's writer of ``run_dir``, started with the uploader (whose lease may refuse it)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    remote_refused = "" if uploader is None else uploader.start()
    return ParquetStreamWriter(
        run_dir,
        rank,
        flush_interval_s=writer.flush_interval_s,
        flush_rows=writer.flush_rows,
        max_pending_rows=writer.max_pending_rows,
        compact_parts=writer.compact_parts,
        refused=remote_refused,
    )


def close_upload(
    uploader: RunUploader,
    run_dir: Path,
    writer_refused: bool,
    timeout_s: float,
    warn_once: Callable[..., None],
) -> None:
    """Upload what is left; say where the rows are if some stay behind (by URI and staging folder)."""
    uploader.close(timeout_s=timeout_s)
    stats = uploader.stats
    if stats.refused and not writer_refused:
        warn_once(
            "upload",
            f"sorl-monitor did not upload {uploader.uri}: {stats.refused}; this writer's {stats.pending} "
            f"files are kept apart in {run_dir}",
            3,
        )
    elif stats.pending and not stats.refused:
        warn_once(
            "upload",
            f"sorl-monitor could not upload {stats.pending} files to {uploader.uri} ({stats.last_error}); "
            f"they are kept in {run_dir}",
            3,
        )
