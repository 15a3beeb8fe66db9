"""A few real updates of every algorithm, logged through the monitor, read back with the query layer."""

from __future__ import annotations

import pytest

from sorl_monitor.read.query import open_runs
from sorl_monitor.remedy import ctn_guard
from sorl_monitor.trainer.algorithms import ALGORITHMS
from sorl_monitor.trainer.config import TrainConfig
from sorl_monitor.trainer.train import train
from tests.helpers.tiny_train import tiny

# The columns the bundled trainer must fill on every update (docs/schema.md, "`steps`: one row per optimizer
# update"): the ratio, clip, KL, entropy, norm, advantage, reward and length statistics every algorithm has,
# and the trainer-given `loss`, `pg_loss`, `ctn_*`, `lr`, `dual_clip_frac`; with a critic also `vf_loss`,
# `value_mean`, `return_mean`; and each `turns` row's columns ("`turns`: one row per (update, episode, turn)")
STEP_COLUMNS = (
    "loss pg_loss ctn_penalty ctn_active ctn_coef lr ratio_mean ratio_min ratio_max ratio_p01 ratio_p99 "
    "log_ratio_std turn_ratio_mean turn_ratio_max seq_ratio_mean clip_frac clip_frac_low clip_frac_high "
    "clip_frac_turn kl_old_k1 kl_old_k3 kl_ref_k3 entropy grad_norm grad_norm_clipped param_norm adv_mean "
    "adv_std reward_mean reward_std zero_std_group_frac response_len_mean turns_mean nonfinite_count "
    "ctn_clip_frac ctn_pull dual_clip_frac"
).split()
CRITIC_COLUMNS = ("vf_loss", "value_mean", "return_mean")
TURN_COLUMNS = (
    "sample_id turn_idx n_tokens ratio_mean log_ratio_sum ratio_max ratio_min clip_frac turn_clipped "
    "advantage return reward kl_k3 entropy"
).split()
KEYS = ("run_id", "rank", "step", "iteration", "ppo_epoch", "minibatch", "policy_lag", "wall_time")


@pytest.mark.slow
def test_every_algorithm_writes_readable_parquet_with_all_design_columns(tmp_path):
    algos = sorted(set(ALGORITHMS) - {"st_ppo"})
    results = {algo: train(tiny(algo, tmp_path)) for algo in algos}
    with open_runs(tmp_path) as runs:
        for algo, result in results.items():
            assert result.status == "finished" and len(result.iteration_rewards) == 2
            steps = runs.sql(f"SELECT * FROM steps WHERE run_id = '{algo}' ORDER BY step").to_pylist()
            assert [row["step"] for row in steps] == list(
                range(8)
            )  # 2 iterations × 2 epochs × 2 mini-batches
            critic = ALGORITHMS[algo].critic
            for column in [*STEP_COLUMNS, *KEYS, *(CRITIC_COLUMNS if critic else ())]:
                assert all(row.get(column) is not None for row in steps), (algo, column)
            assert (
                steps[-1]["policy_lag"] > steps[0]["policy_lag"]
            )  # staleness 1: the lag grows along an iteration
            assert {row["ctn_active"] for row in steps} == {ALGORITHMS[algo].default_ctn == "on"}
            turns = runs.sql(f"SELECT * FROM turns WHERE run_id = '{algo}'").to_pylist()
            assert turns and all(row[c] is not None for row in turns for c in TURN_COLUMNS)
            assert {row["step"] for row in turns} == set(range(8))
            modules = (
                runs.sql(f"SELECT DISTINCT module FROM modules WHERE run_id = '{algo}'").column(0).to_pylist()
            )
            assert any("value_head" in m for m in modules) and len(modules) >= 3
            info = runs.sql(f"SELECT algorithm, status FROM runs WHERE run_id = '{algo}'").to_pylist()[0]
            assert info == {"algorithm": algo, "status": "finished"}


@pytest.mark.slow
def test_log_turns_first_keeps_one_update_of_turn_rows_per_iteration(tmp_path):
    train(tiny("so_ppo", tmp_path, log_turns="first"))
    with open_runs(tmp_path) as runs:
        steps = runs.sql("SELECT DISTINCT step FROM turns ORDER BY step").column(0).to_pylist()
        assert steps == [0, 4]
        assert runs.sql("SELECT count(*) FROM steps").to_pylist()[0]["count_star()"] == 8


@pytest.mark.slow
def test_anneal_lr_decays_the_logged_learning_rate_linearly_to_zero_over_the_iterations(tmp_path):
    cfg = tiny("ppo", tmp_path, anneal_lr=True, lr=1e-3)
    cfg.iterations = 4
    train(cfg)
    with open_runs(tmp_path) as runs:
        rows = runs.sql("SELECT iteration, min(lr) AS lo, max(lr) AS hi FROM steps GROUP BY 1 ORDER BY 1")
    rows = rows.to_pylist()
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    assert all(r["lo"] == r["hi"] for r in rows)  # one rate per rollout batch
    assert [r["lo"] for r in rows] == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])


@pytest.mark.slow
def test_adaptive_ctn_coef_changes_are_logged_as_actions_and_used_by_the_next_rollout_batch(tmp_path):
    # a target far below any clip fraction a 1e-2 learning rate produces: λ must double after each batch
    cfg = tiny("so_ppo", tmp_path, ctn="on", ctn_target_clip=1e-4, ctn_coef=1.0, ctn_coef_max=4.0, lr=1e-2)
    cfg.iterations = 4
    train(cfg)
    with open_runs(tmp_path) as runs:
        coefs = runs.sql(
            "SELECT iteration, min(ctn_coef) AS lo, max(ctn_coef) AS hi FROM steps GROUP BY 1 ORDER BY 1"
        )
        actions = runs.sql(
            "SELECT step, value, message FROM alerts WHERE detector = 'ctn_coef' ORDER BY step"
        )
        clip = runs.sql("SELECT avg(ctn_clip_frac) FROM steps GROUP BY iteration").column(0).to_pylist()
    coefs, actions = coefs.to_pylist(), actions.to_pylist()
    assert all(r["lo"] == r["hi"] for r in coefs)  # one λ per rollout batch
    assert [r["lo"] for r in coefs] == [1.0, 2.0, 4.0, 4.0]  # doubled twice, then held at ctn_coef_max
    assert [r["value"] for r in actions] == [2.0, 4.0] and "target" in actions[0]["message"]
    assert min(clip) > 1.5e-4  # what the controller saw: each batch's mean clip fraction, above the band


def test_lambda_is_not_raised_while_updates_are_gradient_clipped_when_asked(tmp_path):
    # the same far-too-low target as above, but every update is clipped (max_grad_norm 1e-6): λ stays put
    for raise_unclipped, expected in ((True, [1.0, 1.0, 1.0]), (False, [1.0, 2.0, 4.0])):
        cfg = tiny("so_ppo", tmp_path / str(raise_unclipped), ctn="on", ctn_target_clip=1e-4, ctn_coef=1.0,
                   ctn_coef_max=4.0, lr=1e-2, max_grad_norm=1e-6, ctn_raise_unclipped=raise_unclipped)  # fmt: skip
        cfg.iterations = 3
        train(cfg)
        with open_runs(tmp_path / str(raise_unclipped)) as runs:
            coefs = runs.sql("SELECT max(ctn_coef) FROM steps GROUP BY iteration ORDER BY iteration")
        assert coefs.column(0).to_pylist() == expected


def test_warmup_raises_the_learning_rate_linearly_then_anneal_decays_it():
    from sorl_monitor.trainer.train import learning_rate

    cfg = TrainConfig(lr=1e-3, iterations=8, warmup_iterations=4, anneal_lr=False)
    assert [learning_rate(cfg, i) for i in range(6)] == pytest.approx(
        [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3]
    )
    cfg.anneal_lr = True
    assert learning_rate(cfg, 4) == pytest.approx(1e-3 * 0.5)


class ScriptedGuard:
    """A stand-in for ``CtnGuard`` that switches CTN on at its second look (and records each look's step)."""

    looks: list[int] = []

    def __init__(self, *args, start_active: bool = False, **kwargs) -> None:
        ScriptedGuard.looks = []
        self.active = start_active

    def update(self, recent_steps):
        from sorl_monitor.remedy.ctn_guard import GuardDecision

        last_step = max(recent_steps.column("step").to_pylist())
        ScriptedGuard.looks.append(last_step)
        if len(ScriptedGuard.looks) == 2:
            return GuardDecision(True, last_step, "clip_rise", "warning", 4.0, 3.0, "CTN on: scripted")
        return None

    def close(self) -> None:
        pass


def test_auto_ctn_switches_within_a_rollout_batch_and_lambda_judges_only_updates_with_ctn(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(ctn_guard, "CtnGuard", ScriptedGuard)  # the guard guard_for builds
    # 2 epochs × 2 mini-batches = 4 updates per batch; the guard looks after every second update
    cfg = tiny("ppo", tmp_path, ctn="auto", ctn_auto_start="off", ctn_guard_every=2, ctn_target_clip=1e-4,
               ctn_coef=1.0, ctn_coef_max=8.0, lr=1e-2)  # fmt: skip
    train(cfg)
    with open_runs(tmp_path) as runs:
        active = runs.sql("SELECT step, ctn_active, ctn_coef FROM steps ORDER BY step").to_pylist()
        actions = runs.sql(
            "SELECT step, detector FROM alerts WHERE kind = 'action' ORDER BY step"
        ).to_pylist()
    assert ScriptedGuard.looks == [1, 3, 5, 7]  # after updates 2, 4, 6, 8 (steps count from 0)
    # switched on at the second look (after step 3, the end of batch 0): steps 4.. run with CTN
    assert [row["ctn_active"] for row in active] == [False] * 4 + [True] * 4
    assert actions[0] == {"step": 3, "detector": "ctn_on"}
    # batch 0 ran without CTN, so λ's controller first judged batch 1: one doubling, 1 → 2, after step 7
    assert [a["detector"] for a in actions] == ["ctn_on", "ctn_coef"]
    cfg2 = tiny(
        "ppo",
        tmp_path / "mid",
        ctn="auto",
        ctn_auto_start="off",
        ctn_guard_every=1,
        ctn_target_clip=1e-4,
        lr=1e-2,
    )
    train(cfg2)
    assert ScriptedGuard.looks == list(range(8))
    with open_runs(tmp_path / "mid") as runs:
        rows = runs.sql("SELECT ctn_active, ctn_clip_frac FROM steps ORDER BY step").to_pylist()
        change = runs.sql("SELECT message FROM alerts WHERE detector = 'ctn_coef' ORDER BY step LIMIT 1")
    assert [r["ctn_active"] for r in rows] == [False, False] + [True] * 6  # on after the second update
    # the λ change after batch 0 judged its CTN updates (steps 2 and 3), not the two before the switch
    with_ctn = (rows[2]["ctn_clip_frac"] + rows[3]["ctn_clip_frac"]) / 2
    whole_batch = sum(r["ctn_clip_frac"] for r in rows[:4]) / 4
    assert f"{with_ctn:.3f}" != f"{whole_batch:.3f}"  # the two readings tell apart on this run
    assert f"clip fraction {with_ctn:.3f} " in change.column(0)[0].as_py()
    train(tiny("ppo", tmp_path / "default", ctn="auto"))
    assert ScriptedGuard.looks == [3, 7]  # the default: once per rollout batch, after its last update


def test_auto_ctn_armed_from_the_first_update_logs_the_start_like_a_switch(tmp_path, monkeypatch):
    monkeypatch.setattr(ctn_guard, "CtnGuard", ScriptedGuard)  # the guard guard_for builds
    result = train(tiny("ppo", tmp_path, ctn="auto", ctn_auto_start="on"))
    with open_runs(tmp_path) as runs:
        active = runs.sql("SELECT ctn_active FROM steps ORDER BY step").column(0).to_pylist()
        first = runs.sql("SELECT step, detector FROM alerts WHERE kind = 'action' ORDER BY step LIMIT 1")
    assert active == [True] * 8  # on from step 0; the scripted guard never switches it off
    assert first.to_pylist() == [{"step": 0, "detector": "ctn_on"}]
    assert result.ctn_switches[0][:2] == (0, True)
    train(tiny("ppo", tmp_path / "waits", ctn="auto", ctn_auto_start="off"))
    with open_runs(tmp_path / "waits") as runs:
        assert runs.sql("SELECT ctn_active FROM steps WHERE step = 0").column(0).to_pylist() == [False]
