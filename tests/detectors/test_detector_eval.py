"""benchmarks/detector_eval.py: scoring, labels, first crossings, the threshold fit and its leave-one-setting-out
scoring, the baselines' rules and the command line, on small SYNTHETIC corpora (tests/detectors/synthetic.py)
and, where they are here, the real logs."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from sorl_monitor.detectors import DetectorConfig
from sorl_monitor.query import open_runs
from tests.detectors.synthetic import (
    PATTERNS,
    collapse_reward,
    firing_level,
    grad_spike,
    pattern_rows,
    stable_rows,
    write_rows,
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "detector_eval.py"
REAL_LOGS = ROOT.parent / "shared" / "real_logs"
spec = importlib.util.spec_from_file_location("detector_eval", SCRIPT)
detector_eval = importlib.util.module_from_spec(spec)
sys.modules["detector_eval"] = detector_eval
spec.loader.exec_module(detector_eval)
Labelled, Score = detector_eval.Labelled, detector_eval.Score

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
    assert fall.collapse_step is not None and 300 <= fall.collapse_step and not fall.dipped
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


# ---------------------------------------------------------------------------------------- first crossings
def test_first_crossing_is_the_first_step_whose_running_max_exceeds_the_threshold():
    steps, values = [10, 20, 30, 40], [1.0, 5.0, 3.0, 7.0]
    peaks = [max(values[: i + 1]) for i in range(len(values))]
    assert [detector_eval.first_crossing((steps, peaks), t) for t in (0.5, 4.0, 5.0, 6.0, 7.0)] == [
        10,
        20,
        40,
        40,
        None,
    ]


def test_first_crossing_of_an_infinite_threshold_or_a_run_that_never_fired_is_none():
    assert detector_eval.first_crossing(([10], [100.0]), math.inf) is None
    assert detector_eval.first_crossing(None, 1.0) is None


def test_crossings_find_a_brief_early_excursion_that_a_later_higher_one_does_not_hide_synthetic(tmp_path):
    """SYNTHETIC: KL at twice kl_rise's critical fold for steps 150-169, back to normal, then at 4× it from 300."""
    rows = stable_rows(420)
    for row in rows[150:170]:
        PATTERNS["kl_rise"](row)
    for row in rows[300:]:
        PATTERNS["kl_rise"](row)
        PATTERNS["kl_rise"](row)  # twice: the fold is squared from here
    write_rows(tmp_path, "kl-s1", rows)
    with open_runs(tmp_path) as runs:
        series, _ = detector_eval.crossings(runs, DetectorConfig())
    critical = firing_level("kl_rise")
    steps, peaks = series["kl_rise"]["kl-s1"]
    assert peaks == sorted(peaks)  # a running max
    assert 150 <= detector_eval.first_crossing(series["kl_rise"]["kl-s1"], critical) < 170
    assert 300 <= detector_eval.first_crossing(series["kl_rise"]["kl-s1"], 4 * critical) < 320


# ---------------------------------------------------------------------------------------- fit, LOSO
def jump(step: int, value: float) -> tuple[list[int], list[float]]:
    """A fitted detector's (steps, running max) that jumps from 0.1 to ``value`` at ``step``."""
    return [step - 1, step], [0.1, value]


def series_of(kl: dict[str, tuple]) -> tuple[dict, dict]:
    """``crossings``-shaped SYNTHETIC series: ``kl`` for kl_rise, nothing for the other fitted detectors."""
    series = {key.removesuffix("_critical"): {} for key in detector_eval.FITTED}
    series["kl_rise"] = kl
    return series, {"unfitted": {}}


def grid() -> list[float]:
    finite = sorted(v for v in detector_eval.FITTED[KL] if math.isfinite(v))
    assert len(finite) >= 3, "the kl_rise grid needs three finite thresholds for these tests"
    return finite


def between(low: float, high: float) -> float:
    return (low + high) / 2


def test_fit_keeps_the_most_conservative_threshold_that_loses_no_detection_synthetic():
    g = grid()
    runs = [run("calm-s1"), run("fall-s1", collapse=100)]
    series, first = series_of({"calm-s1": jump(50, between(g[0], g[1])), "fall-s1": jump(50, g[-1] + 1)})
    assert detector_eval.fit(runs, series, first)[KL] == g[-1]


def test_fit_lowers_a_threshold_to_catch_a_collapse_when_that_costs_no_false_alarm_synthetic():
    g = grid()
    runs = [run("calm-s1"), run("fall-s1", collapse=100)]
    series, first = series_of(
        {"calm-s1": jump(50, between(g[0], g[1])), "fall-s1": jump(50, between(g[1], g[2]))}
    )
    assert detector_eval.fit(runs, series, first)[KL] == g[1]


def test_fit_ignores_an_alarm_after_the_collapse_synthetic():
    g = grid()
    runs = [run("fall-s1", collapse=100)]
    series, first = series_of({"fall-s1": ([50, 150], [between(g[0], g[1]), g[-1] + 1])})
    assert detector_eval.fit(runs, series, first)[KL] == g[0]


@pytest.fixture
def loso_corpus() -> tuple[list[Labelled], dict, dict]:
    """SYNTHETIC settings: in ``a`` a collapse only the lowest-but-one threshold catches; in ``b`` and ``c`` calm
    runs that peak just under it and collapses every finite threshold catches."""
    g = grid()
    runs, kl = [run("a-s1", collapse=100)], {"a-s1": jump(50, between(g[1], g[2]))}
    for setting in ("b", "c"):
        runs += [run(f"{setting}-s1"), run(f"{setting}-s2", collapse=100)]
        kl |= {f"{setting}-s1": jump(50, between(g[0], g[1])), f"{setting}-s2": jump(50, g[-1] + 1)}
    return (runs, *series_of(kl))


def test_leave_one_setting_out_fits_each_setting_without_its_own_runs_synthetic(loso_corpus):
    runs, series, first = loso_corpus
    g = grid()
    alone = detector_eval.fit([r for r in runs if r.setting == "a"], series, first)
    score, fits = detector_eval.leave_one_setting_out(runs, series, first)
    assert alone[KL] == g[1]  # a's own run would pick the threshold that catches it…
    assert fits["a"][KL] == g[-1]  # …but a is scored with b's and c's choice
    assert [entry.split(" ")[0] for entry in score.missed] == ["a-s1"]


def test_leave_one_setting_out_scores_every_run_once_synthetic(loso_corpus):
    runs, series, first = loso_corpus
    score, fits = detector_eval.leave_one_setting_out(runs, series, first)
    assert sorted(fits) == ["a", "b", "c"]
    assert (score.collapsing, score.detected, score.stable, score.false_alarms) == (3, 2, 2, 0)


def test_combined_alarm_is_the_earliest_of_the_fitted_crossings_and_the_unfitted_critical_alerts_synthetic():
    g = grid()
    series, first = series_of({"r": jump(80, g[-1] + 1)})
    first["unfitted"]["r"] = 120
    thresholds = {key: math.inf for key in detector_eval.FITTED}
    assert detector_eval.combined_alarm("r", thresholds | {KL: g[0]}, series, first) == 80
    assert detector_eval.combined_alarm("r", thresholds, series, first) == 120
    assert detector_eval.combined_alarm("other", thresholds | {KL: g[0]}, series, first) is None


# ---------------------------------------------------------------------------------------- baselines
def test_olmo_style_baseline_fires_on_a_six_sigma_grad_spike_synthetic(tmp_path):
    rows = stable_rows(300)
    rows[200]["grad_norm"] = grad_spike() * 10
    write_rows(tmp_path, "spiked", rows)
    write_rows(tmp_path, "calm", stable_rows(300, seed=1))
    with open_runs(tmp_path) as runs:
        alarms = detector_eval.baseline_alarms(runs, DetectorConfig())
    assert alarms["olmo_grad_spike"] == {"spiked": 200}


def test_foundry_style_baseline_needs_five_consecutive_outliers_synthetic(tmp_path):
    rows = stable_rows(400)
    for row in rows:
        row["loss"] = 1.0 + abs(row["loss"])  # a positive loss well away from 0, as the rule was made for
    collapse_reward(rows, 300, until=304, to=0.01)  # four outliers: no alarm
    collapse_reward(rows, 350, to=0.01)  # a sustained fall: alarm on its fifth update
    write_rows(tmp_path, "r", rows)
    with open_runs(tmp_path) as runs:
        alarms = detector_eval.baseline_alarms(runs, DetectorConfig())
    assert alarms["foundry_spike"] == {"r": 354}


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


def test_cli_prints_the_tables_and_writes_json_synthetic(corpus, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert detector_eval.main(["--corpus", str(corpus), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| detectors (leave-one-setting-out) |" in printed and "| olmo_grad_spike |" in printed
    payload = json.loads(out.read_text())
    assert {s["method"] for s in payload["corpus"]["scores"]} == {
        "detectors (leave-one-setting-out)",
        "olmo_grad_spike",
        "foundry_spike",
    }
    assert sorted(payload["corpus"]["fits"]) == ["calm", "kl"]


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
    assert detector_eval.main(["--corpus", str(corpus), str(more)]) == 0
    assert "per corpus folder" in capsys.readouterr().out


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    write_rows(tmp_path / "runs", "calm-s1", stable_rows(40))
    assert detector_eval.main(["--corpus", str(tmp_path / "missing")]) == 2
    assert detector_eval.main(["--corpus", str(tmp_path / "runs"), "--set", "nope=1"]) == 2
    assert capsys.readouterr().err.count("error:") == 2
    with pytest.raises(SystemExit) as exit_info:
        detector_eval.main([])
    assert exit_info.value.code == 2


@pytest.mark.skipif(
    not REAL_LOGS.is_dir(), reason="../shared/real_logs is not here (it lives beside the repo)"
)
def test_real_logs_are_labelled_and_scored_with_the_defaults():
    files = sorted(str(p) for p in REAL_LOGS.rglob("*.json"))
    result = detector_eval.evaluate_real(files, DetectorConfig())
    collapsed = [r.run_id for r in result["runs"] if r.collapse_step is not None]
    assert len(result["runs"]) == len(files)
    assert [run_id for run_id in collapsed if "rho0.70_seed44" not in run_id] == [] and len(collapsed) == 1
    assert {s.method for s in result["scores"]} == {
        "detectors (defaults)",
        "olmo_grad_spike",
        "foundry_spike",
    }
