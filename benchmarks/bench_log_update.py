"""``Monitor.log_update``'s own time per call on the CPU at a few batch sizes, and its device operations.

The training thread pays this on every update, on any device (on CUDA it is the Python and launch cost of
queueing the metric kernels). A tiny 2-layer model is watched (per-module norms), as in ``bench_overhead.py``'s
tiny demo model, and ``log_update`` is called after one backward pass with the bench's batch (4 turns per row,
advantages, rewards, a tensor ``grad_norm`` and one tensor extra): the median of ``--calls`` calls after a
warm-up, per batch shape. The smallest shape is the fixed cost (what does not grow with tokens). A last line
counts the device operations one ``update_metrics`` call dispatches (``TorchDispatchMode``), at every shape.

To compare two versions, run this file with ``PYTHONPATH`` pointing at each checkout, alternating:

    python benchmarks/bench_log_update.py [--calls 300] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))
from bench_overhead import build, make_batch  # noqa: E402

import sorl_monitor  # noqa: E402
from sorl_monitor import Monitor  # noqa: E402
from sorl_monitor.write.update_metrics import update_metrics  # noqa: E402

SHAPES = ((8, 16), (32, 48), (128, 48))  # rows × tokens; 128 × 48 is bench_overhead's tiny demo batch


class CountOps(TorchDispatchMode):
    """Counts the operations dispatched to the device while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.count += 1
        return func(*args, **(kwargs or {}))


def per_call_ms(model: torch.nn.Module, rows: int, tokens: int, calls: int) -> tuple[float, int]:
    """Median ms of one ``log_update`` at ``rows × tokens``, and the ops of one ``update_metrics``."""
    ids, old_logp, mask, turn_ids, advantages, rewards = make_batch(96, rows, tokens)
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    loss = -(logp * mask).sum() / mask.sum()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    inputs = dict(turn_ids=turn_ids, advantages=advantages, rewards=rewards)
    with tempfile.TemporaryDirectory() as log_dir, Monitor(log_dir, "log-update") as monitor:
        monitor.watch(model)

        def call() -> None:
            monitor.log_update(logp=logp, old_logp=old_logp, mask=mask, grad_norm=grad_norm,
                               extra={"loss": loss.detach()}, **inputs)  # fmt: skip

        for _ in range(30):
            call()
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            call()
            times.append((time.perf_counter() - started) * 1e3)
    with CountOps() as ops:
        update_metrics(logp, old_logp, mask, **inputs)
    return statistics.median(times), ops.count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--calls", type=int, default=300, help="timed calls per shape (after 30 warm-up calls)"
    )
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of torch")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = build("tiny demo model", "cpu")[0]
    results = [(rows, tokens, *per_call_ms(model, rows, tokens, args.calls)) for rows, tokens in SHAPES]
    where = Path(sorl_monitor.__file__).parent.parent.name
    print(f"log_update per call, tiny model watched, cpu, {args.threads} thread(s), code from {where}/:")
    print("  " + "   ".join(f"{rows}×{tokens}: {ms:.2f} ms" for rows, tokens, ms, _ in results))
    print(f"  device operations per update_metrics call: {results[0][3]}")


if __name__ == "__main__":
    main()
