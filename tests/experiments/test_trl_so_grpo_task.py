"""experiments/trl_so_grpo.py: the bundled search task through TRL's real ``GRPOTrainer`` (CPU, tiny runs).

The rollout hook's episodes are real (the env plays them with the warm-started policy); nothing is injected.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from sorl_monitor.read.query import open_runs  # noqa: E402
from sorl_monitor.trainer.env import SearchEnv  # noqa: E402
from sorl_monitor.trainer.policy import PolicyWithValue  # noqa: E402
from sorl_monitor.write.metrics import turn_ids_from_mask  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "trl_so_grpo.py"
spec = importlib.util.spec_from_file_location("trl_so_grpo_script", SCRIPT)
script = importlib.util.module_from_spec(spec)
sys.modules["trl_so_grpo_script"] = script
spec.loader.exec_module(script)

TINY = [
    "episodes=16",
    "group_size=8",
    "epochs=2",
    "minibatches=2",
    "warmstart_steps=5",
    "warmstart_cache=none",
]
"""A few seconds per run: 16 episodes per batch, 2 mini-batches × 2 passes, a 5-batch warm start."""


def test_prompts_map_back_to_the_questions_they_were_sampled_from():
    env = SearchEnv()
    questions = env.sample_questions(32, torch.Generator().manual_seed(0))
    back = script.task_questions(env, [env.vocab.decode(ids) for ids in questions.prompts])
    for name in ("prompts", "start", "relations", "hops", "answer"):
        assert torch.equal(getattr(back, name), getattr(questions, name)), name


def test_the_rollout_fields_carry_the_envs_turns_as_runs_of_one_in_env_mask():
    """Episodes played by the env's demonstrator (1-3 searches, then an answer; some err): real multi-turn play."""
    env = SearchEnv()
    generator = torch.Generator().manual_seed(1)
    questions = env.sample_questions(32, generator)
    episodes = env.play(questions, env.expert(questions, 0.4, generator))
    out = script.rollout_fields(env, episodes)
    assert len(out["completion_ids"]) == len(out["env_mask"]) == len(out["logprobs"]) == 32
    assert out["env_reward"] == episodes.rewards.tolist() and 0 < sum(out["env_reward"]) < 32
    for i, (ids, mask) in enumerate(zip(out["completion_ids"], out["env_mask"], strict=True)):
        turns = turn_ids_from_mask(torch.tensor([mask]))[0]
        assert int(turns.max()) + 1 == int(episodes.n_turns[i]) == int(questions.hops[i]) + 1
        assert turns.tolist() == [j // 7 if j % 7 < 4 else -1 for j in range(len(mask))]  # 4 agent, 3 env
        assert out["prompt_ids"][i] + ids == episodes.tokens[i, : env.prompt_len + len(ids)].tolist()
        assert env.vocab.decode(ids[-4:]).startswith("<answer>")  # ends on the answer turn
    assert max(len(ids) for ids in out["completion_ids"]) == 7 * 4 - 3  # 3 hops: 4 turns


def test_the_rollout_hook_samples_with_the_learner_as_it_was_staleness_batches_ago():
    env = SearchEnv()
    torch.manual_seed(0)
    learner = PolicyWithValue(len(env.vocab), env.seq_len)
    rollout = script.StaleRollout(env, PolicyWithValue(len(env.vocab), env.seq_len), 1, 1.0, seed=0)
    prompts = [env.vocab.decode(ids) for ids in env.sample_questions(8, torch.Generator()).prompts]
    first = learner.lm.state_dict()["lm_head.weight"].clone()
    for step in range(3):
        rollout(prompts, Trainer(learner.lm))
        with torch.no_grad():
            learner.lm.lm_head.weight.add_(1.0)  # a stand-in optimizer step between batches
        lag = max(step - 1, 0)  # batch 0: the learner itself; later: one batch behind
        assert torch.equal(rollout.behaviour.lm.lm_head.weight, first + lag)
    assert len(rollout.iteration_rewards) == 3


class Trainer:
    """What the rollout hook reads of TRL's trainer: its model."""

    def __init__(self, model):
        self.model = model


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["grpo", "so_grpo+auto"])
def test_the_script_trains_through_trl_and_writes_a_labelled_run(tmp_path, variant, capsys):
    steps = 3
    code = script.main(
        ["--seeds", "0", "--steps", str(steps), "--variants", variant, "--log-dir", str(tmp_path),
         "--markdown", str(tmp_path / "table.md"), "--set", *TINY, "staleness=1"]
    )  # fmt: skip
    assert code == 0
    run_dir = tmp_path / f"{variant.replace('+', '-')}-s0"
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["iterations_done"] == steps
    with open_runs(run_dir) as runs:
        rows = runs.sql("SELECT * FROM steps ORDER BY step").to_pylist()
        turns = runs.sql("SELECT count(*) AS n FROM turns").to_pylist()[0]["n"]
    assert [r["step"] for r in rows] == list(range(1, steps * 4 + 1))
    assert {r["iteration"] for r in rows} == set(range(steps))
    assert turns > 0  # the env's turns reach the monitor's turns table
    first = rows[0]  # batch 0 is sampled by the learner itself: the sampler's log-probs, token for token
    assert first["kl_old_k3"] < 1e-4 and first["clip_frac"] == 0
    if variant == "so_grpo+auto":
        assert all(r["ctn_active"] for r in rows)  # armed from the first update (the adapter's default)
    table = (tmp_path / "table.md").read_text()
    assert f"| {variant} | " in table and "collapsed" in table
    assert "seed   0" in capsys.readouterr().out


def test_bad_arguments_are_one_line_and_exit_2(capsys):
    assert script.main(["--variants", "ppo+auto"]) == 2
    assert script.main(["--set", "lr=-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)


def test_a_setting_the_trl_path_would_ignore_is_refused_in_one_line(capsys):
    assert script.main(["--set", "ent_coef=0.01"]) == 2
    assert script.main(["--set", "iterations=5"]) == 2
    first, second = capsys.readouterr().err.strip().splitlines()
    assert first.startswith("error: --set ent_coef: not used by the TRL path;")
    assert second.startswith("error: --set iterations: not used by the TRL path (use --steps);")
    script.check_assignments(["task.max_hops=2", "policy.layers=1", "dual_clip=3", *TINY])  # all honoured


def test_the_lr_schedule_is_the_bundled_trainers_warm_up_then_constant_or_decay():
    from sorl_monitor.trainer.config import TrainConfig

    updates = 8 * 4  # epochs × minibatches: optimizer steps per generation batch
    assert script.lr_schedule(TrainConfig(anneal_lr=False, warmup_iterations=20)) == {
        "lr_scheduler_type": "constant_with_warmup", "warmup_steps": 20 * updates}  # fmt: skip
    assert script.lr_schedule(TrainConfig(anneal_lr=False)) == {
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
    }
    assert script.lr_schedule(TrainConfig(warmup_iterations=3)) == {
        "lr_scheduler_type": "linear", "warmup_steps": 3 * updates}  # fmt: skip


def test_so_grpo_knobs_reach_the_adapters_config_only_when_set(tmp_path):
    from sorl_monitor.integrations.trl_so_grpo import SORLGRPOConfig
    from sorl_monitor.trainer.config import TrainConfig, with_settings

    knobs = ["turn_ratio=mean", "dual_clip=2.5", "ctn_coef=16", "ctn_target_clip=0.1", "ctn_coef_max=64",
             "ctn_kl_cap=2", "ctn_quiet_updates=512", "ctn_auto_start=off", "ctn_guard_every=4"]  # fmt: skip
    assert sorted(k.partition("=")[0] for k in knobs) == sorted(script.PASSED_TO_SORL)
    cfg = with_settings(TrainConfig(), [*knobs, "lr=1e-3"])
    fields = script.sorl_fields(cfg, [*knobs, "lr=1e-3"])
    assert "lr" not in fields and fields["dual_clip"] == 2.5 and fields["ctn_auto_start"] == "off"
    args = SORLGRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], **fields, **script.lr_schedule(cfg)
    )
    assert (args.dual_clip, args.ctn_coef_max, args.turn_ratio, args.ctn_guard_every) == (
        2.5,
        64.0,
        "mean",
        4,
    )
    assert script.sorl_fields(with_settings(TrainConfig(), ["lr=1e-3"]), ["lr=1e-3"]) == {}
