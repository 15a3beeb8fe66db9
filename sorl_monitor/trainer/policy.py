"""The policy: a tiny ``transformers`` causal LM built from config (no hub) with a linear value head.

``forward(tokens)`` returns, for every position ``t ≥ 1``, the log-prob of token ``t`` given the
prefix, the entropy of that next-token distribution, and the value ``V(s_t)`` of the state before
token ``t`` (read off the hidden state at ``t − 1``). Position 0 (``<bos>``) gets zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import Qwen2Config, Qwen2ForCausalLM

from sorl_monitor.write.metrics import entropy_from_logits


@dataclass(frozen=True)
class PolicyConfig:
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    intermediate_size: int = 128


@dataclass
class PolicyOutput:
    logp: Tensor  # (B, T) log π(y_t | y_<t), 0 at t = 0
    entropy: Tensor  # (B, T)
    values: Tensor  # (B, T) V(s_t), the state before token t


class PolicyWithValue(nn.Module):
    """Qwen2 causal LM (``PolicyConfig`` sizes) plus ``value_head: hidden → 1``."""

    def __init__(self, vocab_size: int, max_len: int, config: PolicyConfig | None = None) -> None:
        super().__init__()
        c = config or PolicyConfig()
        self.lm = Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                num_hidden_layers=c.layers, num_attention_heads=c.heads, num_key_value_heads=c.heads,
                max_position_embeddings=max(64, max_len), tie_word_embeddings=True,
            )
        )  # fmt: skip
        self.value_head = nn.Linear(c.hidden_size, 1)

    def next_token_logits(self, tokens: Tensor) -> Tensor:
        """Logits of the token after ``tokens`` ``(B, L)`` → ``(B, V)``."""
        return self.lm(input_ids=tokens).logits[:, -1]

    def forward(self, tokens: Tensor, with_values: bool = True) -> PolicyOutput:
        out = self.lm(input_ids=tokens, output_hidden_states=with_values)
        logits = out.logits[:, :-1].float()
        log_probs = F.log_softmax(logits, dim=-1)
        logp = log_probs.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
        entropy = entropy_from_logits(logits)
        pad = lambda x: F.pad(x, (1, 0))  # noqa: E731
        if with_values:
            values = self.value_head(out.hidden_states[-1][:, :-1]).squeeze(-1)
        else:
            values = torch.zeros_like(logp)
        return PolicyOutput(pad(logp), pad(entropy), pad(values))
