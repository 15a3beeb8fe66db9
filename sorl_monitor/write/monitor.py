"""The public API: attach a ``Monitor`` to any PyTorch RL loop and stream its stability metrics.

    mon = Monitor("runs", config=vars(args))       # 1
    mon.watch(model)                                # 2  per-module grad norms
    ...loss.backward()
    mon.log_update(logp=logp, old_logp=old_logp, mask=mask, advantages=adv)   # 3
    optimizer.step(); optimizer.zero_grad()
    mon.close()                                     # 4  (or use ``with Monitor(...) as mon:``)

The monitor coordinates modules with one job each: ``update_metrics`` computes an update's metrics on the
tensors' device, ``module_tracker`` the per-module norms, ``transfer`` queues their one copy to the host
(never waiting on the device: docs/attach.md, "No sync in the training step"), ``in_flight`` finishes
each update's rows, in order, once its copy has landed, ``writer`` writes rows to Parquet in the
background, ``run_file`` keeps ``run.json`` and the run's end status (finished, failed, interrupted,
terminated), ``warn`` reports failures. Nothing here raises into the training loop once the monitor is
built: a failure is counted (``monitor_errors``) and warned about once.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch import Tensor, nn

from sorl_monitor.metric_names import guess_family, map_metrics
from sorl_monitor.notify import Notifier
from sorl_monitor.schema import KEYS, RUN_FILE, SEVERITIES, check_run_id, column_name, metric_column
from sorl_monitor.settings import check_setting
from sorl_monitor.warn import MonitorWarning, WarnOnce, warn
from sorl_monitor.write.in_flight import InFlight
from sorl_monitor.write.module_tracker import ModuleNormTracker
from sorl_monitor.write.run_file import (
    RunFile,
    distributed_rank,
    ending_status,
    new_run_id,
    run_fields,
    shared_run_id,
    utc_now,
)
from sorl_monitor.write.run_output import close_upload, open_writer, staged_upload
from sorl_monitor.write.transfer import start_copy
from sorl_monitor.write.update_metrics import MetricsConfig, UpdateMetrics, update_metrics
from sorl_monitor.write.update_rows import PendingUpdate, key_value, module_rows, step_row, turn_columns
from sorl_monitor.write.uploader import UploadStats
from sorl_monitor.write.writer import ParquetStreamWriter, WriterConfig, WriterStats

__all__ = ["MetricsConfig", "Monitor", "MonitorWarning", "WriterConfig", "warn"]


class Monitor:
    """Streams per-update and per-turn stability metrics of an RL trainer to Parquet.

    Args:
        log_dir: folder that holds runs; this run goes to ``<log_dir>/<run_id>/`` (or ``s3://bucket/prefix``:
            ``run_output``).
        run_name: the run id (a safe folder name); default ``<date>-<time>[-<algorithm>]-<hex>``.
        config: the trainer's hyper-parameters, stored in ``run.json``.
        algorithm: stored in ``run.json`` (and used in the default run id).
        seed: stored in ``run.json`` (``run_file.storable_seed``); default ``torch.initial_seed()``.
        metrics: what ``log_update`` computes (``update_metrics.MetricsConfig``: the clip fractions' trust
            region, the turn slots written); default ``MetricsConfig()``.
        writer: how rows are written (``writer.WriterConfig``: flush cadence, queue bound, compaction,
            object-storage options); default ``WriterConfig()``.
        window: how many recent ``steps`` rows stay in memory for live detectors (default 512).
        rank, world_size: default from ``torch.distributed`` (or ``RANK``/``WORLD_SIZE``).
        enabled: ``False`` turns every call into a no-op (e.g. to measure overhead).
        notify: a webhook URL (or a ``notify.Notifier``, e.g. for another ``close_timeout_s``): rank 0
            posts alert onsets, guard actions and an end of the run other than ``finished`` there, from a
            background thread.

    Settings that cannot work (``window < 1``, and those the configs refuse) raise ``ValueError``.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] = "runs",
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        algorithm: str | None = None,
        seed: int | None = None,
        metrics: MetricsConfig | None = None,
        writer: WriterConfig | None = None,
        window: int = 512,
        rank: int | None = None,
        world_size: int | None = None,
        enabled: bool = True,
        notify: str | Notifier | None = None,
    ) -> None:
        self.metrics_config = metrics or MetricsConfig()
        self.writer_config = writer = writer or WriterConfig()
        check_setting("window", window, least=1, integer=True)
        self.enabled = enabled
        dist_rank, dist_world = distributed_rank()
        self.rank = dist_rank if rank is None else rank
        self.world_size = dist_world if world_size is None else world_size
        run_id = check_run_id(run_name) if run_name is not None else new_run_id(algorithm)
        self.run_id = shared_run_id(run_id, self.world_size)
        self._warn_once = WarnOnce()
        self._uploader = (
            staged_upload(log_dir, self.run_id, self.rank, writer, self._warn_once) if enabled else None
        )
        self.log_dir = Path(log_dir) if self._uploader is None else self._uploader.staging.parent
        self.run_dir = self.log_dir / self.run_id
        self._recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=window)
        self._modules = ModuleNormTracker()
        self._module_every = 1
        self._updates = 0  # log_update calls (module norms are measured on every ``_module_every``-th)
        self._in_flight = InFlight(lambda error: self._fail("log_update", error))
        self._last_scalars: dict[str, float] = {}  # of the newest update whose row is assembled
        self._step = -1
        self._errors = 0
        self._dropped_reported = 0
        self.trainer_family: str | None = None  # the family log_scalars(names="auto") maps with
        fields = run_fields(
            self.run_id, algorithm=algorithm, seed=seed, config=config, world_size=self.world_size
        )
        self._writer: ParquetStreamWriter | None = None
        if notify is not None and not isinstance(notify, Notifier):
            notify = Notifier(notify)  # a URL: checked here, on every rank (ValueError, one line)
        self.notifier = notify if self.rank == 0 else None
        if not enabled:
            self._info = RunFile(self.run_dir / RUN_FILE, fields, writes=False)
            return
        self._writer = open_writer(self.run_dir, self.rank, writer, self._uploader)
        if self._writer.refused:  # a second monitor on this run and rank: never let it overwrite the first
            self._warn_once(
                "dropped",
                f"sorl-monitor writes nothing: {self._writer.refused}; give each monitor its own run name "
                "or rank (rows logged here are counted as dropped)",
                stacklevel=2,
            )
        writes = self.rank == 0 and not self._writer.refused
        self._info = RunFile(self.run_dir / RUN_FILE, fields, writes=writes, owner=self)

    # ------------------------------------------------------------------ attach
    def watch(
        self, model: nn.Module, modules: Mapping[str, nn.Module] | None = None, *, every: int = 1
    ) -> Monitor:
        """Track grad and parameter norms of ``model``, per top-level module (``module_group``) or per ``modules``,
        on every ``every``-th ``log_update`` from the next one (the others' rows have no module norms)."""
        check_setting("every", every, least=1, integer=True)
        self._modules = ModuleNormTracker.of(model, modules)
        self._module_every = every
        self._updates = 0
        return self

    # ------------------------------------------------------------------ log
    def log_update(
        self,
        *,
        logp: Tensor,
        old_logp: Tensor,
        mask: Tensor,
        grad_norm: float | Tensor | None = None,
        sample_ids: Tensor | None = None,
        step: int | None = None,
        iteration: int | None = None,
        ppo_epoch: int = 0,
        minibatch: int = 0,
        policy_lag: int = 0,
        extra: Mapping[str, Any] | None = None,
        log_turns: bool = True,
        sync: bool = False,
        **inputs: Tensor | None,
    ) -> dict[str, float]:
        """Log one optimiser update: token- and turn-level metrics, grad norms, and ``extra`` scalars.

        ``logp``, ``old_logp``, ``mask`` and ``inputs`` go to ``metrics.update_metrics`` as they are:
        ``turn_ids``, ``ref_logp``, ``logits``, ``entropy``, ``advantages``, ``values``, ``returns``,
        ``rewards``, ``group_ids`` (shapes: docs/schema.md). ``sample_ids`` (B,) number the ``turns`` rows.
        Call it after ``backward()`` and before clipping, or pass ``grad_norm`` = the pre-clip norm that
        ``clip_grad_norm_`` returned (module norms are then rescaled to pre-clip). ``log_turns=False`` keeps
        the turn-level scalars but writes no ``turns`` rows for this update (e.g. to log turns of one update
        per rollout). Never raises.

        On CUDA it queues the metric kernels and one non-blocking copy to the host and returns without
        waiting for the device; the rows are assembled once the copy has landed (at a later call, or when
        ``recent_steps``, ``flush`` or ``close`` asks). Returns the scalars (floats, for progress bars) of
        the newest update whose row is assembled: this one on the CPU or with ``sync=True`` (which waits
        for the copy), usually the previous one on CUDA ({} before the first).
        """
        if not self.enabled or self._info.closed:
            return {}
        started = time.perf_counter()
        try:
            keys = self._keys(step, iteration, ppo_epoch, minibatch, policy_lag)
            settings = self.metrics_config
            metrics = update_metrics(
                logp, old_logp, mask, clip_eps=settings.clip_eps, clip_eps_high=settings.clip_eps_high,
                max_turn_rows=settings.max_turn_rows, **inputs,
            )  # fmt: skip
            update = self._queue_update(keys, metrics, grad_norm, sample_ids, extra or {}, log_turns, started)
            self._in_flight.drain(keep=0 if sync else None)
            update.call_ms = (time.perf_counter() - started) * 1e3
            return dict(self._last_scalars)
        except Exception as error:  # noqa: BLE001 - monitoring must never crash training
            self._fail("log_update", error)
            return {}

    def _queue_update(
        self,
        keys: dict[str, Any],
        metrics: UpdateMetrics,
        grad_norm: float | Tensor | None,
        sample_ids: Tensor | None,
        extra: Mapping[str, Any],
        log_turns: bool,
        started: float,
    ) -> PendingUpdate:
        """Queue the update's one copy to the host (no wait) and, behind it, the assembly of its rows.

        Tensors on the metrics' device go in the copy; tensors elsewhere (e.g. host tensors in a CUDA run)
        are read on the host now: moving them to the device would be a copy that waits for it.
        """
        device, dtype = metrics.values.device, metrics.values.dtype
        tensor_extras = {metric_column(column_name(k)): v for k, v in extra.items() if isinstance(v, Tensor)}
        on_device = {"scalars": metrics.values}  # one host copy of all these
        device_extras = [v for v in tensor_extras.values() if v.device == device]
        if device_extras:
            on_device["extras"] = torch.stack([v.detach().reshape(()).to(dtype) for v in device_extras])
        update = PendingUpdate(
            keys=keys,
            scalar_names=metrics.names,
            tensor_extras=list(tensor_extras),
            host_extras={
                name: float(v.detach().reshape(()).to(torch.float64))
                for name, v in tensor_extras.items()
                if v.device != device
            },
            pre_clip=None,
            sample_ids=None,
            plain_extras={
                metric_column(column_name(k)): v for k, v in extra.items() if not isinstance(v, Tensor)
            },
            log_turns=log_turns,
            started=started,
        )
        if isinstance(grad_norm, Tensor) and grad_norm.device == device:
            on_device["grad_norm"] = grad_norm.detach().reshape(1)
        elif grad_norm is not None:
            update.pre_clip = float(grad_norm)
        if self._modules and self._updates % self._module_every == 0:
            on_device["module_grads"], on_device["module_params"] = self._modules.measure()
        self._updates += 1
        if log_turns:
            on_device["turns"] = metrics.turn_table  # TURN_COLUMNS, then turn_valid
            if sample_ids is not None and sample_ids.device == device:
                on_device["sample_ids"] = sample_ids.reshape(-1)
            elif sample_ids is not None:
                update.sample_ids = sample_ids.detach().reshape(-1).numpy()
        self._in_flight.add(start_copy(on_device, dtype), lambda host: self._assemble(update, host))
        return update

    def _assemble(self, update: PendingUpdate, host: dict[str, np.ndarray]) -> None:
        """The update's ``steps`` row from the host copy; its ``turns`` and ``modules`` rows go to the writer."""
        row, module_grads = step_row(update, host)
        if update.log_turns:
            ids = host["sample_ids"] if "sample_ids" in host else update.sample_ids
            columns, n = turn_columns(update.keys, host["turns"], ids)
            if n:
                self._writer_submit("turns", columns, n)
        if module_grads is not None:
            rows = module_rows(update.keys, self._modules.names, module_grads, host["module_params"])
            self._writer_submit("modules", rows, len(rows))
        in_call = update.call_ms is None  # assembled inside its own log_update (CPU, or sync=True)
        row["monitor_ms"] = (time.perf_counter() - update.started) * 1e3 if in_call else update.call_ms
        self._finish_step(row)
        self._last_scalars = {k: v for k, v in row.items() if isinstance(v, float | int) and k not in KEYS}

    def log_scalars(
        self,
        step: int | None,
        scalars: Mapping[str, Any],
        *,
        iteration: int | None = None,
        ppo_epoch: int = 0,
        minibatch: int = 0,
        policy_lag: int = 0,
        names: str | Mapping[str, str] | None = "auto",
    ) -> None:
        """Log a trainer's metrics dict as one ``steps`` row, its names mapped to schema columns. Never raises.

        ``names``: ``"auto"`` maps with the table of the trainer family guessed from the keys
        (``metric_names.guess_family``; the first call whose keys name one fixes ``trainer_family`` for the run);
        a family (``"trl"``, ``"verl"``, … ``metric_names.NAME_TABLES``) or a ``{trainer name: column}`` mapping
        forces a table; ``None`` maps nothing. Unmapped names become snake_case columns; a name that becomes
        a key column's is stored as ``metric_<key>`` (``schema.metric_column``); values that are not scalars
        (lists, multi-element tensors) are left out.
        """
        if not self.enabled or self._info.closed:
            return
        try:
            if names == "auto":
                if self.trainer_family is None:
                    self.trainer_family = guess_family(scalars)
                names = self.trainer_family
            row: dict[str, Any] = self._keys(step, iteration, ppo_epoch, minibatch, policy_lag)
            row.update((metric_column(k), v) for k, v in map_metrics(scalars, names).items())
            self._in_flight.then(lambda: self._finish_step(row))  # behind the updates still in flight
        except Exception as error:  # noqa: BLE001
            self._fail("log_scalars", error)

    def log_modules(
        self,
        step: int | None,
        grad_norms: Mapping[str, float],
        param_norms: Mapping[str, float] | None = None,
    ) -> None:
        """Write per-module L2 norms measured by the caller (e.g. a trainer callback) as ``modules`` rows.

        One row per name in ``grad_norms``, at ``step`` (default: the last step logged). Never raises.
        """
        if not self.enabled or self._info.closed or not grad_norms:
            return
        try:
            keys = self._keys(self._step if step is None else step, None, 0, 0, 0, advance=False)
            params = param_norms or {}
            rows = [
                {**keys, "module": str(name), "grad_norm": float(grad),
                 "param_norm": float(params.get(name, float("nan")))}
                for name, grad in grad_norms.items()
            ]  # fmt: skip
            self._in_flight.then(lambda: self._writer_submit("modules", rows, len(rows)))
        except Exception as error:  # noqa: BLE001
            self._fail("log_modules", error)

    def log_alert(
        self,
        detector: str,
        severity: str,
        message: str,
        *,
        value: float = float("nan"),
        threshold: float = float("nan"),
        step: int | None = None,
        kind: str = "alert",
    ) -> None:
        """Record a detector firing (``kind="alert"``) or a guard action (``kind="action"``) in ``alerts``."""
        if not self.enabled or self._info.closed:
            return
        try:
            if severity not in SEVERITIES:
                raise ValueError(f"severity must be one of {SEVERITIES}, not {severity!r}")
            row = self._keys(self._step if step is None else step, None, 0, 0, 0, advance=False)
            row.update(kind=kind, detector=detector, severity=severity, value=float(value),
                       threshold=float(threshold), message=message)  # fmt: skip
            self._in_flight.then(lambda: self._writer_submit("alerts", [row], 1))
            if self.notifier is not None:
                self.notifier.alert(self.run_id, row)
        except Exception as error:  # noqa: BLE001
            self._fail("log_alert", error)

    # ------------------------------------------------------------------ read back / lifecycle
    def recent_steps(self, max_in_flight: int = 0) -> pa.Table:
        """The last ``window`` steps rows as an Arrow table (for detectors running live over DuckDB).

        Waits for the host copies still in flight until at most ``max_in_flight`` updates are left out:
        0 (default) gives every update logged so far; 1, called after update n+1 was logged, waits at most
        for update n's copy (queued an update earlier, so the device still has n+1's work to run).
        """
        self._drain(keep=max_in_flight)
        return pa.Table.from_pylist(list(self._recent))

    @property
    def last_step(self) -> int:
        """The most recent step logged (−1 before the first)."""
        return self._step

    def upload_stats(self) -> UploadStats | None:
        """For a run in object storage: files uploaded and deleted, failed upload rounds, files waiting."""
        return None if self._uploader is None else self._uploader.stats

    def writer_stats(self) -> WriterStats:
        """Rows written and dropped so far."""
        return self._writer.stats() if self._writer else WriterStats()

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until everything logged so far is on disk (True on success)."""
        self._drain(keep=0)
        return self._writer.flush(timeout) if self._writer else True

    def update_run_info(self, **fields: Any) -> None:
        """Merge ``fields`` into ``run.json`` (rank 0, unless its writer was refused; atomic rewrite)."""
        try:
            self._info.update(**fields)
        except Exception as error:  # noqa: BLE001
            self._fail("run.json", error)

    def close(self, status: str | None = None, *, compact: bool = True) -> None:
        """Flush and stop the writer, and mark the run ``status`` in ``run.json`` (idempotent); by default
        ``terminated`` once this process got SIGTERM, else ``finished``. ``compact=False`` skips the last
        merge of small parts (as on SIGTERM)."""
        if not self._info.close() or not self.enabled:
            return
        status = ending_status(None) if status is None else status
        self._drain(keep=0)  # the rows of updates whose copies are still in flight (also on SIGTERM)
        if self._writer is not None:
            self._writer.close(compact=compact)
            stats = self._writer.stats()
            if stats.rows_dropped:
                self._warn_once(
                    "dropped", f"sorl-monitor dropped {stats.rows_dropped} rows ({stats.last_error})", 2
                )
        self.update_run_info(status=status, finished_at=utc_now(), last_step=self._step)
        if self._uploader is not None:
            close_upload(
                self._uploader,
                self.run_dir,
                self._writer_refused(),
                5.0 if not compact else 30.0,
                self._warn_once,
            )
        if self.notifier is not None:
            if status != "finished":
                self.notifier.send(f"[sorl] {self.run_id} ended {status} at step {self._step}")
            self.notifier.close()

    def _writer_refused(self) -> bool:
        return self._writer is not None and bool(self._writer.refused)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: Any) -> None:
        self.close(ending_status(exc_type))

    # ------------------------------------------------------------------ internals
    def _keys(
        self,
        step: int | None,
        iteration: int | None,
        ppo_epoch: int,
        minibatch: int,
        policy_lag: int,
        *,
        advance: bool = True,
    ) -> dict[str, Any]:
        current = self._step + (1 if advance else 0) if step is None else key_value("step", step, 64)
        if advance:
            self._step = current
        return {
            "run_id": self.run_id,
            "rank": self.rank,
            "step": current,
            "iteration": current if iteration is None else key_value("iteration", iteration, 64),
            "ppo_epoch": key_value("ppo_epoch", ppo_epoch, 32),
            "minibatch": key_value("minibatch", minibatch, 32),
            "policy_lag": key_value("policy_lag", policy_lag, 32),
            "wall_time": time.time(),
        }

    def _drain(self, keep: int) -> None:
        try:
            self._in_flight.drain(keep=keep)
        except Exception as error:  # noqa: BLE001 - a failed wait on the device
            self._fail("log_update", error)

    def _finish_step(self, row: dict[str, Any]) -> None:
        dropped = self._writer.rows_dropped if self._writer is not None else 0
        row["monitor_dropped_rows"] = float(dropped)
        row["monitor_errors"] = float(self._errors)
        if dropped > self._dropped_reported:
            self._dropped_reported = dropped
            reason = self.writer_stats().last_error
            self._warn_once("dropped", f"sorl-monitor is dropping rows ({reason}); training goes on", 2)
        self._recent.append(row)
        self._writer_submit("steps", [row], 1)

    def _writer_submit(self, table: str, payload: Any, n_rows: int) -> None:
        if self._writer is not None:
            self._writer.submit(table, payload, n_rows)

    def _fail(self, where: str, error: Exception) -> None:
        self._errors += 1
        self._warn_once(
            where, f"sorl-monitor {where} failed ({type(error).__name__}: {error}); training goes on", 2
        )
