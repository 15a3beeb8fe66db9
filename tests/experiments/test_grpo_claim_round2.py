"""experiments/grpo_claim_round2.py: the rule that picks a (base, remedy) pair (synthetic sweep rows)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))  # the script imports collapse_sweep and grpo_claim beside it
spec = importlib.util.spec_from_file_location("grpo_claim_round2", EXPERIMENTS / "grpo_claim_round2.py")
claim = importlib.util.module_from_spec(spec)
spec.loader.exec_module(claim)

BASE8, BASE10 = (text.partition(":")[0] for text in claim.BASES)
AUTO, UNCLIPPED = claim.REMEDIES


def rows(base: str, variant: str, collapsed: list[bool], holds: list[float]) -> list[dict]:
    """Synthetic rows of one variant at one base, a row per tuning seed."""
    return [{"setting": base, "variant": variant, "seed": s, "collapsed": c, "hold": h}
            for s, c, h in zip(claim.TUNING_SEEDS, collapsed, holds, strict=True)]  # fmt: skip


def test_more_grpo_collapses_win_then_the_worst_hold():
    sweep = (rows(BASE8, "grpo", [True, True, True, False], [0.4] * 4)
             + rows(BASE8, AUTO, [False] * 4, [0.95] * 4)
             + rows(BASE10, "grpo", [True] * 4, [0.2] * 4)
             + rows(BASE10, AUTO, [False] * 4, [0.72, 0.8, 0.8, 0.8])
             + rows(BASE10, UNCLIPPED, [False] * 4, [0.75, 0.8, 0.8, 0.8]))  # fmt: skip
    assert claim.pick(sweep)[0] == (BASE10, UNCLIPPED)


def test_two_grpo_collapses_or_one_sag_disqualify():
    sweep = (rows(BASE8, "grpo", [True, True, False, False], [0.4] * 4)
             + rows(BASE8, AUTO, [False] * 4, [0.95] * 4)
             + rows(BASE10, "grpo", [True] * 4, [0.2] * 4)
             + rows(BASE10, AUTO, [False] * 4, [0.699, 0.8, 0.8, 0.8]))  # fmt: skip
    chosen, why = claim.pick(sweep)
    assert chosen is None and why == "no (base, remedy) pair qualifies"


def test_a_pair_with_a_missing_seed_is_not_picked():
    sweep = rows(BASE10, "grpo", [True] * 4, [0.2] * 4) + rows(BASE10, AUTO, [False] * 4, [0.9] * 4)[:-1]
    assert claim.pick(sweep)[0] is None


def test_round_three_judges_its_own_remedies():
    remedy = claim.ROUND3_REMEDIES[0]
    sweep = rows(BASE10, "grpo", [True, True, True, False], [0.2] * 4) + rows(
        BASE10, remedy, [False] * 4, [0.8] * 4
    )
    assert claim.pick(sweep, claim.ROUND3_BASES, claim.ROUND3_REMEDIES)[0] == (BASE10, remedy)
    assert claim.pick(sweep)[0] is None  # round 2's remedies have no rows here


def test_round_four_remedies_are_so_grpo_trainer_settings():
    from collapse_sweep import parse_setting, parse_variant

    from sorl_monitor.trainer.config import TrainConfig, with_settings

    base = parse_setting(claim.ROUND3_BASES[0])[1]
    for remedy in claim.ROUND4_REMEDIES:
        fields = {**base, **parse_variant(remedy)}
        cfg = with_settings(TrainConfig(), [f"{k}={v}" for k, v in fields.items()])
        assert (cfg.algo, cfg.ctn, cfg.staleness, cfg.lr) == ("so_grpo", "auto", 16, 1e-3)
    proximal, target = (parse_variant(r) for r in claim.ROUND4_REMEDIES)
    assert proximal["ctn_anchor"] == proximal["ctn_clip_level"] == "proximal"
    assert float(target["ctn_target_clip"]) == 0.1


def test_round_five_bases_are_staleness_eight_at_a_higher_lr():
    from collapse_sweep import parse_setting

    parsed = [parse_setting(text) for text in claim.ROUND5_BASES]
    assert [name for name, _ in parsed] == ["stale8lr1.2e-3", "stale8lr1.5e-3"]
    assert all(f["staleness"] == "8" and f["anneal_lr"] == "false" for _, f in parsed)
    sweep = rows("stale8lr1.5e-3", "grpo", [True] * 4, [0.2] * 4) + rows(
        "stale8lr1.5e-3", "so_grpo+auto", [False] * 4, [0.75] * 4
    )
    assert claim.pick(sweep, claim.ROUND5_BASES, claim.ROUND5_REMEDIES)[0] == (
        "stale8lr1.5e-3",
        "so_grpo+auto",
    )


def test_round_six_warms_the_lr_up_in_the_base_so_grpo_gets_it_too():
    from collapse_sweep import parse_setting

    from sorl_monitor.trainer.config import TrainConfig, with_settings

    for text in claim.ROUND6_BASES:
        name, fields = parse_setting(text)
        cfg = with_settings(TrainConfig(algo="grpo"), [f"{k}={v}" for k, v in fields.items()])
        assert (cfg.staleness, cfg.lr, cfg.anneal_lr) == (8, 1.2e-3, False)
        assert name.startswith(f"warm{cfg.warmup_iterations}")


def test_round_seven_bases_and_remedies_are_trainer_settings():
    from collapse_sweep import parse_setting, parse_variant

    from sorl_monitor.trainer.config import TrainConfig, with_settings

    (a, base_a), (b, base_b) = (parse_setting(text) for text in claim.ROUND7_BASES)
    assert a == "warm20stale8lr1.2e-3" and b == "ep256" + a
    assert {k: v for k, v in base_b.items() if k != "episodes"} == base_a and base_b["episodes"] == "256"
    for remedy in claim.ROUND7_REMEDIES:
        cfg = with_settings(
            TrainConfig(), [f"{k}={v}" for k, v in {**base_b, **parse_variant(remedy)}.items()]
        )
        assert (cfg.algo, cfg.ctn, cfg.episodes, cfg.warmup_iterations) == ("so_grpo", "auto", 256, 20)
    assert not set(claim.ROUND7_EVAL_SEEDS) & set(claim.EVAL_SEEDS) and len(claim.ROUND7_EVAL_SEEDS) == 8


def test_round_seven_falls_back_to_the_relaxed_pick_only_with_no_sag_collapse():
    base, (lam32, proximal) = "ep256warm20stale8lr1.2e-3", claim.ROUND7_REMEDIES
    sweep = (rows(base, "grpo", [True, True, True, False], [0.2] * 4)
             + rows(base, lam32, [False] * 4, [0.66, 0.8, 0.8, 0.8])
             + rows(base, proximal, [False, False, False, True], [0.9] * 4))  # fmt: skip
    assert claim.pick(sweep, claim.ROUND7_BASES, claim.ROUND7_REMEDIES)[0] is None
    assert claim.pick_relaxed(sweep, claim.ROUND7_BASES, claim.ROUND7_REMEDIES)[0] == (base, lam32)
    two_sags = rows(base, "grpo", [True] * 4, [0.2] * 4) + rows(
        base, lam32, [False] * 4, [0.6, 0.6, 0.8, 0.8]
    )
    assert claim.pick_relaxed(two_sags, claim.ROUND7_BASES, claim.ROUND7_REMEDIES)[0] is None


def test_round_eight_pushes_grpo_harder_at_256_episodes():
    from collapse_sweep import parse_setting, parse_variant

    from sorl_monitor.trainer.config import TrainConfig, with_settings

    pushed = set()
    for text in claim.ROUND8_BASES:
        name, fields = parse_setting(text)
        cfg = with_settings(
            TrainConfig(),
            [f"{k}={v}" for k, v in {**fields, **parse_variant(claim.ROUND8_REMEDIES[0])}.items()],
        )
        assert (cfg.episodes, cfg.warmup_iterations, cfg.ctn_coef_max) == (256, 20, 32.0)
        pushed.add((cfg.staleness, cfg.lr))
        assert name == f"ep256warm20stale{cfg.staleness}lr{fields['lr']}"
    assert pushed == {(8, 2e-3), (16, 1.2e-3)}
