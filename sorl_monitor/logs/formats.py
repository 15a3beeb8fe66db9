"""Which format a file or folder is, told by its content (names only where the format is a naming scheme).

Files, in this order:
- ``tensorboard``: ``tfevents`` in the name (TensorBoard's own rule), or a valid TFRecord header;
- ``wandb``: a ``.wandb`` file; a CSV whose header is a W&B UI export or a ``run.history()`` dump
  (``_step`` with ``_runtime``/``_timestamp``); JSON or JSON lines whose first row has those columns;
- ``hf``: a JSON object with ``log_history``, or a JSON list whose first element is a dict with ``step``;
- ``verl``: JSON lines whose first line is ``{"step": N, "data": {...}}``;
- ``jsonl``: JSON lines whose first object has a step column (``table.STEP_COLUMNS``);
- ``json``: a JSON object holding a list of records with a step column (``json_steps``);
- ``csv``: a CSV whose header has a step column;
- ``jsonl`` again: JSON lines of row kinds whose first row has no step (a ``config`` row) but a later one does;
- ``verl-console``: a text file with a line of verl's console metrics (``step:N - name:value - …``) in its
  first MiB;
- ``hf-console``: a text file with a line that is a printed ``Trainer`` log dict (``{'loss': …, 'epoch': …}``,
  alone on its line or after a ``(pid=…)`` prefix) in its first MiB;
- ``console``: a ``.log``/``.txt``/``.out`` file (or one without a suffix) with at least three counted steps
  (``step 5``, ``Iteration: 12``, ``(40/500)``) holding ``name: number`` pairs in its first MiB (``kv_console``).

Folders: ``sorl`` (a run folder with ``run.json`` or ``<table>/rank=R``, or a folder of them), ``hf`` (an
output folder with ``trainer_state.json`` or ``checkpoint-*/trainer_state.json``), ``mlflow`` (a store,
experiment or run), ``wandb`` (an offline run, or a ``wandb/`` folder of them), ``tensorboard`` (event
files directly inside).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from sorl_monitor.logs import (
    hf,
    hf_console,
    json_steps,
    kv_console,
    mlflow,
    row_kinds,
    tensorboard,
    verl_console,
    wandb,
)
from sorl_monitor.logs.file_head import (
    HEAD_BYTES,
    csv_header,
    first_json_line,
    first_list_item,
    head,
    text_kind,
)
from sorl_monitor.logs.input_limits import json_loads
from sorl_monitor.logs.table import step_column
from sorl_monitor.schema import RUN_FILE, TABLES

LONG_HEAD_BYTES = 1 << 20
"""How much of a file is read to find its first line when that line is longer than ``file_head.HEAD_BYTES``."""


def is_run_dir(path: Path) -> bool:
    """A run is a folder with ``run.json`` or a table folder holding ``rank=R`` partitions.

    (Not just a table folder: a log folder holding a run named ``steps`` or ``turns`` is not a run.)
    """
    return (path / RUN_FILE).is_file() or any(
        any((path / t).glob("rank=*")) for t in TABLES if (path / t).is_dir()
    )


def detect_folder(path: Path) -> str | None:
    """The format of a folder that is one log (or a folder of ``sorl`` runs); ``None`` otherwise."""
    if is_run_dir(path) or any(c.is_dir() and is_run_dir(c) for c in path.iterdir()):
        return "sorl"
    if hf.state_file(path) is not None:
        return "hf"
    if mlflow.run_folders(path):
        return "mlflow"
    if wandb.offline_files(path):
        return "wandb"
    if tensorboard.event_files(path):
        return "tensorboard"
    return None


def detect_file(path: Path) -> str | None:
    """The format of a log file, or ``None``: a structured format first, then a captured console."""
    found = _structured_file_format(path)
    if found is not None:
        return found
    if row_kinds.looks_like(head(path)):
        return "jsonl"
    if verl_console.looks_like(path):
        return "verl-console"
    if hf_console.looks_like(path):
        return "hf-console"
    if kv_console.looks_like(path):
        return "console"
    return None


def _structured_file_format(path: Path) -> str | None:
    if tensorboard.MARKER in path.name or _tfrecord_header(path):
        return "tensorboard"
    if path.suffix == wandb.OFFLINE_SUFFIX:
        return "wandb"
    if path.name == hf.STATE_FILE:  # by its name, even on one line (else a one-row JSON-lines log)
        return "hf"
    start = head(path)
    if len(start) == HEAD_BYTES and b"\n" not in start and start.lstrip().startswith(b"{"):
        start = head(path, LONG_HEAD_BYTES)  # a first line longer than the head: W&B rows with many columns
    kind = text_kind(start)
    if kind == "csv":
        header = csv_header(start)
        if wandb.is_ui_export(header) or wandb.is_history(header):
            return "wandb"
        return "csv" if step_column(header) and len(header) > 1 else None
    if kind == "jsonl":
        return _json_row_format(first_json_line(start))
    if kind == "json":
        return _json_document_format(path, start)
    return None


def _json_row_format(row: object) -> str | None:
    if not isinstance(row, dict):
        return None
    if "log_history" in row:
        return "hf"
    if isinstance(row.get("data"), dict) and isinstance(row.get("step"), int):
        return "verl"
    if wandb.is_history(row.keys()):
        return "wandb"
    return "jsonl" if step_column(row) else None


def _json_document_format(path: Path, start: bytes) -> str | None:
    """A JSON document: a ``log_history`` list, a ``trainer_state.json``, a W&B history in either layout."""
    if start.lstrip().startswith(b"["):
        first = first_list_item(start)
        if isinstance(first, dict) and wandb.is_history(first.keys()):
            return "wandb"
        return "hf" if isinstance(first, dict) and "step" in first else None
    if b'"log_history"' in start:
        return "hf"
    try:
        document = json_loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(document, dict):
        if "log_history" in document:
            return "hf"
        if json_steps.step_records(document) is not None:
            return "json"
        if wandb.is_history(document.keys()) and all(isinstance(v, dict) for v in document.values()):
            return "wandb"
    return None


def _tfrecord_header(path: Path) -> bool:
    """Whether the file starts with a TFRecord header (length and its masked CRC32C), checked when the
    tensorboard package is there to compute the CRC."""
    start = head(path, 12)
    if len(start) < 12:
        return False
    try:
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    except ImportError:
        return False
    return masked_crc32c(start[:8]) == struct.unpack("<I", start[8:12])[0]
