"""How the detectors group a run's steps and judge them, as SQL pieces: blocks that grow with the run, what a
block keeps of each signal (``SERIES``), the history before a block, and the shapes of a value (a fold over the
quiet level, a fall from the high)."""

from __future__ import annotations

from sorl_monitor.diagnose.detectors.signals import SIGNALS


def _growing_size_sql(step: str) -> str:
    """SQL: ``2^⌊log2(step / smooth_growth_steps)⌋`` (at least 1), a block's length before ``smooth_full_step``."""
    return f"(1::BIGINT << floor(log2(greatest(({step}) // $smooth_growth_steps, 1)))::BIGINT)"


def block_size_sql(block: str) -> str:
    """SQL: how many steps the block starting at step ``block`` spans (``block_start_sql``'s stages)."""
    return (
        f"(CASE WHEN ({block}) >= $smooth_full_step THEN $smooth_steps ELSE {_growing_size_sql(block)} END)"
    )


def ma_span_sql(block: str, steps: str) -> str:
    """SQL: a moving average's ``RANGE`` look-back at the block starting at ``block``: ``steps`` once blocks are
    full length, in proportion to the block's length before (4 steps for a one-step block when ``steps`` is 32)."""
    return f"(greatest(1, {steps} * {block_size_sql(block)} // $smooth_steps) - 1)"


SERIES: dict[str, tuple[str, str]] = {
    **{f"{name}_s": (name, f"avg({name})") for name in SIGNALS if name != "grad_log"},
    "grad_log_max": ("grad_log", "max(grad_log)"),
    "reward_ma": (
        "reward",
        "avg(avg(reward)) OVER (PARTITION BY run_id, rank ORDER BY block RANGE BETWEEN "
        + ma_span_sql("block", "$reward_ma_steps")
        + " PRECEDING AND CURRENT ROW)",
    ),
    "nonfinite_n": ("nonfinite", "sum(nonfinite)"),
}
"""What a block keeps of each signal: name → (the signal, its aggregate over the block's rows). ``<signal>_s``
is the block mean (the smoothed signal); ``grad_log_max`` the block's largest ln(grad norm); ``reward_ma`` the
reward's moving average over ``reward_ma_steps`` steps (scaled down with the blocks early in a run, as the collapse
label's)."""


REUSED = """
    SELECT run_id, coalesce(max(greatest(coalesce(ppo_epoch, 0), coalesce(policy_lag, 0))) > 0, false) AS reused
    FROM steps WHERE $run_id::VARCHAR IS NULL OR run_id = $run_id GROUP BY run_id"""
"""SQL, one row per run: ``reused``, the run logs one row per update of reused rollouts (a PPO epoch or a policy
lag above 0). Such a log's rows cycle with each rollout (the clip fraction climbs with each reuse), so its blocks
span ``smooth_steps`` from the start: a block never judges part of a rollout's updates against another part.
(Read over the whole run, or the live window: a property of the trainer's settings, seen from its second update
on.)"""

REUSE_COLUMNS = ("ppo_epoch", "policy_lag")
"""The columns ``REUSED`` reads."""


def block_start_sql(step: str) -> str:
    """SQL: the first step of the block ``step`` falls in (``DetectorConfig.block_start``; ``reused``, the column
    of ``REUSED``, must be in scope). Blocks grow with the run, doubling from single steps at step
    ``2·smooth_growth_steps`` up to ``smooth_steps`` steps; each stage starts on a multiple of its block length, so
    blocks never overlap and a block's id is a step. A log of reused rollouts' updates has ``smooth_steps`` blocks
    throughout."""
    size = _growing_size_sql(step)
    return (
        f"(CASE WHEN reused THEN $smooth_steps * (({step}) // $smooth_steps)"
        f" WHEN ({step}) >= $smooth_full_step"
        f" THEN greatest($smooth_full_step, $smooth_steps * (({step}) // $smooth_steps))"
        f" ELSE {size} * (({step}) // {size}) END)"
    )


HISTORY_BLOCKS = """count(*) OVER (PARTITION BY run_id, rank ORDER BY block
                    RANGE BETWEEN $history_steps PRECEDING AND CURRENT ROW EXCLUDE CURRENT ROW)"""
"""How many blocks a block's history holds: the blocks of the previous ``history_steps`` steps (a block's id is its
first step), never the current one. (``EXCLUDE CURRENT ROW``: DuckDB evaluates a ``RANGE`` frame ending
``1 PRECEDING`` far slower.)"""

HISTORY_WINDOW = """
    history AS (PARTITION BY run_id, rank ORDER BY block ROWS BETWEEN history_blocks PRECEDING AND 1 PRECEDING)"""
"""Detector values may use ``OVER history``: the ``history_blocks`` blocks before this one (``HISTORY_BLOCKS``:
those of the previous ``history_steps`` steps, never the current one). The same rows as the ``RANGE`` frame that
counts them (blocks are unique and ordered in a rank): counted once, then each aggregate's frame is found by
position, which costs DuckDB less than a ``RANGE`` frame per aggregate (docs/results.md, "Measurements behind the
code")."""


KNOWN = (
    "(history_blocks >= $min_history_blocks AND step - first_value(step) OVER history >= $min_history_steps)"
)
"""The run's history is long enough to judge against (``min_history_steps``, ``min_history_blocks``; a history's
first block has its smallest step: ``first_value``, not a ``min`` aggregate)."""


def fold(signal: str, floor: str, *, before_history: bool = False) -> str:
    """``<signal>_s ÷ max(quiet level, floor)``: the smoothed signal over its own running low. With
    ``before_history``, a run too young to have a quiet level is judged against the floor alone (where the
    floor is a natural unit: the trust region's KL, a share of tokens); otherwise it is not judged yet."""
    series = f"{signal}_s"
    quiet = f"greatest(min({series}) OVER history, {floor})"
    if before_history:
        return f"{series} / CASE WHEN {KNOWN} THEN {quiet} ELSE {floor} END"
    return f"CASE WHEN {KNOWN} THEN {series} / {quiet} END"


def peak_fraction(series: str) -> str:
    """``1 − series ÷ its high level`` (its running maximum over the history)."""
    return (f"CASE WHEN {KNOWN} AND max({series}) OVER history > 0 "
            f"THEN 1 - {series} / max({series}) OVER history END")  # fmt: skip


def floor_sql(series: str) -> str:
    """SQL: the floor of ``series``'s scale over the history and this block: 0 for a series never negative, −1 for
    one within [−1, 1] (a signed score), else its lowest value (as the collapse label's ``floors``)."""
    low = f"least(min({series}) OVER history, {series})"
    high = f"greatest(max({series}) OVER history, {series})"
    return f"(CASE WHEN {low} >= 0 THEN 0 WHEN {low} >= -1 AND {high} <= 1 THEN -1 ELSE {low} END)"


def fall_share(series: str) -> str:
    """SQL: how far ``series`` has fallen from its running high, as a share of its scale above its floor
    (``floor_sql``); NULL while the high is at the floor."""
    high, floor = f"max({series}) OVER history", floor_sql(series)
    return f"(CASE WHEN {high} > {floor} THEN ({high} - {series}) / ({high} - {floor}) END)"


BELOW_PEAK = f"reward_s - {floor_sql('reward_s')} < $echo_below_peak * (max(reward_s) OVER history - {floor_sql('reward_s')})"
"""The reward is below its running peak (above its floor): reward variance dying there is not a converged policy."""
