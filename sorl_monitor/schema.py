"""The Parquet tables a run writes, their Arrow schemas and the schema version (docs/schema.md).

``<log_dir>/<run_id>/run.json`` plus one folder per table, ``<table>/rank=R/part-NNNNNN.parquet``.
Every row carries the keys ``run_id, rank, step, iteration, ppo_epoch, minibatch, policy_lag,
wall_time``. Known columns have fixed types; extra scalars a trainer logs become extra ``double``
(or ``string``) columns, read back with ``union_by_name``.
"""

from __future__ import annotations

import functools
import re

import pyarrow as pa

SCHEMA_VERSION = 1
TABLES = ("steps", "turns", "modules", "alerts")
RUN_FILE = "run.json"
PART_GLOB = "part-*.parquet"
PART_NAME = re.compile(r"^part-(\d+)(?:-(\d+))?\.parquet$")
"""``part-N.parquet`` (one flush) or ``part-A-B.parquet`` (flushes A…B compacted into one file)."""

KEY_FIELDS = [
    pa.field("run_id", pa.string()),
    pa.field("rank", pa.int32()),
    pa.field("step", pa.int64()),
    pa.field("iteration", pa.int64()),
    pa.field("ppo_epoch", pa.int32()),
    pa.field("minibatch", pa.int32()),
    pa.field("policy_lag", pa.int32()),
    pa.field("wall_time", pa.float64()),
]
KEYS = [f.name for f in KEY_FIELDS]

STEP_METRICS = [
    # losses and optimiser (given by the trainer)
    "loss", "pg_loss", "vf_loss", "ctn_penalty", "ctn_coef", "lr",
    # token-level IS ratio r_t = π_θ/π_old
    "ratio_mean", "ratio_min", "ratio_max", "ratio_p01", "ratio_p99", "log_ratio_std",
    # turn-level IS ratio w̄_k, arithmetic form mean_{t∈k} r_t (turn_geo_*: geometric), and the sequence ratio
    "turn_ratio_mean", "turn_ratio_max", "turn_ratio_min", "turn_geo_ratio_mean", "turn_log_ratio_sum_max",
    "seq_ratio_mean",
    # clipping
    "clip_frac", "clip_frac_low", "clip_frac_high", "clip_frac_turn", "clip_frac_active",
    # KL estimators vs the behaviour (old) and reference policy
    "kl_old_k1", "kl_old_k2", "kl_old_k3", "kl_ref_k1", "kl_ref_k2", "kl_ref_k3",
    # KL as another trainer computed it (its own estimator): to the behaviour and to the reference policy
    "kl_old", "kl_ref",
    "entropy",
    # gradients and parameters
    "grad_norm", "grad_norm_clipped", "param_norm",
    # advantages, values, returns, rewards
    "adv_mean", "adv_std", "adv_min", "adv_max",
    "value_mean", "value_std", "value_min", "value_max", "vf_clip_frac",
    "return_mean", "return_std", "return_min", "return_max",
    "reward_mean", "reward_std", "reward_min", "reward_max", "group_reward_std", "zero_std_group_frac",
    "reward_optimized_mean",
    # lengths and data health
    "response_len_mean", "response_len_max", "turns_mean", "n_tokens", "nonfinite_count",
    # whole completions as other trainers count them (tool / environment tokens included)
    "completion_len_mean", "completion_len_max", "completion_len_min", "completion_truncated_frac",
    "turn_rows_truncated",
    # the monitor's own health
    "monitor_ms", "monitor_dropped_rows", "monitor_errors",
]  # fmt: skip

STEPS_SCHEMA = pa.schema(
    KEY_FIELDS
    + [pa.field(name, pa.float64()) for name in STEP_METRICS]
    + [pa.field("ctn_active", pa.bool_())]
)

TURN_FLOAT_COLUMNS = [
    "ratio_mean", "ratio_geomean", "log_ratio_sum", "ratio_max", "ratio_min", "clip_frac",
    "advantage", "value", "return", "reward", "kl_k3", "entropy",
]  # fmt: skip
TURNS_SCHEMA = pa.schema(
    KEY_FIELDS
    + [
        pa.field("sample_id", pa.int64()),
        pa.field("turn_idx", pa.int32()),
        pa.field("n_tokens", pa.int32()),
        pa.field("turn_clipped", pa.bool_()),
    ]
    + [pa.field(name, pa.float64()) for name in TURN_FLOAT_COLUMNS]
)

MODULES_SCHEMA = pa.schema(
    KEY_FIELDS
    + [
        pa.field("module", pa.string()),
        pa.field("grad_norm", pa.float64()),
        pa.field("param_norm", pa.float64()),
    ]
)

SEVERITIES = ("info", "warning", "critical")
ALERT_KINDS = ("alert", "action")
ALERTS_SCHEMA = pa.schema(
    KEY_FIELDS
    + [
        pa.field("kind", pa.string()),  # "alert" (a detector fired) or "action" (the guard switched CTN)
        pa.field("detector", pa.string()),
        pa.field("severity", pa.string()),  # info | warning | critical
        pa.field("value", pa.float64()),
        pa.field("threshold", pa.float64()),
        pa.field("message", pa.string()),
    ]
)

SCHEMAS: dict[str, pa.Schema] = {
    "steps": STEPS_SCHEMA,
    "turns": TURNS_SCHEMA,
    "modules": MODULES_SCHEMA,
    "alerts": ALERTS_SCHEMA,
}

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+-]{0,127}$")
_COLUMN = re.compile(r"[^0-9A-Za-z_]+")


RESERVED_RUN_IDS = frozenset({".", "..", "verdicts.parquet"})
"""Names a run folder may not take: ``sorl fleet`` writes its verdict table as ``verdicts.parquet`` beside runs."""


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is a safe folder name (letters, digits, ``._=+-``; no path separators; not one of
    ``RESERVED_RUN_IDS``)."""
    if run_id == "verdicts.parquet":
        raise ValueError(
            f"run name {run_id!r} is not allowed: sorl fleet writes its verdict table under that name"
        )
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id) or run_id in RESERVED_RUN_IDS:
        raise ValueError(
            f"run name {run_id!r} is not allowed: use 1–128 letters, digits and . _ = + - "
            "(starting with a letter or digit), no path separators"
        )
    return run_id


@functools.lru_cache(maxsize=4096)
def column_name(name: str) -> str:
    """A trainer's metric name as a snake_case column: ``actor/pg_clipfrac`` → ``actor_pg_clipfrac``."""
    cleaned = _COLUMN.sub("_", str(name)).strip("_").lower()
    return cleaned or "unnamed"


def metric_column(column: str) -> str:
    """The column a logged metric goes to: its own, or ``metric_<column>`` where that is a key's
    (``step``, ``run_id``, ``rank``, …), so a metric named ``Step`` or ``Run ID`` never overwrites a row's keys."""
    return f"metric_{column}" if column in KEYS else column


def conform(table: str, data: pa.Table) -> pa.Table:
    """Every known column (null where absent) cast to its schema type, in order; extra columns follow, sorted.

    Writing the full known schema in every part keeps every query valid whatever a trainer logs.
    """
    schema = SCHEMAS[table]
    given = dict(zip(data.column_names, data.columns, strict=True))  # one name lookup per column
    if len(given) < data.num_columns:
        raise KeyError(f"{table}: a column name occurs twice in {data.column_names}")
    columns, fields = [], []
    for field in schema:
        column = given.get(field.name)
        if column is not None:
            columns.append(column if column.type == field.type else column.cast(field.type, safe=False))
        else:
            columns.append(pa.nulls(data.num_rows, field.type))
        fields.append(field)
    for name in sorted(given.keys() - set(schema.names)):
        column = given[name]
        if (
            pa.types.is_null(column.type)
            or pa.types.is_integer(column.type)
            or pa.types.is_boolean(column.type)
        ):
            column = column.cast(pa.float64())
        columns.append(column)
        fields.append(pa.field(name, column.type))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _kind(kind: pa.DataType) -> str:
    """What a type holds as readers use it: numbers (bools, ints, floats, decimals), text, or itself."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    numeric = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_decimal)
    if pa.types.is_null(kind) or any(test(kind) for test in numeric):
        return "number"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "text"
    return str(kind)


def type_conflicts(table: str, schema: pa.Schema) -> list[str]:
    """The known columns of ``table`` that a part with ``schema`` stores as another kind of value (text in
    ``loss``), e.g. ``["loss is string, not double"]``; a narrower number (``step`` int32, ``ctn_active`` as
    0/1 doubles in older parts) is no conflict."""
    known = SCHEMAS[table]
    conflicts = []
    for field in schema:
        index = known.get_field_index(field.name)
        if index >= 0 and _kind(field.type) != _kind(known.field(index).type):
            conflicts.append(f"{field.name} is {field.type}, not {known.field(index).type}")
    return conflicts


def empty_table(table: str) -> pa.Table:
    """A table with the known columns and no rows (for views over runs that have not written it yet)."""
    return SCHEMAS[table].empty_table()


def part_range(name: str) -> tuple[int, int] | None:
    """The flush numbers a part file holds: ``part-7.parquet`` → (7, 7), ``part-0-31.parquet`` → (0, 31)."""
    match = PART_NAME.match(name)
    if match is None:
        return None
    first = int(match.group(1))
    return first, int(match.group(2) or first)


def visible_parts(paths: list[str]) -> list[str]:
    """The part paths a reader should read: those not inside a compacted part's range in their folder.

    Compaction writes ``part-A-B`` before it deletes parts ``A…B``; in between both exist, and the
    compacted one wins. Ranges within one folder (one table of one rank) are nested or disjoint.
    """
    by_folder: dict[str, list[tuple[tuple[int, int], str]]] = {}
    for path in paths:
        folder, _, name = path.rpartition("/")
        if (bounds := part_range(name)) is not None:
            by_folder.setdefault(folder, []).append((bounds, path))
    visible = []
    for parts in by_folder.values():
        covered_until = -1
        for (_first, last), path in sorted(parts, key=lambda item: (item[0][0], -item[0][1])):
            if last > covered_until:
                visible.append(path)
                covered_until = last
    return visible


def has_flush_gaps(paths: list[str]) -> bool:
    """Whether the visible parts of a rank folder skip a flush number between their first and last (a part
    written or compacted while the folder was scanned can leave one; a crash can too, for good)."""
    by_folder: dict[str, list[tuple[int, int]]] = {}
    for path in paths:
        folder, _, name = path.rpartition("/")
        if (bounds := part_range(name)) is not None:
            by_folder.setdefault(folder, []).append(bounds)
    for ranges in by_folder.values():
        ranges.sort()
        if any(first > last + 1 for (_, last), (first, _) in zip(ranges, ranges[1:], strict=False)):
            return True
    return False
