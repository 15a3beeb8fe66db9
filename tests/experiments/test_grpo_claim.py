"""experiments/grpo_claim.py: the pre-registered rule that picks the evaluation setting (synthetic sweep rows)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))  # the script imports collapse_sweep beside it
spec = importlib.util.spec_from_file_location("grpo_claim", EXPERIMENTS / "grpo_claim.py")
grpo_claim = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grpo_claim)


def rows(setting: str, grpo: list[bool], so_holds: list[float], so_collapsed: bool = False) -> list[dict]:
    """Synthetic sweep rows: GRPO's labels per tuning seed, SO-GRPO + auto's holds per tuning seed."""
    out = [{"setting": setting, "variant": "grpo", "seed": s, "collapsed": c, "hold": 0.4}
           for s, c in zip(grpo_claim.TUNING_SEEDS, grpo, strict=True)]  # fmt: skip
    out += [{"setting": setting, "variant": "so_grpo+auto", "seed": s, "collapsed": so_collapsed, "hold": h}
            for s, h in zip(grpo_claim.TUNING_SEEDS, so_holds, strict=True)]  # fmt: skip
    return out


def test_strict_beats_relaxed_and_the_highest_worst_hold_wins():
    sweep = (rows("a", [True, False], [0.95, 0.95]) + rows("b", [True, True], [0.72, 0.90])
             + rows("c", [True, True], [0.80, 0.75]))  # fmt: skip
    chosen, why = grpo_claim.pick(sweep, ["a", "b", "c"])
    assert chosen == "c" and why.startswith("strict")


def test_relaxed_when_no_setting_collapses_grpo_on_every_seed():
    sweep = rows("a", [True, False], [0.71, 0.9]) + rows("b", [False, False], [0.99, 0.99])
    assert grpo_claim.pick(sweep, ["a", "b"])[0] == "a"


def test_a_remedy_that_collapses_or_sags_disqualifies_the_setting():
    sweep = rows("a", [True, True], [0.69, 0.9]) + rows("b", [True, True], [0.9, 0.9], so_collapsed=True)
    chosen, why = grpo_claim.pick(sweep, ["a", "b"])
    assert chosen is None and "no candidate" in why


def test_a_setting_with_unfinished_runs_is_not_picked():
    sweep = rows("a", [True, True], [0.9, 0.9])[:-1]
    chosen, why = grpo_claim.pick(sweep, ["a"])
    assert chosen is None and "unfinished: a" in why
