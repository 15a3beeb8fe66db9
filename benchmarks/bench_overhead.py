"""Monitor overhead as a share of a PPO update, measured in one run (not a test).

A PPO update (forward, clipped loss, backward, grad clipping, Adam step) on a causal LM built from
config, with and without ``Monitor.log_update`` (+ ``watch`` for per-module grad norms). Updates with
and without the monitor alternate, so drift in machine load hits both alike; medians are reported,
plus the monitor's own time per update (``monitor_ms``), which load affects less.

    python benchmarks/bench_overhead.py [--updates 12] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from sorl_monitor import Monitor

MODELS = {
    # name: (config kwargs, batch, sequence length)
    "10M causal LM": (dict(vocab_size=8192, hidden_size=256, intermediate_size=1024, num_hidden_layers=6,
                           num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False), 8, 256),
    "tiny demo model": (dict(vocab_size=96, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False), 128, 48),
}  # fmt: skip


def ppo_update(model, optimizer, batch, monitor: Monitor | None) -> float:
    """One clipped-surrogate update; returns its wall time in seconds."""
    ids, old_logp, mask, turn_ids, advantages, rewards = batch
    started = time.perf_counter()
    logits = model(input_ids=ids).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    ratio = (logp - old_logp).exp()
    surrogate = torch.min(ratio * advantages[:, None], ratio.clamp(0.8, 1.2) * advantages[:, None])
    loss = -(surrogate * mask).sum() / mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if monitor is not None:
        monitor.log_update(logp=logp, old_logp=old_logp, mask=mask, turn_ids=turn_ids, advantages=advantages,
                           rewards=rewards, grad_norm=grad_norm, extra={"loss": loss})  # fmt: skip
    optimizer.step()
    return time.perf_counter() - started


def make_batch(vocab: int, batch: int, length: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, length), generator=g)
    # 4 agent turns separated by observation tokens (mask 0), as in a multi-turn search episode
    pattern = torch.tensor(([1] * (length // 8) + [0] * (length // 8)) * 4)[: length - 1]
    mask = pattern.expand(batch, length - 1).float()
    turn_ids = (torch.cumsum(torch.diff(pattern, prepend=torch.tensor([0])).clamp(min=0), 0) - 1).expand_as(
        mask
    )
    turn_ids = torch.where(mask > 0, turn_ids, -1)
    old_logp = -torch.rand(batch, length - 1, generator=g) * 6
    return ids, old_logp, mask, turn_ids, torch.randn(batch, generator=g), torch.rand(batch, generator=g)


def measure(name: str, updates: int) -> None:
    kwargs, batch_size, length = MODELS[name]
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**kwargs))
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    batch = make_batch(kwargs["vocab_size"], batch_size, length)
    with tempfile.TemporaryDirectory() as log_dir, Monitor(log_dir, "overhead") as mon:
        mon.watch(model)
        for _ in range(2):  # warm-up both paths
            ppo_update(model, optimizer, batch, None)
            ppo_update(model, optimizer, batch, mon)
        plain, monitored, own = [], [], []
        for _ in range(updates):
            plain.append(ppo_update(model, optimizer, batch, None))
            monitored.append(ppo_update(model, optimizer, batch, mon))
            own.append(mon.recent_steps().column("monitor_ms")[-1].as_py() / 1e3)
    base, with_mon, mon_time = (statistics.median(x) for x in (plain, monitored, own))
    print(
        f"{name}: {n_params / 1e6:.1f} M parameters, batch {batch_size}×{length}, {updates} updates each way"
    )
    print(f"  update without monitor : {base * 1e3:8.1f} ms (median)")
    print(f"  update with monitor    : {with_mon * 1e3:8.1f} ms (median)  → {(with_mon - base) / base:+.1%}")
    print(
        f"  monitor's own time     : {mon_time * 1e3:8.2f} ms per update → {mon_time / base:.2%} of an update"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name in MODELS:
        measure(name, args.updates)


if __name__ == "__main__":
    main()
