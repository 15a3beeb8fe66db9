"""Two real ``torch.distributed`` processes (gloo, CPU) log one run: per-rank partitions, cross-rank queries."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
import torch.multiprocessing as mp

from sorl_monitor.read.query import QueryError, open_runs
from sorl_monitor.read.ranks import metric_across_ranks, rank_skew
from tests.helpers.two_ranks import UPDATES, run_rank

WORLD = 2


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("ranks")
    mp.spawn(run_rank, args=(WORLD, str(log_dir), str(log_dir / "rendezvous")), nprocs=WORLD, join=True)
    return log_dir


@pytest.mark.slow
def test_both_ranks_log_one_run_under_rank_zeros_id_in_their_own_partitions(two_rank_run):
    ids = {(two_rank_run / f"run_id.rank{r}").read_text() for r in range(WORLD)}
    assert len(ids) == 1
    run = two_rank_run / ids.pop()
    for table in ("steps", "turns", "modules"):
        assert sorted(p.name for p in (run / table).iterdir()) == ["rank=0", "rank=1"]
    meta = json.loads((run / "run.json").read_text())
    assert meta["world_size"] == WORLD and meta["status"] == "finished"
    with open_runs(two_rank_run) as runs:
        counts = runs.sql("SELECT rank, count(*) AS n FROM steps GROUP BY rank ORDER BY rank").to_pylist()
    assert counts == [{"rank": r, "n": UPDATES} for r in range(WORLD)]


@pytest.mark.slow
def test_a_metric_aggregates_across_ranks_per_step(two_rank_run):
    with open_runs(two_rank_run) as runs:
        across = metric_across_ranks(runs, "log_ratio_std").to_pylist()
        per_rank = runs.sql("SELECT step, rank, log_ratio_std FROM steps").to_pylist()
    values = {(r["step"], r["rank"]): r["log_ratio_std"] for r in per_rank}
    assert [r["step"] for r in across] == list(range(UPDATES))
    for row in across:
        pair = [values[(row["step"], rank)] for rank in range(WORLD)]
        assert row["ranks"] == WORLD
        assert row["mean"] == pytest.approx(sum(pair) / WORLD)
        assert row["spread"] == pytest.approx(max(pair) - min(pair))


@pytest.mark.slow
def test_rank_skew_points_at_the_noisier_rank(two_rank_run):
    with open_runs(two_rank_run) as runs:
        skew = {r["rank"]: r for r in rank_skew(runs, "log_ratio_std").to_pylist()}
        across = metric_across_ranks(runs, "log_ratio_std")
    assert skew[1]["mean_skew"] > 0 > skew[0]["mean_skew"]
    assert skew[0]["mean_skew"] == pytest.approx(-skew[1]["mean_skew"])
    assert set(across.column("max_rank").to_pylist()) == {1}


def test_rank_helpers_refuse_a_metric_that_is_not_a_column(run_dir):
    with open_runs(run_dir) as runs:
        with pytest.raises(QueryError, match="no column"):
            rank_skew(runs, 'clip_frac" FROM steps; --')
        assert isinstance(metric_across_ranks(runs, "clip_frac"), pa.Table)
