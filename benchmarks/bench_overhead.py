"""Monitor overhead as a share of a PPO update, end to end, measured in one run (not a test).

A PPO update (forward, clipped loss, backward, grad clipping, Adam step) on a causal LM built from
config, with and without ``Monitor.log_update`` (+ ``watch`` for per-module grad norms): on the CPU small
float32 models, on CUDA (``--device cuda``) a Qwen2-0.5B-shaped model in bf16 (sdpa, AdamW) at 8×2048 and
4×8192 tokens, 4 policy turns per row separated by observation spans. The headline
is what the user pays: the wall time of updates with the monitor against updates without it, all the
monitor's work included (its metrics on the training thread, the writer thread's Parquet writes, the
allocations, the competition for 2 cores).

Updates run in blocks of a few seconds, alternately without and with the monitor, starting and ending
without. A monitored block ends with ``Monitor.flush()`` inside its timing: the writer's work for the
block's rows is charged to that block, never to the plain block after it (at most one flush more than a
steady run makes, so the figure errs high). Each monitored block gives one effect, its per-update time
over the mean of the two plain blocks around it − 1 (which cancels a steady drift in machine speed); the
headline is the median effect with a bootstrap 95 % interval of that median (neighbouring effects share a
plain block, so the interval is, if anything, a little narrow) and the effects' quartiles. Separate lines
give the monitor's own time in ``log_update`` (``monitor_ms``) and the CPU time of its background
threads (writer, compactor) per update; what the end-to-end effect holds beyond their sum is contention
(caches, memory bandwidth, the 2 cores) that neither of them shows. On CUDA each block's edges wait for
the device (``torch.cuda.synchronize``), and the monitor's own time is the wall time of the ``log_update``
call (it queues work and returns). A last line counts the synchronizing operations inside one
``log_update`` (``torch.cuda.set_sync_debug_mode``, which sees blocking copies and stream/device syncs)
and the waits on an in-flight copy (``transfer.STATS.waits``, which that mode does not see); on the CPU
there is nothing to count ("n/a"). ``--compare-sync`` adds blocks with ``log_update(sync=True)`` (a wait for
each update's copy, as before issue #29), between plain blocks of their own, for a same-run comparison.

    python benchmarks/bench_overhead.py [--device cpu|cuda] [--blocks 24] [--block-seconds 4] [--compare-sync]
                                        [--models ...]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import tempfile
import threading
import time
import warnings

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from sorl_monitor import Monitor
from sorl_monitor.write import transfer

QWEN2_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
CUDA_MODELS = {  # name: (config kwargs, batch, sequence length); bf16, sdpa, AdamW
    "0.5B Qwen2 8x2048": (QWEN2_05B, 8, 2048),
    "0.5B Qwen2 4x8192": (QWEN2_05B, 4, 8192),
}
CUDA_GOAL = 0.01  # end-to-end overhead goal at 8 × 2048 tokens on one H100/H200-class GPU
MODELS = {
    # name: (config kwargs, batch, sequence length)
    "10M causal LM": (dict(vocab_size=8192, hidden_size=256, intermediate_size=1024, num_hidden_layers=6,
                           num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False), 8, 256),
    "tiny demo model": (dict(vocab_size=96, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False), 128, 48),
}  # fmt: skip
GOAL = 0.02  # end-to-end overhead goal on the 10.5 M-parameter model


def count_syncs(call) -> tuple[int, int]:
    """Synchronizing operations (``set_sync_debug_mode`` warnings) and in-flight copy waits made by ``call()``."""
    waits = transfer.STATS.waits
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message).lower() for w in caught), transfer.STATS.waits - waits


def ppo_update(
    model,
    optimizer,
    batch,
    monitor: Monitor | None,
    syncs: list[tuple[int, int]] | None = None,
    sync: bool = False,
) -> float:
    """One clipped-surrogate update; returns the monitor's own time in ms (0 without it). With ``syncs``
    (CUDA), appends what ``count_syncs`` counts inside ``log_update``; ``sync`` is log_update's."""
    ids, old_logp, mask, turn_ids, advantages, rewards = batch
    logits = model(input_ids=ids).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    ratio = (logp - old_logp).exp()
    surrogate = torch.min(ratio * advantages[:, None], ratio.clamp(0.8, 1.2) * advantages[:, None])
    loss = -(surrogate * mask).sum() / mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    monitor_ms = 0.0
    if monitor is not None:

        def log() -> None:
            monitor.log_update(logp=logp, old_logp=old_logp, mask=mask, turn_ids=turn_ids,
                               advantages=advantages, rewards=rewards, grad_norm=grad_norm,
                               extra={"loss": loss}, sync=sync)  # fmt: skip

        started = time.perf_counter()
        log() if syncs is None else syncs.append(count_syncs(log))
        monitor_ms = (time.perf_counter() - started) * 1e3
    optimizer.step()
    return monitor_ms


def make_batch(vocab: int, batch: int, length: int, device: str = "cpu") -> tuple[torch.Tensor, ...]:
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
    tensors = ids, old_logp, mask, turn_ids, torch.randn(batch, generator=g), torch.rand(batch, generator=g)
    return tuple(t.to(device) for t in tensors)


def background_cpu_s() -> float:
    """CPU seconds used so far by the monitor's background threads (writer, compactor) in this process."""
    total = 0.0
    for thread in threading.enumerate():
        if thread.name.startswith("sorl-") and thread.ident is not None:
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            except OSError:  # the thread ended meanwhile
                pass
    return total


def machine_busy_s() -> float:
    """CPU seconds all processes have used on this machine (Linux ``/proc/stat``; NaN elsewhere)."""
    try:
        with open("/proc/stat") as stat:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, stat.readline().split()[1:9])
    except (OSError, ValueError):
        return math.nan
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def median_interval(values: list[float], resamples: int = 4000, level: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap ``level`` interval of the median of ``values`` (seeded: the same run, the same
    interval)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1 - level) / 2
    return medians[int(tail * resamples)], medians[math.ceil((1 - tail) * resamples) - 1]


def build(
    name: str, device: str
) -> tuple[torch.nn.Module, torch.optim.Optimizer, tuple[torch.Tensor, ...], int]:
    """The model (bf16 and AdamW on CUDA, float32 and Adam on the CPU), its optimizer, batch and size."""
    kwargs, batch_size, length = (CUDA_MODELS if device == "cuda" else MODELS)[name]
    torch.manual_seed(0)
    if device == "cuda":
        config = Qwen2Config(**kwargs, attn_implementation="sdpa")
        model = Qwen2ForCausalLM(config).to(device, torch.bfloat16)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**kwargs))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    n_params = sum(p.numel() for p in model.parameters())
    return model, optimizer, make_batch(kwargs["vocab_size"], batch_size, length, device), n_params


def measure(name: str, blocks: int, block_seconds: float, device: str, compare_sync: bool = False) -> None:
    model, optimizer, batch, n_params = build(name, device)
    batch_size, length = batch[0].shape
    wait = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with tempfile.TemporaryDirectory() as log_dir, Monitor(log_dir, "overhead") as mon:
        mon.watch(model)

        def block(n: int, monitor: Monitor | None, sync: bool = False) -> tuple[float, float, list[float]]:
            """Wall seconds per update, background CPU seconds per update, monitor_ms of each update."""
            wait()
            cpu = background_cpu_s()
            started = time.perf_counter()
            own = [ppo_update(model, optimizer, batch, monitor, sync=sync) for _ in range(n)]
            if monitor is not None:
                monitor.flush()
            wait()
            return (time.perf_counter() - started) / n, (background_cpu_s() - cpu) / n, own

        warm_up = [block(2, monitor)[0] for monitor in (None, mon, None, mon)]  # both paths
        busy, own_cpu, started = machine_busy_s(), time.process_time(), time.perf_counter()
        n = max(2, round(block_seconds / min(warm_up[0], warm_up[2])))
        timeline, background, own = [("plain", block(n, None)[0])], [], []
        for _ in range(blocks):
            seconds, cpu, own_ms = block(n, mon)
            timeline += [("monitor", seconds), ("plain", block(n, None)[0])]
            background.append(cpu)
            own.extend(own_ms)
            if compare_sync:  # the same monitor, waiting for each update's copy (as before issue #29)
                timeline += [("sync", block(n, mon, sync=True)[0]), ("plain", block(n, None)[0])]
        others = (machine_busy_s() - busy - (time.process_time() - own_cpu)) / (time.perf_counter() - started)
        syncs: list[tuple[int, int]] = []
        if device == "cuda":  # three updates in a row, each log_update's own syncs and waits
            for _ in range(3):
                ppo_update(model, optimizer, batch, mon, syncs)

    def arm_effects(arm: str) -> list[float]:
        """Each block of ``arm``: its time per update over the mean of the plain blocks around it − 1."""
        return [
            seconds / ((timeline[i - 1][1] + timeline[i + 1][1]) / 2) - 1
            for i, (kind, seconds) in enumerate(timeline)
            if kind == arm
        ]

    plain = [seconds for kind, seconds in timeline if kind == "plain"]
    monitored = [seconds for kind, seconds in timeline if kind == "monitor"]
    effects = arm_effects("monitor")
    base, with_mon = statistics.median(plain), statistics.median(monitored)
    effect = statistics.median(effects)
    low, high = median_interval(effects)
    q1, _, q3 = statistics.quantiles(effects, n=4)
    own_ms, background_ms = statistics.median(own), statistics.mean(background) * 1e3
    where = torch.cuda.get_device_name() if device == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"{name}: {n_params / 1e6:.1f} M parameters, batch {batch_size}×{length}, {where}; "
          f"{blocks} blocks of {n} updates with the monitor{' (and as many with sync=True)' if compare_sync else ''}, "
          f"{len(plain)} without, alternating")  # fmt: skip
    print(f"  update without monitor        : {base * 1e3:8.1f} ms (median of blocks)")
    print(f"  update with monitor           : {with_mon * 1e3:8.1f} ms (median of blocks)")
    print(f"  END-TO-END OVERHEAD           : {effect:+.2%} per update (median of {blocks} blocks; "
          f"95 % CI {low:+.2%} … {high:+.2%}; quartiles {q1:+.2%} … {q3:+.2%})")  # fmt: skip
    print(f"  monitor's own time (log_update, training thread): {own_ms:6.2f} ms per update "
          f"→ {own_ms / 1e3 / base:.2%} of an update (median)")  # fmt: skip
    print(f"  monitor's background threads (writer, compactor): {background_ms:6.2f} ms CPU per update "
          f"→ {background_ms / 1e3 / base:.2%} of an update (mean)")  # fmt: skip
    print(f"  per block                     : {' '.join(f'{e:+.1%}' for e in effects)}")
    print(f"  other processes meanwhile     : {max(others, 0.0):.2f} of {os.cpu_count()} cores on average")
    if compare_sync:
        synced = arm_effects("sync")
        sync_low, sync_high = median_interval(synced)
        print(f"  with log_update(sync=True)    : {statistics.median(synced):+.2%} per update (median of {blocks} "
              f"blocks; 95 % CI {sync_low:+.2%} … {sync_high:+.2%}): waiting for each copy, as before")  # fmt: skip
    if syncs:
        counted = ", ".join(f"{s} syncs + {w} waits" for s, w in syncs)
        print(f"  synchronizing ops per log_update (3 in a row): {counted}")
    else:
        print("  synchronizing ops per log_update: n/a (cpu)")
    first = next(iter(CUDA_MODELS if device == "cuda" else MODELS))
    goal = CUDA_GOAL if device == "cuda" else GOAL
    if name == first:
        if high <= goal:
            verdict = "met (the median and its whole 95 % interval)"
        elif effect <= goal:
            verdict = "met by the median, not by the whole 95 % interval"
        else:
            verdict = "not met"
        print(f"  goal ≤ {goal:.0%} end to end: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--blocks", type=int, default=24, help="blocks with the monitor (one more without)")
    parser.add_argument("--block-seconds", type=float, default=4.0, help="about how long one block runs")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of torch (on the CPU)")
    parser.add_argument("--compare-sync", action="store_true",
                        help="also run blocks with log_update(sync=True) (a wait per update, as before)")  # fmt: skip
    parser.add_argument(
        "--models", nargs="+", help=f"cpu: {', '.join(MODELS)}; cuda: {', '.join(CUDA_MODELS)}"
    )
    args = parser.parse_args()
    known = CUDA_MODELS if args.device == "cuda" else MODELS
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "bench_overhead: --device cuda, but torch sees no CUDA device\n")
    unknown = [m for m in args.models or [] if m not in known]
    if unknown:
        parser.exit(
            2, f"bench_overhead: no {args.device} model {unknown[0]!r} (choose from {', '.join(known)})\n"
        )
    torch.set_num_threads(args.threads)
    for name in args.models or list(known):
        measure(name, args.blocks, args.block_seconds, args.device, args.compare_sync)


if __name__ == "__main__":
    main()
