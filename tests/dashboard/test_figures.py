"""The figures the dashboard and the HTML report share, built from tables (SYNTHETIC values unless the test
says real)."""

from __future__ import annotations

import colorsys
import math

import numpy as np
import pyarrow as pa
import pytest

from sorl_monitor.diagnose.detectors import DETECTOR_NAMES
from sorl_monitor.diagnose.live import LiveRuns
from sorl_monitor.diagnose.timeline import Timeline, family_of
from sorl_monitor.figures.modules import module_norms_figure
from sorl_monitor.figures.overview import OverviewOptions, RunCurves, overview_figure
from sorl_monitor.figures.panels import DETECTOR_PANEL, OVERVIEW_PANELS
from sorl_monitor.figures.series import LOG_TICKS, log_axis
from sorl_monitor.figures.style import MISSING_CELL, RUN_COLORS, SEVERITY_STYLE
from sorl_monitor.figures.turns import StepRatios, ratio_distribution_figure, turn_heatmap_figure
from tests.helpers.dashboard_app import GUARDED, STABLE


def steps_table(n: int = 50, **columns: np.ndarray) -> pa.Table:
    data = {"step": np.arange(n), "reward_mean": np.linspace(0, 1, n), "clip_frac": np.full(n, 0.1)}
    data.update(columns)
    return pa.table(data)


def onset(step: int, detector: str, severity: str = "warning") -> dict:
    return {
        "step": step,
        "detector": detector,
        "family": family_of(detector),
        "severity": severity,
        "message": "m",
    }


def titles(figure) -> list[str]:
    """The panel titles, top to bottom (bold annotations)."""
    return [
        a.text.split("</b>")[0].removeprefix("<b>")
        for a in figure.layout.annotations
        if a.text.startswith("<b>")
    ]


def panel_axis(figure, title: str) -> str:
    """The y axis (``y``, ``y2``, …) of the panel called ``title``."""
    row = titles(figure).index(title) + 1
    return "y" if row == 1 else f"y{row}"


def lane_axis(figure) -> str:
    return f"y{len(titles(figure)) + 1}"


def test_panels_not_logged_are_left_out_and_the_verdicts_signals_come_first():
    figure = overview_figure([RunCurves("a", steps_table(kl_old_k3=np.full(50, 0.01), entropy=np.ones(50)))])
    assert titles(figure) == ["reward", "clip fraction", "KL", "entropy"]
    assert [p.title for p in OVERVIEW_PANELS][:4] == ["reward", "clip fraction", "KL", "IS ratio"]


def test_a_one_step_grad_norm_spike_of_a_long_run_is_drawn():
    n = 200_000
    grad = np.full(n, 1.0)
    grad[123_457] = 400.0
    figure = overview_figure([RunCurves("long", steps_table(n, grad_norm=grad))])

    curve = next(
        t for t in figure.data if t.yaxis == panel_axis(figure, "grad norm") and t.name == "pre-clip"
    )
    assert len(curve.x) <= OverviewOptions().max_points
    assert 400.0 in curve.y
    assert curve.x[list(curve.y).index(400.0)] == 123_457


def test_an_onset_is_marked_on_its_detectors_panel_and_in_its_familys_row_of_the_lane():
    steps = steps_table(kl_old_k3=np.linspace(0.01, 0.2, 50))
    figure = overview_figure([RunCurves("a", steps, Timeline([onset(30, "kl_rise", "critical")]))])

    marks = [t for t in figure.data if t.mode in ("markers", "markers+text") and t.x and t.x[0] is not None]
    on_panel = next(t for t in marks if t.yaxis == panel_axis(figure, "KL"))
    in_lane = next(t for t in marks if t.yaxis == lane_axis(figure))
    assert list(on_panel.x) == [30] and on_panel.y[0] == pytest.approx(steps.column("kl_old_k3")[30].as_py())
    assert list(in_lane.x) == [30] and list(in_lane.y) == ["kl"]
    assert in_lane.marker.symbol[0] == SEVERITY_STYLE["critical"][1]


def test_a_family_left_out_of_the_options_draws_no_marker_and_one_legend_entry_toggles_each_family():
    timeline = Timeline([onset(10, "clip_rise"), onset(20, "kl_rise"), onset(25, "kl_ref_rise")])
    steps = steps_table(kl_old_k3=np.full(50, 0.01), kl_ref_k3=np.full(50, 0.1))
    every = overview_figure([RunCurves("a", steps, timeline)])
    only_kl = overview_figure([RunCurves("a", steps, timeline)], OverviewOptions(families=frozenset({"kl"})))

    def groups(figure) -> dict[str, int]:
        found: dict[str, int] = {}
        for trace in figure.data:
            if (trace.legendgroup or "").startswith("alerts/") and len(trace.x) and trace.x[0] is not None:
                found[trace.legendgroup] = found.get(trace.legendgroup, 0) + len(trace.x)
        return found

    assert groups(every) == {"alerts/ratio": 2, "alerts/kl": 4}  # each onset on its panel and in the lane
    assert groups(only_kl) == {"alerts/kl": 4}
    entries = [
        t.legendgroup for t in every.data if t.showlegend is not False and len(t.x) == 1 and t.x[0] is None
    ]
    assert sorted(e for e in entries if e.startswith("alerts/")) == ["alerts/kl", "alerts/ratio"]


def test_every_detector_has_a_panel_of_the_overview_for_its_markers():
    columns = {column for panel in OVERVIEW_PANELS for column in panel.columns}
    assert sorted(DETECTOR_PANEL) == sorted(DETECTOR_NAMES)
    assert {d: cols for d, cols in DETECTOR_PANEL.items() if not columns >= set(cols)} == {}


def test_a_lone_runs_ctn_spans_shade_every_panel_and_its_collapse_is_a_labelled_line():
    figure = overview_figure([RunCurves("a", steps_table(), Timeline([], [(10, 20)], 40))])
    bands = [s for s in figure.layout.shapes if s.type == "rect"]
    assert [(s.x0, s.x1, s.yref, s.y0, s.y1) for s in bands] == [(10, 20, "paper", 0, 1)]
    assert any(s.type == "line" and s.x0 == s.x1 == 40 for s in figure.layout.shapes)
    assert "collapse at 40" in [a.text for a in figure.layout.annotations]


def test_overlaid_runs_ctn_spans_and_collapse_lines_say_which_run_they_belong_to():
    runs = [
        RunCurves("a", steps_table(), Timeline([onset(5, "clip_rise")], [(10, 20)], 40)),
        RunCurves("b", steps_table(), Timeline([], [(30, 45)], None)),
    ]
    figure = overview_figure(runs)
    lane_rows = list(figure.layout[f"yaxis{len(titles(figure)) + 1}"].categoryarray)
    assert lane_rows == ["b · CTN on", "a · CTN on", "a · ratio"]  # bottom to top
    assert not [s for s in figure.layout.shapes if s.type == "rect"]  # no unlabelled bands
    assert "collapse · a · 40" in [a.text for a in figure.layout.annotations]


def hue_distance(a: str, b: str) -> float:
    def hue(color: str) -> float:
        red, green, blue = (int(color[i : i + 2], 16) / 255 for i in (1, 3, 5))
        return colorsys.rgb_to_hsv(red, green, blue)[0] * 360

    distance = abs(hue(a) - hue(b)) % 360
    return min(distance, 360 - distance)


def test_run_colours_are_never_severity_colours_nor_close_to_their_hues():
    severity = [color for color, _ in SEVERITY_STYLE.values() if color != SEVERITY_STYLE["info"][0]]
    runs = [
        RunCurves(name, steps_table(), Timeline([onset(10, "clip_rise", "critical")])) for name in "abcdef"
    ]
    figure = overview_figure(runs)
    curve_colors = {t.line.color for t in figure.data if t.mode == "lines" and t.x[0] is not None}
    assert curve_colors and not curve_colors & set(severity)
    assert min(hue_distance(run, sev) for run in RUN_COLORS for sev in severity) >= 60


def test_a_log_axis_ignores_a_first_steps_kl_of_almost_zero_and_labels_at_most_four_ticks():
    kl = np.full(50, 0.05)
    kl[0] = 1e-15
    kl[30] = 3.0
    figure = overview_figure([RunCurves("a", steps_table(kl_old_k3=kl))])
    axis = figure.layout[f"yaxis{titles(figure).index('KL') + 1}"]
    assert axis.type == "log" and len(axis.tickvals) <= 4
    low, high = axis.range
    assert -3 < low < math.log10(0.05) and high > math.log10(3.0)


def test_log_scale_follows_the_options_panel_by_panel():
    figure = overview_figure(
        [RunCurves("a", steps_table())], OverviewOptions(log_panels=frozenset({"reward"}))
    )
    assert figure.layout.yaxis.type == "log"
    assert figure.layout.yaxis2.type != "log"


def test_smoothing_draws_the_trailing_mean_over_the_steps_and_keeps_the_raw_curve_faint():
    reward = np.zeros(50)
    reward[20] = 8.0
    figure = overview_figure(
        [RunCurves("a", steps_table(reward_mean=reward))], OverviewOptions(smooth_steps=4)
    )
    raw, smoothed = [t for t in figure.data if t.yaxis == "y" and t.mode == "lines"]
    assert raw.opacity < 1 and max(raw.y) == 8.0  # the spike stays visible
    assert list(smoothed.y[20:24]) == [2.0, 2.0, 2.0, 2.0] and smoothed.y[24] == 0.0


def test_the_x_axis_can_be_the_iteration_or_the_wall_time_since_the_run_began():
    steps = steps_table(iteration=np.arange(50) // 10, wall_time=1000.0 + 60.0 * np.arange(50))
    timeline = Timeline([onset(30, "clip_rise")])
    by_iteration = overview_figure([RunCurves("a", steps, timeline)], OverviewOptions(x_axis="iteration"))
    by_time = overview_figure([RunCurves("a", steps, timeline)], OverviewOptions(x_axis="wall time"))

    assert max(by_iteration.data[0].x) == 4
    lane = next(t for t in by_time.data if t.yaxis == lane_axis(by_time))
    assert list(lane.x) == [30.0]  # step 30 is 30 minutes in
    assert "time since start (min)" in by_time.layout[f"xaxis{len(titles(by_time))}"].title.text
    assert (
        by_iteration.layout.uirevision != by_time.layout.uirevision
    )  # a zoom in steps means nothing in time


def test_a_run_without_wall_time_is_drawn_over_its_steps():
    figure = overview_figure([RunCurves("a", steps_table())], OverviewOptions(x_axis="wall time"))
    assert max(figure.data[0].x) == 49


def test_the_zoom_key_stays_the_same_when_new_rows_arrive():
    before = overview_figure([RunCurves("a", steps_table(40))])
    after = overview_figure([RunCurves("a", steps_table(50))])
    assert before.layout.uirevision == after.layout.uirevision


def test_the_heatmap_has_a_row_per_run_and_missing_cells_are_grey_not_white():
    cells = pa.table({"step": [0, 0, 1], "turn_idx": [0, 1, 0], "ratio_mean": [1.0, 2.0, 0.5]})
    figure = turn_heatmap_figure({"a": cells, "b": cells})
    assert [t.type for t in figure.data] == ["heatmap", "heatmap"]
    assert np.isnan(np.asarray(figure.data[0].z, dtype=float)[1, 1])  # turn 1 at step 1: nothing logged
    assert figure.layout.plot_bgcolor == MISSING_CELL != "#ffffff"
    assert [a.text for a in figure.layout.annotations] == ["<b>a</b>", "<b>b</b>"]


def test_the_ratio_distribution_shows_each_runs_turn_and_token_ratios_in_its_own_rows():
    turns = pa.table({"ratio_mean": [0.9, 1.1], "ratio_min": [0.5, 0.8], "ratio_max": [1.5, 2.0]})
    token = {"ratio_min": 0.01, "ratio_p01": 0.2, "ratio_mean": 1.0, "ratio_p99": 3.0, "ratio_max": 80.0}
    figure = ratio_distribution_figure(
        {"a": StepRatios(3, turns, token, 0.2), "b": StepRatios(5, turns, {}, 0.1)}
    )
    rows = list(reversed(figure.layout.yaxis.categoryarray))
    assert rows == [
        "a · turn w̄_k", "a · tokens in each turn (min, max)", "a · token r_t (min, p01, mean, p99, max)",
        "b · turn w̄_k", "b · tokens in each turn (min, max)",
    ]  # fmt: skip
    assert [(s.x0, s.x1) for s in figure.layout.shapes] == [(0.8, 1.2), (0.9, 1.1)]


def test_module_norms_have_a_row_per_run_and_one_legend_entry_per_module():
    modules = pa.table(
        {"step": [0, 0, 1, 1], "module": ["head", "body"] * 2, "grad_norm": [1.0, 2.0, 3.0, 4.0]}
    )
    figure = module_norms_figure({"a": modules, "b": modules})
    assert {(t.yaxis, t.name): list(t.y) for t in figure.data} == {
        ("y", "head"): [1.0, 3.0], ("y", "body"): [2.0, 4.0], ("y2", "head"): [1.0, 3.0], ("y2", "body"): [2.0, 4.0]
    }  # fmt: skip
    assert sorted(t.name for t in figure.data if t.showlegend) == ["body", "head"]


def test_every_panel_of_a_real_guarded_run_is_drawn(ppo_logs):
    live = LiveRuns(ppo_logs)
    live.refresh()
    figure = overview_figure([live.curves(GUARDED)])
    live.close()
    assert titles(figure) == [panel.title for panel in OVERVIEW_PANELS]


def test_the_turn_heatmap_of_a_real_run_is_turn_index_by_step(ppo_logs):
    live = LiveRuns(ppo_logs)
    live.refresh()
    cells = live.turn_cells(STABLE)
    live.close()
    heatmap = turn_heatmap_figure({STABLE: cells}).data[0]
    assert list(heatmap.x) == sorted(set(cells.column("step").to_pylist()))
    assert list(heatmap.y) == [0, 1, 2]


@pytest.mark.parametrize(("low", "high"), [(1.0, 1.8), (0.004, 0.02), (1e-3, 1e4), (0.05, 2e8)])
def test_log_ticks_are_at_most_four_round_values_inside_the_range(low, high):
    axis = log_axis([np.geomspace(low, high, 100)])
    bottom, top = axis["range"]
    assert 2 <= len(axis["tickvals"]) <= 4
    assert all(bottom <= math.log10(t) <= top for t in axis["tickvals"])
    mantissas = {round(t / 10 ** math.floor(math.log10(t) + 1e-9), 6) for t in axis["tickvals"]}
    assert mantissas <= set(LOG_TICKS[0])
