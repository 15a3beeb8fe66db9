"""The page's choices in its URL: runs, view, x axis and chart options, read once per session and written back
on every run.

Streamlit's ``bind="query-params"`` drops a parameter whose value equals the widget's default, and a fresh
session then falls back to a default that may differ (the first run picked is data-dependent), so a link
would not hold. Here the URL is the source: a new session (a link opened, a reload) seeds the widgets'
state from it, and every run writes the whole choice back (``runs`` and ``view`` always; an option only
when it differs from its default, so an absent option reads back as that same default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NONE = "none"
"""The value of a list option (``log``, ``alerts``) the viewer emptied, so that it differs from absent."""
PARAMS = ("runs", "view", "x", "smooth", "log", "alerts")


@dataclass(frozen=True)
class Choice:
    """What the page shows: runs, view (tab label), x axis, smoothing steps, log-scale panels, alert families."""

    runs: tuple[str, ...]
    view: str
    x_axis: str
    smooth_steps: int
    log_panels: tuple[str, ...]
    families: tuple[str, ...]


def read_link(
    params: Mapping[str, Sequence[str]],
    defaults: Choice,
    *,
    views: Sequence[str],
    x_axes: Sequence[str],
    smoothing: Sequence[int],
    panels: Sequence[str],
    families: Sequence[str],
) -> Choice:
    """The choice a URL's ``params`` (each name → its values) asks for; an absent or unknown value is the
    default (runs are kept as asked: one not in the folder yet is shown once it appears)."""

    def one(name: str, allowed: Sequence[str], default: str) -> str:
        values = params.get(name) or []
        return values[-1] if values and values[-1] in allowed else default

    def several(name: str, allowed: Sequence[str], default: tuple[str, ...]) -> tuple[str, ...]:
        values = list(params.get(name) or [])
        if not values:
            return default
        if values == [NONE]:
            return ()
        return tuple(v for v in dict.fromkeys(values) if v in allowed) or default

    smooth = one("smooth", [str(s) for s in smoothing], str(defaults.smooth_steps))
    return Choice(
        runs=tuple(dict.fromkeys(params.get("runs") or [])) or defaults.runs,
        view=one("view", views, defaults.view),
        x_axis=one("x", x_axes, defaults.x_axis),
        smooth_steps=int(smooth),
        log_panels=several("log", panels, defaults.log_panels),
        families=several("alerts", families, defaults.families),
    )


def link_params(choice: Choice, defaults: Choice) -> dict[str, list[str]]:
    """The URL parameters of ``choice``: runs and view always, each option only when not its default."""
    params = {"runs": list(choice.runs), "view": [choice.view]}
    if choice.x_axis != defaults.x_axis:
        params["x"] = [choice.x_axis]
    if choice.smooth_steps != defaults.smooth_steps:
        params["smooth"] = [str(choice.smooth_steps)]
    if set(choice.log_panels) != set(defaults.log_panels):
        params["log"] = list(choice.log_panels) or [NONE]
    if set(choice.families) != set(defaults.families):
        params["alerts"] = list(choice.families) or [NONE]
    return params
