"""Turns tab: turn-level IS ratio per (turn, step), and at one step turn ratios vs token ratios."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow.compute as pc
import streamlit as st

from dashboard import common
from sorl_monitor.dashboard_data import LiveRuns, off_policy_step
from sorl_monitor.views import ratio_distribution_figure, turn_heatmap_figure

NO_TURNS = (
    "Run {run_id} has no turn rows: `Monitor.log_update` writes them when the batch has turns "
    "(policy tokens separated by environment tokens in `mask`, or `turn_ids`)."
)


def render(live: LiveRuns, run_ids: Sequence[str], refresh_s: float | None) -> None:
    run_id = common.pick_one(run_ids, key="turns-run")
    common.live_fragment(refresh_s, _turns, live, run_id)


def _turns(live: LiveRuns, run_id: str) -> None:
    with common.shown_errors("the turn view"):
        live.refresh()
        message = common.starting_message(live, run_id)
        if message:
            st.info(message)
            return
        cells = live.turn_cells(run_id)
        if cells.num_rows == 0:
            st.info(NO_TURNS.format(run_id=run_id))
            return
        st.markdown("**Turn-level IS ratio** `w̄_k = mean of the turn's token ratios` by turn and step")
        st.plotly_chart(turn_heatmap_figure(cells), key="turn-heatmap", config={"displaylogo": False})
        steps = sorted(pc.unique(cells.column("step")).to_pylist())
        steps_table = live.steps(run_id)
        step = _chosen_step(steps, off_policy_step(steps_table, steps))
        matches = steps_table.filter(pc.equal(steps_table.column("step"), step)).to_pylist()
        step_row = matches[0] if matches else {}
        st.markdown(f"**Step {step}: turn ratios vs token ratios** — the granularity mismatch")
        st.caption(reuse_caption(step_row))
        st.plotly_chart(
            ratio_distribution_figure(live.turns_at(run_id, step), step_row, live.clip_eps(run_id)),
            key="ratio-distribution",
            config={"displaylogo": False},
        )
        st.caption(clip_caption(step_row))


def _chosen_step(steps: list[int], latest: int) -> int:
    """The step to inspect: ``latest`` unless the viewer turned "follow" off and chose one."""
    follow = st.toggle(
        "follow the latest update that reused a rollout",
        value=True,
        key="turns-follow",
        help="the first update on a fresh rollout has every ratio equal to 1",
    )
    if follow or len(steps) == 1:
        return latest
    chosen = st.select_slider("step", options=steps, value=latest, key="turns-step")
    return chosen if chosen in steps else latest


def reuse_caption(step_row: dict) -> str:
    """Which reuse of its rollout the step was (epoch, minibatch, policy lag)."""
    keys = ("ppo_epoch", "minibatch", "policy_lag")
    if any(step_row.get(key) is None for key in keys):
        return ""
    return "PPO epoch {:g}, minibatch {:g}, policy lag {:g} updates".format(*(step_row[key] for key in keys))


def clip_caption(step_row: dict) -> str:
    """Token vs turn clip fraction at the step, in words."""
    token, turn = step_row.get("clip_frac"), step_row.get("clip_frac_turn")
    if token is None or turn is None:
        return "Band: the trust region [1−ε, 1+ε]."
    return (
        f"Band: the trust region [1−ε, 1+ε]. Outside it at this step: {token:.1%} of tokens, "
        f"{turn:.1%} of turns."
    )
