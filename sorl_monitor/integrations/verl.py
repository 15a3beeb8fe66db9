"""Attach to verl three ways, no fork of verl (docs/attach.md shows each).

(a) ``MonitoredPolicyLoss``: a policy loss with verl's signature, registered with
    ``verl.trainer.ppo.core_algos.register_policy_loss`` (``register_monitored_loss``). It calls the
    wrapped loss (``vanilla`` by default) unchanged and logs token- and turn-level metrics from
    ``old_log_prob``, ``log_prob``, ``advantages`` and ``response_mask`` (turns = contiguous runs of 1
    in ``response_mask``: verl's agent loop marks LLM tokens 1 and tool/observation tokens 0), one row
    per optimizer update (the micro-batches between two optimizer steps). It runs in each actor
    worker, so every rank writes its own partition. The richest path.
(b) ``SorlTracking``: a tracking backend (``log(data, step)``, ``finish()``) for verl's ``Tracking``;
    every ``data`` dict becomes one ``steps`` row, names mapped with the ``verl`` name table. verl's trainer
    builds its ``Tracking`` inside ``fit()`` from a fixed list of backends, so ``install_tracking_backend``
    adds this one to every ``Tracking`` a process creates.
(c) ``ingest_verl_jsonl``: reads verl's ``file`` logger output (``{"step": N, "data": {...}}`` per
    line), optionally following the file as it grows (``sorl ingest FILE [--follow]``).

Signatures looked up in verl 0.9.1's source: ``PolicyLossFn`` and ``register_policy_loss`` in
``verl/trainer/ppo/core_algos.py``; the engine workers call the loss with keywords once per micro-batch
(``workers/utils/losses.py`` ``ppo_loss``), ``engine.train_batch`` steps the optimizer once per mini-batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle

from sorl_monitor.integrations.batches import TokenBatch, concat_batches, log_batch
from sorl_monitor.logs.ingest import IngestReport, ingest_lines
from sorl_monitor.logs.verl import parse_record
from sorl_monitor.metric_names import TAP_MEASURED, map_metrics, names_for
from sorl_monitor.warn import WarnOnce, warn
from sorl_monitor.write.monitor import Monitor
from sorl_monitor.write.update_metrics import MetricsConfig

VERL_LOSS_PARAMETERS = (
    "old_log_prob",
    "log_prob",
    "advantages",
    "response_mask",
    "loss_agg_mode",
    "config",
    "rollout_is_weights",
)
"""The keywords verl's actor passes to a registered policy loss, in ``PolicyLossFn`` order."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


def config_value(config: Any, name: str, default: Any = None) -> Any:
    """``config.name`` of a verl ``ActorConfig`` (a Mapping dataclass), an OmegaConf ``DictConfig`` or a dict."""
    if config is None:
        return default
    value = getattr(config, name, None)
    if value is None and isinstance(config, Mapping):
        value = config.get(name)
    return default if value is None else value


def config_dict(config: Any) -> dict[str, Any]:
    """A config as a plain dict for ``run.json`` (dataclass, mapping, pydantic model, argparse namespace;
    anything else as text)."""
    if config is None:
        return {}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    if isinstance(config, Mapping):
        return {str(k): config[k] for k in config}
    if callable(getattr(config, "model_dump", None)):  # pydantic (prime-rl's configs)
        return config.model_dump(mode="json")
    if isinstance(config, argparse.Namespace):
        return vars(config)
    return {"config": str(config)}


class MonitoredPolicyLoss:
    """A verl policy loss that calls ``wrapped`` and logs one ``steps`` row per optimizer update.

    verl calls the loss once per micro-batch; the micro-batches of one optimizer update are those
    between two optimizer steps, whatever their number (it varies with ``use_dynamic_bsz``). The
    wrapper keeps each micro-batch's tensors, detached, and a process-wide optimizer step hook
    (``torch.optim.optimizer.register_optimizer_step_post_hook``) writes them as one row at
    ``step`` = 1, 2, … (updates done by this rank, as transformers numbers its steps).

    Args:
        wrapped: the loss to call: a registered verl loss name (looked up at the first call) or a
            function with verl's policy-loss signature.
        log_dir, run_name, monitor_kwargs: the ``Monitor`` built at the first call, in the worker
            (``clip_eps``/``clip_eps_high`` default to the config's ``clip_ratio_low``/``clip_ratio_high``).
        accumulate: group a fixed number of micro-batches per row instead of following optimizer steps.
        monitor: log here instead of building one.
    """

    max_buffered = 1024
    """Micro-batches kept before a row is written without an optimizer step (bounds memory)."""

    def __init__(
        self,
        wrapped: str | Callable[..., tuple[torch.Tensor, dict[str, Any]]] = "vanilla",
        *,
        log_dir: str | os.PathLike[str] = "runs",
        run_name: str | None = None,
        accumulate: int | None = None,
        monitor: Monitor | None = None,
        **monitor_kwargs: Any,
    ) -> None:
        self.wrapped = wrapped
        self.log_dir = log_dir
        self.run_name = run_name
        self.accumulate = accumulate
        self.monitor = monitor
        self.monitor_kwargs = monitor_kwargs
        self.updates = 0
        self._batches: list[TokenBatch] = []
        self._hook: RemovableHandle | None = None
        self._warn_once = WarnOnce()

    def __call__(
        self,
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        pg_loss, pg_metrics = self._loss_fn()(
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=advantages,
            response_mask=response_mask,
            loss_agg_mode=loss_agg_mode,
            config=config,
            rollout_is_weights=rollout_is_weights,
        )
        try:
            self._record(old_log_prob, log_prob, advantages, response_mask, config, pg_loss, pg_metrics)
        except Exception as error:  # noqa: BLE001 - monitoring must never break the update
            self._warn(error)
        return pg_loss, pg_metrics

    def close(self) -> None:
        """Log a partly gathered update, stop following optimizer steps and close the monitor."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.monitor is not None:
            self._write()
            self.monitor.close()

    def _warn(self, error: Exception) -> None:
        message = f"sorl-monitor verl loss tap failed ({type(error).__name__}: {error}); training goes on"
        self._warn_once("tap", message, stacklevel=3)

    def _loss_fn(self) -> Callable[..., tuple[torch.Tensor, dict[str, Any]]]:
        if isinstance(self.wrapped, str):
            from verl.trainer.ppo.core_algos import get_policy_loss_fn

            self.wrapped = get_policy_loss_fn(self.wrapped)
        return self.wrapped

    def _start(self, config: Any) -> Monitor:
        clip = config_value(config, "clip_ratio", 0.2)
        metrics = MetricsConfig(
            clip_eps=float(config_value(config, "clip_ratio_low", clip)),
            clip_eps_high=float(config_value(config, "clip_ratio_high", clip)),
        )
        kwargs = {"metrics": metrics, "algorithm": "verl", **self.monitor_kwargs}
        return Monitor(self.log_dir, self.run_name, config_dict(config), **kwargs)

    def _record(
        self,
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        config: Any,
        pg_loss: torch.Tensor,
        pg_metrics: Mapping[str, Any],
    ) -> None:
        if self.monitor is None:
            self.monitor = self._start(config)
        if self.accumulate is None and self._hook is None:
            self._hook = register_optimizer_step_post_hook(self._on_optimizer_step)
        metrics = map_metrics(pg_metrics, "verl")
        metrics["pg_loss"] = float(pg_loss.detach())
        self._batches.append(
            TokenBatch.detached(
                logp=log_prob,
                old_logp=old_log_prob,
                mask=response_mask,
                advantages=advantages,
                metrics={k: v for k, v in metrics.items() if isinstance(v, float)},
            )
        )
        if len(self._batches) >= (self.accumulate or self.max_buffered):
            self._write()

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """After any optimizer step in this process: the micro-batches gathered so far were one update."""
        try:
            self._write()
        except Exception as error:  # noqa: BLE001 - runs inside optimizer.step()
            self._warn(error)

    def _write(self) -> None:
        batches, self._batches = self._batches, []
        if not batches or self.monitor is None:
            return
        batch = concat_batches(batches)
        extra = {k: v for k, v in batch.metrics.items() if k not in TAP_MEASURED}
        self.updates += 1
        log_batch(self.monitor, batch, step=self.updates, extra=extra)


def register_monitored_loss(
    name: str = "sorl", wrapped: str = "vanilla", **kwargs: Any
) -> MonitoredPolicyLoss:
    """Register ``MonitoredPolicyLoss(wrapped, **kwargs)`` as verl policy loss ``name`` (needs verl).

    Then set ``actor_rollout_ref.actor.policy_loss.loss_mode=<name>``; import the module that calls
    this in every worker, e.g. with ``VERL_USE_EXTERNAL_MODULES=<module>``.
    """
    from verl.trainer.ppo.core_algos import register_policy_loss

    loss = MonitoredPolicyLoss(wrapped, **kwargs)
    register_policy_loss(name)(loss)
    return loss


class SorlTracking:
    """A verl tracking backend: ``log(data, step)`` writes one ``steps`` row; ``finish()`` closes the run.

    Add it to verl's ``Tracking`` next to its own backends: ``tracking.logger["sorl"] = SorlTracking(...)``.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] = "runs",
        run_name: str | None = None,
        config: Any = None,
        *,
        monitor: Monitor | None = None,
        names: str | Mapping[str, str] = "verl",
    ) -> None:
        self.names = names_for(names)
        self.monitor = monitor or Monitor(log_dir, run_name, config_dict(config), algorithm="verl")

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """One row at ``step`` from verl's metrics dict (never raises)."""
        try:
            self.monitor.log_scalars(int(step), data, names=self.names)
        except Exception as error:  # noqa: BLE001
            warn(f"sorl-monitor: cannot log verl metrics ({error})", stacklevel=2)

    def finish(self) -> None:
        """Close the run (idempotent; never raises)."""
        try:
            self.monitor.close()
        except Exception as error:  # noqa: BLE001
            warn(f"sorl-monitor: cannot close the run ({error})", stacklevel=2)


def safe_run_name(text: str, default: str = "verl") -> str:
    """``text`` made a valid run name: runs of other characters become ``-`` (verl experiment names, file stems)."""
    name = _UNSAFE.sub("-", text).lstrip("._=+-")[:128]
    return name or default


def install_tracking_backend(log_dir: str | os.PathLike[str] = "runs", run_name: str | None = None) -> None:
    """Give every verl ``Tracking`` created from now on a ``"sorl"`` backend (``SorlTracking``; needs verl).

    The run is named ``run_name`` or the experiment name. Call it in the driver process, e.g. from a
    module listed in ``VERL_USE_EXTERNAL_MODULES``; calling it twice installs it once.
    """
    from verl.utils.tracking import Tracking

    original = Tracking.__init__
    if getattr(original, "sorl_backend", False):
        return

    @functools.wraps(original)
    def init(
        self: Any,
        project_name: str,
        experiment_name: str,
        default_backend: Any = "console",
        config: Any = None,
    ) -> None:
        original(self, project_name, experiment_name, default_backend, config)
        try:
            name = run_name or safe_run_name(str(experiment_name))
            self.logger["sorl"] = SorlTracking(log_dir, name, config)
        except Exception as error:  # noqa: BLE001 - never stop verl from starting
            warn(f"sorl-monitor: no sorl tracking backend ({error})", stacklevel=2)

    original_finish = getattr(Tracking, "finish", None)

    def finish(self: Any, *args: Any, **kwargs: Any) -> Any:
        backend = getattr(self, "logger", {}).get("sorl")
        if backend is not None:  # verl ≥ 0.9 finishes only the backends it knows by name
            backend.finish()
        return original_finish(self, *args, **kwargs) if original_finish is not None else None

    init.sorl_backend = True  # type: ignore[attr-defined]
    Tracking.__init__ = init
    Tracking.finish = finish


# ---------------------------------------------------------------------- (c) file-logger output
# (the line format itself is read by sorl_monitor.logs.verl.parse_record)


def ingest_verl_jsonl(
    path: str | os.PathLike[str],
    monitor: Monitor,
    *,
    after_step: int = -1,
    follow: bool = False,
    idle_timeout_s: float | None = None,
    poll_s: float = 0.5,
    stop: threading.Event | None = None,
    names: str | Mapping[str, str] = "verl",
) -> IngestReport:
    """Write each record of verl's file-logger output with ``step > after_step`` as one ``steps`` row
    (``logs.ingest.ingest_lines`` with ``parse_record``: ``follow`` keeps reading as the file grows)."""
    return ingest_lines(
        path,
        monitor,
        parse_record,
        family=names,
        after_step=after_step,
        follow=follow,
        idle_timeout_s=idle_timeout_s,
        poll_s=poll_s,
        stop=stop,
    )
