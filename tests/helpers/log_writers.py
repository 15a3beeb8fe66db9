"""Small logs written by each format's own writer (synthetic metrics; the writers are the real ones)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

TRL_STEPS = {
    step: {"loss": 0.5 - 0.01 * step, "reward": 0.1 * step, "entropy": 1.0 + step} for step in range(1, 7)
}
TRL_STEPS[4]["loss"] = math.nan  # NaN is data
VERL_STEPS = {
    step: {
        "actor/pg_loss": 0.2 * step,
        "actor/pg_clipfrac": 0.01 * step,
        "critic/score/mean": 0.3,
        "timing_s/gen": 2.0,
    }
    for step in range(1, 6)
}


def tensorboard_run(folder: Path, steps: dict[int, dict[str, float]] = TRL_STEPS) -> Path:
    """``SummaryWriter`` events: ``loss`` as ``simple_value``, the rest as tensor summaries, plus a histogram."""
    writer_module = pytest.importorskip("torch.utils.tensorboard")
    pytest.importorskip("tensorboard")
    import torch

    writer = writer_module.SummaryWriter(str(folder))
    for step, metrics in steps.items():
        for name, value in metrics.items():
            writer.add_scalar(name, value, step, new_style=name != "loss")
        writer.add_histogram("weights", torch.arange(4.0), step)
    writer.close()
    return folder


def jsonl_file(path: Path, steps: dict[int, dict[str, float]] = TRL_STEPS) -> Path:
    """One ``json.dumps`` line per step, the step's metrics split over two lines (merged on read)."""
    with open(path, "w") as handle:
        for step, metrics in steps.items():
            items = list(metrics.items())
            handle.write(json.dumps({"step": step, **dict(items[:1])}) + "\n")
            handle.write(json.dumps({"step": step, **dict(items[1:])}) + "\n")
    return path


def csv_file(
    path: Path, steps: dict[int, dict[str, float]] = TRL_STEPS, step_name: str = "global_step"
) -> Path:
    """``csv.DictWriter`` rows with a ``global_step`` column."""
    names = sorted({name for metrics in steps.values() for name in metrics})
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, [step_name, *names])
        writer.writeheader()
        for step, metrics in steps.items():
            writer.writerow({step_name: step, **metrics})
    return path


def verl_file(path: Path, steps: dict[int, dict[str, float]] = VERL_STEPS) -> Path:
    """verl's file logger: ``json.dumps({"step": step, "data": data})`` per line."""
    with open(path, "w") as handle:
        for step, data in steps.items():
            handle.write(json.dumps({"step": step, "data": data}) + "\n")
    return path


def mlflow_store(
    folder: Path, monkeypatch: pytest.MonkeyPatch, steps: dict[int, dict[str, float]] = TRL_STEPS
) -> Path:
    """Runs logged by mlflow's own client into a file store at ``folder`` (``file:`` tracking URI)."""
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind this switch
    client = mlflow.MlflowClient(tracking_uri=folder.as_uri())
    experiment = client.create_experiment("grpo-sweep")
    run = client.create_run(experiment, run_name="grpo seed 0")
    client.log_param(run.info.run_id, "algorithm", "grpo")
    client.log_param(run.info.run_id, "lr", "1e-06")
    for step, metrics in steps.items():
        for name, value in metrics.items():
            client.log_metric(run.info.run_id, name, value, step=step)
    client.log_metric(run.info.run_id, "perf/tokens_per_s", 1000.0, step=1)  # a key with "/": a sub-folder
    client.set_terminated(run.info.run_id)
    return folder


def hf_history(path: Path) -> Path:
    """A ``trainer_state.json``-style ``log_history`` list of ``TRL_STEPS``."""
    path.write_text(json.dumps([{"step": s, "epoch": s / 6, **m} for s, m in TRL_STEPS.items()]))
    return path
