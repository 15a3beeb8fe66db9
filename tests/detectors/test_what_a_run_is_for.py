"""A run judged by what it was for: the task score over the optimized reward, on the score's own scale, with
answers that shrink and a reward that is hacked (SYNTHETIC verl file-logger logs, shaped like the agent runs
people report: a teacher's reward rising while the task score, in [-1, 1], falls to its minimum)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from sorl_monitor.diagnose.detectors import DetectorConfig, detect
from sorl_monitor.diagnose.postmortem import postmortem
from sorl_monitor.read.query import open_runs


def verl_log(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps({"step": r["step"], "data": r["data"]}) + "\n" for r in rows))
    return path


def agent_rows(n: int = 120, fall_at: int = 60, hacked: bool = True, shrink: bool = True) -> list[dict]:
    """SYNTHETIC: the score sits near -0.55 then falls to -1.0 from ``fall_at``; the optimized reward keeps
    rising (``hacked``) or falls with it; answers shrink from ~1,200 tokens to 4 (``shrink``)."""
    rows = []
    for step in range(1, n + 1):
        after = max(0, step - fall_at)
        score = -0.55 - 0.45 * min(1.0, after / 8) + 0.01 * math.sin(step)
        optimized = 0.2 + 0.004 * step if hacked else score + 0.1
        length = 1200.0 * (1 - min(1.0, after / 8)) + 4.0 if shrink else 1200.0 + 5 * math.sin(step)
        data = {
            "critic/score/mean": score,
            "critic/rewards/mean": optimized,
            "response_length/mean": length,
            "actor/entropy": 0.4 * (1 - 0.999 * min(1.0, after / 8)) + 1e-4 if shrink else 0.4,
            "actor/pg_loss": 0.01 * math.cos(step),
        }
        rows.append({"step": step, "data": data})
    return rows


def verdict_of(path: Path):
    with open_runs(path) as runs:
        (run_id,) = runs.foreign
        return postmortem(runs, run_id), runs.foreign[run_id].info["config"]["judged"]


def test_a_hacked_reward_over_a_falling_signed_score_is_a_collapse_named_reward_hacking(tmp_path):
    verdict, judged = verdict_of(verl_log(tmp_path / "agent.jsonl", agent_rows()))
    assert judged == {"column": "critic/score/mean", "why": judged["why"], "optimized": "critic/rewards/mean"}
    assert verdict.status in ("collapsed", "collapsing")  # a non-zero exit: 3 or 4
    assert verdict.root_cause == "reward_hacking"
    assert verdict.fall_step is not None and 58 <= verdict.fall_step <= 62


def test_the_same_score_held_is_healthy_though_negative_throughout(tmp_path):
    rows = agent_rows(fall_at=10**6, shrink=False)
    verdict, _ = verdict_of(verl_log(tmp_path / "calm.jsonl", rows))
    assert verdict.status == "healthy" and verdict.first_critical is None


def test_reward_hacking_fires_critical_while_the_optimized_reward_climbs(tmp_path):
    with open_runs(verl_log(tmp_path / "agent.jsonl", agent_rows(shrink=False))) as runs:
        alerts = detect(runs, detectors=["reward_hacking"]).to_pylist()
    critical = [a["step"] for a in alerts if a["severity"] == "critical"]
    assert critical and 60 <= critical[0] <= 80, critical[:3]


def test_answers_shrinking_to_a_few_tokens_are_flagged_and_name_the_cause(tmp_path):
    rows = agent_rows(hacked=False)
    with open_runs(verl_log(tmp_path / "short.jsonl", rows)) as runs:
        (run_id,) = runs.foreign
        alerts = detect(runs, detectors=["length_collapse"]).to_pylist()
        verdict = postmortem(runs, run_id)
    assert alerts and 60 <= alerts[0]["step"] <= 72, alerts[:2]
    assert verdict.status in ("collapsed", "collapsing") and verdict.root_cause == "answer_collapse"


def test_short_answers_that_keep_the_score_are_not_a_length_collapse(tmp_path):
    """A policy learning to answer a multiple-choice question with its letter: the score holds."""
    rows = agent_rows(fall_at=10**6)
    for k, row in enumerate(rows):
        row["data"]["response_length/mean"] = 50.0 if k < 10 else 3.0
    with open_runs(verl_log(tmp_path / "brief.jsonl", rows)) as runs:
        assert detect(runs, detectors=["length_collapse"]).num_rows == 0


def test_the_fall_of_a_signed_score_is_measured_above_its_floor_not_as_a_ratio_to_a_negative_peak(tmp_path):
    """-0.55 -> -0.60 is a tenth of the scale above -1: no alert; a ratio to the peak (-0.60 / -0.55 > 1) would
    call every such run collapsed or never call one."""
    rows = agent_rows(fall_at=10**6, hacked=False, shrink=False)
    for row in rows[60:]:
        row["data"]["critic/score/mean"] -= 0.05
    config = DetectorConfig().replace(reward_drop_critical=0.5)
    with open_runs(verl_log(tmp_path / "dip.jsonl", rows)) as runs:
        (run_id,) = runs.foreign
        assert postmortem(runs, run_id, config).status == "healthy"
        drops = detect(runs, config, detectors=["reward_drop"]).to_pylist()
    assert max((a["value"] for a in drops), default=0.0) < 0.2
