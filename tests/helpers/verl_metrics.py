"""SYNTHETIC metrics dicts with the names and value types verl's trainer logs, and its JSONL file lines."""

from __future__ import annotations

import json

import numpy as np
import torch


def verl_metrics(step: int) -> dict:
    """A synthetic metrics dict with the names and value types verl's trainer logs."""
    return {
        "actor/pg_clipfrac": 0.01 * step,
        "actor/pg_clipfrac_lower": 0.001 * step,
        "actor/ppo_kl": np.float32(0.002 * step),
        "actor/grad_norm": torch.tensor(1.5),
        "critic/score/mean": 0.1 * step,
        "response_length/mean": 120.0,
        "num_turns/mean": np.int64(5),
        "timing_s/gen": 2.5,
        "training/global_step": step,
    }


def record(step: int) -> bytes:
    return (
        json.dumps({"step": step, "data": {k: float(v) for k, v in verl_metrics(step).items()}}).encode()
        + b"\n"
    )
