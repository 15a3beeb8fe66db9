"""A tiny Qwen2 causal LM built from config and a character tokenizer built in code (no hub, CPU)."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tests.helpers.benchmark_code import load

# the character tokenizer is benchmarks/char_tokenizer.py's: the benchmarks' tiny models use it too
_tokenizer_module = load("char_tokenizer")
CHARACTERS, SPECIAL = _tokenizer_module.CHARACTERS, _tokenizer_module.SPECIAL
char_tokenizer = _tokenizer_module.char_tokenizer


def tiny_qwen2(seed: int = 0, layers: int = 2) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(SPECIAL) + len(CHARACTERS),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    return Qwen2ForCausalLM(config)


def save_tiny_qwen2(folder: Path, seed: int = 0) -> Path:
    """Save the model and tokenizer with ``save_pretrained`` (TRL builds its reference model from a path)."""
    tiny_qwen2(seed, layers=1).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder


class TokenSequences(torch.utils.data.Dataset):
    """``n`` random sequences of ``length`` tokens, labels = inputs (a causal LM's own objective)."""

    def __init__(self, n: int = 32, length: int = 12) -> None:
        self.n, self.length = n, length

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(
            3, 3 + len(CHARACTERS), (self.length,), generator=torch.Generator().manual_seed(i)
        )
        return {"input_ids": ids, "labels": ids}


class NanAfterTwoSteps(torch.nn.Module):
    """A model whose loss turns NaN from its third forward pass on (as a diverging run's does)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 8)
        self.head = torch.nn.Linear(8, 1)
        self.calls = 0

    def forward(self, input_ids, labels=None):
        self.calls += 1
        loss = self.head(self.embed(input_ids)).pow(2).mean()
        return {"loss": loss * math.nan if self.calls > 2 else loss}
