"""The detectors' inputs found by name in a log no name table knows (a hand-written loop's ``entropy_avg``,
``avg_response_len``, ``kl_div``).

A trainer family's name table (``names``) maps what it knows; for any other log, a ``steps`` column a detector
reads that is still empty is filled from the one logged column whose snake-cased name says it (``RULES``: words
that must be there, words that must not). The logged column stays; what was taken is recorded in the run's
config as ``signals`` (``{column: logged name}``), and ``--map`` overrides it.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

from sorl_monitor.logs.table import ForeignRun

_SPREAD = frozenset({"std", "min", "max", "var", "p10", "p50", "p90", "median", "sum", "total", "count"})
RULES: dict[str, tuple[tuple[frozenset[str], ...], frozenset[str]]] = {
    # column: (each set must share a word with the name, words the name must not have)
    "entropy": ((frozenset({"entropy", "ent"}),), _SPREAD | {"coef", "coeff", "bonus", "weight", "reg", "entreg"}),
    "response_len_mean": (
        (frozenset({"len", "length"}), frozenset({"response", "completion", "answer", "output", "gen", "avg", "mean"})),
        _SPREAD | {"prompt", "input", "context", "clip", "clipped", "truncated", "ratio"},
    ),
    "kl_ref": ((frozenset({"kl"}),), _SPREAD | {"coef", "coeff", "beta", "weight", "penalty", "ratio", "target", "magnitude"}),
    "clip_frac": ((frozenset({"clip", "clipped", "clipfrac"}), frozenset({"frac", "fraction", "ratio", "clipfrac", "rate"})),
                  _SPREAD | {"grad", "completion", "completions", "response", "length", "value", "vf", "critic"}),
    "grad_norm": ((frozenset({"grad", "gradient"}), frozenset({"norm"})), _SPREAD | {"clipped", "after", "critic", "value"}),
    "completion_truncated_frac": ((frozenset({"truncated", "truncation", "clipped"}),), _SPREAD | {"grad", "reward"}),
}  # fmt: skip
_SPLIT = re.compile(r"[^a-z0-9]+")
KEYS = frozenset({"run_id", "rank", "step", "wall_time"})


def _filled(steps: pa.Table, column: str) -> bool:
    return column in steps.column_names and steps.column(column).null_count < steps.num_rows


def _numeric(steps: pa.Table, column: str) -> bool:
    kind = steps.schema.field(column).type
    return (pa.types.is_floating(kind) or pa.types.is_integer(kind)) and steps.column(
        column
    ).null_count < steps.num_rows


def match(column: str, target: str) -> bool:
    words = set(w for w in _SPLIT.split(column.lower()) if w)
    needed, banned = RULES[target]
    return all(words & group for group in needed) and not words & banned


def infer_signals(run: ForeignRun) -> dict[str, str]:
    """Fill the detectors' empty input columns of ``run`` from the one logged column each rule matches (none when
    two match: an ambiguous name is left for ``--map``); ``{column: logged column}`` of what was filled. A run of
    a known trainer family is left as its name table maps it."""
    taken: dict[str, str] = {}
    if run.family is not None:
        return taken
    for target in RULES:
        if _filled(run.steps, target):
            continue
        found = [c for c in run.steps.column_names if c not in KEYS and c not in RULES and _numeric(run.steps, c)
                 and match(c, target)]  # fmt: skip
        if len(found) != 1:
            continue
        values = pc.cast(run.steps.column(found[0]), pa.float64())
        steps = run.steps
        if target in steps.column_names:
            run.steps = steps.set_column(steps.column_names.index(target), target, values)
        else:
            run.steps = steps.append_column(target, values)
        taken[target] = found[0]
    if taken:
        config = run.info.setdefault("config", {})
        if isinstance(config, dict):
            config["signals"] = taken
    return taken
