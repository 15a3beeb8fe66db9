"""Attach to a Hugging Face ``transformers.Trainer`` or any TRL trainer with one callback.

    mon = Monitor("runs")
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[SorlCallback(mon)])
    trainer.train()

Every optimizer update becomes one ``steps`` row at ``step = state.global_step`` (1-based, as the
trainer logs it), holding what the trainer logged for that step (names mapped by ``metric_names.map_metrics``
with the ``trl`` table, which covers transformers' too; unknown keys kept as extra columns) and, with the TRL tap
(``integrations.trl``), the update's token- and turn-level metrics (a tap may set ``clip_bounds``, the
trust region the monitor measures with, and ``update_columns``, columns it computes over each update). Per-module gradient norms are read
from the model in ``on_pre_optimizer_step`` (after the trainer clipped them) and rescaled to the
pre-clip ``grad_norm`` the trainer logs, so they are written on logged steps. ``run.json`` gets the
trainer's arguments. A ``detect`` function, run over the recent ``steps`` window after each row, can
raise alerts, and with ``stop_on_critical`` a critical one ends training
(``control.should_training_stop``). The monitor is closed on train end. No callback event raises.

A row is written once its step's logs are in: at ``on_log``, or at ``on_evaluate`` when an evaluation
runs at that step (so ``eval_*`` values join the row), or at ``on_step_end`` when nothing is logged.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import pyarrow as pa
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from sorl_monitor.integrations.batches import TokenBatch, concat_batches, log_batch
from sorl_monitor.metric_names import TAP_MEASURED, map_metrics, names_for
from sorl_monitor.warn import WarnOnce
from sorl_monitor.write.module_tracker import ModuleNormTracker, pre_clip_norms
from sorl_monitor.write.monitor import Monitor
from sorl_monitor.write.transfer import to_host

AlertSource = Callable[[pa.Table], "pa.Table | Iterable[Mapping[str, Any]]"]
"""Recent ``steps`` rows → alerts, each with ``step, detector, severity, value, threshold, message``."""

SUMMARY_KEY = "train_runtime"  # the trainer's end-of-training summary log, stored in run.json
F = TypeVar("F", bound=Callable[..., Any])


def _never_raises(event: F) -> F:
    """A callback event that warns (once per event) instead of raising into the trainer."""

    @functools.wraps(event)
    def guarded(self: SorlCallback, *args: Any, **kwargs: Any) -> None:
        try:
            event(self, *args, **kwargs)
        except Exception as error:  # noqa: BLE001 - monitoring must never stop training
            self.warn_once(event.__name__, f"{event.__name__} failed ({type(error).__name__}: {error})")

    return guarded  # type: ignore[return-value]


@dataclass
class _PendingStep:
    step: int
    logs: dict[str, Any] = field(default_factory=dict)
    module_grads: torch.Tensor | None = None
    module_params: torch.Tensor | None = None
    updates: list[TokenBatch] = field(default_factory=list)


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def _algorithm(args: TrainingArguments) -> str | None:
    """``GRPOConfig`` → ``grpo``; plain ``TrainingArguments`` → None."""
    name = type(args).__name__
    return name.removesuffix("Config").lower() if name.endswith("Config") else None


class SorlCallback(TrainerCallback):
    """Streams a ``transformers``/TRL trainer's logs, module grad norms and tapped updates into a ``Monitor``.

    Args:
        monitor: where rows go; default: a ``Monitor(log_dir, run_name)`` built at train start with the
            trainer's arguments as config (if it cannot be built, monitoring is off with a warning).
        names: a trainer family of ``metric_names.NAME_TABLES`` or a ``{trainer name: column}`` mapping (default
            TRL's table, which includes transformers' names).
        detect: alerts from the recent ``steps`` window, run after each row (see ``AlertSource``).
        stop_on_critical: end training when ``detect`` reports a critical alert.
        close_on_train_end: close the monitor when training ends.
    """

    def __init__(
        self,
        monitor: Monitor | None = None,
        *,
        log_dir: str | os.PathLike[str] = "runs",
        run_name: str | None = None,
        names: str | Mapping[str, str] = "trl",
        detect: AlertSource | None = None,
        stop_on_critical: bool = False,
        close_on_train_end: bool = True,
    ) -> None:
        self.monitor = monitor
        self.log_dir = log_dir
        self.run_name = run_name
        self.names = names_for(names)
        self.detect = detect
        self.stop_on_critical = stop_on_critical
        self.close_on_train_end = close_on_train_end
        self.stopped_by: str | None = None
        self._pending: _PendingStep | None = None
        self._alerted_through = -1
        self._modules = ModuleNormTracker()
        self._clips = True
        self._warn_once = WarnOnce()
        self.clip_bounds: tuple[float, float] | None = None
        """A tap's trust region ``(ε_low, ε_high)``, given to the monitor at train start."""
        self.update_columns: Callable[[TokenBatch], Mapping[str, Any]] | None = None
        """A tap's columns of one update, computed over its batch; they win over the trainer's logs."""

    # ------------------------------------------------------------------ what the TRL tap feeds in
    def add_update(self, step: int, batch: TokenBatch) -> None:
        """Add one micro-batch's tapped tensors to optimizer update ``step`` (called by the TRL tap)."""
        self._pending_for(step).updates.append(batch)

    # ------------------------------------------------------------------ trainer events
    @_never_raises
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model=None, **kwargs
    ) -> None:
        if self.monitor is None:
            try:
                self.monitor = Monitor(
                    self.log_dir, self.run_name, args.to_dict(), algorithm=_algorithm(args), seed=args.seed
                )
            except Exception as error:  # noqa: BLE001 - e.g. an unwritable log dir: train without monitoring
                self.monitor = Monitor(self.log_dir, enabled=False)
                self.warn_once("start", f"cannot start a run in {self.log_dir} ({error}); monitoring is off")
                return
        if self.clip_bounds is not None:
            low, high = self.clip_bounds
            self.monitor.metrics_config = replace(
                self.monitor.metrics_config, clip_eps=low, clip_eps_high=high
            )
        info: dict[str, Any] = {"trainer_args": args.to_dict(), "trainer_args_class": type(args).__name__}
        if model is not None and hasattr(model, "config") and hasattr(model.config, "to_dict"):
            info["model_config"] = model.config.to_dict()
        self.monitor.update_run_info(**info)
        self._clips = args.max_grad_norm is not None and args.max_grad_norm > 0
        if model is not None:
            self._modules = ModuleNormTracker.of(model)

    @_never_raises
    def on_step_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        self._write_pending(control)

    @_never_raises
    def on_pre_optimizer_step(self, args, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        if self._modules:
            grads, params = self._modules.measure()
            pending = self._pending_for(state.global_step + 1)
            pending.module_grads, pending.module_params = grads, params

    @_never_raises
    def on_step_end(self, args, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        if not (control.should_log or control.should_evaluate):
            self._write_pending(control)

    @_never_raises
    def on_log(self, args, state: TrainerState, control: TrainerControl, logs=None, **kwargs) -> None:
        if not logs:
            return
        if SUMMARY_KEY in logs:
            if self.monitor is not None:
                self.monitor.update_run_info(train_summary=dict(logs))
            return
        self._pending_for(state.global_step).logs.update(logs)
        if not control.should_evaluate:
            self._write_pending(control)

    @_never_raises
    def on_evaluate(self, args, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        self._write_pending(control)

    @_never_raises
    def on_train_end(self, args, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        self._write_pending(control)
        if self.monitor is not None and self.close_on_train_end:
            if self.stopped_by is not None:
                self.monitor.update_run_info(stopped_by=self.stopped_by)
            self.monitor.close("stopped" if self.stopped_by is not None else "finished")

    # ------------------------------------------------------------------ rows
    def warn_once(self, key: str, message: str) -> None:
        """Warn about ``key`` once per callback (``warn.WarnOnce``; never raised into the trainer)."""
        self._warn_once(key, f"sorl-monitor: {message}; training goes on", stacklevel=3)

    def _pending_for(self, step: int) -> _PendingStep:
        if self._pending is not None and self._pending.step != step:
            self._write_pending(None)
        if self._pending is None:
            self._pending = _PendingStep(step)
        return self._pending

    def _write_pending(self, control: TrainerControl | None) -> None:
        pending, self._pending = self._pending, None
        if pending is None or self.monitor is None or not (pending.logs or pending.updates):
            return
        columns = map_metrics(pending.logs, self.names)
        module_rows = self._module_rows(pending, columns)
        if pending.updates:
            batch = concat_batches(pending.updates)
            grad_norm = columns.pop("grad_norm", None)
            extra = {k: v for k, v in columns.items() if k not in TAP_MEASURED}
            extra.update(batch.metrics)
            if self.update_columns is not None:
                extra.update(self.update_columns(batch))
            log_batch(
                self.monitor,
                batch,
                step=pending.step,
                grad_norm=grad_norm if isinstance(grad_norm, float) else None,
                extra=extra,
            )
        else:
            self.monitor.log_scalars(pending.step, columns, names=None)  # mapped already
        if module_rows is not None:
            self.monitor.log_modules(pending.step, *module_rows)
        self._run_detectors(control)

    def _module_rows(
        self, pending: _PendingStep, columns: dict[str, Any]
    ) -> tuple[dict[str, float], dict[str, float]] | None:
        """Module grad/param norms of the step, rescaled to the logged pre-clip ``grad_norm``
        (``module_tracker.pre_clip_norms``, which adds ``grad_norm_clipped`` and ``param_norm`` to
        ``columns``); None if unknown (the trainer clipped but logged no finite ``grad_norm``)."""
        if pending.module_grads is None or pending.module_params is None:
            return None
        pre_clip = columns.get("grad_norm")
        if not (isinstance(pre_clip, float) and math.isfinite(pre_clip)):
            if self._clips:
                return None
            pre_clip = None
        host = to_host({"grads": pending.module_grads, "params": pending.module_params})
        grads, norms = pre_clip_norms(host["grads"], host["params"], pre_clip)
        columns.update(norms)
        return self._modules.by_name(grads), self._modules.by_name(host["params"])

    def _run_detectors(self, control: TrainerControl | None) -> None:
        if self.detect is None or self.monitor is None:
            return
        found = self.detect(self.monitor.recent_steps())
        alerts = found.to_pylist() if isinstance(found, pa.Table) else list(found)
        newest = self._alerted_through
        for alert in alerts:
            step = int(alert["step"])
            if step <= self._alerted_through:
                continue
            newest = max(newest, step)
            self.monitor.log_alert(
                str(alert["detector"]),
                str(alert["severity"]),
                str(alert.get("message") or ""),
                value=_number(alert.get("value")),
                threshold=_number(alert.get("threshold")),
                step=step,
            )
            if self.stop_on_critical and alert["severity"] == "critical" and control is not None:
                control.should_training_stop = True
                if self.stopped_by is None:
                    self.stopped_by = f"{alert['detector']} at step {step}"
                    self.monitor.log_alert(
                        "stop_training",
                        "critical",
                        f"stopped training: {alert['detector']} critical at step {step}",
                        step=step,
                        kind="action",
                    )
        self._alerted_through = newest
