"""Colours, symbols and small layout pieces shared by the figures.

Run colours are cool hues only (blues, purples, teals, greys): severity owns red and amber, CTN
owns green, so a run's curve is never mistaken for an alert or a CTN span.
"""

from __future__ import annotations

import plotly.graph_objects as go

RUN_COLORS = ("#1f77b4", "#a21caf", "#0f766e", "#111827", "#0891b2", "#4338ca", "#64748b", "#7c3aed")
"""One per run (several runs) or per series of a panel (one run), cycled."""
SERIES_STYLES = (
    ("#1f77b4", "solid"),
    ("#7c3aed", "dot"),
    ("#111827", "solid"),
    ("#0891b2", "dash"),
    ("#a21caf", "dashdot"),
)
"""Colour and line style of a panel's 1st, 2nd, … series when one run is drawn: no two alike in both."""
MODULE_COLORS = (
    "#1f77b4", "#7c3aed", "#0891b2", "#111827", "#a21caf", "#4338ca", "#64748b", "#0e7490", "#6d28d9",
    "#1e3a8a", "#9333ea", "#334155",
)  # fmt: skip
"""Per-module colours: blues, purples, cyans, greys; never the red and amber of the alerts nor CTN's green."""
MODULE_DASHES = ("solid", "dash", "dot", "dashdot")
SEVERITY_STYLE = {
    "info": ("#6b7280", "circle-open"),
    "warning": ("#f59e0b", "triangle-up"),
    "critical": ("#dc2626", "x"),
}
"""Marker colour and symbol per alert severity."""
CTN_BAND = "rgba(34, 139, 34, 0.12)"
CTN_BAR = "rgba(34, 139, 34, 0.55)"
COLLAPSE_COLOR = "#7f1d1d"
MISSING_CELL = "#d4d4d4"
"""Heatmap background: a cell nothing was logged for is grey, never the white of w̄ = 1."""
FONT = {"size": 11}
_NARROW, _WIDE = frozenset("fijlrtI.,:;'|!·()[]/- "), frozenset("mwMW")


def text_px(text: str, size: float) -> float:
    """An upper estimate of ``text``'s width in pixels at font ``size`` in plotly's fonts ("Open Sans",
    verdana, arial): Verdana's widths, the widest of them, rounded up by class: narrow letters and
    punctuation 0.43 em, m and w 1 em, other capitals 0.8 em, anything else 0.64 em."""
    return size * sum(
        0.43 if ch in _NARROW else 1.0 if ch in _WIDE else 0.8 if ch.isupper() else 0.64 for ch in text
    )


def run_color(index: int) -> str:
    """The colour of the ``index``-th run (or series)."""
    return RUN_COLORS[index % len(RUN_COLORS)]


def empty_figure(message: str) -> go.Figure:
    """A small figure that only says ``message``."""
    figure = go.Figure()
    figure.add_annotation(text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    figure.update_layout(height=160, xaxis={"visible": False}, yaxis={"visible": False})
    return figure


def module_style(index: int) -> dict[str, str]:
    """Line colour and dash of the ``index``-th module: ``MODULE_COLORS`` first solid, then dashed, …"""
    return {
        "color": MODULE_COLORS[index % len(MODULE_COLORS)],
        "dash": MODULE_DASHES[(index // len(MODULE_COLORS)) % len(MODULE_DASHES)],
    }
