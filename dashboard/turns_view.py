"""Turns tab: the turn-level IS ratio per (turn, step) of each selected run, and at one step turn vs token ratios."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import streamlit as st

from sorl_monitor.dashboard import view_parts
from sorl_monitor.dashboard.verdict_line import plain
from sorl_monitor.diagnose.live import LiveRuns
from sorl_monitor.figures.overview import OverviewOptions
from sorl_monitor.figures.series import XAxis
from sorl_monitor.figures.turns import StepRatios, ratio_distribution_figure, turn_heatmap_figure
from sorl_monitor.read.live_tables import latest_reused_step

NO_TURNS = (
    "Run {run_id} has no turn rows: `Monitor.log_update` writes them when the batch has turns "
    "(policy tokens separated by environment tokens in `mask`, or `turn_ids`)."
)


def render(live: LiveRuns, run_ids: Sequence[str], refresh_s: float | None, options: OverviewOptions) -> None:
    follow = st.toggle(
        "follow the latest update that reused a rollout",
        value=True,
        key="turns-follow",
        help="the first update on a fresh rollout has every ratio equal to 1",
    )
    view_parts.live_fragment(refresh_s, _turns, live, list(run_ids), options.x_axis, follow)


def _turns(live: LiveRuns, run_ids: list[str], x_axis: str, follow: bool) -> None:
    with view_parts.shown_errors("the turn view"):
        live.refresh()
        head, body = st.container(), st.container()
        cells = view_parts.tables_per_run(
            live, run_ids, head, live.turn_cells, lambda run_id: no_turns(live, run_id)
        )
        if not cells:
            return
        with body:
            st.markdown("**Turn-level IS ratio** `w̄_k` (mean of the turn's token ratios) by turn and step")
            axis = XAxis({run_id: live.steps(run_id) for run_id in cells}, x_axis)
            view_parts.chart(
                "turn-heatmap",
                live,
                list(cells),
                x_axis,
                lambda: turn_heatmap_figure(cells, axis, events={r: live.timeline(r) for r in cells}),
            )
            chosen = _chosen_steps(live, cells, follow)
            st.markdown("**Turn ratios vs token ratios** at one step: the granularity mismatch")
            at = {run_id: _step_ratios(live, run_id, step) for run_id, step in chosen.items()}
            for run_id, ratios in at.items():
                st.caption(f"**{plain(run_id)}**, step {ratios.step}: " + step_caption(ratios.step_row))
            view_parts.chart(
                "ratio-distribution", live, list(at), chosen, lambda: ratio_distribution_figure(at)
            )


def _chosen_steps(live: LiveRuns, cells: dict[str, pa.Table], follow: bool) -> dict[str, int]:
    """The step each run is shown at: its latest update that reused a rollout, or the one the viewer picks."""
    steps = {run_id: sorted(pc.unique(table.column("step")).to_pylist()) for run_id, table in cells.items()}
    latest = {run_id: latest_reused_step(live.steps(run_id), s) for run_id, s in steps.items()}
    if follow:
        return latest
    every = sorted({step for s in steps.values() for step in s})
    default = next(iter(latest.values()))
    picked = (
        st.select_slider("step", options=every, value=default, key="turns-step")
        if len(every) > 1
        else every[0]
    )
    missing = [run_id for run_id, s in steps.items() if picked not in s]
    if missing:
        st.caption(f"No turn rows at step {picked} in {', '.join(missing)}.")
    return {run_id: picked for run_id, s in steps.items() if picked in s}


def _step_ratios(live: LiveRuns, run_id: str, step: int) -> StepRatios:
    steps = live.steps(run_id)
    rows = steps.filter(pc.equal(steps.column("step"), step)).to_pylist()
    return StepRatios(step, live.turns_at(run_id, step), rows[0] if rows else {}, live.clip_eps(run_id))


def no_turns(live: LiveRuns, run_id: str) -> str:
    if any(p.table == "turns" for p in live.skipped_parts(run_id)):
        return f"Run {run_id}'s turn parts could not be read (listed below), so it shows no turn rows."
    foreign = view_parts.foreign_log(live, run_id)
    if foreign:
        return (
            f"Run {run_id} has no turn rows: it is {foreign}, one row of metrics per step, without "
            "per-turn or per-token importance ratios."
        )
    return NO_TURNS.format(run_id=run_id)


def step_caption(step_row: dict) -> str:
    """Which reuse of its rollout the step was, and how many tokens and turns fell outside the trust region."""
    text = []
    keys = ("ppo_epoch", "minibatch", "policy_lag")
    if all(step_row.get(key) is not None for key in keys):
        text.append(
            "PPO epoch {:g}, minibatch {:g}, policy lag {:g} updates".format(*(step_row[k] for k in keys))
        )
    token, turn = step_row.get("clip_frac"), step_row.get("clip_frac_turn")
    if token is not None and turn is not None:
        text.append(
            f"outside the trust region [1−ε, 1+ε] (green): {token:.1%} of tokens, {turn:.1%} of turns"
        )
    return "; ".join(text) or "green band: the trust region [1−ε, 1+ε]"
