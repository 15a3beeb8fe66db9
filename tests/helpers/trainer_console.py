"""A real ``transformers.Trainer`` run (a tiny GPT-2 built from its config, random tokens) with its console
captured twice over: as a terminal shows it (stdout and stderr in one stream, as written) and as ``nohup`` or
``> log 2>&1`` keeps it when stdout is block-buffered (the bar's stream first, the printed dicts after)."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


class _Tee(io.TextIOBase):
    """Writes to two text buffers; ``isatty`` False, like a file."""

    def __init__(self, *targets: io.StringIO) -> None:
        self.targets = targets

    def write(self, text: str) -> int:
        for target in self.targets:
            target.write(text)
        return len(text)

    def flush(self) -> None:
        pass


@dataclass
class TrainerConsole:
    interleaved: str
    """stdout and stderr in one stream, in the order written (a terminal, or ``PYTHONUNBUFFERED``)."""
    buffered: str
    """stderr as written, then stdout (a block-buffered stdout flushed at exit)."""
    log_history: list[dict[str, Any]]
    """``trainer.state.log_history``: the steps and values the console shows."""


def run_trainer(
    output_dir: Path, *, max_steps: int = 12, logging_steps: int = 3, eval_steps: int | None = 6
) -> TrainerConsole:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16)
    model = transformers.GPT2LMHeadModel(config)
    data = [
        {"input_ids": torch.randint(0, 64, (8,)), "labels": torch.randint(0, 64, (8,))} for _ in range(64)
    ]
    args = transformers.TrainingArguments(
        output_dir=str(output_dir),
        max_steps=max_steps,
        logging_steps=logging_steps,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        disable_tqdm=False,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        eval_strategy="steps" if eval_steps else "no",
        eval_steps=eval_steps,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=data, eval_dataset=data[:16] if eval_steps else None
    )
    both, out, err = io.StringIO(), io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(_Tee(both, out)), contextlib.redirect_stderr(_Tee(both, err)):
        trainer.train()
    return TrainerConsole(both.getvalue(), err.getvalue() + out.getvalue(), trainer.state.log_history)
