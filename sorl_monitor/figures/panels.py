"""The overview's panels, in the order the verdict reads them, and which panel shows each detector's alerts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from sorl_monitor.read.step_rows import column_values


@dataclass(frozen=True)
class Panel:
    """One row of the overview: a title, the ``steps`` columns drawn in it (with labels), log scale by default."""

    title: str
    series: tuple[tuple[str, str], ...]
    log_y: bool = False

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(column for column, _ in self.series)


OVERVIEW_PANELS = (
    Panel("reward", (("reward_mean", "mean reward"),)),
    Panel(
        "clip fraction",
        (
            ("clip_frac", "token"),
            ("clip_frac_active", "token, where the clip binds"),
            ("clip_frac_turn", "turn"),
            ("clip_frac_low", "token low r<1−ε"),
            ("clip_frac_high", "token high r>1+ε"),
        ),
    ),
    Panel(
        "KL",
        (
            ("kl_old_k3", "to π_old, k3"),
            ("kl_old", "to π_old, trainer's"),
            ("kl_ref_k3", "to reference, k3"),
            ("kl_ref", "to reference, trainer's"),
        ),
        log_y=True,
    ),
    Panel(
        "IS ratio",
        (("ratio_max", "token r_t max"), ("ratio_p99", "token r_t p99"), ("turn_ratio_max", "turn w̄_k max")),
        log_y=True,
    ),
    Panel("entropy", (("entropy", "entropy"),)),
    Panel("grad norm", (("grad_norm", "pre-clip"), ("grad_norm_clipped", "after clipping")), log_y=True),
    Panel(
        "response length",
        (("response_len_mean", "mean tokens"), ("completion_len_mean", "completion tokens")),
    ),
)
"""Top to bottom: the collapse label's reward, then the signals of the detectors that decide the verdict
(ratio and KL families first: the fitted critical alerts and the CTN guard's triggers), then the rest.
A panel none of whose columns a run logged is left out."""

DETECTOR_PANEL: dict[str, tuple[str, ...]] = {
    "clip_rise": ("clip_frac", "clip_frac_active"), "turn_clip_rise": ("clip_frac_turn",),
    "kl_rise": ("kl_old_k3", "kl_old"), "kl_ref_rise": ("kl_ref_k3", "kl_ref"),
    "ratio_tail_rise": ("ratio_p99", "ratio_max"), "grad_norm_spike": ("grad_norm",),
    "entropy_collapse": ("entropy",), "entropy_rise": ("entropy",),
    "echo_trap": ("reward_mean",), "reward_std_collapse": ("reward_mean",), "reward_drop": ("reward_mean",),
    "nonfinite": ("reward_mean",), "diverging": ("reward_mean",),
    "length_rise": ("response_len_mean", "completion_len_mean"),
    "truncation_rise": ("response_len_mean", "completion_len_mean"),
    "length_collapse": ("response_len_mean", "completion_len_mean"),
    "reward_hacking": ("reward_mean",), "kl_runaway": ("kl_ref_k3", "kl_ref"),
}  # fmt: skip
"""Which panel shows each detector's alerts: the one drawing the first of these columns the run logged (an
alert whose panel is not drawn goes to the first panel). The only place this mapping is kept."""


def logged_panels(tables: Sequence[pa.Table], panels: Sequence[Panel] = OVERVIEW_PANELS) -> list[Panel]:
    """The panels with at least one column holding a finite value in one of ``tables``."""
    return [
        panel
        for panel in panels
        if any(np.isfinite(column_values(t, column)).any() for t in tables for column in panel.columns)
    ]


def alert_spot(detector: str, panels: Sequence[Panel], table: pa.Table) -> tuple[int, str | None]:
    """The panel (index in ``panels``) and the column whose curve carries ``detector``'s markers for a run
    whose step rows are ``table``: the first of ``DETECTOR_PANEL[detector]`` the run logged and a panel draws;
    else the first panel, on its first logged column (``None``: the run logged none of them)."""
    for column in DETECTOR_PANEL.get(detector, ()):
        for index, panel in enumerate(panels):
            if column in panel.columns and np.isfinite(column_values(table, column)).any():
                return index, column
    first = next((c for c in panels[0].columns if np.isfinite(column_values(table, c)).any()), None)
    return 0, first
