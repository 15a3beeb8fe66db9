"""CPU cost of the SO-GRPO objective against a whole TRL ``GRPOTrainer`` update (not a test).

    python benchmarks/so_grpo_overhead.py [--hidden 64 256] [--steps 12]

For each model size (a Qwen2 built from config, tokenizer in code, CPU, one thread) it trains
``SORLGRPOTrainer`` (loss_type so_grpo, CTN on) for ``--steps`` updates (4 passes per generation batch) and
times each update with the thread's CPU clock (``time.thread_time``: other processes on the machine do not
count). The objective alone — ``policy_objective`` forward and backward on tensors of the update's shape —
is timed the same way, 200 times. Reported: the median reuse-pass update (no generation in it: the smallest
update, so the largest share) and the objective's median, and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from char_tokenizer import CHARACTERS, SPECIAL, char_tokenizer  # noqa: E402  (benchmarks/char_tokenizer.py)
from datasets import Dataset  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM, TrainerCallback  # noqa: E402

from sorl_monitor import Monitor  # noqa: E402
from sorl_monitor.integrations.trl_so_grpo import SORLGRPOConfig, SORLGRPOTrainer  # noqa: E402
from sorl_monitor.remedy.objective import ObjectiveSettings, policy_objective  # noqa: E402

GENERATIONS, COMPLETION, PASSES = 8, 64, 4


class UpdateClock(TrainerCallback):
    """Thread CPU seconds of each optimizer update (``on_step_begin`` → ``on_step_end``)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.thread_time()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.thread_time() - self._start)


def update_seconds(root: Path, hidden: int, steps: int) -> list[float]:
    config = Qwen2Config(
        vocab_size=len(SPECIAL) + len(CHARACTERS),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(root / "model")
    char_tokenizer().save_pretrained(root / "model")
    args = SORLGRPOConfig(
        output_dir=str(root / "out"),
        max_steps=steps,
        logging_steps=1,
        per_device_train_batch_size=GENERATIONS,
        num_generations=GENERATIONS,
        steps_per_generation=1,
        num_iterations=PASSES,
        max_completion_length=COMPLETION,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        ctn="on",
    )
    clock = UpdateClock()
    trainer = SORLGRPOTrainer(
        model=str(root / "model"),
        processing_class=char_tokenizer(),
        args=args,
        reward_funcs=lambda completions, **kw: [float(len(c) % 5) for c in completions],
        train_dataset=Dataset.from_dict({"prompt": ["abc", "hello", "xyz"] * 40}),
        callbacks=[clock],
        monitor=Monitor(root / "runs", "overhead"),
    )
    trainer.train()
    return [s for i, s in enumerate(clock.seconds) if i % PASSES]  # reuse passes: no generation


def objective_seconds(repeats: int = 200) -> list[float]:
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(GENERATIONS, COMPLETION, generator=g) * 3
    mask = (torch.rand(GENERATIONS, COMPLETION, generator=g) < 0.8).float()
    advantages = torch.randn(GENERATIONS, COMPLETION, generator=g)
    settings = ObjectiveSettings(dual_clip=3.0)
    seconds = []
    for _ in range(repeats):
        logp = (old + 0.3 * torch.randn(GENERATIONS, COMPLETION, generator=g)).requires_grad_()
        start = time.thread_time()
        terms = policy_objective(
            logp, old, advantages, mask, turn_level=True, ctn_coef=32.0, settings=settings
        )
        terms.loss.backward()
        seconds.append(time.thread_time() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--steps", type=int, default=12)
    options = parser.parse_args()
    torch.set_num_threads(1)
    objective = statistics.median(objective_seconds())
    print(
        f"objective (turn ratio, dual-clip, CTN; fwd+bwd, {GENERATIONS}×{COMPLETION}): {objective * 1e3:.2f} ms"
    )
    print("| hidden (4 layers) | TRL update (median reuse pass) | objective | share |")
    print("|---|---|---|---|")
    for hidden in options.hidden:
        with tempfile.TemporaryDirectory() as folder:
            update = statistics.median(update_seconds(Path(folder), hidden, options.steps))
        print(
            f"| {hidden} | {update * 1e3:.1f} ms | {objective * 1e3:.2f} ms | {100 * objective / update:.1f} % |"
        )


if __name__ == "__main__":
    main()
