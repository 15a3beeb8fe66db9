"""One TRL ``GRPOTrainer`` update plain, with ``MonitoredGRPOTrainer`` and with ``SORLGRPOTrainer`` (not a test).

    python benchmarks/trl_step_overhead.py [--device cpu|cuda] [--model tiny|qwen2-0.5b] [--rounds 3]
                                           [--steps 8] [--completion 128]

Three variants train the same model (a Qwen2 built from config and saved once, so each trainer loads the same
weights; bf16 on CUDA, generation with transformers, no vLLM) on the same prompts and reward:

- ``grpo``: TRL's own ``GRPOTrainer`` (``loss_type="grpo"``), no monitor;
- ``monitored``: ``MonitoredGRPOTrainer`` with a ``Monitor`` (the token tap, per-module norms, rows on disk);
- ``so_grpo+auto``: ``SORLGRPOTrainer`` with ``SORLGRPOConfig``'s defaults (``loss_type="so_grpo"``, auto-CTN).

Each generation batch makes ``--passes`` optimizer updates; the first one of a batch also generates. Rounds
alternate the variants (``grpo``, ``monitored``, ``so_grpo+auto``, then again), each round a fresh trainer
for ``--steps`` updates whose first generation batch is left out as warm-up. An update's time runs from
``on_step_begin`` to ``on_step_end``, with the device drained at both edges. Reported per variant: the
median update with generation and the median reuse pass (no generation: the smallest update, so the monitor's
and the loss's largest share), and each over the plain ``grpo``'s median − 1.

On CUDA a last table counts the synchronizing calls (``torch.cuda.set_sync_debug_mode``, every blocking copy
and stream/device sync reported) made inside the monitor's part of each update (the token tap, the reward
tap, the callback's hooks that measure module norms and call ``log_update``) and, for ``so_grpo+auto``,
inside the SO-GRPO loss and the CTN switch, per update; the counting runs after the timed rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from char_tokenizer import CHARACTERS, SPECIAL, char_tokenizer  # noqa: E402  (benchmarks/char_tokenizer.py)
from datasets import Dataset  # noqa: E402
from transformers import PrinterCallback, Qwen2Config, Qwen2ForCausalLM, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from sorl_monitor import Monitor  # noqa: E402
from sorl_monitor.integrations.trl import MonitoredGRPOTrainer  # noqa: E402
from sorl_monitor.integrations.trl_so_grpo import SORLGRPOConfig, SORLGRPOTrainer  # noqa: E402

VARIANTS = ("grpo", "monitored", "so_grpo+auto")
MODELS = {  # Qwen2Config kwargs besides the character vocabulary
    "tiny": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    "qwen2-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2),
}  # fmt: skip
MONITOR_PARTS = {  # the monitor's part of a step: methods of the trainer, and of its SorlCallback
    "trainer": ("_tap", "_keep_rewards"),
    "callback": ("on_step_begin", "on_pre_optimizer_step", "on_step_end", "on_log"),
}
LOSS_PARTS = ("_before_micro_batch", "_so_grpo_loss")  # SORLGRPOTrainer's loss and CTN switch


def drain(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class UpdateClock(TrainerCallback):
    """Wall seconds of each optimizer update, the device drained at both edges."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.seconds: list[float] = []
        self._start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        drain(self.device)
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        drain(self.device)
        self.seconds.append(time.perf_counter() - self._start)


class SyncCounter:
    """Counts the synchronizing calls CUDA reports inside wrapped methods, by part (outermost call only)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._depth = 0

    @contextlib.contextmanager
    def watching(self, part: str) -> Iterator[None]:
        if self._depth:
            yield
            return
        self._depth += 1
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                yield
        finally:
            torch.cuda.set_sync_debug_mode(0)
            self._depth -= 1
        self.counts[part] += sum("synchroniz" in str(w.message).lower() for w in caught)

    def wrap(self, owner: Any, names: tuple[str, ...], part: str) -> None:
        for name in names:
            method = getattr(owner, name, None)
            if method is None:
                continue

            def wrapped(*args: Any, _method: Callable[..., Any] = method, **kwargs: Any) -> Any:
                with self.watching(part):
                    return _method(*args, **kwargs)

            setattr(owner, name, functools.wraps(method)(wrapped))


def save_model(root: Path, model: str) -> Path:
    config = Qwen2Config(vocab_size=len(SPECIAL) + len(CHARACTERS), max_position_embeddings=1024, pad_token_id=0,
                         eos_token_id=1, bos_token_id=1, tie_word_embeddings=True, **MODELS[model])  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(root / "model")
    char_tokenizer().save_pretrained(root / "model")
    return root / "model"


def trainer_for(
    variant: str, model: Path, root: Path, options: argparse.Namespace, clock: UpdateClock
) -> Any:
    common = dict(
        output_dir=str(root / "out"), max_steps=options.steps, logging_steps=1,
        per_device_train_batch_size=options.generations, num_generations=options.generations,
        steps_per_generation=1, num_iterations=options.passes, max_completion_length=options.completion,
        report_to=[], use_cpu=options.device == "cpu", bf16=options.device == "cuda", save_strategy="no",
        disable_tqdm=True, seed=0, model_init_kwargs={"dtype": torch.bfloat16} if options.device == "cuda" else None,
    )  # fmt: skip
    args = SORLGRPOConfig(**common) if variant == "so_grpo+auto" else GRPOConfig(**common)
    kwargs: dict[str, Any] = dict(
        model=str(model),
        processing_class=char_tokenizer(),
        args=args,
        reward_funcs=lambda completions, **kw: [float(len(c) % 5) for c in completions],
        train_dataset=Dataset.from_dict({"prompt": ["abc", "hello", "xyz", "search: capital of"] * 64}),
        callbacks=[clock],
    )
    if variant == "grpo":
        return GRPOTrainer(**kwargs)
    monitor = Monitor(root / "runs", f"{variant.replace('+', '-')}-{time.monotonic_ns()}")
    trainer_class = MonitoredGRPOTrainer if variant == "monitored" else SORLGRPOTrainer
    return trainer_class(**kwargs, monitor=monitor)


def run(
    variant: str, model: Path, root: Path, options: argparse.Namespace, syncs: SyncCounter | None
) -> list:
    """(update seconds, whether it generated) of one fresh trainer's updates after its first generation batch."""
    clock = UpdateClock(options.device)
    trainer = trainer_for(variant, model, root, options, clock)
    trainer.remove_callback(PrinterCallback)  # TRL's log lines on stdout
    if syncs is not None and variant != "grpo":
        syncs.wrap(trainer, MONITOR_PARTS["trainer"], "monitor")
        syncs.wrap(trainer.sorl_callback, MONITOR_PARTS["callback"], "monitor")
        if variant == "so_grpo+auto":
            syncs.wrap(trainer, LOSS_PARTS, "loss")
    trainer.train()
    return [(s, i % options.passes == 0) for i, s in enumerate(clock.seconds) if i >= options.passes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--model", choices=list(MODELS), default="tiny")
    parser.add_argument("--rounds", type=int, default=3, help="fresh trainers per variant, alternating")
    parser.add_argument("--steps", type=int, default=8, help="optimizer updates per trainer")
    parser.add_argument("--passes", type=int, default=4, help="updates per generation batch")
    parser.add_argument("--generations", type=int, default=8, help="completions per update (one group)")
    parser.add_argument("--completion", type=int, default=128, help="max completion tokens")
    options = parser.parse_args()
    if options.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "trl_step_overhead: --device cuda, but torch sees no CUDA device\n")
    if options.steps < 2 * options.passes:
        parser.exit(
            2, "trl_step_overhead: --steps must be at least 2 × --passes (the first batch is warm-up)\n"
        )
    if options.device == "cpu":
        torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    times: dict[str, list[tuple[float, bool]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        model = save_model(root, options.model)
        for _ in range(options.rounds):
            for variant in VARIANTS:
                times[variant] += run(variant, model, root, options, None)
        syncs = SyncCounter() if options.device == "cuda" else None
        counted: dict[str, Counter[str]] = {}
        if syncs is not None:
            for variant in VARIANTS[1:]:
                syncs.counts = Counter()
                updates = len(run(variant, model, root, options, syncs)) + options.passes
                parts = ("monitor", "loss") if variant == "so_grpo+auto" else ("monitor",)
                counted[variant] = Counter({part: syncs.counts[part] / updates for part in parts})
    where = torch.cuda.get_device_name() if options.device == "cuda" else "cpu, 1 thread"
    print(f"TRL GRPOTrainer update, {options.model} model ({where}), {options.generations} completions of")
    print(
        f"  ≤ {options.completion} tokens, {options.passes} updates per generation batch; {options.rounds} round(s)"
    )
    print(f"  alternating the variants, {options.steps - options.passes} updates per trainer timed (medians)")
    medians = {}
    for variant in VARIANTS:
        generating = [s for s, g in times[variant] if g]
        reuse = [s for s, g in times[variant] if not g]
        medians[variant] = (statistics.median(generating), statistics.median(reuse))
    base_gen, base_reuse = medians["grpo"]
    for variant in VARIANTS:
        gen, reuse = medians[variant]
        print(f"  {variant:13s} generating {gen * 1e3:8.1f} ms {gen / base_gen - 1:+7.2%}  "
              f"reuse pass {reuse * 1e3:7.1f} ms {reuse / base_reuse - 1:+7.2%}")  # fmt: skip
    if counted:
        for variant, counts in counted.items():
            parts = ", ".join(f"{part} {n:.2f}" for part, n in sorted(counts.items())) or "none"
            print(f"  synchronizing calls per update, {variant}: {parts}")
    else:
        print("  synchronizing calls: n/a (cpu)")


if __name__ == "__main__":
    main()
