"""Weights & Biases logs: the CSV the W&B UI exports, ``run.history()`` dumps, offline run folders.

- UI export (a chart's "Export CSV"): a ``Step`` column, then ``<run name> - <metric>`` columns, each with
  ``__MIN``/``__MAX`` companions (the band of a smoothed or bucketed line: dropped). One file may hold
  several runs: one run per name.
- ``run.history()`` (a pandas DataFrame) saved with ``to_csv``, ``to_json`` (``orient="records"`` or the
  default ``"columns"``) or ``to_json(orient="records", lines=True)``: columns ``_step``, ``_runtime``,
  ``_timestamp`` and the logged keys (``train/loss``). The step is ``train/global_step`` or another
  ``table.STEP_COLUMNS`` name when logged, else ``_step``; ``_timestamp`` is the wall time.
- Offline runs (``wandb/offline-run-*/run-*.wandb``): read with the ``wandb`` package's own record reader,
  without network, when it is installed; otherwise a one-line error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from sorl_monitor.logs import csvlog, jsonl
from sorl_monitor.logs.file_head import csv_header, first_json_line, head, text_kind
from sorl_monitor.logs.input_limits import json_loads
from sorl_monitor.logs.segments import wide_run
from sorl_monitor.logs.table import (
    ForeignRun,
    LogFormatError,
    foreign_run,
    one_row_per_step,
    records_table,
    run_name,
)

EXPORT_STEP = "Step"
SEPARATOR = " - "
BAND_SUFFIXES = ("__MIN", "__MAX")
OFFLINE_SUFFIX = ".wandb"
INSTALL_HINT = (
    "reading a W&B offline run needs the wandb package (pip install wandb); "
    "or export the run's history as CSV from the W&B UI"
)


def is_ui_export(header: list[str]) -> bool:
    """A header the W&B UI writes: ``Step`` first, metric columns named ``<run> - <metric>``."""
    return bool(header) and header[0] == EXPORT_STEP and any(SEPARATOR in name for name in header[1:])


def is_history(names: list[str] | set[str]) -> bool:
    """Columns of a ``run.history()`` dump (W&B's own ``_step`` with ``_runtime`` or ``_timestamp``)."""
    return "_step" in names and bool({"_runtime", "_timestamp"} & set(names))


def is_columns_layout(document: object) -> bool:
    """``DataFrame.to_json()``'s default layout: ``{column: {row index: value}}``."""
    return (
        isinstance(document, dict) and bool(document) and all(isinstance(v, dict) for v in document.values())
    )


def offline_files(folder: Path) -> list[Path]:
    """The ``.wandb`` record files of an offline run folder, or of the offline runs in a ``wandb/`` folder."""
    own = sorted(folder.glob(f"*{OFFLINE_SUFFIX}"))
    return own or sorted(folder.glob(f"*run-*/*{OFFLINE_SUFFIX}"))


def read(path: Path, name: str) -> list[ForeignRun]:
    """The runs of a W&B export, history dump or offline run (folder or ``.wandb`` file)."""
    if path.is_dir():
        return [run for file in offline_files(path) for run in _offline(file, _offline_name(file))]
    if path.suffix == OFFLINE_SUFFIX:
        return _offline(path, name)
    start = head(path)
    kind = text_kind(start)
    if kind == "jsonl" and is_columns_layout(first_json_line(start)):
        kind = "json"  # a one-line ``to_json()`` document
    if kind == "csv":
        if is_ui_export(csv_header(start)):
            return _ui_export(path, csvlog.read_table(path))
        return csvlog.read(path, name, "wandb")
    if kind == "jsonl":
        return jsonl.read(path, name, "wandb")
    if kind == "json":
        return wide_run(path, "wandb", name, _json_history(path))
    raise LogFormatError(f"{path} is not a W&B CSV export, history dump or offline run")


def _ui_export(path: Path, table: pa.Table) -> list[ForeignRun]:
    """One run per ``<run name>`` prefix of the export's columns."""
    by_run: dict[str, list[str]] = {}
    for column in table.column_names[1:]:
        if column.endswith(BAND_SUFFIXES) or SEPARATOR not in column:
            continue
        run, _, metric = column.rpartition(SEPARATOR)
        by_run.setdefault(run, []).append(metric)
    runs = []
    for run, metrics in by_run.items():
        wide = table.select([EXPORT_STEP, *(f"{run}{SEPARATOR}{m}" for m in metrics)])
        wide = wide.rename_columns([EXPORT_STEP, *metrics])
        wide = wide.filter(_any_valid(wide, metrics))
        runs.append(foreign_run(path, "wandb", run_name(run), one_row_per_step(wide, EXPORT_STEP)))
    return runs


def _any_valid(table: pa.Table, columns: list[str]) -> pa.ChunkedArray:
    """Rows with a value in at least one of ``columns`` (a run's rows of a multi-run export)."""
    mask = pc.is_valid(table.column(columns[0]))
    for column in columns[1:]:
        mask = pc.or_(mask, pc.is_valid(table.column(column)))
    return mask


def _json_history(path: Path) -> pa.Table:
    """A history saved with ``to_json``: a list of row objects, or ``{column: {row index: value}}``."""
    try:
        document = json_loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise LogFormatError(f"cannot read {path} as JSON: {error}") from None
    if is_columns_layout(document):
        index = list(dict.fromkeys(i for column in document.values() for i in column))
        document = [{name: column.get(i) for name, column in document.items()} for i in index]
    if not isinstance(document, list) or not all(isinstance(row, dict) for row in document):
        raise LogFormatError(f"{path} is not a W&B history dump (a list of rows or a dict of columns)")
    return records_table(document)


def _offline_name(file: Path) -> str:
    """``offline-run-20240101_120000-abc123/run-abc123.wandb`` → ``abc123`` (the run id W&B gave it)."""
    return run_name(file.stem.removeprefix("run-"))


def _offline(file: Path, name: str) -> list[ForeignRun]:
    """The history rows of one ``.wandb`` record file, read with wandb's own reader."""
    try:
        from wandb.proto import wandb_internal_pb2
        from wandb.sdk.internal import datastore
    except ImportError:
        raise LogFormatError(INSTALL_HINT) from None
    store = datastore.DataStore()
    try:
        store.open_for_scan(str(file))
    except AssertionError as error:
        raise LogFormatError(f"{file} is not a W&B run file ({error})") from None
    rows = []
    while True:
        try:
            data = store.scan_data()
        except AssertionError:
            if store.in_last_block():
                break  # the run is still being written
            raise LogFormatError(f"{file} is corrupt") from None
        if data is None:
            break
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") != "history":
            continue
        row = {}
        for item in record.history.item:
            key = item.key or "/".join(item.nested_key)
            value = json_loads(item.value_json)
            if isinstance(value, bool | int | float | str):
                row[key] = value
        rows.append(row)
    return wide_run(file, "wandb", name, records_table(rows))
