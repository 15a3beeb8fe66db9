"""Run several trainings at once, one process each (one thread each), reporting progress to the parent."""

from __future__ import annotations

import multiprocessing as mp
import queue
import traceback
from collections.abc import Callable
from typing import Any

from sorl_monitor.trainer.config import TrainConfig

Report = Callable[[str, str, int, int, dict[str, Any]], None]
"""``report(name, phase, done, total, fields)``; phase ``warmup`` | ``train`` | ``done`` | ``error``."""


def _child(name: str, cfg: TrainConfig, events: Any) -> None:
    from sorl_monitor.trainer.train import train

    try:
        result = train(
            cfg, progress=lambda phase, done, total, fields: events.put((name, phase, done, total, fields))
        )
        events.put((name, "done", 1, 1, {"run_dir": str(result.run_dir), "run_id": result.run_id,
                                         "status": result.status, "final": result.final_reward,
                                         "peak": result.peak_reward, "seconds": result.seconds,
                                         "switches": result.ctn_switches}))  # fmt: skip
    except BaseException as error:  # noqa: BLE001 - reported to the parent, which decides
        events.put((name, "error", 0, 0, {"error": f"{type(error).__name__}: {error}",
                                          "traceback": traceback.format_exc()}))  # fmt: skip


def train_many(configs: dict[str, TrainConfig], report: Report, jobs: int = 2) -> dict[str, dict[str, Any]]:
    """Train every config (``jobs`` at a time); return each run's final fields (or ``{"error": …}``)."""
    for cfg in configs.values():
        cfg.check()
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    pending = list(configs.items())
    running: dict[str, Any] = {}
    results: dict[str, dict[str, Any]] = {}
    try:
        while pending or running:
            while pending and len(running) < jobs:
                name, cfg = pending.pop(0)
                proc = ctx.Process(target=_child, args=(name, cfg, events), daemon=True)
                proc.start()
                running[name] = proc
            try:
                name, phase, done, total, fields = events.get(timeout=1.0)
            except queue.Empty:
                for name, proc in list(running.items()):
                    if not proc.is_alive() and name not in results:
                        results[name] = {"error": f"the training process exited with code {proc.exitcode}"}
                        running.pop(name)
                        report(name, "error", 0, 0, results[name])
                continue
            report(name, phase, done, total, fields)
            if phase in ("done", "error"):
                results[name] = fields
                running.pop(name).join(timeout=30)
    finally:
        for proc in running.values():
            proc.terminate()
    return results
