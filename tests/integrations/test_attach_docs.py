"""Every snippet of docs/attach.md runs, with a tiny model on CPU standing in for the reader's."""

from __future__ import annotations

import asyncio
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments
from typer.testing import CliRunner

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.cli.main import app
from sorl_monitor.read.query import open_runs
from tests.helpers import trainer_hooks
from tests.helpers.tiny_lm import (
    NanAfterTwoSteps,
    TokenSequences,
    char_tokenizer,
    save_tiny_qwen2,
    tiny_qwen2,
)
from tests.helpers.verl_calls import call_as_verl_actor, micro_batch, optimizer_step
from tests.helpers.verl_metrics import record
from tests.helpers.verl_reference import ActorConfigStandIn

DOC = Path(__file__).resolve().parents[2] / "docs" / "attach.md"
SNIPPET = re.compile(r"<!-- test: ([\w-]+) -->\n```(\w+)\n(.*?)```", re.DOTALL)


def snippets() -> dict[str, str]:
    return {name: code for name, _, code in SNIPPET.findall(DOC.read_text())}


def steps(run_dir: Path) -> list[dict]:
    with open_runs(run_dir) as runs:
        return runs.sql("SELECT * FROM steps ORDER BY step").to_pylist()


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def trainer_args(tmp_path, **overrides) -> TrainingArguments:
    settings = {"max_steps": 3, "logging_steps": 1, "per_device_train_batch_size": 4, "report_to": [],
                "use_cpu": True, "save_strategy": "no", "disable_tqdm": True, **overrides}  # fmt: skip
    return TrainingArguments(output_dir=str(tmp_path / "out"), **settings)


def test_every_marked_snippet_is_tested():
    assert set(snippets()) == {
        "hf", "hf-stop", "trl", "trl-so-grpo", "verl-loss", "verl-so-ppo", "verl-tracking", "ingest-cli",
        "openrlhf", "roll", "skyrl", "prime-rl", "ranks",
    }  # fmt: skip


def test_hf_snippets_monitor_a_trainer_and_stop_it_on_a_critical_alert(tmp_path):
    namespace = {"Trainer": Trainer, "model": tiny_qwen2(), "args": trainer_args(tmp_path),
                 "train_dataset": TokenSequences()}  # fmt: skip
    exec(snippets()["hf"], namespace)
    assert [row["step"] for row in steps(tmp_path / "runs" / "sft-1")] == [1, 2, 3]
    exec(snippets()["hf-stop"], namespace)
    stopping = Trainer(
        model=NanAfterTwoSteps(), args=trainer_args(tmp_path, max_steps=8, logging_nan_inf_filter=False),
        train_dataset=TokenSequences(), callbacks=[namespace["callback"]],
    )  # fmt: skip
    stopping.train()
    assert stopping.state.global_step == 3


@pytest.mark.slow
def test_trl_snippet_logs_token_metrics_of_a_grpo_run(tmp_path):
    pytest.importorskip("trl")
    from trl import GRPOConfig

    grpo_args = GRPOConfig(
        output_dir=str(tmp_path / "out"), max_steps=2, logging_steps=1, per_device_train_batch_size=4,
        num_generations=4, max_completion_length=6, report_to=[], use_cpu=True, save_strategy="no",
        disable_tqdm=True,
    )  # fmt: skip
    namespace = {
        "model_path": str(save_tiny_qwen2(tmp_path / "model")),
        "reward": lambda completions, **kwargs: [float(len(c)) for c in completions],
        "grpo_args": grpo_args,
        "prompts": Dataset.from_dict({"prompt": ["abc", "hello"] * 4}),
        "tokenizer": char_tokenizer(),
    }
    exec(snippets()["trl"], namespace)
    rows = steps(tmp_path / "runs" / "grpo-1")
    assert [r["step"] for r in rows] == [1, 2] and all(r["ratio_mean"] is not None for r in rows)


@pytest.mark.slow
def test_trl_so_grpo_snippet_trains_with_ctn_and_logs_its_columns(tmp_path):
    pytest.importorskip("trl")
    from sorl_monitor.integrations.trl_so_grpo import SORLGRPOConfig

    so_grpo_args = SORLGRPOConfig(
        output_dir=str(tmp_path / "out"), max_steps=2, logging_steps=1, per_device_train_batch_size=4,
        num_generations=4, max_completion_length=6, report_to=[], use_cpu=True, save_strategy="no",
        disable_tqdm=True, num_iterations=2, loss_type="so_grpo",
    )  # fmt: skip
    namespace = {
        "model_path": str(save_tiny_qwen2(tmp_path / "model")),
        "reward": lambda completions, **kwargs: [float(len(c)) for c in completions],
        "so_grpo_args": so_grpo_args,
        "prompts": Dataset.from_dict({"prompt": ["abc", "hello"] * 4}),
        "tokenizer": char_tokenizer(),
    }
    exec(snippets()["trl-so-grpo"], namespace)
    assert namespace["trainer"].sorl.ctn == "auto" and namespace["trainer"].ctn_active  # armed
    with open_runs(tmp_path / "runs") as runs:
        rows = runs.sql("SELECT step, ctn_active, ctn_coef FROM steps ORDER BY step").to_pylist()
        actions = runs.sql("SELECT detector FROM alerts WHERE kind = 'action'").column(0).to_pylist()
    assert [r["step"] for r in rows] == [1, 2] and all(r["ctn_active"] and r["ctn_coef"] == 32 for r in rows)
    assert actions == ["ctn_on"]


def test_verl_so_ppo_snippet_registers_both_losses(tmp_path, verl_modules_installed):
    exec(snippets()["verl-so-ppo"], {})
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    loss = get_policy_loss_fn("so_ppo")
    assert get_policy_loss_fn("so_grpo") is loss
    for update in range(4):
        call_as_verl_actor(loss, micro_batch(update, 10), ActorConfigStandIn())
        optimizer_step()
    loss.close()
    rows = steps(tmp_path / "runs" / "exp1-actor")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(r["ctn_active"] for r in rows)


def test_verl_loss_snippet_registers_a_loss_verls_actor_can_call(tmp_path, verl_modules_installed):
    exec(snippets()["verl-loss"], {})
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    loss = get_policy_loss_fn("sorl")
    for update in range(2):  # two optimizer steps of two micro-batches
        for seed in (2 * update, 2 * update + 1):
            call_as_verl_actor(loss, micro_batch(seed, 10), ActorConfigStandIn())
        optimizer_step()
    loss.close()
    assert [r["step"] for r in steps(tmp_path / "runs" / "exp1-actor")] == [1, 2]


def test_verl_tracking_snippet_adds_the_backend(tmp_path, verl_modules_installed):
    from verl.utils.tracking import Tracking

    namespace = {"tracking": Tracking("proj", "exp1", default_backend=[])}
    exec(snippets()["verl-tracking"], namespace)
    namespace["tracking"].log(data={"actor/pg_clipfrac": 0.25}, step=1)
    later = Tracking("proj", "exp2", default_backend=[])
    later.log(data={"critic/score/mean": 0.5}, step=1)
    namespace["tracking"].logger["sorl"].finish()
    later.finish()  # a Tracking's finish closes the sorl backend too
    assert steps(tmp_path / "runs" / "exp1-driver")[0]["clip_frac_active"] == 0.25
    assert steps(tmp_path / "runs" / "exp2")[0]["reward_mean"] == 0.5


def test_ingest_commands_run_as_written(tmp_path):
    Path("exp1.jsonl").write_bytes(b"".join(record(step) for step in (1, 2, 3)))
    for line in snippets()["ingest-cli"].strip().splitlines():
        args = shlex.split(line.replace("--idle-timeout 600", "--idle-timeout 0.2"))  # a finished file
        assert args[0] == "sorl"
        result = CliRunner().invoke(app, args[1:])
        assert result.exit_code == 0, result.output
    assert [r["step"] for r in steps(tmp_path / "runs" / "exp1")] == [1, 2, 3]


@pytest.fixture
def trainer_hooks_installed(monkeypatch):
    trainer_hooks.install(monkeypatch)


def test_openrlhf_snippet_adds_a_logger_to_openrlhfs_trainer(tmp_path, trainer_hooks_installed):
    namespace: dict = {}
    exec(snippets()["openrlhf"], namespace)
    namespace["setup"]()  # what Ray's worker_process_setup_hook calls
    from openrlhf.trainer.ppo_trainer import BasePPOTrainer

    trainer = BasePPOTrainer({})
    trainer.save_logs_and_checkpoints(1, {"ppo_clip_ratio": 0.125})
    trainer.tensorboard_logger.close()
    assert steps(tmp_path / "runs" / "exp1")[0]["clip_frac_active"] == 0.125


def test_roll_snippet_registers_a_tracker_rolls_pipeline_can_build(tmp_path, trainer_hooks_installed):
    exec(snippets()["roll"], {})
    from roll.utils.tracking import create_tracker

    tracker = create_tracker("sorl", {"exp_name": "exp1"}, log_dir="runs", run_name="exp1")
    tracker.log(values={"actor/ppo_ratio_clipfrac@sum": 0.25}, step=1)
    tracker.finish()
    assert steps(tmp_path / "runs" / "exp1")[0]["actor_ppo_ratio_clipfrac"] == 0.25


def test_skyrl_snippet_wraps_the_experiments_tracker(tmp_path, trainer_hooks_installed):
    namespace: dict = {}
    exec(snippets()["skyrl"], namespace)
    cfg = SimpleNamespace(trainer=SimpleNamespace(run_name="sky1"))
    tracker = namespace["MonitoredExp"](cfg).get_tracker()
    tracker.log({"policy/loss": 0.5}, step=1, commit=True)
    tracker.finish()
    assert steps(tmp_path / "runs" / "sky1")[0]["policy_loss"] == 0.5


def test_prime_rl_snippet_adds_a_monitor_to_prime_rls(tmp_path, trainer_hooks_installed, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("DP_RANK", raising=False)
    exec(snippets()["prime-rl"], {})
    from prime_rl import monitors

    async def trainer() -> None:
        await monitors.setup(output_dir=tmp_path)
        await monitors.log({"entropy/all/mean": 1.5}, step=1)
        await monitors.finalize()

    asyncio.run(trainer())
    assert steps(tmp_path / "runs" / "exp1-trainer")[0]["entropy"] == 1.5


def test_ranks_snippet_aggregates_a_two_rank_run(tmp_path):
    for rank, noise in ((0, 0.05), (1, 0.5)):
        with Monitor(
            "runs", "dp", rank=rank, world_size=2, writer=WriterConfig(flush_interval_s=0.05)
        ) as mon:
            for step in range(3):
                logp = -torch.rand(2, 8)
                mon.log_update(
                    logp=logp, old_logp=logp + noise * torch.randn(2, 8), mask=torch.ones(2, 8), step=step
                )
    namespace: dict = {}
    exec(snippets()["ranks"], namespace)
    assert namespace["per_step"].num_rows == 3
    skew = {r["rank"]: r["mean_skew"] for r in namespace["per_rank"].to_pylist()}
    assert skew[1] > 0 > skew[0]
