"""The plotly figures of the dashboard and the HTML report: Arrow tables in, a plotly figure out, no I/O.

* ``overview.overview_figure`` — per-step curves of one or more runs on one x axis, with a lane of alert
  onsets per detector family, CTN-on spans and the collapse step of each run;
* ``turns.turn_heatmap_figure`` — turn index × step of the turn-level IS ratio ``w̄_k``, one row per run;
* ``turns.ratio_distribution_figure`` — at one step, turn ratios vs token ratios, per run;
* ``modules.module_norms_figure`` — per-module grad norms over steps, one row per run.

Every figure keeps a ``uirevision``, so a live redraw (``Plotly.react``) keeps the viewer's zoom.
"""
