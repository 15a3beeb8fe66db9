"""A Hugging Face ``Trainer`` on the tiny Qwen2 and random token sequences (CPU, a few steps)."""

from __future__ import annotations

from transformers import Trainer, TrainingArguments

from sorl_monitor.integrations.hf import SorlCallback
from tests.helpers.tiny_lm import TokenSequences, tiny_qwen2


def make_trainer(tmp_path, callback: SorlCallback, **overrides) -> Trainer:
    settings = {
        "max_steps": 6,
        "logging_steps": 1,
        "per_device_train_batch_size": 4,
        "learning_rate": 1e-3,
        "report_to": [],
        "use_cpu": True,
        "save_strategy": "no",
        "disable_tqdm": True,
        **overrides,
    }
    args = TrainingArguments(output_dir=str(tmp_path / "out"), **settings)
    return Trainer(
        model=tiny_qwen2(),
        args=args,
        train_dataset=TokenSequences(),
        eval_dataset=TokenSequences(8),
        callbacks=[callback],
    )
