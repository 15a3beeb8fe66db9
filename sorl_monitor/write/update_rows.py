"""An update's rows, once the host copy of its tensors has landed: its ``steps`` row, its ``turns`` rows (one per
turn slot that exists) and its ``modules`` rows (one per tracked module)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from sorl_monitor.write.module_tracker import pre_clip_norms
from sorl_monitor.write.update_metrics import TURN_COLUMNS


@dataclass
class PendingUpdate:
    """What an update's row needs besides the host copy of its tensors (host values taken at the call)."""

    keys: dict[str, Any]
    scalar_names: list[str]
    tensor_extras: list[str]  # column names, in the order they were given
    host_extras: dict[str, float]  # tensor extras that were not on the metrics' device, read at the call
    pre_clip: float | None  # grad_norm given as a number or a host tensor (a device tensor is in the copy)
    sample_ids: np.ndarray | None  # given on the host (on the device: in the copy)
    plain_extras: dict[str, Any]
    log_turns: bool
    started: float  # perf_counter at the call
    call_ms: float | None = None  # the call's time on the training thread, once it returned


def key_value(name: str, value: Any, bits: int) -> int:
    """``value`` as an int that fits the key column's ``bits``-bit type (``ValueError`` otherwise)."""
    number = int(value)
    if not -(2 ** (bits - 1)) <= number < 2 ** (bits - 1):
        raise ValueError(f"{name} {number} does not fit the schema's {bits}-bit integer column")
    return number


def step_row(update: PendingUpdate, host: dict[str, np.ndarray]) -> tuple[dict[str, Any], np.ndarray | None]:
    """The update's ``steps`` row (keys, metrics, extras, grad norms), and its modules' pre-clip grad norms when
    they were measured."""
    row: dict[str, Any] = dict(update.keys)
    row.update(zip(update.scalar_names, host["scalars"].tolist(), strict=True))
    device_extras = iter(host["extras"].tolist() if "extras" in host else [])
    for name in update.tensor_extras:
        row[name] = update.host_extras[name] if name in update.host_extras else next(device_extras)
    pre_clip = float(host["grad_norm"][0]) if "grad_norm" in host else update.pre_clip
    module_grads = None
    if "module_grads" in host:
        module_grads, norms = pre_clip_norms(host["module_grads"], host["module_params"], pre_clip)
        row.update(norms)
    elif pre_clip is not None:
        row["grad_norm"] = pre_clip
    row.update(update.plain_extras)
    return row, module_grads


def turn_columns(
    keys: Mapping[str, Any], block: np.ndarray, ids: np.ndarray | None
) -> tuple[dict[str, Any], int]:
    """The ``turns`` rows of ``block`` (``TURN_COLUMNS`` then the valid flag, per row and turn slot) as columns,
    and how many rows: one per turn slot that exists."""
    valid = block[-1] > 0
    rows, turn = np.nonzero(valid)
    n = len(rows)
    if n == 0:
        return {}, 0
    columns: dict[str, Any] = {
        k: pa.repeat(v, n) if isinstance(v, str) else np.full(n, v) for k, v in keys.items()
    }
    columns["sample_id"] = (ids[rows] if ids is not None else rows).astype(np.int64)
    columns["turn_idx"] = turn.astype(np.int32)
    for index, name in enumerate(TURN_COLUMNS):
        values = block[index][valid]
        if name == "n_tokens":
            values = values.astype(np.int32)
        elif name == "turn_clipped":
            values = values > 0
        columns[name] = values
    return columns, n


def module_rows(
    keys: Mapping[str, Any], names: Sequence[str], grads: np.ndarray, params: np.ndarray
) -> list[dict[str, Any]]:
    """One ``modules`` row per tracked module: its grad and parameter norms."""
    return [
        {**keys, "module": name, "grad_norm": float(g), "param_norm": float(p)}
        for name, g, p in zip(names, grads, params, strict=True)
    ]
