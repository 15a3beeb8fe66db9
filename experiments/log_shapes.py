"""A bundled-trainer run re-logged the way real trainers log: per rollout batch (verl), every 5 steps (TRL), cut.

    rows = per_batch(steps_of_one_run, updates_per_batch(run_info)); write_verl(rows, Path("run.jsonl"))

The corpus runs log one row per optimizer update. Real trainers do not:

* ``batch`` — verl logs one row per training step, i.e. per rollout batch: the actor's metrics are the mean
  over the step's ``ppo_epochs × mini-batches`` updates (``reduce_metrics``: ``np.mean``) except the losses
  it sums over them (``SUMMED_BY_VERL``), the data metrics are the batch's; steps count from 1. The bundled trainer makes ``epochs × minibatches`` updates per
  rollout batch (its ``run.json`` config), so row ``b`` is the mean over updates ``(b − 1)·U … b·U − 1``.
  Written as verl's file logger writes (``{"step": b, "data": {...}}`` per line).
* ``every5`` — the Hugging Face ``Trainer`` (and TRL on it) logs at every ``logging_steps``-th optimizer step
  (default 5): ``loss`` and TRL's own metrics are the mean over the window since the last log
  (``Trainer._maybe_log_save_evaluate``; ``GRPOTrainer.log``, NaN-free values), ``grad_norm`` is the last
  step's; the row's ``step`` is ``global_step`` (updates so far: update ``u`` ends step ``u + 1``). A last,
  incomplete window is not logged. Written as ``<run>/trainer_state.json`` (``log_history``).
* ``cut`` — the ``batch`` log stopped early, as a run stopped (or crashed) at the collapse is: a collapsing
  run at a random point from just after its fall starts to well after its label, a stable run at a random
  point in the last 70 % of its updates (``cut_point``).

Metric names: where a trainer's name table (``sorl_monitor.metric_names``) holds a name for exactly the
quantity a column holds, the column is written under that name (``entropy`` as ``actor/entropy``,
``kl_ref_k3`` as TRL's ``kl``); every other column keeps its schema name, which the readers keep as it is.
Reading the files back goes through the same readers a user's logs go through (``sorl_monitor.logs``).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from sorl_monitor.metric_names import TRL_NAMES, VERL_NAMES

SHAPES = ("update", "batch", "every5", "cut")
"""The logging shapes scored: as the bundled trainer logs (one row per update), and as real trainers do."""
LOGGING_STEPS = 5
"""The Hugging Face ``Trainer``'s default ``logging_steps``."""

PER_UPDATE_ONLY = ("ppo_epoch", "policy_lag", "ctn_active")
"""Columns of the bundled trainer's own bookkeeping, left out of the shaped logs (no trainer logs them per step)."""

SUMMED_BY_VERL = ("pg_loss", "kl_ref_k3")
"""What verl's actor logs as the sum over a step's ``ppo_epochs × mini-batches`` updates, not their mean
(``actor/pg_loss`` and ``actor/kl_loss`` since verl #4711: ``metric_names.VERL_ACTOR_NAMES``)."""

SAME_QUANTITY = {"kl_ref_k3": "kl_ref"}
"""A corpus column that is an instance of a more general ``steps`` column a name table maps to (verl's
``actor/kl_loss`` and TRL's ``kl`` are the k3 KL to the reference by default)."""


def foreign_names(table: Mapping[str, str], columns: Sequence[str]) -> dict[str, str]:
    """``{column: trainer's name}`` for the ``columns`` a trainer's name ``table`` has a name for (the first)."""
    names: dict[str, str] = {}
    for foreign, column in table.items():
        for ours in columns:
            if SAME_QUANTITY.get(ours, ours) == column and ours not in names:
                names[ours] = foreign
    return names


def updates_per_batch(run_info: Mapping, rows_per_iteration: Sequence[int] = ()) -> int:
    """Optimizer updates per rollout batch of a bundled-trainer run: its config's ``epochs × minibatches``, or
    else the most common count of rows per logged ``iteration`` (``rows_per_iteration``)."""
    config = run_info.get("config") or {}
    if isinstance(config, str):
        config = json.loads(config)
    epochs, minibatches = config.get("epochs"), config.get("minibatches")
    if epochs and minibatches:
        return int(epochs) * int(minibatches)
    if rows_per_iteration:
        return max(set(rows_per_iteration), key=list(rows_per_iteration).count)
    raise ValueError(
        f"run {run_info.get('run_id')!r}: its config names no epochs and minibatches, nor does it log iterations"
    )


def _columns(rows: pa.Table) -> dict[str, np.ndarray]:
    """Each metric column as float64 with nulls as a mask: ``{name: (values, valid)}``."""
    out = {}
    for name in rows.column_names:
        if name in ("run_id", "rank", "step", *PER_UPDATE_ONLY):
            continue
        column = rows.column(name)
        values = column.cast(pa.float64()).to_numpy(zero_copy_only=False).astype(float)
        valid = ~np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        out[name] = (values, valid)
    return out


def window_rows(
    rows: pa.Table,
    window: np.ndarray,
    steps: np.ndarray,
    last: Sequence[str] = (),
    finite_only: bool = False,
    summed: Sequence[str] = (),
) -> pa.Table:
    """One row per window (``window``: each input row's window number, non-decreasing): each metric's mean
    over the window's non-null values (null where it has none; a NaN among them makes the mean NaN unless
    ``finite_only``), except the ``last`` columns, which keep the window's last row's value, and the
    ``summed`` ones, their sum. ``steps``: each window's step."""
    starts = np.flatnonzero(np.r_[True, window[1:] != window[:-1]])
    ends = np.r_[starts[1:], len(window)] - 1
    out: dict[str, pa.Array] = {"step": pa.array(steps, pa.int64())}
    for name, (values, valid) in _columns(rows).items():
        if name in last:
            keep = valid[ends]
            out[name] = pa.array(np.where(keep, values[ends], 0.0), mask=~keep)
            continue
        use = valid & np.isfinite(values) if finite_only else valid
        total = np.add.reduceat(np.where(use, values, 0.0), starts)
        count = np.add.reduceat(use.astype(float), starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = total / count
        value = total if name in summed else mean
        out[name] = pa.array(np.where(count > 0, value, 0.0), mask=count == 0)
    return pa.table(out)


def per_batch(rows: pa.Table, updates: int) -> pa.Table:
    """verl's rows: one per rollout batch of ``updates`` updates (the mean over them; the sum for
    ``SUMMED_BY_VERL``), steps ``1, 2, …``."""
    step = np.asarray(rows.column("step").to_numpy(zero_copy_only=False), dtype=np.int64)
    batch = step // updates
    return window_rows(rows, batch, np.unique(batch) + 1, summed=SUMMED_BY_VERL)


def every_n(rows: pa.Table, n: int = LOGGING_STEPS) -> pa.Table:
    """The Hugging Face ``Trainer``'s rows at ``logging_steps = n``: at ``global_step`` n, 2n, …; the mean over
    the window (finite values) except ``grad_norm`` (the last step's); an incomplete last window is dropped."""
    global_step = np.asarray(rows.column("step").to_numpy(zero_copy_only=False), dtype=np.int64) + 1
    window = (global_step - 1) // n
    complete = window < global_step.max() // n
    rows, window = rows.filter(pa.array(complete)), window[complete]
    if not len(window):
        return pa.table({"step": pa.array([], pa.int64())})
    return window_rows(rows, window, (np.unique(window) + 1) * n, last=("grad_norm",), finite_only=True)


def cut_point(run_id: str, last_step: int, updates: int, onset: int | None, label_step: int | None) -> int:
    """The update step after which the ``cut`` log of ``run_id`` stops (seeded by the run id).

    A collapsing run (``onset``: where its fall starts; ``label_step``: where the label confirms it) is cut
    uniformly in ``[onset + U, label_step + max(label_step − onset, 4U)]`` (U = ``updates`` per logged row),
    so from the first row after the fall starts to well after it; a stable run uniformly in its last 70 %."""
    rng = random.Random(f"cut:{run_id}")
    if onset is None or label_step is None:
        return rng.randint(math.ceil(0.3 * last_step), last_step)
    low = min(onset + updates, last_step)
    high = min(max(label_step + max(label_step - onset, 4 * updates), low), last_step)
    return rng.randint(low, high)


def cut_batches(batch_rows: pa.Table, update_step: int, updates: int) -> pa.Table:
    """The ``batch`` log as it stands when update ``update_step`` has finished (complete batches only, but at
    least the first)."""
    last_batch = max(1, (update_step + 1) // updates)
    return batch_rows.filter(pa.compute.less_equal(batch_rows.column("step"), last_batch))


def to_update_step(shape: str, step: int, updates: int) -> int:
    """The update after which a row of ``shape`` logged at ``step`` exists (its window's last update)."""
    if shape in ("batch", "cut"):
        return step * updates - 1
    if shape == "every5":
        return step - 1
    return step


def _value(value: float | None) -> float | None:
    return None if value is None else float(value)


def write_verl(rows: pa.Table, path: Path) -> None:
    """``rows`` as verl's file logger writes them: ``{"step": N, "data": {name: value}}`` per line."""
    names = foreign_names(VERL_NAMES, rows.column_names)
    with path.open("w") as out:
        for row in rows.to_pylist():
            data = {names.get(k, k): _value(v) for k, v in row.items() if k != "step" and v is not None}
            out.write(json.dumps({"step": row["step"], "data": data}) + "\n")


def write_trainer_state(rows: pa.Table, path: Path, run_id: str) -> None:
    """``rows`` as ``<path>/<run_id>/trainer_state.json`` with a ``log_history`` of TRL's names."""
    names = foreign_names(TRL_NAMES, rows.column_names)
    history = [
        {**{names.get(k, k): _value(v) for k, v in row.items() if k != "step" and v is not None},
         "step": row["step"]}
        for row in rows.to_pylist()
    ]  # fmt: skip
    folder = path / run_id
    folder.mkdir(parents=True, exist_ok=True)
    last = history[-1]["step"] if history else 0
    state = {"global_step": last, "logging_steps": LOGGING_STEPS, "log_history": history}
    (folder / "trainer_state.json").write_text(json.dumps(state))
