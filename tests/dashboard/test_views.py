"""The dashboard's plotly figures, built from tables (SYNTHETIC values unless the test says real)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from sorl_monitor.dashboard_data import LiveRuns, RunCurves
from sorl_monitor.detectors import DETECTOR_NAMES
from sorl_monitor.report import DETECTOR_PANEL
from sorl_monitor.views import (
    OVERVIEW_PANELS,
    module_norms_figure,
    overview_figure,
    ratio_distribution_figure,
    turn_heatmap_figure,
)
from tests.dashboard.conftest import GUARDED, STABLE


def synthetic_steps(n: int = 50, **columns: np.ndarray) -> pa.Table:
    data = {"step": np.arange(n), "reward_mean": np.linspace(0, 1, n), "clip_frac": np.full(n, 0.1)}
    data.update(columns)
    return pa.table(data)


def titles(figure) -> list[str]:
    return [annotation.text for annotation in figure.layout.annotations]


def panel_axis(figure, title: str) -> str:
    """The y axis name (``y``, ``y2``, …) of the panel called ``title``."""
    row = titles(figure).index(title) + 1
    return "y" if row == 1 else f"y{row}"


def test_overview_leaves_out_panels_with_nothing_logged_synthetic():
    figure = overview_figure([RunCurves("a", synthetic_steps())])
    assert titles(figure) == ["reward", "clip fraction"]


def test_overview_of_a_long_synthetic_run_still_draws_its_one_step_grad_norm_spike():
    n = 200_000
    grad = np.full(n, 1.0)
    grad[123_457] = 400.0
    figure = overview_figure([RunCurves("long", synthetic_steps(n, grad_norm=grad))], max_points=2000)

    axis = panel_axis(figure, "grad norm")
    curve = next(t for t in figure.data if t.yaxis == axis and t.name == "pre-clip")
    assert len(curve.x) <= 2000
    assert 400.0 in curve.y
    assert curve.x[list(curve.y).index(400.0)] == 123_457


def test_alert_markers_sit_on_the_panel_of_their_detector_synthetic():
    steps = synthetic_steps(kl_old_k3=np.linspace(0.01, 0.2, 50))
    marker = {"step": 30, "detector": "kl_rise", "severity": "critical", "message": "KL jumped"}
    figure = overview_figure([RunCurves("a", steps, markers=[marker])])

    markers = [t for t in figure.data if t.mode == "markers"]
    assert len(markers) == 1
    assert markers[0].yaxis == panel_axis(figure, "KL")
    assert list(markers[0].x) == [30]
    assert markers[0].y[0] == steps.column("kl_old_k3")[30].as_py()
    assert "KL jumped" in markers[0].text[0]


def test_every_detector_has_a_panel_of_the_overview_for_its_markers():
    columns = {column for panel in OVERVIEW_PANELS for column, _ in panel.series}
    assert {
        d: DETECTOR_PANEL.get(d) for d in DETECTOR_NAMES if not columns & set(DETECTOR_PANEL.get(d, ()))
    } == {}


def test_ctn_spans_are_shaded_and_the_collapse_step_is_marked_synthetic():
    figure = overview_figure([RunCurves("a", synthetic_steps(), ctn_spans=[(10, 20)], collapse_step=40)])
    shapes = figure.layout.shapes
    assert any(s.type == "rect" and (s.x0, s.x1) == (10, 20) for s in shapes)
    assert any(s.type == "line" and s.x0 == s.x1 == 40 for s in shapes)


def test_each_ctn_span_is_one_band_over_every_panel_on_the_shared_step_axis_synthetic():
    spans = [(10 * i, 10 * i + 5) for i in range(12)]
    figure = overview_figure([RunCurves("a", synthetic_steps(), ctn_spans=spans, collapse_step=40)])

    bands = [s for s in figure.layout.shapes if s.type == "rect"]
    assert [(s.x0, s.x1) for s in bands] == spans
    assert all((s.xref, s.yref, s.y0, s.y1) == ("x", "paper", 0, 1) for s in bands)
    matched = [axis.matches for axis in figure.select_xaxes()]
    assert len(set(matched) - {None}) == 1 and matched.count(None) == 1  # one step range, zoomed together


def test_overlaid_runs_get_one_legend_entry_each_synthetic():
    runs = [RunCurves("a", synthetic_steps()), RunCurves("b", synthetic_steps())]
    figure = overview_figure(runs)
    run_entries = [t.name for t in figure.data if t.showlegend is not False and t.legend in (None, "legend")]
    assert run_entries == ["a", "b"]


def test_every_overview_panel_is_drawn_for_a_real_run(ppo_logs):
    live = LiveRuns(ppo_logs)
    live.refresh()
    figure = overview_figure([live.curves(GUARDED)])
    assert titles(figure) == [panel.title for panel in OVERVIEW_PANELS]


def test_turn_heatmap_is_turn_index_by_step_for_a_real_run(ppo_logs):
    live = LiveRuns(ppo_logs)
    live.refresh()
    cells = live.turn_cells(STABLE)
    heatmap = turn_heatmap_figure(cells).data[0]

    steps = sorted(set(cells.column("step").to_pylist()))
    assert list(heatmap.x) == steps
    assert list(heatmap.y) == [0, 1, 2]
    assert np.asarray(heatmap.customdata).shape == (3, len(steps))


def test_ratio_distribution_puts_turn_ratios_beside_the_token_ratio_summary_synthetic():
    turns = pa.table(
        {"ratio_mean": [0.9, 1.1, 1.3], "ratio_min": [0.5, 0.8, 0.9], "ratio_max": [1.5, 2.0, 4.0]}
    )
    step_row = {"ratio_min": 0.01, "ratio_p01": 0.2, "ratio_mean": 1.0, "ratio_p99": 3.0, "ratio_max": 80.0}
    figure = ratio_distribution_figure(turns, step_row, clip_eps=0.2)

    turn_box = next(t for t in figure.data if t.name == "turn w̄_k")
    assert sorted(turn_box.x) == [0.9, 1.1, 1.3]
    token_x = {x for t in figure.data if t.type == "scatter" for x in t.x}
    assert token_x == set(step_row.values())
    assert figure.layout.xaxis.type == "log"
    band = figure.layout.shapes[0]
    assert (band.x0, band.x1) == (0.8, 1.2)


def test_ratio_distribution_without_ratios_says_so():
    figure = ratio_distribution_figure(pa.table({"ratio_mean": pa.array([], pa.float64())}), {}, 0.2)
    assert "no turn or token ratios" in titles(figure)[0]


def test_module_grad_norms_draw_one_line_per_module_synthetic():
    modules = pa.table(
        {"step": [0, 0, 1, 1], "module": ["head", "body", "head", "body"], "grad_norm": [1.0, 2.0, 3.0, 4.0]}
    )
    figure = module_norms_figure(modules)
    assert {t.name: list(t.y) for t in figure.data} == {"head": [1.0, 3.0], "body": [2.0, 4.0]}
