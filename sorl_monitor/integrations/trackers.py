"""Adapters for the logging hooks of OpenRLHF, ROLL, SkyRL and prime-rl (docs/attach.md shows each).

Each trainer hands a metrics dict and a step to its loggers; the adapter writes it as one ``steps`` row
(``Monitor.log_scalars``, names mapped with the trainer family's table where ``metric_names.py`` has one). A
trainer that logs several dicts at one step gets one row for that step. Nothing here raises into the
trainer: a failure warns once (``MonitorWarning``) and training goes on. The hooks, read off the sources:

- OpenRLHF (``openrlhf/utils/logging_utils.py``, ``trainer/ppo_trainer.py``): the PPO trainer holds
  ``wandb_logger`` and ``tensorboard_logger``, objects with ``log_train(global_step, logs_dict)``,
  ``log_eval(global_step, logs_dict)`` and ``close()``; its loggers prefix names with ``train/``.
- ROLL (``roll/utils/tracking.py``): ``tracker_registry[name] = cls``; the pipeline builds
  ``cls(config, **tracker_kwargs)`` for ``track_with: name`` and calls ``log(values, step)``, ``finish()``;
  names may carry a reducer tag (``actor/pg_loss@sum``) that its trackers strip.
- SkyRL (``skyrl/train/utils/tracking.py``, ``entrypoints/main_base.py``): ``BasePPOExp.get_tracker()``
  returns a ``Tracking`` with ``log(data, step, commit=False)`` and ``finish()``; W&B-style, dicts with
  ``commit=False`` wait for the step's committing call.
- prime-rl (``src/prime_rl/monitors``): ``monitors.setup(...)`` fills the list ``MONITORS``, whose
  members get ``await log(data, step, kind, subset)`` (a metrics dict, or episodes) and ``await finalize()``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from sorl_monitor.integrations.verl import config_dict
from sorl_monitor.metric_names import names_for
from sorl_monitor.warn import WarnOnce, warn
from sorl_monitor.write.monitor import Monitor

Names = str | Mapping[str, str] | None


class TrackerRun:
    """One run fed with metrics dicts: the rows of a step are merged until ``flush`` (or a later step).

    Args:
        log_dir, run_name, config, algorithm: the ``Monitor`` to build (unless ``monitor`` is given).
        names: a trainer family of ``metric_names.NAME_TABLES``, a ``{trainer name: column}`` mapping, or ``None``
            (names only snake-cased).
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] = "runs",
        run_name: str | None = None,
        config: Any = None,
        *,
        monitor: Monitor | None = None,
        names: Names = None,
        algorithm: str | None = None,
    ) -> None:
        self.names = names_for(names)
        self.monitor = monitor or Monitor(log_dir, run_name, config_dict(config), algorithm=algorithm)
        self._step: int | None = None
        self._pending: dict[str, Any] = {}
        self._warn_once = WarnOnce()

    def add(self, step: int | None, metrics: Mapping[str, Any]) -> None:
        """Merge ``metrics`` into the row of ``step`` (a row of an earlier step is written first)."""
        self._guard(self._add, step, metrics)

    def flush(self) -> None:
        """Write the pending row."""
        self._guard(self._flush)

    def close(self) -> None:
        """Write the pending row and close the run (idempotent)."""
        self._guard(self._flush)
        self._guard(self.monitor.close)

    def _add(self, step: int | None, metrics: Mapping[str, Any]) -> None:
        step = None if step is None else int(step)
        if self._pending and step != self._step:
            self._flush()
        self._step = step
        self._pending.update(metrics)

    def _flush(self) -> None:
        pending, self._pending = self._pending, {}
        if pending:
            self.monitor.log_scalars(self._step, pending, names=self.names)

    def _guard(self, call: Callable[..., Any], *args: Any) -> None:
        try:
            call(*args)
        except Exception as error:  # noqa: BLE001 - a logger must never stop training
            message = f"sorl-monitor: cannot log ({type(error).__name__}: {error}); training goes on"
            self._warn_once("log", message, stacklevel=3)


# ---------------------------------------------------------------------- OpenRLHF
class OpenRLHFLogger(TrackerRun):
    """An OpenRLHF logger: ``log_train`` writes one row at OpenRLHF's ``global_step`` (names as its W&B
    logger writes them, ``train/…``, mapped with the ``openrlhf`` table); ``log_eval`` is left out, as the
    log readers leave evaluation rows out."""

    def __init__(self, *args: Any, names: Names = "openrlhf", **kwargs: Any) -> None:
        super().__init__(*args, names=names, **kwargs)

    def log_train(self, global_step: int, logs_dict: Mapping[str, Any]) -> None:
        self.add(global_step, {f"train/{name}": value for name, value in logs_dict.items()})
        self.flush()

    def log_eval(self, global_step: int, logs_dict: Mapping[str, Any]) -> None:
        """Evaluation is not written to ``steps``."""


class _BothLoggers:
    """OpenRLHF's logger slot holding its own logger and ours."""

    def __init__(self, *loggers: Any) -> None:
        self.loggers = [logger for logger in loggers if logger is not None]

    def log_train(self, global_step: int, logs_dict: Mapping[str, Any]) -> None:
        for logger in self.loggers:
            logger.log_train(global_step, logs_dict)

    def log_eval(self, global_step: int, logs_dict: Mapping[str, Any]) -> None:
        for logger in self.loggers:
            logger.log_eval(global_step, logs_dict)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


def install_openrlhf_logger(
    trainer_cls: type, log_dir: str | os.PathLike[str] = "runs", run_name: str | None = None
) -> None:
    """Give every OpenRLHF PPO trainer of ``trainer_cls`` (``BasePPOTrainer``) an ``OpenRLHFLogger`` beside
    its TensorBoard logger, in the process that builds it (its Ray actor). Calling it twice installs it once."""
    original = trainer_cls.__init__
    if getattr(original, "sorl_logger", False):
        return

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            ours = OpenRLHFLogger(log_dir, run_name, config=getattr(self, "args", None))
            self.tensorboard_logger = _BothLoggers(getattr(self, "tensorboard_logger", None), ours)
        except Exception as error:  # noqa: BLE001 - never stop OpenRLHF from starting
            warn(f"sorl-monitor: no OpenRLHF logger ({error})", stacklevel=2)

    init.sorl_logger = True  # type: ignore[attr-defined]
    trainer_cls.__init__ = init


# ---------------------------------------------------------------------- ROLL
class RollTracker(TrackerRun):
    """A ROLL tracker: ``tracker_registry["sorl"] = RollTracker`` and ``track_with: sorl``; the pipeline
    builds it as ``RollTracker(config, **tracker_kwargs)`` (``log_dir``, ``run_name``, ``names``). ROLL's
    names are kept as logged (no name table yet), reducer tags (``@sum``) stripped."""

    def __init__(
        self,
        config: Any = None,
        log_dir: str | os.PathLike[str] = "runs",
        run_name: str | None = None,
        names: Names = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(log_dir, run_name, config, names=names, **kwargs)

    def log(self, values: Mapping[str, Any], step: int | None, **kwargs: Any) -> None:
        self.add(step, {str(name).rsplit("@", 1)[0]: value for name, value in values.items()})
        self.flush()

    def finish(self) -> None:
        self.close()


# ---------------------------------------------------------------------- SkyRL
class SkyRLTracking(TrackerRun):
    """SkyRL's ``Tracking`` and a run beside it: return it from ``BasePPOExp.get_tracker``. A step's dicts
    are merged into one row, written at the call with ``commit=True``; everything else goes to ``tracking``."""

    def __init__(self, tracking: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tracking = tracking

    def log(self, data: Mapping[str, Any], step: int, commit: bool = False) -> None:
        self.tracking.log(data, step, commit=commit)
        self.add(step, data)
        if commit:
            self.flush()

    def finish(self) -> None:
        self.close()
        self.tracking.finish()

    def __getattr__(self, name: str) -> Any:
        tracking = self.__dict__.get("tracking")
        if tracking is None:
            raise AttributeError(name)
        return getattr(tracking, name)


# ---------------------------------------------------------------------- prime-rl
class PrimeRLMonitor(TrackerRun):
    """A prime-rl monitor (duck-typed: ``init``, ``log``, ``log_metrics``, ``log_episodes``, ``finalize``).

    prime-rl logs several dicts per step (trainer: performance, optimizer, tensor statistics, …); they
    make one row, written when the next step's first dict arrives or at ``finalize``. Episodes are
    not written (their rewards reach ``steps`` through the orchestrator's metrics).
    """

    def __init__(self, *args: Any, names: Names = "prime_rl", **kwargs: Any) -> None:
        super().__init__(*args, names=names, **kwargs)

    async def init(self, **kwargs: Any) -> None:
        """Nothing to set up (the run was created with the monitor)."""

    async def log(self, data: Any, step: int, kind: str = "train", subset: str = "effective") -> None:
        if isinstance(data, Mapping):
            await self.log_metrics(data, step)

    async def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        self.add(step, metrics)

    async def log_episodes(self, episodes: list[Any], step: int, kind: str, subset: str) -> None:
        """Episodes are not written."""

    async def finalize(self) -> None:
        self.close()


def install_prime_rl_monitor(
    monitors: Any, log_dir: str | os.PathLike[str] = "runs", run_name: str | None = None
) -> None:
    """Add a ``PrimeRLMonitor`` to what ``monitors.setup`` registers (``monitors``: ``prime_rl.monitors``),
    on rank 0 as prime-rl does. Call it in the process, before prime-rl's entry point sets up its monitors."""
    original = monitors.setup
    if getattr(original, "sorl_monitor", False):
        return

    async def setup(*args: Any, **kwargs: Any) -> None:
        await original(*args, **kwargs)
        if int(os.environ.get("RANK", os.environ.get("DP_RANK", "0"))) != 0:
            return
        try:
            monitors.MONITORS.append(PrimeRLMonitor(log_dir, run_name, kwargs.get("run_config")))
        except Exception as error:  # noqa: BLE001 - never stop prime-rl from starting
            warn(f"sorl-monitor: no prime-rl monitor ({error})", stacklevel=2)

    setup.sorl_monitor = True  # type: ignore[attr-defined]
    monitors.setup = setup
