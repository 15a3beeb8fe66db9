"""``sorl summary`` takes time linear in the number of metric columns (issue 27, item 7): 1,000 columns
took 74 s before (2,000: over 2 minutes), each column a statement of one ``UNION ALL`` over the ``steps``
view. Synthetic values: column ``m{i}`` holds ``i + step``."""

from __future__ import annotations

import json
import time

import pytest

from sorl_monitor.query import metric_summary, open_runs

COLUMNS = 1000


@pytest.fixture(scope="module")
def wide_log(tmp_path_factory):
    log = tmp_path_factory.mktemp("wide") / "wide.jsonl"
    rows = [{"step": step, **{f"m{i}": float(i + step) for i in range(COLUMNS)}} for step in range(3)]
    log.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return log


def test_a_summary_of_1000_columns_is_quick_and_right(wide_log, record_measurement):
    with open_runs(wide_log) as runs:
        started = time.monotonic()
        summary = metric_summary(runs, "wide")
        summary_s = time.monotonic() - started
    record_measurement(columns=COLUMNS, rows=3, summary_s=round(summary_s, 2), before_s=74)
    assert summary_s < 30, summary_s  # before: 74 s on the same machine
    by_metric = {row["metric"]: row for row in summary.to_pylist()}
    assert len(by_metric) == COLUMNS
    assert by_metric["m7"] == {"metric": "m7", "n": 3, "min": 7.0, "median": 8.0, "max": 9.0, "last": 9.0}
    assert by_metric["m999"]["last"] == 1001.0
