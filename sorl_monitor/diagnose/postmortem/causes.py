"""Root causes: what each means and its remedy, and the rules that pick one for a collapse (``attribute``)."""

from __future__ import annotations

import math
from typing import Any

from sorl_monitor.diagnose.detectors.catalogue import DETECTOR_FAMILY
from sorl_monitor.diagnose.postmortem.alert_summary import first_firing
from sorl_monitor.diagnose.postmortem.config import PostmortemConfig

CAUSES: dict[str, tuple[str, str]] = {
    "granularity_mismatch": (
        "granularity mismatch: token-level importance ratios are far wider than the turn-level ratios "
        "the multi-turn reward is assigned at, so token-level clipping and IS variance explode",
        "Use turn-level importance sampling (Turn-PPO / SO-PPO: one ratio w̄_k per turn, a mean of its token ratios) "
        "and turn on Clipping-Triggered Normalization (CTN).",
    ),
    "off_policy_variance": (
        "off-policy variance accumulation: clip fraction and KL grow with each reuse of a rollout "
        "(PPO epochs × mini-batches, stale rollouts)",
        "Reuse each rollout less (fewer PPO epochs or mini-batches, fresher rollouts) and turn on CTN.",
    ),
    "echo_trap": (
        "Echo Trap: reward variance (and entropy) collapsed before any ratio or gradient blow-up; "
        "groups with identical rewards give no learning signal",
        "Keep reward variance: drop zero-variance groups, keep exploration (temperature or entropy "
        "bonus), and lower the learning rate; CTN limits the damage meanwhile.",
    ),
    "entropy_blowup": (
        "entropy blow-up: the policy's entropy exploded before any ratio or KL alert (the note on "
        "completion lengths says whether the generations degenerated)",
        "Lower the learning rate, keep a KL penalty to the reference policy (or raise it), lower the "
        "sampling temperature, and resume from a checkpoint before the entropy rose.",
    ),
    "reward_hacking": (
        "reward hacking: the reward the trainer optimizes held or climbed while the score the run is for fell "
        "(the policy found a way to earn the reward without doing the task)",
        "Fix the reward so it cannot be earned without the task (tie it to the score, cap or drop the part that "
        "climbs), keep a KL penalty to the reference policy, and resume from a checkpoint before the score fell.",
    ),
    "answer_collapse": (
        "answer collapse: the responses shrank to a small share of their length before any ratio or KL alert "
        "(the policy stopped answering: a few tokens, or the end-of-sequence token at once)",
        "Check the reward for a shortcut that short answers earn (a format or length term), add a length floor "
        "or penalty, keep an entropy bonus or KL to the reference, and resume from before the answers shrank.",
    ),
    "entropy_collapse": (
        "entropy collapse: the policy's entropy fell to a small share of its level before any ratio or KL alert "
        "(it stopped exploring; its groups then score alike)",
        "Keep exploration: an entropy bonus, a higher sampling temperature or a higher upper clip (DAPO's "
        "clip-higher), and a lower learning rate; resume from before the entropy fell.",
    ),
    "optimisation_blowup": (
        "optimisation blow-up: gradient-norm spikes, non-finite values or ratio / KL alerts without a "
        "token/turn, off-policy, entropy or reward-variance signature",
        "Lower the learning rate (and tighten gradient clipping).",
    ),
    "unexplained": (
        "collapse without a preceding critical alert: no detector saw it coming",
        "Inspect the run's curves (sorl report); log the missing inputs listed below so more detectors can run.",
    ),
}
"""Each root cause of a collapse: what it means, and the remedy (the paper's, arXiv 2511.20718, where it
has one)."""

TRAINER_SWITCHES = {
    "trl": "TRL: use `SORLGRPOTrainer(..., ctn='auto')` with `SORLGRPOConfig(loss_type='so_grpo')` "
    "(sorl_monitor.integrations.trl_so_grpo).",
    "verl": "verl: call `register_sorl_loss()` (sorl_monitor.integrations.verl_so_ppo) in each worker and set "
    "`actor.policy_loss.loss_mode=so_ppo` (so_grpo with GRPO advantages).",
}
"""The switch that applies the remedy in the trainer a run came from (turn-level IS and auto-CTN as a loss)."""
SWITCHED_CAUSES = ("granularity_mismatch", "off_policy_variance")
"""The root causes whose remedy is turn-level IS and CTN."""


def trainer_family(algorithm: str | None, config: dict[str, Any]) -> str | None:
    """``bundled`` | ``trl`` | ``verl`` | None: the trainer a run came from, by its config's keys (the bundled
    ``TrainConfig``'s ``warmstart_steps``; TRL's ``num_generations``; verl's actor ``ppo_mini_batch_size``) or
    its algorithm (``verl``)."""
    if "warmstart_steps" in config:
        return "bundled"
    if algorithm == "verl" or "ppo_mini_batch_size" in config or "clip_ratio_c" in config:
        return "verl"
    if "num_generations" in config or (
        "per_device_train_batch_size" in config and (algorithm or "").endswith("grpo")
    ):
        return "trl"
    return None


def remedy_for(cause: str, family: str | None) -> str:
    """``cause``'s remedy, with the switch of the run's trainer (``TRAINER_SWITCHES``) where one applies."""
    remedy = CAUSES[cause][1]
    switch = TRAINER_SWITCHES.get(family or "") if cause in SWITCHED_CAUSES else None
    return remedy if switch is None else f"{remedy} {switch}"


def _at_least(value: float | None, threshold: float) -> bool:
    return value is not None and math.isfinite(value) and value >= threshold


def _first_of_family(summary: list[dict[str, Any]], end: int | None) -> dict[str, int]:
    """Per detector family, the first step ``≤ end`` at which any of its detectors fired."""
    first: dict[str, int] = {}
    for row in summary:
        family, step = DETECTOR_FAMILY[row["detector"]], row["first_step"]
        if step is not None and (end is None or step <= end):
            first[family] = min(step, first.get(family, step))
    return first


def attribute(
    summary: list[dict[str, Any]],
    evidence: dict[str, Any],
    end: int,
    turn_level: bool,
    config: PostmortemConfig,
    during: int | None = None,
) -> str:
    """The root cause of a collapse at ``end`` (a key of ``CAUSES``) from the alerts and the evidence, by the rules of
    docs/detectors.md's root-cause table. Signs that are the fall itself rather than its precursors (the score
    falling under a held reward, answers shrinking, entropy dying) count up to ``during`` (where the collapse is
    confirmed; default ``end``)."""
    first = _first_of_family(summary, end)
    during = end if during is None else max(end, during)
    first_during = _first_of_family(summary, during)

    def before_all(family: str, others: tuple[str, ...]) -> bool:
        return family in first and all(first[family] < first.get(other, math.inf) for other in others)

    if first_firing(summary, during, critical=True) is None and not first_during:
        return "unexplained"
    if first_firing(summary, during, ("reward_hacking",)) is not None:
        return "reward_hacking"
    ratio_or_kl = min(first_during.get("ratio", math.inf), first_during.get("kl", math.inf))
    shrank = first_firing(summary, during, ("length_collapse",))
    if shrank is not None and shrank < ratio_or_kl:
        return "answer_collapse"
    if before_all("reward_variance", ("ratio", "kl", "entropy", "gradient", "blowup")):
        return "echo_trap"
    entropy_fell = first_firing(summary, during, ("entropy_collapse",), critical=True)
    if entropy_fell is not None and entropy_fell < ratio_or_kl:
        return "entropy_collapse"
    entropy_critical = first_firing(summary, end, ("entropy_rise",), critical=True)
    if entropy_critical is not None and entropy_critical < min(
        first.get("ratio", math.inf), first.get("kl", math.inf)
    ):
        return "entropy_blowup"
    if "ratio" in first or "kl" in first:
        token_clip = evidence.get("token_clip_frac")
        mismatch = not turn_level and (
            (
                _at_least(evidence.get("token_turn_clip_ratio"), config.mismatch_clip_ratio)
                and _at_least(token_clip, config.mismatch_min_clip)
            )
            or _at_least(evidence.get("tail_width_ratio"), config.mismatch_tail_ratio)
        )
        if mismatch:
            return "granularity_mismatch"
        slope, early = evidence.get("clip_frac_per_lag"), evidence.get("clip_frac_per_lag_early")
        if _at_least(slope, config.off_policy_min_slope) and _at_least(
            slope, config.off_policy_growth * max(early or 0.0, 0.0)
        ):
            return "off_policy_variance"
        # stale or reused rollouts whose drift accumulates across iterations rather than within one
        if _at_least(evidence.get("max_policy_lag"), config.off_policy_min_lag) and _at_least(
            evidence.get("clip_frac_growth"), config.off_policy_clip_growth
        ):
            return "off_policy_variance"
        return "optimisation_blowup"
    if "gradient" in first or "blowup" in first:
        return "optimisation_blowup"
    if "entropy" in first:
        rose = first_firing(summary, end, ("entropy_rise",))
        fell = first_firing(summary, end, ("entropy_collapse",))
        return "entropy_collapse" if fell is not None and (rose is None or fell < rose) else "entropy_blowup"
    return "unexplained"


def degeneration_note(evidence: dict[str, Any], config: PostmortemConfig) -> str:
    """Whether the generations degenerated as the entropy blew up, from the length evidence."""
    growth, truncated = evidence.get("length_growth"), evidence.get("truncated_share_max")
    if growth is None and truncated is None:
        return "the run logs no completion length, so degenerate generations could not be checked"
    seen = []
    if _at_least(growth, config.degenerate_length_rise):
        seen.append(f"completions grew to {growth:.2g}× their early length")
    elif growth is not None and 0 < growth <= 1 / config.degenerate_length_rise:
        seen.append(f"completions shrank to {growth:.2g}× their early length")
    if _at_least(truncated, config.degenerate_truncation):
        seen.append(f"up to {truncated:.0%} of them hit the length limit")
    return (
        "degenerate generations: " + "; ".join(seen)
        if seen
        else "completion lengths stayed near their early level"
    )
