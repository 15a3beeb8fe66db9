"""experiments/detector_eval.py: scoring, labels, first crossings, the threshold fit and its leave-one-setting-out
scoring, the baselines' rules, the logging shapes (experiments/log_shapes.py) and the command line, on small
SYNTHETIC corpora (tests/helpers/synthetic.py) and, where they are here, the real logs."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from sorl_monitor.diagnose.detectors import DetectorConfig
from sorl_monitor.read.query import open_runs
from tests.helpers.synthetic import (
    ONSET,
    PATTERNS,
    RISING_PATTERNS,
    collapse_reward,
    firing_level,
    grad_spike,
    pattern_rows,
    stable_rows,
    write_rows,
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "detector_eval.py"
REAL_LOGS = ROOT.parent / "shared" / "real_logs"
spec = importlib.util.spec_from_file_location("detector_eval", SCRIPT)
detector_eval = importlib.util.module_from_spec(spec)
sys.modules["detector_eval"] = detector_eval
spec.loader.exec_module(detector_eval)
Labelled, Score = detector_eval.Labelled, detector_eval.Score
log_shapes = sys.modules["log_shapes"]

KL = "kl_rise_critical"


def run(
    run_id: str, collapse: int | None = None, dipped: bool = False, setting: str | None = None
) -> Labelled:
    return Labelled(run_id, setting or run_id.rsplit("-s", 1)[0], collapse, dipped, False)


# ---------------------------------------------------------------------------------------- Score
@pytest.fixture
def scored() -> Score:
    score = Score("m")
    for labelled, alarm in [
        (run("early", 100), 90),
        (run("on-time", 100), 100),
        (run("late", 100), 120),
        (run("silent", 100), None),
        (run("false"), 5),
        (run("calm"), None),
        (run("dip-alarmed", dipped=True), 50),
        (run("dip-quiet", dipped=True), None),
    ]:
        score.add(labelled, alarm)
    return score


def test_score_counts_an_alarm_at_or_before_the_collapse_as_a_detection_with_its_lead(scored):
    assert (scored.collapsing, scored.detected) == (4, 2)
    assert scored.leads == [10, 0] and scored.lead_shares == [pytest.approx(0.1), 0.0]


def test_score_counts_a_late_alarm_as_a_miss_like_no_alarm(scored):
    assert [entry.split(" ")[0] for entry in scored.missed] == ["late", "silent"]


def test_score_counts_an_alarm_on_a_stable_run_as_a_false_alarm(scored):
    assert (scored.stable, scored.false_alarms) == (2, 1) and scored.false[0].startswith("false ")


def test_score_counts_recovered_dips_apart_neither_false_alarms_nor_detections(scored):
    assert (scored.dipped, scored.alarmed_dips) == (2, 1)
    assert not any(entry.startswith("dip-") for entry in scored.false + scored.missed)


def test_score_row_summarises_recall_false_alarms_and_leads(scored):
    assert scored.row() == {
        "method": "m",
        "recall": "2/4",
        "false alarms": "1/2",
        "median lead": 5.0,
        "min lead": 0,
        "median lead share": pytest.approx(0.05),
        "alarms on recovered dips": "1/2",
    }


# ---------------------------------------------------------------------------------------- labels
@pytest.fixture(scope="module")
def label_corpus(tmp_path_factory) -> Path:
    """SYNTHETIC: a collapse, a calm run, a dip that recovers, each of settings named with a seed suffix."""
    log_dir = tmp_path_factory.mktemp("labels")
    write_rows(log_dir, "ppo-r4x4-st4-lr1e-3-s1", collapse_reward(stable_rows(420), 300))
    write_rows(log_dir, "ppo-r4x4-st4-lr1e-3-s2", stable_rows(300))
    write_rows(log_dir, "grpo-r1x4-st0-lr3e-4-s1", collapse_reward(stable_rows(420), 300, until=340))
    return log_dir


def test_labels_give_each_run_its_collapse_step_and_its_setting_without_the_seed_synthetic(label_corpus):
    with open_runs(label_corpus) as runs:
        found = {r.run_id: r for r in detector_eval.labels(runs, DetectorConfig())}
    fall, calm = found["ppo-r4x4-st4-lr1e-3-s1"], found["ppo-r4x4-st4-lr1e-3-s2"]
    assert fall.setting == calm.setting == "ppo-r4x4-st4-lr1e-3"
    assert fall.label_step is not None and 300 <= fall.label_step and not fall.dipped
    assert (
        280 <= fall.collapse_step <= 310 < fall.label_step
    )  # the fall starts at the reward's last peak rows
    assert calm.collapse_step is None and not calm.dipped


def test_labels_mark_a_recovered_dip_below_half_the_peak_as_dipped_not_collapsed_synthetic(label_corpus):
    with open_runs(label_corpus) as runs:
        found = {r.run_id: r for r in detector_eval.labels(runs, DetectorConfig())}
    dip = found["grpo-r1x4-st0-lr3e-4-s1"]
    assert (dip.collapse_step, dip.dipped, dip.setting) == (None, True, "grpo-r1x4-st0-lr3e-4")


def test_a_run_id_without_a_seed_suffix_is_its_own_setting(tmp_path):
    write_rows(tmp_path, "token-ppo-stale", stable_rows(60))
    with open_runs(tmp_path) as runs:
        (found,) = detector_eval.labels(runs, DetectorConfig())
    assert found.setting == "token-ppo-stale"


# ---------------------------------------------------------------------------------------- fall start, streak
def test_labels_move_the_collapse_to_where_the_fall_starts_and_void_alerts_before_a_recovered_dip_synthetic(
    tmp_path,
):
    """SYNTHETIC: the reward dips at 150-199 and comes back; it falls for good at 300."""
    rows = collapse_reward(collapse_reward(stable_rows(420), 150, until=200), 300)
    write_rows(tmp_path, "dip-then-fall-s1", rows)
    with open_runs(tmp_path) as runs:
        (found,) = detector_eval.labels(runs, DetectorConfig())
    assert 280 <= found.collapse_step <= 310 < found.label_step
    assert 200 <= found.streak_from < found.collapse_step


def test_labels_take_the_fall_and_the_recovery_from_the_post_mortem_where_it_gives_them(
    tmp_path, monkeypatch
):
    """SYNTHETIC label rows as the post-mortem gives them (``collapse_step``, ``confirmed_step``, ``recovered_step``)."""
    write_rows(tmp_path, "fall-s1", stable_rows(60))
    given = pa.Table.from_pylist([
        {"run_id": "fall-s1", "collapse_step": 40, "confirmed_step": 55, "recovered_step": 24, "deepest_dip": 0.1,
         "ends_collapsed": False, "last_step": 59},
        {"run_id": "calm-s1", "collapse_step": None, "confirmed_step": None, "recovered_step": None,
         "deepest_dip": 0.9, "ends_collapsed": False, "last_step": 59},
    ])  # fmt: skip
    monkeypatch.setattr(detector_eval, "label_collapse", lambda *args, **kwargs: given)
    with open_runs(tmp_path) as runs:
        fall, calm = detector_eval.labels(runs, DetectorConfig())
    assert (fall.collapse_step, fall.label_step, fall.streak_from) == (40, 55, 24)
    assert (calm.collapse_step, calm.streak_from, calm.dipped) == (None, -math.inf, False)


# ---------------------------------------------------------------------------------------- crossings, alarms
def test_first_crossing_is_the_first_step_from_start_whose_value_exceeds_the_threshold():
    series = (np.array([10.0, 20, 30, 40]), np.array([1.0, 5.0, 3.0, 7.0]))
    found = [detector_eval.first_crossing(series, t) for t in (0.5, 4.0, 5.0, 6.0, 7.0)]
    assert found == [10, 20, 40, 40, math.inf]
    assert detector_eval.first_crossing(series, 2.0, start=25) == 30


def test_first_crossing_of_an_infinite_threshold_or_a_run_that_never_fired_is_never():
    assert detector_eval.first_crossing((np.array([10.0]), np.array([100.0])), math.inf) == math.inf
    assert detector_eval.first_crossing(None, 1.0) == math.inf


def test_collect_alarms_finds_a_brief_early_excursion_that_a_later_higher_one_does_not_hide_synthetic(
    tmp_path,
):
    """SYNTHETIC: KL at twice kl_rise's critical fold for steps 150-169, back to normal, then at 4× it from 300."""
    rows = stable_rows(420)
    for row in rows[150:170]:
        PATTERNS["kl_rise"](row)
    for row in rows[300:]:
        PATTERNS["kl_rise"](row)
        PATTERNS["kl_rise"](row)  # twice: the fold is squared from here
    write_rows(tmp_path, "kl-s1", rows)
    with open_runs(tmp_path) as runs:
        found = detector_eval.collect_alarms(runs, DetectorConfig())
    critical, series = firing_level("kl_rise"), found.fitted["kl_rise"]["kl-s1"]
    assert 150 <= detector_eval.first_crossing(series, critical) < 170
    assert 300 <= detector_eval.first_crossing(series, 4 * critical) < 320
    assert 300 <= detector_eval.first_crossing(series, critical, start=200) < 320


def test_collect_alarms_counts_diverging_families_at_their_configured_warning_levels_synthetic(tmp_path):
    """SYNTHETIC: entropy and length above their warning levels from ONSET, clip fraction and KL quiet: two
    families, under ``diverging``'s critical count. (Probing the fitted detectors with their warnings at 0
    counted the quiet clip and KL families too, and gave this run a critical ``diverging`` alarm.)"""
    rows = stable_rows(400)
    for row in rows[ONSET:]:
        RISING_PATTERNS["entropy_rise"](row)
        RISING_PATTERNS["length_rise"](row)
    write_rows(tmp_path, "two-families", rows)
    config = DetectorConfig()
    assert config.diverging_critical >= 2  # two families must stay below the critical count
    with open_runs(tmp_path) as runs:
        found = detector_eval.collect_alarms(runs, config)
    assert "two-families" not in found.unfitted
    assert len(found.fitted["clip_rise"]["two-families"][0]) > 0  # the fitted values are still all reported


def test_baselines_fire_as_their_rules_say_synthetic(tmp_path):
    """SYNTHETIC: a 10× grad spike at 200 (OLMo's 6σ), and a loss of 1 whose reward falls for 4 rows (no
    alarm) and then for good at 350 (llm-foundry's fifth consecutive outlier)."""
    spiked = stable_rows(300)
    spiked[200]["grad_norm"] = grad_spike() * 10
    write_rows(tmp_path, "spiked", spiked)
    rows = stable_rows(400, seed=1)
    for row in rows:
        row["loss"] = 1.0 + abs(row["loss"])  # a positive loss well away from 0, as the rule was made for
    collapse_reward(rows, 300, until=304, to=0.01)
    collapse_reward(rows, 350, to=0.01)
    write_rows(tmp_path, "fall", rows)
    with open_runs(tmp_path) as runs:
        found = detector_eval.collect_alarms(runs, DetectorConfig()).baselines
    assert list(found["olmo_grad_spike"]["spiked"]) == [200]
    assert found["foundry_spike"]["fall"][0] == 354  # not at 300-303: four outliers in a row


# ---------------------------------------------------------------------------------------- fit, LOSO
def jump(step: int, value: float) -> tuple[np.ndarray, np.ndarray]:
    """A fitted detector's (steps, values) that jumps from 0.1 to ``value`` at ``step``."""
    return np.array([step - 1.0, step]), np.array([0.1, value])


def alarms_of(kl: dict[str, tuple], unfitted: dict[str, list[int]] | None = None) -> dict:
    """SYNTHETIC ``collect_alarms`` results: ``kl`` for kl_rise, nothing for the other fitted detectors."""
    fitted = {key.removesuffix("_critical"): {} for key in detector_eval.FITTED}
    fitted["kl_rise"] = kl
    steps = {run_id: np.array(s, float) for run_id, s in (unfitted or {}).items()}
    return {"update": detector_eval.Alarms(fitted, steps, {})}


def grid() -> list[float]:
    finite = sorted(v for v in detector_eval.FITTED[KL] if math.isfinite(v))
    assert len(finite) >= 3, "the kl_rise grid needs three finite thresholds for these tests"
    return finite


def between(low: float, high: float) -> float:
    return (low + high) / 2


def test_fit_keeps_the_most_conservative_threshold_that_loses_no_detection_synthetic():
    g = grid()
    runs = [run("calm-s1"), run("fall-s1", collapse=100)]
    alarms = alarms_of({"calm-s1": jump(50, between(g[0], g[1])), "fall-s1": jump(50, g[-1] + 1)})
    assert detector_eval.fit(runs, alarms)[KL] == g[-1]


def test_fit_lowers_a_threshold_to_catch_a_collapse_when_that_costs_no_false_alarm_synthetic():
    g = grid()
    runs = [run("calm-s1"), run("fall-s1", collapse=100)]
    alarms = alarms_of({"calm-s1": jump(50, between(g[0], g[1])), "fall-s1": jump(50, between(g[1], g[2]))})
    assert detector_eval.fit(runs, alarms)[KL] == g[1]


def test_fit_ignores_an_alarm_after_the_collapse_synthetic():
    g = grid()
    runs = [run("fall-s1", collapse=100)]
    alarms = alarms_of({"fall-s1": (np.array([50.0, 150]), np.array([between(g[0], g[1]), g[-1] + 1]))})
    assert detector_eval.fit(runs, alarms)[KL] == g[0]


def test_an_alert_before_the_last_recovery_is_not_the_alarm_of_the_collapse_synthetic():
    g = grid()
    recovered = Labelled("fall-s1", "fall", 100, False, False, streak_from=60)
    alarms = alarms_of({"fall-s1": jump(50, g[-1] + 1)}, unfitted={"fall-s1": [40, 90]})
    thresholds = {key: math.inf for key in detector_eval.FITTED} | {KL: g[0]}
    assert detector_eval._alarm_at(recovered, alarms["update"], thresholds) == 90
    assert detector_eval._alarm_at(run("fall-s1", 100), alarms["update"], thresholds) == 40


@pytest.fixture
def loso_corpus() -> tuple[list[Labelled], dict]:
    """SYNTHETIC settings: in ``a`` a collapse only the lowest-but-one threshold catches; in ``b`` and ``c`` calm
    runs that peak just under it and collapses every finite threshold catches."""
    g = grid()
    runs, kl = [run("a-s1", collapse=100)], {"a-s1": jump(50, between(g[1], g[2]))}
    for setting in ("b", "c"):
        runs += [run(f"{setting}-s1"), run(f"{setting}-s2", collapse=100)]
        kl |= {f"{setting}-s1": jump(50, between(g[0], g[1])), f"{setting}-s2": jump(50, g[-1] + 1)}
    return runs, alarms_of(kl)


def test_leave_one_setting_out_fits_each_setting_without_its_own_runs_synthetic(loso_corpus):
    runs, alarms = loso_corpus
    g = grid()
    alone = detector_eval.fit([r for r in runs if r.setting == "a"], alarms)
    found, fits = detector_eval.leave_one_setting_out(runs, alarms)
    assert alone[KL] == g[1]  # a's own run would pick the threshold that catches it…
    assert fits["a"][KL] == g[-1]  # …but a is scored with b's and c's choice
    score = detector_eval.score_with("m", runs, found)
    assert [entry.split(" ")[0] for entry in score.missed] == ["a-s1"]


def test_leave_one_setting_out_scores_every_run_once_synthetic(loso_corpus):
    runs, alarms = loso_corpus
    found, fits = detector_eval.leave_one_setting_out(runs, alarms)
    score = detector_eval.score_with("m", runs, found)
    assert sorted(fits) == ["a", "b", "c"] and len(found) == len(runs)
    assert (score.collapsing, score.detected, score.stable, score.false_alarms) == (3, 2, 2, 0)


def test_a_row_deadline_moves_to_the_first_logged_row_at_or_after_the_fall_and_never_earlier():
    rows = {"a": np.array([4.0, 9.0, 14.0]), "b": np.array([4.0, 9.0]), "c": np.array([4.0])}
    runs = [run("a-s0", 8), run("b-s0", 9), run("c-s0", 8), run("calm-s0")]
    for r, run_id in zip(runs, "abcd", strict=True):
        r.run_id = run_id
    moved = detector_eval.with_row_deadlines(runs, rows)
    assert [r.deadline for r in moved] == [9, 9, 8, None]  # no row after the fall: the deadline stays
    assert [r.deadline for r in detector_eval.with_row_deadlines(runs, None)] == [8, 9, 8, None]
    assert runs[0].deadline == 8  # the runs given are not changed


def test_the_alarm_matrix_takes_the_earliest_of_the_fitted_crossings_and_the_unfitted_alerts_synthetic():
    g = grid()
    alarms = alarms_of({"r": jump(80, g[-1] + 1)}, unfitted={"r": [120]})
    (row,) = detector_eval.alarm_matrix([run("r")], alarms)
    at = {tuple(c.values()): a for c, a in zip(detector_eval.combos(), row, strict=True)}
    off = [math.inf] * len(detector_eval.FITTED)
    kl = list(detector_eval.FITTED).index(KL)
    assert at[tuple(off)] == 120
    assert at[tuple(g[0] if i == kl else v for i, v in enumerate(off))] == 80


# ---------------------------------------------------------------------------------------- logging shapes
def synthetic_table(n: int = 23) -> pa.Table:
    """SYNTHETIC per-update rows: step, a metric equal to the step, a grad norm, a column null on odd steps."""
    return pa.table({
        "step": pa.array(range(n), pa.int64()),
        "reward_mean": pa.array([float(s) for s in range(n)]),
        "grad_norm": pa.array([10.0 + s for s in range(n)]),
        "kl_old_k3": pa.array([float(s) if s % 2 == 0 else None for s in range(n)]),
        "policy_lag": pa.array([s % 4 for s in range(n)], pa.int64()),
    })  # fmt: skip


def test_per_batch_is_the_mean_over_each_rollout_batch_numbered_from_1_synthetic():
    rows = log_shapes.per_batch(synthetic_table(), updates=4)
    assert rows.column("step").to_pylist() == [1, 2, 3, 4, 5, 6]
    assert rows.column("reward_mean").to_pylist()[:2] == [1.5, 5.5]
    assert rows.column("reward_mean").to_pylist()[-1] == 21.0  # the last batch's 3 updates
    assert rows.column("kl_old_k3").to_pylist()[:2] == [1.0, 5.0]  # nulls left out of the mean
    assert "policy_lag" not in rows.column_names  # the trainer's own bookkeeping is not logged


def test_per_batch_sums_what_verl_sums_over_a_step_synthetic():
    table = synthetic_table(8).append_column("kl_ref_k3", pa.array([1.0] * 8))
    assert log_shapes.per_batch(table, updates=4).column("kl_ref_k3").to_pylist() == [4.0, 4.0]


def test_per_batch_keeps_a_non_finite_value_non_finite_synthetic():
    table = synthetic_table(8)
    values = table.column("reward_mean").to_pylist()
    values[5] = float("nan")
    table = table.set_column(1, "reward_mean", pa.array(values))
    assert math.isnan(log_shapes.per_batch(table, updates=4).column("reward_mean").to_pylist()[1])


def test_every_n_logs_at_each_fifth_global_step_the_window_mean_and_the_last_grad_norm_synthetic():
    rows = log_shapes.every_n(synthetic_table(23), n=5)
    assert rows.column("step").to_pylist() == [5, 10, 15, 20]  # updates 20-22 make no complete window
    assert rows.column("reward_mean").to_pylist()[:2] == [2.0, 7.0]
    assert rows.column("grad_norm").to_pylist()[:2] == [14.0, 19.0]


def test_a_shaped_row_maps_back_to_the_update_after_which_it_exists():
    assert log_shapes.to_update_step("batch", 1, 16) == 15
    assert log_shapes.to_update_step("cut", 3, 4) == 11
    assert log_shapes.to_update_step("every5", 10, 4) == 9
    assert log_shapes.to_update_step("update", 7, 4) == 7


def test_cut_points_fall_from_just_after_the_fall_starts_to_after_the_label_and_repeat():
    points = {log_shapes.cut_point(f"r-s{i}", 1000, 4, onset=300, label_step=340) for i in range(200)}
    assert min(points) >= 304 and max(points) <= 380 and len(points) > 20
    assert log_shapes.cut_point("r-s1", 1000, 4, 300, 340) == log_shapes.cut_point("r-s1", 1000, 4, 300, 340)
    calm = [log_shapes.cut_point(f"c-s{i}", 1000, 4, None, None) for i in range(50)]
    assert min(calm) >= 300 and max(calm) <= 1000


def test_updates_per_batch_come_from_the_config_or_the_rows_per_iteration():
    assert log_shapes.updates_per_batch({"config": {"epochs": 4, "minibatches": 4}}) == 16
    assert log_shapes.updates_per_batch({"config": json.dumps({"epochs": 1, "minibatches": 4})}) == 4
    assert log_shapes.updates_per_batch({"config": {}}, [4, 4, 4, 2]) == 4
    with pytest.raises(ValueError, match="epochs and minibatches"):
        log_shapes.updates_per_batch({"run_id": "x", "config": {}})


def test_shaped_logs_read_back_through_the_trainers_readers_with_their_names_synthetic(tmp_path):
    """SYNTHETIC rows written as verl's file logger and as a TRL trainer_state.json open as runs whose columns
    are the schema's again (``actor/entropy`` → entropy, TRL ``kl`` → kl_ref, ``reward`` → reward_mean)."""
    rows = pa.table({"step": pa.array([1, 2], pa.int64()), "entropy": [0.5, 0.6], "kl_ref_k3": [0.01, 0.02],
                     "reward_mean": [0.2, 0.3], "clip_frac": [0.1, 0.2]})  # fmt: skip
    (tmp_path / "verl").mkdir()
    log_shapes.write_verl(rows, tmp_path / "verl" / "a-s1.jsonl")
    log_shapes.write_trainer_state(rows, tmp_path / "trl", "a-s1")
    assert '"actor/entropy": 0.5' in (tmp_path / "verl" / "a-s1.jsonl").read_text()
    assert '"kl": 0.01' in (tmp_path / "trl" / "a-s1" / "trainer_state.json").read_text()
    for folder in ("verl", "trl"):
        with open_runs(tmp_path / folder) as runs:
            back = runs.sql(
                "SELECT run_id, step, entropy, kl_ref, reward_mean, clip_frac FROM steps ORDER BY step"
            )
        assert back.column("run_id").to_pylist() == ["a-s1", "a-s1"]
        assert back.column("kl_ref").to_pylist() == pytest.approx([0.01, 0.02])
        assert back.column("clip_frac").to_pylist() == pytest.approx([0.1, 0.2])  # no table's name: kept


# ---------------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """SYNTHETIC corpus: setting ``kl`` (KL fold from ONSET, reward falls at 300) and setting ``calm``, 2 seeds each."""
    log_dir = tmp_path_factory.mktemp("corpus")
    for seed in (1, 2):
        rows = collapse_reward(pattern_rows("kl_rise", 420, seed=seed), 300)
        write_rows(log_dir, f"kl-s{seed}", rows)
        write_rows(log_dir, f"calm-s{seed}", stable_rows(420, seed=seed))
    return log_dir


def test_a_setting_whose_collapses_only_it_shows_is_missed_leave_one_setting_out_synthetic(corpus):
    result = detector_eval.evaluate_corpus([str(corpus)], DetectorConfig())
    loso = result["scores"][0]
    assert result["settings"] == 2 and (loso.collapsing, loso.stable) == (2, 2)
    assert loso.detected == 0  # the calm runs alone give no reason to lower any threshold
    assert math.isinf(result["fits"]["kl"][KL])
    assert math.isfinite(result["fit_on_all"][KL])  # fitted on kl's own runs, it would catch them


@pytest.mark.slow
def test_every_shape_scores_every_run_and_the_cut_logs_stop_early_synthetic(corpus):
    result = detector_eval.evaluate_corpus([str(corpus)], DetectorConfig(), log_shapes.SHAPES)
    assert list(result["by_shape"]) == list(log_shapes.SHAPES)
    for shape, scores in result["by_shape"].items():
        assert [(s.collapsing, s.stable) for s in scores] == [(2, 2)] * 5, shape
        assert scores[-1].method == detector_eval.ROW_DEADLINE


def test_cli_fit_takes_only_critical_settings_with_a_one_line_error(tmp_path, capsys):
    assert detector_eval.main(["--corpus", str(tmp_path), "--fit", "smooth_steps=4,8"]) == 2
    assert detector_eval.main(["--corpus", str(tmp_path), "--fit", "no_such_critical=1"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(line.startswith("error: --fit ") for line in errors)


def test_cli_prints_the_tables_and_writes_json_synthetic(corpus, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert (
        detector_eval.main(["--corpus", str(corpus), "--shapes", "update", "batch", "--json", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    assert "| detectors (leave-one-setting-out) |" in printed and "| olmo_grad_spike |" in printed
    assert "### batch: per rollout batch" in printed and "| shape | method |" in printed
    payload = json.loads(out.read_text())
    assert {s["method"] for s in payload["corpus"]["scores"]} == {
        "detectors (leave-one-setting-out)",
        "olmo_grad_spike",
        "foundry_spike",
        f"{detector_eval.LATE_PREFIX}{DetectorConfig().min_history_steps}",
        detector_eval.ROW_DEADLINE,
    }
    assert sorted(payload["corpus"]["by_shape"]) == ["batch", "update"]
    assert sorted(payload["corpus"]["fits"]) == ["calm", "kl"]


@pytest.mark.slow
def test_two_corpus_folders_are_fitted_together_and_also_scored_apart_synthetic(corpus, tmp_path, capsys):
    """SYNTHETIC: a second folder (one more ``kl`` seed, one more calm seed) joins the same leave-one-setting-out
    fit; the per-folder scores split that one score between the folders."""
    more = tmp_path / "more"
    write_rows(more, "kl-s3", collapse_reward(pattern_rows("kl_rise", 420, seed=3), 300))
    write_rows(more, "calm-s3", stable_rows(420, seed=3))
    result = detector_eval.evaluate_corpus([str(corpus), str(more)], DetectorConfig())
    loso, (first, second) = result["scores"][0], result["by_folder"]
    assert (loso.collapsing, loso.stable) == (3, 3) and result["settings"] == 2
    assert (first.collapsing, first.stable, second.collapsing, second.stable) == (2, 2, 1, 1)
    assert first.detected + second.detected == loso.detected
    assert first.false_alarms + second.false_alarms == loso.false_alarms
    assert first.method.endswith(f", {corpus.name}") and second.method.endswith(", more")
    assert detector_eval.main(["--corpus", str(corpus), str(more), "--shapes", "update"]) == 0
    assert "per corpus folder" in capsys.readouterr().out


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    write_rows(tmp_path / "runs", "calm-s1", stable_rows(40))
    assert detector_eval.main(["--corpus", str(tmp_path / "missing")]) == 2
    assert detector_eval.main(["--corpus", str(tmp_path / "runs"), "--set", "nope=1"]) == 2
    assert detector_eval.main(["--corpus", str(tmp_path / "runs"), "--shapes", "hourly"]) == 2
    assert capsys.readouterr().err.count("error:") == 3
    with pytest.raises(SystemExit) as exit_info:
        detector_eval.main([])
    assert exit_info.value.code == 2


@pytest.mark.slow
@pytest.mark.skipif(
    not REAL_LOGS.is_dir(), reason="../shared/real_logs is not here (it lives beside the repo)"
)
def test_real_logs_are_labelled_and_scored_with_the_defaults():
    files = sorted(str(p) for p in (REAL_LOGS / "trl-grpo-qwen3.5-9b-rho-sweep").glob("*.json"))
    result = detector_eval.evaluate_real(files, DetectorConfig())
    collapsed = [r for r in result["runs"] if r.collapse_step is not None]
    assert len(result["runs"]) == len(files)
    assert [r.run_id for r in collapsed] == ["rho0.70_seed44.step_logs"]
    assert (
        collapsed[0].collapse_step < collapsed[0].label_step
    )  # the fall starts before the label confirms it
    assert {s.method for s in result["scores"]} == {
        "detectors (defaults)",
        "olmo_grad_spike",
        "foundry_spike",
    }
    assert set(result["verdicts"]) == {r.run_id for r in result["runs"]}
