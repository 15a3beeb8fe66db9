"""Read the logs other tools write, as runs: Hugging Face/TRL, TensorBoard, W&B, MLflow, JSON lines, CSV, verl.

    runs = read_log("outputs/checkpoint-500/trainer_state.json")   # → [ForeignRun]
    detect_format("logs/events.out.tfevents.1700000000.host")      # → "tensorboard"

Each reader keeps one row per logged training step, with metric names mapped to ``steps`` columns by
``metric_names.map_metrics`` (unknown names kept, snake-cased). Nothing is written anywhere: the
query layer (``query.RunSet``) holds these runs in memory next to Parquet runs. docs/logs.md has what
each reader reads and leaves out.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sorl_monitor.logs import (
    csvlog,
    hf,
    hf_console,
    json_steps,
    jsonl,
    kv_console,
    mlflow,
    tensorboard,
    verl,
    verl_console,
    wandb,
)
from sorl_monitor.logs.formats import detect_file, detect_folder, is_run_dir
from sorl_monitor.logs.judged import JUDGED, judge
from sorl_monitor.logs.options import LogOptions, apply_names, source_column
from sorl_monitor.logs.signal_names import infer_signals
from sorl_monitor.logs.table import ForeignRun, LogFormatError, LogWarning, run_name, unique_ids
from sorl_monitor.metric_names import OLDER_NAMES

FORMATS = (
    "sorl",
    "hf",
    "tensorboard",
    "wandb",
    "mlflow",
    "jsonl",
    "csv",
    "verl",
    "verl-console",
    "hf-console",
    "console",
    "json",
)
"""Format names, as ``--format`` takes them (``sorl``: this project's own Parquet runs)."""
FOREIGN_FORMATS = FORMATS[1:]
SEARCH_DEPTH = 4
"""How many folder levels below a given folder are searched for logs (TensorBoard run folders nest)."""

READERS: dict[str, Callable[[Path, str], list[ForeignRun]]] = {
    "hf": hf.read,
    "tensorboard": tensorboard.read,
    "wandb": wandb.read,
    "mlflow": mlflow.read,
    "jsonl": jsonl.read,
    "csv": csvlog.read,
    "verl": verl.read,
    "verl-console": verl_console.read,
    "hf-console": hf_console.read,
    "console": kv_console.read,
    "json": json_steps.read,
}

__all__ = [
    "FORMATS",
    "ForeignRun",
    "LogFormatError",
    "LogOptions",
    "LogSource",
    "LogWarning",
    "detect_format",
    "find_logs",
    "fingerprint",
    "is_run_dir",
    "read_log",
    "read_source",
]


@dataclass(frozen=True)
class LogSource:
    """One log to read: a file or a folder, its format, and the run name it gets (when the log names none)."""

    path: Path
    format: str
    name: str


def check_format(fmt: str | None) -> str | None:
    """``fmt`` if it is a known format name (or ``None``); ``LogFormatError`` otherwise."""
    if fmt is not None and fmt not in FORMATS:
        raise LogFormatError(f"unknown format {fmt!r}; known formats: {', '.join(FORMATS)}")
    return fmt


def detect_format(path: str | os.PathLike[str]) -> str | None:
    """The format of the log at ``path`` (one of ``FORMATS``), or ``None`` if it is none of them."""
    path = Path(path)
    if path.is_dir():
        return detect_folder(path)
    return detect_file(path) if path.is_file() else None


def unknown(path: Path) -> LogFormatError:
    return LogFormatError(
        f"{path}: not a directory of runs, nor a log in a format I know "
        f"({', '.join(FORMATS)}); give --format to force one"
    )


def find_logs(path: str | os.PathLike[str], fmt: str | None = None) -> list[LogSource]:
    """The foreign logs at ``path``: a file (``LogFormatError`` if its format is unknown), a folder that is
    one log, or the logs in a folder's files and sub-folders (``SEARCH_DEPTH`` levels; Parquet runs and
    hidden entries skipped). ``fmt`` forces the format of a file, and keeps only logs of that format in a
    folder."""
    given = Path(path)
    path = given.resolve()
    check_format(fmt)
    if fmt == "sorl":
        return []
    if path.is_file():
        found = fmt or detect_file(path)
        if found is None:
            raise unknown(given)
        return [LogSource(path, found, _name(path, found))]
    return _folder_logs(path, fmt, path, SEARCH_DEPTH)


def _folder_logs(folder: Path, fmt: str | None, root: Path, depth: int) -> list[LogSource]:
    own = detect_folder(folder)
    if own == "sorl" and is_run_dir(folder):
        return []
    found = []
    is_log = own not in (None, "sorl") and fmt in (None, own)
    if is_log:
        found.append(LogSource(folder, own, _name(folder, own, root)))
        if own != "tensorboard":  # TensorBoard: each folder with event files is a run, its sub-folders too
            return found
    for child in sorted(folder.iterdir()):
        if child.name.startswith(".") or _links_inside(child, root):
            continue
        if child.is_file() and not is_log:
            kind = detect_file(child)
            if kind is not None and fmt in (None, kind):
                found.append(LogSource(child, kind, _name(child, kind)))
        elif child.is_dir() and depth > 0:
            found.extend(_folder_logs(child, fmt, root, depth - 1))
    return found


def _links_inside(child: Path, root: Path) -> bool:
    """Whether ``child`` is a symbolic link to a file or folder under ``root`` (the walk finds that one itself:
    ``latest -> run-1`` would list the run twice, a link back to a parent once per level)."""
    if not child.is_symlink():
        return False
    try:
        return child.resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # a link loop that does not resolve
        return True


def _name(path: Path, fmt: str, root: Path | None = None) -> str:
    """The run name of a log the log itself does not name: a folder's path below ``root`` (``ppo-train``
    for ``root/ppo/train``), an event file's folder, a ``trainer_state.json``'s output folder, a file's stem."""
    if fmt == "hf":
        return hf.default_name(path)
    if path.is_dir():
        relative = path.relative_to(root) if root is not None else Path()
        return run_name("-".join(relative.parts) or path.name)
    if fmt == "tensorboard":
        return run_name(path.parent.name)
    return run_name(path.stem)


def read_source(source: LogSource, options: LogOptions | None = None) -> list[ForeignRun]:
    """The runs of one log, columns filled from a family's older names (``metric_names.OLDER_NAMES``) and then from
    ``options.names``; ``LogFormatError`` (one line) when it cannot be read as its format."""
    options = options or LogOptions()
    try:
        if source.format == "hf-console":
            runs = hf_console.read(source.path, source.name, logging_steps=options.logging_steps)
        else:
            runs = READERS[source.format](source.path, source.name)
    except LogFormatError:
        raise
    except (OSError, ValueError, KeyError) as error:
        raise LogFormatError(f"cannot read {source.path} as {source.format}: {error}") from None
    mapped_reward = dict(options.names).get(JUDGED)
    for run in runs:
        older = OLDER_NAMES.get(run.family or "", {})
        present = set(run.steps.column_names)
        try:
            apply_names(run, [(column, name) for name, column in older.items() if column not in present])
            found = apply_names(run, options.names)
        except ValueError as error:
            raise LogFormatError(f"{source.path}: {error}") from None
        infer_signals(run)
        judge(run, mapped_reward if mapped_reward in found else None)
    return runs


def check_names_found(runs: list[ForeignRun], options: LogOptions | None) -> None:
    """``LogFormatError`` naming a ``--map`` name that none of ``runs`` logged (a typo, most likely)."""
    for target, name in (options or LogOptions()).names:
        if runs and not any(source_column(run, name) is not None for run in runs):
            raise LogFormatError(f"--map {target}={name}: no log read here has a metric named {name!r}")


def read_log(
    path: str | os.PathLike[str], fmt: str | None = None, options: LogOptions | None = None
) -> list[ForeignRun]:
    """Every run in the log(s) at ``path`` (see ``find_logs``), with unique run ids; ``options``: what the
    user told the readers (``logs.options``)."""
    sources = find_logs(path, fmt)
    if not sources:
        raise unknown(Path(path))
    runs = [run for source in sources for run in read_source(source, options)]
    check_names_found(runs, options)
    unique_ids(runs)
    return runs


def fingerprint(source: LogSource) -> tuple[tuple[str, int, int], ...]:
    """Size and modification time of every file under the log: it changed when this changed."""
    files = (
        [source.path] if source.path.is_file() else sorted(p for p in source.path.rglob("*") if p.is_file())
    )
    stamps = []
    for file in files:
        try:
            stat = file.stat()
        except OSError:
            continue
        stamps.append((str(file), stat.st_size, stat.st_mtime_ns))
    return tuple(stamps)
