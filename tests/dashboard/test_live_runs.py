"""``LiveRuns``: incremental reads of runs being written, statuses, and what the views and the report draw."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.diagnose.detectors import detect
from sorl_monitor.diagnose.live import LiveRuns
from sorl_monitor.diagnose.postmortem import label_collapse, postmortem
from sorl_monitor.read import live_tables
from sorl_monitor.read.live_tables import latest_reused_step
from sorl_monitor.read.query import open_runs
from sorl_monitor.read.views import Views
from tests.helpers.dashboard_app import GUARDED
from tests.helpers.synthetic import KEYS, PATTERNS, collapse_reward, stable_rows, write_rows

TURN_CELLS_CHECK = """
SELECT step, turn_idx, count(*) AS turns, avg(ratio_mean) AS ratio_mean, max(ratio_max) AS token_ratio_max
FROM turns WHERE isfinite(ratio_mean) GROUP BY ALL ORDER BY step, turn_idx
"""


def log_updates(mon: Monitor, n: int, seed: int = 0) -> None:
    """``n`` updates of random batches (4 episodes × 12 tokens, 3 turns) through the real ``Monitor``."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 1, 0, 1, 0, 0, 0]] * 4)
    for _ in range(n):
        logp = -torch.rand(4, 12, generator=g)
        mon.log_update(
            logp=logp, old_logp=logp + 0.3 * torch.randn(4, 12, generator=g), mask=mask,
            advantages=torch.randn(4, generator=g), rewards=torch.rand(4, generator=g),
        )  # fmt: skip
    assert mon.flush()


def files_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A list that fills with every part file the query layer reads for ``LiveRuns`` from now on."""
    read: list[str] = []
    original = Views.read_parts

    def recording(cursor, sql: str, files: list[str]) -> pa.Table:
        read.extend(files)
        return original(cursor, sql, files)

    monkeypatch.setattr(Views, "read_parts", staticmethod(recording))
    return read


def fresh(log_dir: Path) -> LiveRuns:
    live = LiveRuns(log_dir, min_refresh_s=0)
    live.refresh()
    return live


def test_refresh_reads_only_the_part_files_it_has_not_read_before(tmp_path, monkeypatch):
    with Monitor(tmp_path, "live", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        log_updates(mon, 3)
        live = fresh(tmp_path)
        live.turn_cells("live")
        first_parts = set(live.run_set.files("steps")) | set(live.run_set.files("turns"))
        read = files_read(monkeypatch)
        log_updates(mon, 2, seed=1)
        live.refresh()

    assert {Path(f).parts[-3] for f in read} == {"steps", "turns"}, "the new parts of both tables were read"
    assert not set(read) & first_parts
    assert live.steps("live").num_rows == 5


def test_a_runs_turn_rows_are_read_only_once_a_view_asks_for_them(tmp_path, monkeypatch):
    with Monitor(tmp_path, "run", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        log_updates(mon, 3)
    live = LiveRuns(tmp_path, min_refresh_s=0)
    read = files_read(monkeypatch)
    live.refresh()
    live.curves("run")
    tables_before = {Path(f).parts[-3] for f in read}
    live.turn_cells("run")

    assert "turns" not in tables_before
    assert "turns" in {Path(f).parts[-3] for f in read}


def test_new_updates_of_a_run_being_written_appear_on_refresh(tmp_path):
    with Monitor(tmp_path, "live", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        log_updates(mon, 3)
        live = fresh(tmp_path)
        before = live.run_state("live")
        log_updates(mon, 4, seed=1)
        live.refresh()
        after = live.run_state("live")

    assert (before.updates, before.last_step, before.status) == (3, 2, "live")
    assert (after.updates, after.last_step) == (7, 6)


def test_turn_cells_read_in_two_refreshes_equal_one_query_over_all_turn_rows(tmp_path):
    with Monitor(tmp_path, "live", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        log_updates(mon, 3)
        live = fresh(tmp_path)
        live.turn_cells("live")
        log_updates(mon, 3, seed=1)
        live.refresh()
    cells = live.turn_cells("live").select(["step", "turn_idx", "turns", "ratio_mean", "token_ratio_max"])

    with open_runs(tmp_path) as runs:
        expected = runs.sql(TURN_CELLS_CHECK)
    assert cells.num_rows == expected.num_rows == 6 * 3
    for got, want in zip(cells.to_pylist(), expected.to_pylist(), strict=True):
        assert got == pytest.approx(want)


def test_turns_at_a_step_are_that_steps_raw_turn_rows(tmp_path):
    with Monitor(tmp_path, "run", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        log_updates(mon, 5)
    live = fresh(tmp_path)

    rows = live.turns_at("run", 3)

    with open_runs(tmp_path) as runs:
        expected = runs.sql("SELECT ratio_mean FROM turns WHERE step = 3 ORDER BY sample_id, turn_idx")
    assert rows.num_rows == expected.num_rows == 4 * 3
    assert set(rows.column("step").to_pylist()) == {3}
    assert rows.column("ratio_mean").to_pylist() == pytest.approx(expected.column("ratio_mean").to_pylist())


def test_a_missing_folder_is_a_problem_to_show_not_an_error(tmp_path):
    live = fresh(tmp_path / "nowhere")
    assert live.run_ids() == []
    assert "does not exist" in live.problem


def test_an_empty_folder_waits_for_runs_and_picks_up_the_first_one(tmp_path):
    live = fresh(tmp_path)
    assert "No runs" in live.problem

    with Monitor(tmp_path, "late", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        log_updates(mon, 2)
    live.refresh()
    assert live.problem is None
    assert live.run_ids() == ["late"]


def test_a_run_that_has_not_logged_an_update_is_live_with_no_steps(tmp_path):
    mon = Monitor(tmp_path, "starting")
    try:
        info = fresh(tmp_path).run_state("starting")
    finally:
        mon.close()
    assert (info.status, info.updates, info.last_step) == ("live", 0, None)
    assert "no updates yet" in info.label


def test_finished_and_failed_runs_show_their_status(tmp_path):
    with Monitor(tmp_path, "done", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        log_updates(mon, 2)
    failed = Monitor(tmp_path, "crashed", writer=WriterConfig(flush_interval_s=0.05))
    log_updates(failed, 2)
    failed.close("failed")

    statuses = {info.run_id: info.status for info in fresh(tmp_path).run_states()}
    assert statuses == {"done": "finished", "crashed": "failed"}


def test_collapse_step_is_the_postmortem_label_on_a_synthetic_reward_collapse(tmp_path):
    rows = collapse_reward(stable_rows(400), 250)
    write_rows(tmp_path, "synthetic-collapse", rows)
    live = fresh(tmp_path)

    with open_runs(tmp_path) as runs:
        expected = label_collapse(runs).column("collapse_step")[0].as_py()
    assert expected is not None
    assert live.collapse_step("synthetic-collapse") == expected
    assert f"collapsed at {expected}" in live.run_state("synthetic-collapse").label


def test_rows_of_one_step_from_two_ranks_are_averaged(tmp_path):
    for rank, reward in ((0, 1.0), (1, 3.0)):
        with Monitor(
            tmp_path, "ddp", rank=rank, world_size=2, writer=WriterConfig(flush_interval_s=0.05)
        ) as mon:
            for step in range(4):
                mon.log_scalars(step, {"reward_mean": reward + step})
    steps = fresh(tmp_path).steps("ddp")
    assert steps.column("step").to_pylist() == [0, 1, 2, 3]
    assert steps.column("reward_mean").to_pylist() == [2.0, 3.0, 4.0, 5.0]


def test_an_unreadable_part_is_skipped_and_reported(tmp_path):
    with Monitor(tmp_path, "run", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        log_updates(mon, 3)
    (tmp_path / "run" / "steps" / "rank=0" / "part-999999.parquet").write_bytes(b"not parquet")

    live = fresh(tmp_path)
    assert live.steps("run").num_rows == 3
    assert [Path(part.path).name for part in live.skipped_parts("run")] == ["part-999999.parquet"]


def test_detector_firings_found_while_a_synthetic_run_is_written_equal_detect_over_the_whole_run(tmp_path):
    rows = stable_rows(400)
    for row in rows[250:]:
        PATTERNS["clip_rise"](row)
        PATTERNS["kl_rise"](row)
    live = LiveRuns(tmp_path, min_refresh_s=0)
    with Monitor(tmp_path, "growing", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        for chunk in (rows[:120], rows[120:260], rows[260:]):
            for row in chunk:
                mon.log_scalars(
                    row["step"], {k: v for k, v in row.items() if k not in KEYS}, iteration=row["iteration"],
                    ppo_epoch=row["ppo_epoch"], minibatch=row["minibatch"], policy_lag=row["policy_lag"],
                    names=None,
                )  # fmt: skip
            assert mon.flush()
            live.refresh()
            live.detector_alerts("growing")

    with open_runs(tmp_path) as runs:
        expected = detect(runs, run_id="growing")
    found = live.detector_alerts("growing")
    assert expected.num_rows > 0
    assert (
        found.select(["step", "detector", "severity"]).to_pylist()
        == expected.select(["step", "detector", "severity"]).to_pylist()
    )


def test_ctn_spans_start_where_the_guard_switched_ctn_on_in_a_real_run(ppo_logs):
    live = fresh(ppo_logs)
    alerts = live.alerts(GUARDED)
    switched_on = alerts.filter(pc.equal(alerts.column("detector"), "ctn_on")).column("step").to_pylist()

    timeline = live.timeline(GUARDED)
    assert switched_on, "the guard switched CTN on in this run"
    assert timeline.ctn_spans
    assert all(start >= switched_on[0] for start, _ in timeline.ctn_spans)
    assert {onset["severity"] for onset in timeline.onsets} <= {"warning", "critical"}
    assert timeline.onsets


def test_the_page_gets_the_last_verdict_while_a_new_post_mortem_runs_in_the_background(tmp_path, monkeypatch):
    with Monitor(tmp_path, "run", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        log_updates(mon, 4)
    live = fresh(tmp_path)
    release = threading.Event()
    original = live._postmortem

    def slow_postmortem(*args):
        assert release.wait(30)
        return original(*args)

    monkeypatch.setattr(live, "_postmortem", slow_postmortem)
    first = live.verdict("run", wait_s=0)
    running = live.verdict_pending("run")
    release.set()
    ready = live.verdict("run")

    assert first is None and running
    assert ready.updates == 4 and not live.verdict_pending("run")
    live.close()


def test_verdict_is_the_postmortem_of_the_run(ppo_logs):
    live = fresh(ppo_logs)
    verdict = live.verdict(GUARDED)
    with open_runs(ppo_logs) as runs:
        expected = postmortem(runs, GUARDED).to_dict()
    got = verdict.to_dict()
    assert {k: v for k, v in got.items() if k != "evidence"} == {
        k: v for k, v in expected.items() if k != "evidence"
    }
    assert got["evidence"].keys() == expected["evidence"].keys()
    for name, value in expected["evidence"].items():
        assert got["evidence"][name] == (value if value is None else pytest.approx(value)), name


def test_turn_view_opens_at_the_latest_update_that_reused_a_rollout_synthetic():
    steps = pa.table({"step": [0, 1, 2, 3, 4], "policy_lag": [0, 1, 2, 0, 0]})
    assert latest_reused_step(steps, [0, 1, 2, 3, 4]) == 2
    assert latest_reused_step(steps, [0, 3]) == 3
    assert latest_reused_step(steps, []) is None


def test_parts_compacted_after_they_were_read_are_not_counted_twice(tmp_path):
    with Monitor(tmp_path, "live", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        log_updates(mon, 3)
        mon.flush()
        live = fresh(tmp_path)
        live.turn_cells("live")
        assert live.steps("live").num_rows == 3
        log_updates(mon, 2, seed=1)
    # closing compacted the run's parts into one per table
    parts = [p.name for p in (tmp_path / "live" / "steps" / "rank=0").iterdir()]
    assert len(parts) == 1 and parts[0].count("-") == 2, parts
    live.refresh(force=True)
    assert live.steps("live").num_rows == 5
    assert sorted(live.steps("live").column("step").to_pylist()) == list(range(5))


def test_turns_at_a_step_whose_parts_were_compacted_since_the_last_refresh_rereads_them(tmp_path):
    with Monitor(tmp_path, "live", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        log_updates(mon, 3)
        live = fresh(tmp_path)
        assert live.turn_cells("live").num_rows == 3 * 3
        log_updates(mon, 2, seed=1)
        live.refresh(force=True)
        assert live.turn_cells("live").num_rows == 5 * 3
        assert len(list((tmp_path / "live" / "turns" / "rank=0").iterdir())) >= 2
    # closing compacted the turn parts into one: every part `live` listed is gone, and no refresh ran
    parts = list((tmp_path / "live" / "turns" / "rank=0").iterdir())
    assert len(parts) == 1 and parts[0].name.count("-") == 2, parts

    rows = live.turns_at("live", 1)

    assert rows.num_rows == 4 * 3
    assert set(rows.column("step").to_pylist()) == {1}
    assert live.skipped_parts("live") == []


def test_detector_firings_of_a_two_rank_run_are_those_detect_finds_rank_by_rank(tmp_path):
    rows = stable_rows(300)
    for row in rows[200:]:
        PATTERNS["clip_rise"](row)
    for rank in (0, 1):
        with Monitor(
            tmp_path, "ddp", rank=rank, world_size=2, writer=WriterConfig(flush_interval_s=0.05)
        ) as mon:
            for row in rows if rank == 0 else rows[:200]:
                mon.log_scalars(row["step"], {k: v for k, v in row.items() if k not in KEYS}, names=None)
    live = fresh(tmp_path)

    with open_runs(tmp_path) as runs:
        expected = detect(runs, run_id="ddp")
    assert expected.num_rows > 0
    got = live.detector_alerts("ddp").select(["step", "detector", "severity"]).to_pylist()
    assert got == expected.select(["step", "detector", "severity"]).to_pylist()
    live.close()


def test_the_verdict_is_computed_over_the_same_run_set_the_views_read(tmp_path, monkeypatch):
    with Monitor(tmp_path, "run", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        log_updates(mon, 4)
    opened = []
    original = live_tables.open_runs
    monkeypatch.setattr(
        live_tables, "open_runs", lambda *args, **kwargs: opened.append(args) or original(*args, **kwargs)
    )
    live = fresh(tmp_path)

    assert live.verdict("run").updates == 4
    assert len(opened) == 1
    live.close()


def test_a_truncated_turns_part_is_left_out_of_the_turn_cells_and_named(tmp_path):
    with Monitor(tmp_path, "run", writer=WriterConfig(flush_interval_s=3600, compact=False)) as mon:
        for _ in range(3):
            log_updates(mon, 1)
    victim = sorted((tmp_path / "run" / "turns" / "rank=0").glob("part-*.parquet"))[1]
    victim.write_bytes(victim.read_bytes()[:100])
    live = fresh(tmp_path)

    assert sorted(set(live.turn_cells("run").column("step").to_pylist())) == [0, 2]
    assert [(Path(p.path).name, p.table) for p in live.skipped_parts("run")] == [(victim.name, "turns")]
    live.close()
