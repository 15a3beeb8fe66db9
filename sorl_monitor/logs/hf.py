"""Hugging Face ``Trainer`` / TRL logs: ``trainer_state.json``, a bare ``log_history`` list, an output folder.

``Trainer`` appends every ``log()`` call to ``state.log_history`` (a list of dicts with ``step`` and
``epoch``) and saves it in ``trainer_state.json`` with each checkpoint (``checkpoint-N/``) and at
``save_state()``. Training rows are kept; evaluation rows (``eval_*`` keys) and the end-of-training summary
row (``train_runtime``, ``train_loss``, …) are not updates and are left out.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sorl_monitor.logs.input_limits import json_loads
from sorl_monitor.logs.segments import segmented_runs
from sorl_monitor.logs.table import (
    NO_STEPS,
    ForeignRun,
    LogFormatError,
    foreign_run,
    json_config,
    records_table,
    run_name,
)

STATE_FILE = "trainer_state.json"
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
SUMMARY_KEYS = frozenset(
    {"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss"}
)
"""Keys of the row ``Trainer`` logs once at the end of training (``train_loss`` is the whole run's mean)."""
EVAL_PREFIX = "eval_"


def state_file(folder: Path) -> Path | None:
    """The newest ``trainer_state.json`` of an output folder: its own (when at least as new as the newest
    checkpoint's) or the one of the highest-numbered ``checkpoint-N``; ``None`` if it has neither."""
    checkpoints = sorted(
        (int(match.group(1)), child / STATE_FILE)
        for child in folder.iterdir()
        if (match := CHECKPOINT.match(child.name)) and (child / STATE_FILE).is_file()
    )
    own = folder / STATE_FILE
    if not own.is_file():
        return checkpoints[-1][1] if checkpoints else None
    if checkpoints and checkpoints[-1][1].stat().st_mtime > own.stat().st_mtime:
        return checkpoints[-1][1]
    return own


def is_training_row(row: Any) -> bool:
    """A ``log_history`` entry that is one logged training step (not an evaluation or the summary)."""
    return (
        isinstance(row, dict)
        and isinstance(row.get("step"), int)
        and not isinstance(row.get("step"), bool)
        and not SUMMARY_KEYS & row.keys()
        and not any(str(key).startswith(EVAL_PREFIX) for key in row)
    )


def read(path: Path, name: str) -> list[ForeignRun]:
    """The run in an output folder, a ``trainer_state.json`` or a JSON list that is a ``log_history``."""
    file = state_file(path) if path.is_dir() else path
    if file is None:
        raise LogFormatError(f"{path} holds no {STATE_FILE} (nor checkpoint-*/{STATE_FILE})")
    try:
        document = json_loads(file.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise LogFormatError(f"cannot read {file} as JSON: {error}") from None
    state = document if isinstance(document, dict) else {}
    history = state.get("log_history") if isinstance(document, dict) else document
    if not isinstance(history, list):
        raise LogFormatError(f"{file} is neither a trainer_state.json nor a log_history list")
    rows = [row for row in history if is_training_row(row)]
    config = json_config(
        {k: v for k, v in state.items() if k != "log_history" and not isinstance(v, list | dict)}
    )
    info = {"config": config} if config else None
    if not rows:
        return [foreign_run(path, "hf", name, NO_STEPS, info=info)]
    return segmented_runs(path, "hf", name, records_table(rows), "step", info=info, unit="log_history entry")


def default_name(path: Path) -> str:
    """A run name for ``path``: the output folder's name for a ``trainer_state.json`` (or a checkpoint
    folder), else the file name without ``.json``."""
    if path.is_dir() or path.name == STATE_FILE:
        folder = path.resolve() if path.is_dir() else path.resolve().parent
        return run_name(folder.parent.name if CHECKPOINT.match(folder.name) else folder.name)
    return run_name(path.name.removesuffix(".json"))
