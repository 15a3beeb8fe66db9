"""Console logs as trainers print them: verl's console logger, Hugging Face ``Trainer``'s printed dicts."""

from __future__ import annotations

import math
import pprint
import warnings

import numpy as np
import pytest

from sorl_monitor.logs import LogWarning, detect_format, hf_console, read_log, verl_console
from tests.helpers.same_steps import assert_same_steps, parquet_steps
from tests.helpers.trainer_console import run_trainer

RAY_PREFIX = "\x1b[36m(TaskRunner pid=14640)\x1b[0m "
# synthetic metrics, printed as verl's LocalLogger prints a step (concat_dict_to_str)
VERL_METRICS = {
    step: {
        "actor/entropy": np.float64(0.5 + 0.01 * step),
        "actor/pg_clipfrac": np.float64(0.002 * step),
        "actor/kl_loss": np.float32(0.25 * step),
        "critic/score/mean": np.float64(0.3),
        "response_length/mean": np.int64(100 + step),
        "actor/grad_norm": float("nan") if step == 3 else 1.5,
        "timing_s/gen": float("inf") if step == 4 else 2.0,
    }
    for step in range(1, 6)
}


def concat_pformat(metrics: dict, step: int) -> str:
    """verl since mid-2025: ``f"{k}:{pprint.pformat(v)}"`` (NumPy 2 writes ``np.float64(0.5)``)."""
    return " - ".join([f"step:{step}", *(f"{k}:{pprint.pformat(v)}" for k, v in metrics.items())])


def concat_3f(metrics: dict, step: int) -> str:
    """verl up to mid-2025: ``f"{k}:{v:.3f}"``."""
    return " - ".join([f"step:{step}", *(f"{k}:{v:.3f}" for k, v in metrics.items())])


def write_verl_console(path, concat, steps=VERL_METRICS, preamble_lines=3):
    lines = [
        "Job submission server address: http://localhost:8265",
        "2025-05-22 07:03:31,997\tINFO job_manager",
    ]
    lines += [
        f"{RAY_PREFIX}{{'actor_rollout_ref': {{'lr': 1e-06, 'step': {i}}}}}" for i in range(preamble_lines)
    ]
    for step, metrics in steps.items():
        lines.append(f"{RAY_PREFIX}list(reward_extra_infos_dict.keys())=[]")
        lines.append(RAY_PREFIX + concat(metrics, step))
        lines.append(f"Training Progress:  23%|██▎       | {step}/435 [00:11<1:05:35, 11.78s/it]")
    path.write_text("\n".join(lines) + "\n")
    return path


def as_floats(steps, digits=None):
    def value(v):
        v = float(v)
        return v if digits is None or not math.isfinite(v) else round(v, digits)

    return {step: {k: value(v) for k, v in metrics.items()} for step, metrics in steps.items()}


def test_synthetic_verl_console_pformat_values_read_as_the_numbers(tmp_path):
    path = write_verl_console(tmp_path / "verl.log", concat_pformat)
    assert "np.float64(0.51)" in path.read_text()  # the NumPy 2 repr verl prints
    assert detect_format(path) == "verl-console"
    (run,) = read_log(path)
    assert (run.format, run.family) == ("verl-console", "verl")
    assert_same_steps(run, parquet_steps(tmp_path / "ref", as_floats(VERL_METRICS), family="verl"))


def test_synthetic_verl_console_3f_values_and_a_long_preamble(tmp_path):
    path = write_verl_console(tmp_path / "verl.log", concat_3f, preamble_lines=3000)
    assert path.stat().st_size > 1 << 16  # the first step line is past the 64 KiB the other formats sniff
    assert detect_format(path) == "verl-console"
    (run,) = read_log(path)
    assert_same_steps(run, parquet_steps(tmp_path / "ref", as_floats(VERL_METRICS, 3), family="verl"))


def test_synthetic_verl_console_resumed_step_keeps_the_later_line_and_a_half_line_waits(tmp_path):
    path = write_verl_console(tmp_path / "verl.log", concat_pformat)
    with path.open("a") as handle:
        handle.write(RAY_PREFIX + concat_pformat({"actor/entropy": 9.0}, 5) + "\n")
        handle.write(RAY_PREFIX + "step:6 - actor/entropy:0.7 - actor/pg_clip")  # still being written
    (run,) = read_log(path)
    rows = {row["step"]: row for row in run.steps.to_pylist()}
    assert sorted(rows) == [1, 2, 3, 4, 5]
    assert rows[5]["entropy"] == 9.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.41", 0.41),
        ("np.float64(0.002)", 0.002),
        ("np.int64(12)", 12.0),
        ("numpy.float32(1.5)", 1.5),
        ("tensor(0.25)", 0.25),
        ("tensor(0.25, device='cuda:0')", 0.25),
        ("-inf", -math.inf),
        ("True", 1.0),
        ("'text'", None),
        ("np.float64(abc)", None),
    ],
)
def test_verl_console_values(text, expected):
    assert verl_console.number(text) == expected


def test_verl_console_line_is_not_global_step_nor_prose():
    assert verl_console.parse_line("training/global_step:101.000 - actor/entropy:0.4") is None
    assert verl_console.parse_line("resuming from step:100") is None
    assert verl_console.parse_line("x step:7 - a/b:1 - c:oops") == (7, {"a/b": 1.0})


@pytest.fixture(scope="module")
def trainer_console(tmp_path_factory):
    return run_trainer(tmp_path_factory.mktemp("trainer"), max_steps=12, logging_steps=3, eval_steps=6)


def _training_rows(log_history):
    return [r for r in log_history if "loss" in r and not any(k.startswith("eval_") for k in r)]


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["interleaved", "buffered"])
def test_a_real_trainer_console_reads_as_its_log_history(tmp_path, trainer_console, shape):
    path = tmp_path / "train.log"
    path.write_text(getattr(trainer_console, shape))
    assert detect_format(path) == "hf-console"
    (run,) = read_log(path)
    expected = _training_rows(trainer_console.log_history)
    rows = run.steps.to_pylist()
    assert [r["step"] for r in rows] == [r["step"] for r in expected]  # evaluation and summary dicts left out
    for row, truth in zip(rows, expected, strict=True):
        assert math.isclose(row["loss"], truth["loss"], rel_tol=1e-3)  # printed with 4 significant digits
        assert math.isclose(row["lr"], truth["learning_rate"], rel_tol=1e-3)
    assert not any(c.startswith("eval") for c in run.steps.column_names)
    rule = run.info["config"]["step_rule"]
    assert rule == ("bar" if shape == "interleaved" else "logging_steps 3 × rank")


@pytest.mark.slow
def test_logging_steps_given_wins(tmp_path, trainer_console):
    path = tmp_path / "train.log"
    path.write_text(trainer_console.buffered)
    (run,) = hf_console.read(path, "run", logging_steps=4)
    assert run.steps.column("step").to_pylist() == [4, 8, 12, 16]


def test_synthetic_printed_dicts_without_a_bar_use_printed_logging_steps_or_ranks(tmp_path):
    dicts = [
        "{'loss': 0.5, 'grad_norm': nan, 'reward': 0.1, 'kl': inf, 'epoch': 0.01}",
        "{'eval_loss': 0.4, 'epoch': 0.01}",
        "{'loss': 0.4, 'grad_norm': 1.0, 'reward': -inf, 'kl': 0.2, 'epoch': 0.02}",
        "{'train_runtime': 9.0, 'train_loss': 0.45, 'epoch': 0.02}",
    ]
    path = tmp_path / "printed.log"
    path.write_text("TrainingArguments(logging_steps=10, output_dir='out')\n" + "\n".join(dicts) + "\n")
    (run,) = read_log(path)
    rows = run.steps.to_pylist()
    assert [r["step"] for r in rows] == [10, 20]
    assert (
        math.isnan(rows[0]["grad_norm"])
        and rows[0]["kl_ref"] == math.inf
        and rows[1]["reward_mean"] == -math.inf
    )
    bare = tmp_path / "bare.log"
    bare.write_text("\n".join(dicts) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (run,) = read_log(bare)
    assert run.steps.column("step").to_pylist() == [1, 2]
    assert any(issubclass(w.category, LogWarning) and "ranks" in str(w.message) for w in caught)


@pytest.mark.parametrize(
    "line",
    [
        "{'loss': __import__('os').getcwd(), 'epoch': 1}",  # not a literal
        "{'loss': {'nested': 1}, 'epoch': 1}",  # not flat
        "{'loss': 0.1, 'epoch': 1" + ", 'x': 1" * 20000 + "}",  # longer than MAX_DICT_CHARS
    ],
)
def test_hf_console_refuses_what_is_not_a_flat_literal_dict(line):
    assert hf_console.parse_dict(line) is None


def test_synthetic_older_verl_entropy_name_fills_entropy_only_when_the_newer_is_absent(tmp_path):
    older = {1: {"actor/entropy_loss": 0.3, "actor/pg_clipfrac": 0.01}}
    (run,) = read_log(write_verl_console(tmp_path / "old.log", concat_3f, steps=older))
    assert run.steps.column("entropy").to_pylist() == [0.3]
    both = {1: {"actor/entropy": 0.5, "actor/entropy_loss": 0.3, "actor/pg_clipfrac": 0.01}}
    (run,) = read_log(write_verl_console(tmp_path / "new.log", concat_3f, steps=both))
    assert run.steps.column("entropy").to_pylist() == [0.5]


@pytest.mark.parametrize(
    "line",
    [
        "{'loss': '3.647', 'grad_norm': 1.04, 'learning_rate': 4.167e-05, 'epoch': 0.19}",
        "{'loss': 0.5, 'flag': True, 'none': None, 'neg': -1.5e-3, 'text': 'it is', 'epoch': 1}",
        "{'loss': \"it's\", 'epoch': 1}",  # double quotes: literal_eval's path
    ],
)
def test_hf_console_fast_path_reads_what_literal_eval_reads(line):
    import ast

    expected = {k: float(v) if isinstance(v, int) and not isinstance(v, bool) else v
                for k, v in ast.literal_eval(line).items()}  # fmt: skip
    assert hf_console.parse_dict("prefix " + line) == expected


def test_hf_console_fast_path_reads_bare_non_finite_values():
    logs = hf_console.parse_dict("{'loss': nan, 'kl': -inf, 'epoch': 0.5}")
    assert math.isnan(logs["loss"]) and logs["kl"] == -math.inf and logs["epoch"] == 0.5


def test_synthetic_verl_console_validation_only_line_is_left_out_and_a_comma_first_line_is_no_csv(tmp_path):
    path = tmp_path / "verl.log"
    lines = [
        "2025-05-22 07:03:31,997\tINFO job_manager.py:531 -- Runtime env is setting up.",  # a comma: CSV-like
        RAY_PREFIX + "step:0 - val-core/openai/gsm8k/reward/mean@1:0.81",  # val_before_train
        RAY_PREFIX + "step:1 - actor/entropy:0.5 - val-core/openai/gsm8k/reward/mean@1:0.82",
        RAY_PREFIX + "step:2 - actor/entropy:0.4",
    ]
    path.write_text("\n".join(lines) + "\n")
    assert detect_format(path) == "verl-console"
    (run,) = read_log(path)
    assert run.steps.column("step").to_pylist() == [1, 2]
    assert run.steps.column("val_core_openai_gsm8k_reward_mean_1").to_pylist() == [0.82, None]


def test_python_code_with_a_log_dict_is_not_a_console_log(tmp_path):
    code = tmp_path / "train.py"
    code.write_text("logs = {'loss': 0.1, 'epoch': 1.0}\nprint(logs)\n")
    assert detect_format(code) is None
    ray = tmp_path / "ray.log"
    ray.write_text("(RayTrainWorker pid=7) {'loss': 0.1, 'epoch': 1.0}\n")
    assert detect_format(ray) == "hf-console"
