"""Hand-written training loops' consoles open (``kv_console``), and the column a run is judged by is found by
name where no name table knows it (``judged``): synthetic logs in the shapes people print."""

from __future__ import annotations

import json
from pathlib import Path

from sorl_monitor.logs import LogOptions, detect_format, read_log


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def judged(run) -> dict:
    return run.info["config"]["judged"]


def test_epoch_and_bracketed_count_lines_open_with_their_steps(tmp_path):
    lines = ["Loading model...", "Batch size: 8"] + [
        f"Epoch:[1/1]({k}/500), Reward: {0.3 + k / 1000:.3f}, Fmt: 0.9, KL_ref: 0.004, Avg Len: {90 - k // 10}"
        for k in range(10, 210, 10)
    ]
    path = write(tmp_path / "train.log", lines)
    assert detect_format(path) == "console"
    (run,) = read_log(path)
    rows = run.steps.to_pylist()
    assert [r["step"] for r in rows] == list(range(10, 210, 10))
    assert rows[0]["avg_len"] == 89 and "batch_size" not in run.steps.column_names  # the header is not a step
    assert judged(run)["column"] == "reward" and rows[-1]["reward_mean"] == 0.5


def test_an_iteration_block_with_a_histogram_averages_its_lines(tmp_path):
    lines = []
    for k in range(1, 13):
        lines += [f"GRPO Iteration: {k}", "Reward histogram:", "  0.0-0.2: ####", "  0.8-1.0: ##"]
        lines += [
            f"  Prompt 1: avg reward = {0.2 + k / 100:.2f}",
            f"  Prompt 2: avg reward = {0.4 + k / 100:.2f}",
        ]
        lines += [f"  Micro-update 1/1: grad_norm={k}.5", f"KL: 0.00{k % 10}"]
    (run,) = read_log(write(tmp_path / "grpo.txt", lines))
    rows = {r["step"]: r for r in run.steps.to_pylist()}
    assert sorted(rows) == list(range(1, 13))  # "Micro-update 1/1" is not the loop's counter
    assert abs(rows[3]["avg_reward"] - 0.33) < 1e-9  # two prompts' rewards averaged
    assert "grpo_iteration" not in run.steps.column_names
    assert judged(run) == {"column": "avg_reward", "why": "the reward, found by its name"}


def test_timestamped_step_lines_with_equals_signs(tmp_path):
    lines = [
        f"2025-09-03 15:10:{k:02d} | INFO | step {k} | reward=0.{k:02d} kl=0.002 loss=-0.04"
        for k in range(1, 31)
    ]
    (run,) = read_log(write(tmp_path / "run.out", lines))
    assert run.steps.num_rows == 30 and run.steps.column("reward_mean").to_pylist()[4] == 0.05


def test_a_jsonl_log_whose_reward_is_mean_reward(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps({"step": k, "loss": -0.05, "mean_reward": k / 100, "kl_div": 0.01}) + "\n"
                            for k in range(1, 21)))  # fmt: skip
    (run,) = read_log(path)
    assert judged(run)["column"] == "mean_reward"
    assert run.steps.column("reward_mean").to_pylist()[:2] == [0.01, 0.02]


def test_a_task_score_beside_the_optimized_reward_is_what_the_run_is_judged_by(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"step": k, "env/all/reward/total": 0.5 + k / 100, "env/all/correct": 0.5 - k / 100}
        for k in range(20)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run,) = read_log(path)
    assert judged(run)["column"] == "env_all_correct"
    assert judged(run)["optimized"] == "env_all_reward_total"
    assert run.steps.column("reward_mean").to_pylist()[1] == 0.49
    assert run.steps.column("reward_optimized_mean").to_pylist()[1] == 0.51


def test_map_overrides_the_inference_and_no_candidate_lists_what_there_is(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(
        "".join(json.dumps({"step": k, "loss": 0.1, "gain": k, "acc": 0.2}) + "\n" for k in range(20))
    )
    (run,) = read_log(path, options=LogOptions.build(["reward=gain"]))
    assert judged(run) == {"column": "gain", "why": "named with --map reward=…", "others": ["acc"]}
    path.write_text("".join(json.dumps({"step": k, "loss": 0.1, "gain": k}) + "\n" for k in range(20)))
    (run,) = read_log(path)
    assert judged(run)["column"] is None and judged(run)["candidates"] == ["loss", "gain"]
