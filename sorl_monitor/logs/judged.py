"""Which logged column a run is judged by: the task score when the log carries one, else the reward.

A trainer optimizes a reward; the run is for a task. Where a log carries a task score beside that reward
(verl's ``critic/score/mean`` beside ``critic/rewards/mean``; an accuracy, pass rate or correctness reward beside
TRL's summed ``reward``; Tinker's ``env/all/correct`` beside ``env/all/reward/total``), the collapse label
follows the score and the optimized reward is kept beside it as ``reward_optimized_mean`` (the
``reward_hacking`` detector reads both). Where a log names its reward in a way no name table knows
(``mean_reward``, ``Reward``, ``avg reward``), the reward is found by its name. The choice, the optimized
reward and the other candidates go to the run's config as ``judged``, which the verdict prints; ``--map
reward=NAME`` overrides it. A log with no candidate at all is left unjudged (``not_judged``) with the columns
that might have been listed.

Candidates are numeric columns with at least ``MIN_VALUES`` finite values whose snake-cased name has a word that
says score (``SCORE_WORDS``) or reward (``REWARD_WORDS``) and none that says it is a spread, a part or something
else (``NOT_A_MEAN``); a name with a mean word (``mean``, ``avg``, ``total``) is preferred, then a training
one over an evaluation one (``val``, ``eval``, ``test``), then the most values, then the shortest name.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sorl_monitor.logs.table import ForeignRun

JUDGED = "reward_mean"
OPTIMIZED = "reward_optimized_mean"
MIN_VALUES = 10
SCORE_WORDS = frozenset(
    {"acc", "accuracy", "correct", "correctness", "pass", "passrate", "pass_rate", "pass@1", "success",
     "solved", "solve", "exact", "em", "win", "winrate", "score", "performance", "answer"}
)  # fmt: skip
REWARD_WORDS = frozenset({"reward", "rewards", "return"})
NOT_A_MEAN = frozenset(
    {"std", "min", "max", "var", "variance", "count", "num", "frac", "zero", "format", "fmt", "len", "length",
     "time", "kl", "loss", "lr", "penalty", "advantage", "advantages", "adv", "ratio", "change", "diff",
     "difference", "delta", "initial", "baseline", "value", "values", "clip", "p10", "p50", "p90",
     "median", "stderr", "sem", "weight", "coef", "scale", "fn_std", "magnitude", "tokens"}
)  # fmt: skip
MEAN_WORDS = frozenset({"mean", "avg", "average", "total", "overall", "all"})
EVAL_WORDS = frozenset({"val", "eval", "evaluation", "test", "valid", "validation"})
_SPLIT = re.compile(r"[^a-z0-9@]+")


def words(column: str) -> list[str]:
    return [w for w in _SPLIT.split(column.lower()) if w]


def _kind(column: str) -> str | None:
    said = set(words(column))
    if said & NOT_A_MEAN:
        return None
    if said & SCORE_WORDS:
        return "score"
    if said & REWARD_WORDS:
        return "reward"
    return None


def _values(steps: pa.Table, column: str) -> int:
    values = steps.column(column)
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
        return 0
    finite = pc.is_finite(values.cast(pa.float64()))
    return int(pc.sum(finite).as_py() or 0)


def _rank(column: str, count: int) -> tuple:
    said = set(words(column))
    return (not (said & MEAN_WORDS), bool(said & EVAL_WORDS), -count, len(column))


def _enough(run: ForeignRun) -> int:
    """Values a candidate needs: ``MIN_VALUES``, or half the rows of a shorter log."""
    return max(1, min(MIN_VALUES, run.steps.num_rows // 2))


def candidates(run: ForeignRun) -> dict[str, list[str]]:
    """``{"score": [...], "reward": [...]}``: the run's candidate columns, best first."""
    found: dict[str, list[tuple[tuple, str]]] = {"score": [], "reward": []}
    enough = _enough(run)
    for column in run.steps.column_names:
        if column in (JUDGED, OPTIMIZED) or column in ("run_id", "rank", "step", "wall_time"):
            continue
        kind = _kind(column)
        if kind is None:
            continue
        count = _values(run.steps, column)
        if count >= enough:
            found[kind].append((_rank(column, count), column))
    return {kind: [c for _, c in sorted(items)] for kind, items in found.items()}


def _source_name(run: ForeignRun, column: str) -> str:
    """The name the log gave ``column`` (the run's name table read backwards), else the column."""
    from sorl_monitor.metric_names import names_for

    if run.family:
        for name, mapped in names_for(run.family).items():
            if mapped == column:
                return name
    return column


def _same(steps: pa.Table, a: str, b: str) -> bool:
    """Whether two columns hold the same numbers (verl's rewards equal its score when no KL is in the reward)."""
    left, right = steps.column(a).cast(pa.float64()), steps.column(b).cast(pa.float64())
    differs = pc.greater(pc.abs(pc.subtract(left, right)), 1e-9)
    return not pc.any(pc.fill_null(differs, False)).as_py()


def _set(run: ForeignRun, column: str, values: pa.ChunkedArray) -> None:
    values = values.cast(pa.float64())
    steps = run.steps
    if column in steps.column_names:
        run.steps = steps.set_column(steps.column_names.index(column), column, values)
    else:
        run.steps = steps.append_column(column, values)


def judge(run: ForeignRun, mapped_reward: str | None = None) -> dict[str, Any]:
    """Choose the column ``run`` is judged by (module docstring), fill ``reward_mean`` (and
    ``reward_optimized_mean``) with it, and record the choice in ``run.info["config"]["judged"]``."""
    found = candidates(run)
    has_reward = JUDGED in run.steps.column_names and _values(run.steps, JUDGED) > 0
    choice: dict[str, Any]
    if mapped_reward is not None:
        choice = {"column": mapped_reward, "why": "named with --map reward=…"}
    elif run.family == "verl" and has_reward:
        choice = {
            "column": "critic/score/mean",
            "why": "verl's task score (the reward function's, before any KL penalty)",
        }
        rewards = "critic_rewards_mean"
        if (
            rewards in run.steps.column_names
            and _values(run.steps, rewards)
            and not _same(run.steps, rewards, JUDGED)
        ):
            _set(run, OPTIMIZED, run.steps.column("critic_rewards_mean"))
            choice["optimized"] = "critic/rewards/mean"
    elif found["score"]:
        score = found["score"][0]
        reward = JUDGED if has_reward else (found["reward"][0] if found["reward"] else None)
        if reward is not None and _same(run.steps, reward, score):
            reward = None  # the reward is the score (a correctness reward logged twice)
        choice = {"column": score, "why": "a task score beside the reward the trainer optimizes" if reward
                  else "a task score"}  # fmt: skip
        if reward is not None:
            _set(run, OPTIMIZED, run.steps.column(reward))
            choice["optimized"] = _source_name(run, reward) if reward == JUDGED else reward
        _set(run, JUDGED, run.steps.column(score))
    elif has_reward:
        choice = {"column": _source_name(run, JUDGED), "why": "the reward, by the trainer's name table"}
    elif found["reward"]:
        reward = found["reward"][0]
        _set(run, JUDGED, run.steps.column(reward))
        choice = {"column": reward, "why": "the reward, found by its name"}
    else:
        choice = {"column": None, "why": "no column says reward, score or accuracy",
                  "candidates": _numeric_columns(run)[:8]}  # fmt: skip
    used = {choice.get("column"), choice.get("optimized"), *_columns_named(choice.get("optimized"))}
    others = [c for kind in ("score", "reward") for c in found[kind] if c not in used]
    if others and choice.get("column") is not None:
        choice["others"] = others[:4]
    config = run.info.setdefault("config", {})
    if isinstance(config, dict):
        config["judged"] = choice
    return choice


def _columns_named(name: str | None) -> list[str]:
    """The columns a logged name may be stored under (itself, snake-cased)."""
    from sorl_monitor.schema import column_name

    return [] if name is None else [name, column_name(name)]


def _numeric_columns(run: ForeignRun) -> list[str]:
    return [
        c for c in run.steps.column_names
        if c not in ("run_id", "rank", "step", "wall_time") and _values(run.steps, c) >= _enough(run)
    ]  # fmt: skip
