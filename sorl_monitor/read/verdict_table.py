"""The fleet's verdict table: its columns, its order, and reading and writing it (``sorl fleet``).

Kept apart from ``fleet`` (which judges runs) so the query layer can show the table as the ``verdicts``
view without importing the post-mortem.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sorl_monitor.storage import StorageError, filesystem, is_remote, one_line

VERDICTS_FILE = "verdicts.parquet"
"""The fleet's verdict table, written at the root it judged."""

VERDICT_COLUMNS = pa.schema(
    [
        pa.field("run_id", pa.string()),
        pa.field("path", pa.string()),
        pa.field("algorithm", pa.string()),
        pa.field("status", pa.string()),
        pa.field("collapse_step", pa.int64()),
        pa.field("first_critical", pa.int64()),
        pa.field("lead_time", pa.int64()),
        pa.field("root_cause", pa.string()),
        pa.field("families_rising", pa.string()),
        pa.field("last_step", pa.int64()),
        pa.field("updates", pa.int64()),
        pa.field("error", pa.string()),
        pa.field("source_mtime", pa.float64()),
        pa.field("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)
"""One row per run: its verdict, or ``status = 'error'`` with the reason."""
KEY_COLUMNS = ("run_id", "path", "status")
"""The columns a table must have to be read as a verdict table (the run list needs these)."""

STATUS_ORDER = ("error", "collapsing", "diverging", "collapsed", "not_judged", "healthy")
"""Most urgent first: the order ``sorted_verdicts`` puts runs in (unknown statuses after these)."""


def verdict_table(rows: Iterable[dict[str, Any]]) -> pa.Table:
    """Rows as a ``VERDICT_COLUMNS`` table (missing columns null)."""
    rows = list(rows)
    return pa.Table.from_pylist(
        [{name: row.get(name) for name in VERDICT_COLUMNS.names} for row in rows], schema=VERDICT_COLUMNS
    )


def sorted_verdicts(table: pa.Table) -> pa.Table:
    """Most urgent status first (``STATUS_ORDER``), then run id."""
    order = {status: i for i, status in enumerate(STATUS_ORDER)}
    rows = sorted(table.to_pylist(), key=lambda r: (order.get(r["status"], len(order)), r["run_id"] or ""))
    return verdict_table(rows)


def verdicts_file(root: str | os.PathLike[str]) -> str:
    """Where ``sorl fleet`` writes the table of ``root`` unless told: ``root/verdicts.parquet`` (a URI stays
    a URI)."""
    text = os.fspath(root)
    return f"{text.rstrip('/')}/{VERDICTS_FILE}" if is_remote(text) else str(Path(text) / VERDICTS_FILE)


def check_table_path(path: str | os.PathLike[str]) -> Path:
    """The file a local verdict table is written to or read from (a link followed), or ``ValueError`` where
    ``path`` is there and not a regular file (a folder, a device, a FIFO: never replaced, never opened)."""
    target = Path(path).resolve() if Path(path).is_symlink() else Path(path)
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return target
    except OSError as error:
        raise ValueError(f"cannot use {os.fspath(path)}: {error.strerror}") from None
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise ValueError(f"{os.fspath(path)} is {kind}; the verdict table is a file (give --out FILE)")
    return target


def write_verdicts(table: pa.Table, path: str | os.PathLike[str]) -> str:
    """Write the table to ``path`` all or nothing: a new temporary file beside it, then ``os.replace``, only
    ever over a regular file (``check_table_path``; ``ValueError`` otherwise, and when the disk fails); in
    object storage (``s3://…``) one PUT, which readers see whole or not at all (``StorageError`` if the store
    fails)."""
    if not is_remote(path):
        target = check_table_path(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as sink:
                pq.write_table(table, sink)
            check_table_path(target)  # still not a folder, device or FIFO
            os.replace(tmp, target)
        except OSError as error:
            raise ValueError(f"cannot write {os.fspath(path)}: {error.strerror or error}") from None
        finally:
            Path(tmp).unlink(missing_ok=True)
        return str(target)
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer)
    fs, inner = filesystem(os.fspath(path))
    try:
        with fs.open_output_stream(inner) as sink:
            sink.write(buffer.getvalue())
    except OSError as error:
        raise StorageError(f"{os.fspath(path)}: {one_line(error)}") from None
    return os.fspath(path)


def verdicts_stamp(path: str | os.PathLike[str]) -> tuple[float, int] | None:
    """The modification time and size of the table at ``path`` (a file, or a folder or prefix holding
    ``VERDICTS_FILE``; one HEAD or two in object storage), or ``None`` if there is none."""
    try:
        fs, inner = _located(path)
        info = fs.get_file_info(inner)
    except (OSError, StorageError):
        return None
    if info.type != pafs.FileType.File:
        return None
    return (info.mtime.timestamp() if info.mtime is not None else 0.0, info.size or 0)


def load_verdicts(path: str | os.PathLike[str]) -> pa.Table:
    """The verdict table at ``path`` (as ``verdicts_stamp`` finds it), or ``ValueError`` saying in one line
    why not (missing, not a regular file, not Parquet, not the columns ``sorl fleet`` writes, or one of them
    of another type: ``column_problem``)."""
    try:
        fs, inner = _located(path)
        if not is_remote(path):
            check_table_path(inner)  # a FIFO or a device is never opened
        with fs.open_input_file(inner) as source:
            table = pq.read_table(source)
    except (FileNotFoundError, IsADirectoryError):
        raise ValueError(f"no verdict table at {os.fspath(path)} (sorl fleet writes one)") from None
    except (OSError, pa.ArrowInvalid, StorageError) as error:
        raise ValueError(f"not a verdict table: {os.fspath(path)} ({one_line(error)})") from None
    if missing := [name for name in KEY_COLUMNS if name not in table.column_names]:
        raise ValueError(
            f"not a verdict table: {os.fspath(path)} (no column {missing[0]!r}; sorl fleet writes one)"
        )
    if problem := column_problem(table.schema):
        raise ValueError(f"not a verdict table: {os.fspath(path)} ({problem}; sorl fleet writes one)")
    return table


def column_problem(schema: pa.Schema) -> str | None:
    """What makes a table's columns not ``VERDICT_COLUMNS``' kinds (``status`` as integers, ``collapse_step``
    as text), said for the first such column; ``None`` if each column it shares with them is of their kind
    (text, whole numbers, numbers, times; a column of nulls only fits any)."""
    for field in VERDICT_COLUMNS:
        index = schema.get_field_index(field.name)
        if index < 0:
            continue
        found = schema.field(index).type
        if pa.types.is_null(found) or _KINDS[_kind(field.type)](found):
            continue
        return f"column {field.name!r} is {found}, not {_kind(field.type)}"
    return None


_KINDS = {
    "text": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
    "whole numbers": pa.types.is_integer,
    "numbers": lambda t: pa.types.is_integer(t) or pa.types.is_floating(t),
    "times": pa.types.is_timestamp,
}


def _kind(expected: pa.DataType) -> str:
    if pa.types.is_string(expected):
        return "text"
    if pa.types.is_integer(expected):
        return "whole numbers"
    return "numbers" if pa.types.is_floating(expected) else "times"


def read_verdicts(path: str | os.PathLike[str]) -> pa.Table | None:
    """The verdict table at ``path`` (a file, or a folder or object-store prefix holding ``VERDICTS_FILE``),
    or ``None`` where there is none or it does not read."""
    try:
        return load_verdicts(path)
    except ValueError:
        return None


def _located(path: str | os.PathLike[str]) -> tuple[pafs.FileSystem, str]:
    """The filesystem and inner path of the table file at ``path`` (``VERDICTS_FILE`` inside a folder)."""
    if not is_remote(path):
        local = Path(path)
        return pafs.LocalFileSystem(), str(local / VERDICTS_FILE if local.is_dir() else local)
    fs, inner = filesystem(os.fspath(path))
    try:
        if fs.get_file_info(inner).type == pafs.FileType.Directory:
            inner = f"{inner}/{VERDICTS_FILE}"
    except OSError as error:
        raise StorageError(f"{os.fspath(path)}: {str(error).splitlines()[0]}") from None
    return fs, inner
