"""Running the detectors: over a ``RunSet`` (``detect``) or over Arrow tables of ``steps`` rows on a connection
of their own (``ArrowDetector``, the live path)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa

from sorl_monitor.diagnose.detectors.assembly import (
    detect_params,
    detect_sql,
    required_columns,
    window_params,
)
from sorl_monitor.diagnose.detectors.catalogue import DETECTORS, Detector, get_detectors
from sorl_monitor.diagnose.detectors.config import DetectorConfig
from sorl_monitor.read.query import RunSet

FIRED_COLUMNS = pa.schema(
    [("run_id", pa.string()), ("step", pa.int64()), ("detector", pa.string()), ("severity", pa.string()),
     ("value", pa.float64()), ("threshold", pa.float64()), ("message", pa.string())]
)  # fmt: skip
"""Columns of ``detect``'s result: one row per (run, step, detector) that fired."""


def with_columns(steps: pa.Table, columns: Iterable[str], run_id: str = "live") -> pa.Table:
    """``steps`` with every key and ``columns`` present (missing ones as null doubles / defaults)."""
    table = steps
    if "run_id" not in table.column_names:
        table = table.append_column("run_id", pa.array([run_id] * table.num_rows, pa.string()))
    if "rank" not in table.column_names:
        table = table.append_column("rank", pa.array([0] * table.num_rows, pa.int32()))
    for name in columns:
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, pa.float64()))
        elif not pa.types.is_floating(table.schema.field(name).type):
            table = table.set_column(
                table.schema.get_field_index(name), name, table.column(name).cast(pa.float64())
            )
    return table


@dataclass
class ArrowDetector:
    """Runs a fixed set of detectors over Arrow tables of ``steps`` rows, on its own DuckDB connection.

    Keeps the compiled SQL, its parameters and the connection between calls (the live path). A call costs
    about DuckDB's fixed per-query cost, barely more on a 512-row window than on 50 rows. With
    ``optimize=False`` (what the CTN guard uses) DuckDB's query optimizer is off: on a window of a few
    hundred rows planning costs more than it saves, and the answer is the same. The few alert rows come
    back as Python rows on purpose: DuckDB's Arrow result on this cursor warns of an extra copy (a warning
    that ``-W error`` would raise into training), and its relational ``sql(...).to_arrow_table()`` is slower per
    guard call (docs/results.md, "Measurements behind the code").
    """

    config: DetectorConfig = field(default_factory=DetectorConfig)
    detectors: tuple[Detector, ...] = DETECTORS
    optimize: bool = True

    def __post_init__(self) -> None:
        self.sql = detect_sql(self.detectors)
        self.columns = required_columns(self.detectors)
        self._params = detect_params(self.sql, self.config)
        self._con = duckdb.connect(config={"threads": 1})
        if not self.optimize:
            self._con.execute("PRAGMA disable_optimizer")

    def __call__(self, steps: pa.Table, run_id: str | None = None, after_step: int | None = None) -> pa.Table:
        if steps.num_rows == 0 or "step" not in steps.column_names:
            return FIRED_COLUMNS.empty_table()
        wanted = [c for c in ("run_id", "rank", "step", *self.columns) if c in steps.column_names]
        self._con.register("steps", with_columns(steps.select(wanted), self.columns))
        params = {**self._params, **window_params(self.config, run_id, after_step)}
        try:
            rows = self._con.execute(self.sql, {k: params[k] for k in self._params}).fetchall()
            columns = list(zip(*rows, strict=True)) if rows else [()] * len(FIRED_COLUMNS)
            return pa.Table.from_arrays(
                [pa.array(column, f.type) for column, f in zip(columns, FIRED_COLUMNS, strict=True)],
                schema=FIRED_COLUMNS,
            )
        finally:
            self._con.unregister("steps")

    def close(self) -> None:
        self._con.close()


def detect(
    source: RunSet | pa.Table,
    config: DetectorConfig | None = None,
    run_id: str | None = None,
    *,
    detectors: Iterable[str] | None = None,
) -> pa.Table:
    """Run the detectors over ``source`` (a ``RunSet``, or an Arrow table of ``steps`` rows).

    Returns one row per firing: ``run_id, step, detector, severity, value, threshold, message``
    (``FIRED_COLUMNS``), ordered by run and step. ``run_id`` restricts to one run; ``detectors``
    to some detectors by name.
    """
    config = config or DetectorConfig()
    chosen = get_detectors(detectors)
    if isinstance(source, pa.Table):
        runner = ArrowDetector(config, chosen)
        try:
            return runner(source, run_id)
        finally:
            runner.close()
    sql = detect_sql(chosen)
    return source.sql(sql, detect_params(sql, config, run_id)).cast(FIRED_COLUMNS)
