"""MLflow's file store, read as files (no mlflow import): ``mlruns/``, one experiment, or one run.

Layout (``mlflow.store.tracking.file_store``): ``mlruns/<experiment id>/meta.yaml`` and one folder per
run, ``<run id>/meta.yaml``, ``metrics/<key>`` (a key with ``/`` is a sub-folder), ``params/<name>`` and
``tags/<name>`` (the run's name in ``tags/mlflow.runName``). A metric file holds one ``timestamp value
step`` line per point (timestamp in milliseconds; files of MLflow before 1.0 have no step: step 0).
Runs in the trash (``lifecycle_stage: deleted``, or under ``.trash``) are left out.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from sorl_monitor.logs.table import NO_STEPS, ForeignRun, LogWarning, foreign_run, pivot, run_name

META = "meta.yaml"
RUN_NAME_TAG = "mlflow.runName"


def is_run(folder: Path) -> bool:
    return (folder / "metrics").is_dir() and ((folder / META).is_file() or (folder / "tags").is_dir())


def _children(folder: Path) -> list[Path]:
    return sorted(c for c in folder.iterdir() if c.is_dir() and not c.name.startswith("."))


def is_experiment(folder: Path) -> bool:
    return (folder / META).is_file() and not is_run(folder) and any(is_run(c) for c in _children(folder))


def run_folders(path: Path) -> list[Path]:
    """The live runs of a run folder, an experiment folder or a whole store (``[]`` if it is none of them)."""
    if is_run(path):
        runs = [path]
    elif is_experiment(path):
        runs = [c for c in _children(path) if is_run(c)]
    else:
        runs = [r for e in _children(path) if is_experiment(e) for r in _children(e) if is_run(r)]
    return [r for r in runs if _meta(r).get("lifecycle_stage") != "deleted"]


def _meta(folder: Path) -> dict[str, str]:
    """The top-level ``key: value`` lines of a ``meta.yaml`` (enough for names and the lifecycle stage)."""
    try:
        lines = (folder / META).read_text(errors="replace").splitlines()
    except OSError:
        return {}
    pairs = (line.split(":", 1) for line in lines if ":" in line and not line.startswith((" ", "-")))
    return {key.strip(): value.strip().strip("'\"") for key, value in pairs}


def _texts(folder: Path) -> dict[str, str]:
    """``{name: content}`` of the files under a ``params/`` or ``tags/`` folder (names with ``/`` nested)."""
    if not folder.is_dir():
        return {}
    return {
        file.relative_to(folder).as_posix(): file.read_text(errors="replace").strip()
        for file in sorted(folder.rglob("*"))
        if file.is_file()
    }


def _points(file: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(steps, values, timestamps in s)`` of one metric file (a line still being written is left out); a
    line that does not read (garbage, a step beyond 64 bits) is skipped, with one warning for the file."""
    data = file.read_bytes()
    data = data[: data.rfind(b"\n") + 1]
    tokens = data.split()
    if not tokens:
        return np.empty(0, np.int64), np.empty(0), np.empty(0)
    width = len(data.split(b"\n", 1)[0].split())
    if width in (2, 3) and len(tokens) % width == 0:
        fields = np.array(tokens).reshape(-1, width)
        try:
            steps = fields[:, 2].astype(np.int64) if width == 3 else np.zeros(len(fields), np.int64)
            return steps, fields[:, 1].astype(np.float64), fields[:, 0].astype(np.float64) / 1000.0
        except (ValueError, OverflowError):
            pass
    return _points_line_by_line(file, data)


def _points_line_by_line(file: Path, data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_points`` one line at a time, each line that does not read skipped and counted."""
    steps, values, seconds, bad = [], [], [], []
    for number, line in enumerate(data.split(b"\n"), 1):
        fields = line.split()
        if not fields:
            continue
        try:
            if len(fields) not in (2, 3):
                raise ValueError(f"{len(fields)} fields, not: timestamp value step")
            step = int(fields[2]) if len(fields) == 3 else 0
            if not -(2**63) <= step < 2**63:
                raise ValueError(f"step {fields[2].decode(errors='replace')[:40]} does not fit 64 bits")
            point = (step, float(fields[1]), float(fields[0]) / 1000.0)
        except ValueError as error:
            bad.append(f"line {number}: {error}")
            continue
        for column, value in zip((steps, values, seconds), point, strict=True):
            column.append(value)
    if bad:
        warnings.warn(
            f"{file}: skipped {len(bad)} unreadable lines (first: {bad[0]})", LogWarning, stacklevel=4
        )
    return np.array(steps, np.int64), np.array(values, np.float64), np.array(seconds, np.float64)


def read_run(folder: Path, name: str) -> ForeignRun:
    """One run folder as a ``ForeignRun``."""
    steps, names, values, wall = [], [], [], []
    metrics = folder / "metrics"
    for file in sorted(p for p in metrics.rglob("*") if p.is_file()):
        at, value, seconds = _points(file)
        steps.append(at)
        values.append(value)
        wall.append(seconds)
        names.extend([file.relative_to(metrics).as_posix()] * len(at))
    params = _texts(folder / "params")
    info = {"config": params, "algorithm": params.get("algorithm")}
    if not names:
        return foreign_run(folder, "mlflow", name, NO_STEPS, info=info)
    table = pivot(np.concatenate(steps), names, np.concatenate(values), np.concatenate(wall))
    return foreign_run(folder, "mlflow", name, table, info=info)


def read(path: Path, name: str) -> list[ForeignRun]:
    """Every run under ``path``, each named after its ``mlflow.runName`` tag (else its run id); a single run
    folder given as ``path`` is named ``name`` when it has no run name."""
    runs = []
    for folder in run_folders(path):
        label = _texts(folder / "tags").get(RUN_NAME_TAG) or _meta(folder).get("run_name")
        runs.append(
            read_run(
                folder, run_name(label) if label else (name if folder == path else run_name(folder.name))
            )
        )
    return runs
