"""``log_update`` with its host copy still in flight (docs/attach.md, "No sync in the training step").

On the CPU every copy lands at once; ``tests.helpers.deferred_copy.hold`` makes each one wait for the test (a
stand-in for a CUDA event whose copy is still queued), so the deferred path runs here as it would on a
GPU. All inputs are synthetic (random log-probs and gradients)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.read.query import open_runs
from sorl_monitor.write import transfer
from sorl_monitor.write.in_flight import MAX_IN_FLIGHT
from sorl_monitor.write.update_metrics import update_metrics
from tests.helpers.deferred_copy import hold, small_model, synthetic_update

ROOT = Path(__file__).resolve().parents[1]
VARYING = {"wall_time", "monitor_ms", "run_id"}  # differ between two runs of the same inputs


def log_run(tmp_path, name: str, held=None, updates: int = 7) -> tuple[list[dict], list[int]]:
    """Log ``updates`` synthetic updates (plus a ``log_scalars`` row and an alert between them); with
    ``held``, update i's copy lands only after update i+1 was logged (i+2 for every third update).
    Returns the metrics computed directly from each update's inputs, and the steps in the order the live
    window (``recent_steps``, what a guard reads) holds them."""
    generator = torch.Generator().manual_seed(0)
    model = small_model()
    direct = []
    with Monitor(tmp_path, name, writer=WriterConfig(flush_interval_s=3600)) as mon:
        mon.watch(model)
        for i in range(updates):
            inputs = synthetic_update(generator, model)
            metrics = update_metrics(inputs["logp"], inputs["old_logp"], inputs["mask"], advantages=inputs["advantages"],
                                     rewards=inputs["rewards"], group_ids=inputs["group_ids"], ref_logp=inputs["ref_logp"])  # fmt: skip
            direct.append({k: v.item() for k, v in metrics.scalars.items()})
            mon.log_update(step=2 * i, **inputs)
            if i == 3:
                mon.log_scalars(2 * i + 1, {"eval_reward": 0.5})
                mon.log_alert("probe", "info", "between updates", step=2 * i)
            if held is not None and i % 3 != 2:
                for event in held.events[:-1]:
                    event.land()
        order = mon.recent_steps().column("step").to_pylist()
    return direct, order


def nan_as_text(value):
    """NaN as the text "nan", so that rows holding NaN compare equal."""
    return "nan" if isinstance(value, float) and math.isnan(value) else value


def read(run) -> dict[str, list[dict]]:
    """Every table's rows in key order, without the columns that vary between runs (NaN as "nan")."""
    orders = {
        "steps": "step",
        "turns": "step, sample_id, turn_idx",
        "modules": "step, module",
        "alerts": "step",
    }
    with open_runs(run) as runs:
        return {
            table: [{k: nan_as_text(v) for k, v in row.items() if k not in VARYING}
                    for row in runs.sql(f"SELECT * FROM {table} ORDER BY {order}").to_pylist()]
            for table, order in orders.items()
        }  # fmt: skip


def test_rows_written_with_the_copy_in_flight_equal_rows_written_at_once_step_for_step(tmp_path, monkeypatch):
    """Synthetic updates: the deferred path writes the same steps, turns, modules and alerts rows as the
    copy that lands at once, and each steps row holds the metrics computed directly from its inputs."""
    direct, order = log_run(tmp_path, "at-once")
    at_once = read(tmp_path / "at-once")
    held = hold(monkeypatch)
    assert log_run(tmp_path, "held", held) == (direct, order)
    assert order == [0, 2, 4, 6, 7, 8, 10, 12]  # the scalars row of step 7 after update 6, as logged
    deferred = read(tmp_path / "held")
    assert len(held.events) == 7 and sum(e.waited for e in held.events) >= 1  # close() waited
    assert deferred == at_once
    updates = [row for row in deferred["steps"] if row["step"] % 2 == 0]
    assert [row["step"] for row in deferred["steps"]] == [0, 2, 4, 6, 7, 8, 10, 12]
    assert len(deferred["turns"]) == 7 * 4 * 3 and len(deferred["modules"]) == 7 * 2
    for row, metrics in zip(updates, direct, strict=True):
        assert {k: row[k] for k in metrics} == {k: nan_as_text(v) for k, v in metrics.items()}
        assert row["loss"] > 0 and row["success"] == 0.5 and row["ctn_active"] and row["lr"] == 1e-3


def test_log_update_returns_the_newest_assembled_row_and_waits_only_when_asked(tmp_path, monkeypatch):
    held = hold(monkeypatch)
    generator = torch.Generator().manual_seed(1)
    model = small_model()
    with Monitor(tmp_path, "ret", writer=WriterConfig(flush_interval_s=3600)) as mon:
        first = synthetic_update(generator, model)
        assert mon.log_update(**first) == {}  # nothing has landed yet
        second = synthetic_update(generator, model)
        held.events[0].land()
        waits = transfer.STATS.waits
        returned = mon.log_update(**second)  # the first update's row, no wait
        assert transfer.STATS.waits == waits and not held.events[1].landed
        expected = update_metrics(first["logp"], first["old_logp"], first["mask"]).scalars["clip_frac"].item()
        assert returned["clip_frac"] == expected
        third = synthetic_update(generator, model)
        now = mon.log_update(sync=True, **third)  # waits for the second's copy and its own
        assert transfer.STATS.waits == waits + 2
        expected = update_metrics(third["logp"], third["old_logp"], third["mask"]).scalars["clip_frac"].item()
        assert now["clip_frac"] == expected


def test_one_host_copy_per_update_and_no_wait_in_the_step(tmp_path, monkeypatch):
    """Synthetic updates with module norms, turns, tensor extras, sample ids and a tensor grad_norm."""
    hold(monkeypatch)
    generator = torch.Generator().manual_seed(2)
    model = small_model()
    with Monitor(tmp_path, "count", writer=WriterConfig(flush_interval_s=3600)) as mon:
        mon.watch(model)
        copies, waits = transfer.STATS.copies, transfer.STATS.waits
        for i in range(MAX_IN_FLIGHT):
            mon.log_update(**synthetic_update(generator, model))
            assert transfer.STATS.copies - copies == i + 1
        assert transfer.STATS.waits == waits  # none landed, none waited for
        assert len(mon.recent_steps(max_in_flight=MAX_IN_FLIGHT)) == 0
        mon.log_update(
            **synthetic_update(generator, model)
        )  # one more than the bound: the oldest is waited for
        assert transfer.STATS.waits == waits + 1
        assert len(mon.recent_steps(max_in_flight=MAX_IN_FLIGHT)) == 1


class HostReads:
    """Counts the calls that read a tensor's value on the host (on CUDA each one waits for the device)
    and the tensors built from Python data (on CUDA each one is a host→device copy that waits)."""

    METHODS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__")

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        self.counting = False
        for name in self.METHODS:
            monkeypatch.setattr(torch.Tensor, name, self._wrap(name, getattr(torch.Tensor, name)))
        monkeypatch.setattr(torch, "tensor", self._wrap("torch.tensor", torch.tensor))

    def _wrap(self, name, original):
        def counted(*args, **kwargs):
            if self.counting:
                self.calls.append(name)
            return original(*args, **kwargs)

        return counted


def test_log_update_reads_no_tensor_on_the_host_and_builds_none_from_python_data(tmp_path, monkeypatch):
    """Synthetic updates: after the first (which builds the quantile levels and module index once), a
    log_update whose copy has not landed makes none of the calls that synchronise on CUDA."""
    hold(monkeypatch)
    generator = torch.Generator().manual_seed(3)
    model = small_model()
    with Monitor(tmp_path, "reads", writer=WriterConfig(flush_interval_s=3600)) as mon:
        mon.watch(model)
        mon.log_update(**synthetic_update(generator, model))
        reads = HostReads(monkeypatch)
        for _ in range(3):
            inputs = synthetic_update(generator, model)
            reads.counting = True
            mon.log_update(**inputs)
            reads.counting = False
        assert reads.calls == []
        assert len(mon.recent_steps()) == 4  # the guard's own call waits: every update is there


def test_close_writes_the_rows_of_updates_whose_copies_are_still_in_flight(tmp_path, monkeypatch):
    held = hold(monkeypatch)
    generator = torch.Generator().manual_seed(4)
    model = small_model()
    mon = Monitor(tmp_path, "close", writer=WriterConfig(flush_interval_s=3600))
    mon.watch(model)
    for step in range(3):
        mon.log_update(step=step, **synthetic_update(generator, model))
    assert not any(e.landed for e in held.events)
    assert len(mon.recent_steps(max_in_flight=1)) == 2  # waits for all but the newest
    mon.close()
    with open_runs(tmp_path / "close") as runs:
        assert runs.sql("SELECT step FROM steps ORDER BY step").column(0).to_pylist() == [0, 1, 2]
        assert runs.sql("SELECT count(*) FROM turns WHERE step = 2").column(0)[0].as_py() == 12
        assert runs.sql("SELECT count(*) FROM modules WHERE step = 2").column(0)[0].as_py() == 2


def test_watch_every_k_measures_module_norms_on_every_kth_update(tmp_path):
    generator = torch.Generator().manual_seed(5)
    model = small_model()
    with Monitor(tmp_path, "every", writer=WriterConfig(flush_interval_s=3600)) as mon:
        mon.watch(model, every=3)
        rows = [mon.log_update(**synthetic_update(generator, model)) for _ in range(7)]
    assert [math.isfinite(row.get("param_norm", math.nan)) for row in rows] == [
        True, False, False, True, False, False, True
    ]  # fmt: skip
    assert all(row["grad_norm"] > 0 for row in rows)  # the given pre-clip norm, every update
    with open_runs(tmp_path / "every") as runs:
        assert runs.sql("SELECT DISTINCT step FROM modules ORDER BY step").column(0).to_pylist() == [0, 3, 6]


def test_sigterm_writes_the_rows_of_updates_whose_copies_are_still_in_flight(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.deferred_child", str(tmp_path), "3"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (tmp_path / "ready").exists():
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.02)
    child.send_signal(signal.SIGTERM)
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGTERM
    with open_runs(tmp_path / "run") as runs:
        assert runs.sql("SELECT status FROM runs").column(0)[0].as_py() == "terminated"
        assert runs.sql("SELECT step FROM steps ORDER BY step").column(0).to_pylist() == [0, 1, 2]
        assert runs.sql("SELECT count(*) FROM turns").column(0)[0].as_py() == 3 * 12
