"""The public API: attach a ``Monitor`` to any PyTorch RL loop and stream its stability metrics.

    mon = Monitor("runs", config=vars(args))       # 1
    mon.watch(model)                                # 2  per-module grad norms
    ...loss.backward()
    mon.log_update(logp=logp, old_logp=old_logp, mask=mask, advantages=adv)   # 3
    optimizer.step(); optimizer.zero_grad()
    mon.close()                                     # 4  (or use ``with Monitor(...) as mon:``)

Metrics are computed on the tensors' device (``sorl_monitor.metrics``), packed into one tensor and
moved to the host once per update; rows go to a background Parquet writer. Nothing here raises
into the training loop once the monitor is built: a failure is counted (``monitor_errors``) and
warned about once.

``run.json``'s status comes from the process that owns the run: ``finished`` on ``close()``, ``failed`` on
an uncaught exception, ``interrupted`` on Ctrl-C (``KeyboardInterrupt``), ``terminated`` on SIGTERM (what
SLURM, Kubernetes and torchrun send): everything logged is flushed first, then the signal does what it
did before (the handler that was installed is called, or the process ends by SIGTERM). A forked child's
copy of a monitor is closed: it never writes to, or marks, its parent's run.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import datetime as dt
import os
import platform
import re
import secrets
import signal
import socket
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch import Tensor, nn

from sorl_monitor import __version__
from sorl_monitor.integrations.names import guess_family, map_metrics
from sorl_monitor.metrics import TURN_COLUMNS, module_norms, update_metrics
from sorl_monitor.notify import Notifier
from sorl_monitor.schema import (
    KEYS,
    RUN_FILE,
    SCHEMA_VERSION,
    SEVERITIES,
    check_run_id,
    column_name,
    metric_column,
)
from sorl_monitor.writer import (
    ParquetStreamWriter,
    WriterStats,
    check_setting,
    check_writer_settings,
    write_json_atomic,
)

_NUMERIC = re.compile(r"^\d+$")


class MonitorWarning(RuntimeWarning):
    """Monitoring lost data or failed; training goes on."""


def warn(message: str, stacklevel: int = 1) -> None:
    """Issue a ``MonitorWarning`` that never raises into training: where a filter turns it into an
    exception (``python -W error``), the message is written to stderr instead."""
    try:
        warnings.warn(message, MonitorWarning, stacklevel=stacklevel + 1)
    except MonitorWarning:
        with contextlib.suppress(Exception):
            print(f"MonitorWarning: {message}", file=sys.stderr)


def module_group(parameter_name: str) -> str:
    """Top-level module a parameter belongs to: up to the first numeric part, else its first two parts.

    ``model.layers.3.mlp.up_proj.weight`` → ``model.layers.3``; ``model.embed_tokens.weight`` →
    ``model.embed_tokens``; ``lm_head.weight`` → ``lm_head``.
    """
    parts = parameter_name.split(".")[:-1] or parameter_name.split(".")
    for i, part in enumerate(parts):
        if _NUMERIC.match(part):
            return ".".join(parts[: i + 1])
    return ".".join(parts[:2])


def _key(name: str, value: Any, bits: int) -> int:
    """``value`` as an int that fits the key column's ``bits``-bit type (``ValueError`` otherwise)."""
    number = int(value)
    if not -(2 ** (bits - 1)) <= number < 2 ** (bits - 1):
        raise ValueError(f"{name} {number} does not fit the schema's {bits}-bit integer column")
    return number


def storable_seed(seed: int | None) -> int | None:
    """``seed`` as a signed 64-bit int, which every run.json reader takes (``None`` if it is not a seed).

    torch's seeds run to 2⁶⁴ − 1; one ≥ 2⁶³ is stored as its two's complement ``seed − 2⁶⁴``, which
    ``torch.manual_seed`` maps back to the same seed.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not -(2**63) <= seed < 2**64:
        return None
    return int(seed) - 2**64 if seed >= 2**63 else int(seed)


def _distributed_rank() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _new_run_id(algorithm: str | None) -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    middle = f"-{column_name(algorithm)}" if algorithm else ""
    return f"{stamp}{middle}-{secrets.token_hex(2)}"


def _shared_run_id(run_id: str, world_size: int) -> str:
    """Rank 0's run id on every rank (a broadcast when torch.distributed is initialised)."""
    if world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        box = [run_id]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]
    return run_id


_LIVE: weakref.WeakSet[Monitor] = weakref.WeakSet()
"""The open monitors of this process (flushed on SIGTERM, closed in a forked child)."""
_sigterm: dict[str, Any] = {"pid": None, "previous": None, "received": False}
"""Our SIGTERM handler: the process it is installed in, the handler it chains to, whether SIGTERM came."""
TERMINATE_TIMEOUT_S = 20.0
"""How long a SIGTERM waits for the rows still queued to reach disk (SLURM and Kubernetes allow 30 s)."""


def ending_status(exc_type: type[BaseException] | None) -> str:
    """A run's status when its process ends with ``exc_type`` uncaught (``None``: normally):
    ``terminated`` once SIGTERM came, ``interrupted`` on ``KeyboardInterrupt``, ``failed`` on any other."""
    if _sigterm["received"]:
        return "terminated"
    if exc_type is None:
        return "finished"
    return "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed"


def _on_sigterm(signum: int, frame: Any) -> None:
    """Flush every monitor of this process and record ``terminated``, then let SIGTERM act as before."""
    previous = _sigterm["previous"]
    if _sigterm["pid"] == os.getpid():
        _sigterm["received"] = True
        for monitor in list(_LIVE):
            monitor._terminate(exiting=previous == signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # end by SIGTERM, as without this handler


def _handle_sigterm() -> None:
    """Install ``_on_sigterm`` once per process, from the main thread, where a Python-level handler (or the
    default) is in place; an ignored SIGTERM stays ignored."""
    if _sigterm["pid"] == os.getpid() or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is None or previous == signal.SIG_IGN:
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    _sigterm.update(pid=os.getpid(), previous=previous)


def _close_copies_in_child() -> None:
    """In a forked child, the parent's monitors are closed without touching their files."""
    for monitor in list(_LIVE):
        monitor._closed = True
    _LIVE.clear()


os.register_at_fork(after_in_child=_close_copies_in_child)


class Monitor:
    """Streams per-update and per-turn stability metrics of an RL trainer to Parquet.

    Args:
        log_dir: folder that holds runs; this run goes to ``<log_dir>/<run_id>/``.
        run_name: the run id (a safe folder name); default ``<date>-<time>[-<algorithm>]-<hex>``.
        config: the trainer's hyper-parameters, stored in ``run.json``.
        algorithm: stored in ``run.json`` (and used in the default run id).
        seed: stored in ``run.json`` (``storable_seed``); default ``torch.initial_seed()``.
        clip_eps, clip_eps_high: PPO's trust region ``[1 − ε_low, 1 + ε_high]`` for clip fractions.
        flush_interval_s, flush_rows, max_pending_rows: the writer's flush cadence and queue bound (rows).
            Settings that cannot work (``flush_interval_s <= 0``, ``window < 1``, …) raise ``ValueError``.
        max_turn_rows: turn slots per episode written to the ``turns`` table.
        window: how many recent ``steps`` rows stay in memory for live detectors.
        compact: merge small part files into ``part-A-B.parquet`` as they pile up and at close.
        rank, world_size: default from ``torch.distributed`` (or ``RANK``/``WORLD_SIZE``).
        enabled: ``False`` turns every call into a no-op (e.g. to measure overhead).
        notify: a webhook URL (or a ``notify.Notifier``): rank 0 posts alert onsets, guard actions and an
            end of the run other than ``finished`` there, from a background thread.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] = "runs",
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        algorithm: str | None = None,
        seed: int | None = None,
        clip_eps: float = 0.2,
        clip_eps_high: float | None = None,
        flush_interval_s: float = 2.0,
        flush_rows: int = 200_000,
        max_pending_rows: int = 4_000_000,
        max_turn_rows: int = 64,
        window: int = 512,
        compact: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        enabled: bool = True,
        notify: str | Notifier | None = None,
    ) -> None:
        check_writer_settings(flush_interval_s, flush_rows, max_pending_rows, 32 if compact else 0, 1)
        check_setting("max_turn_rows", max_turn_rows, least=0, integer=True)
        check_setting("window", window, least=1, integer=True)
        check_setting("clip_eps", clip_eps, above=0)
        if clip_eps_high is not None:
            check_setting("clip_eps_high", clip_eps_high, above=0)
        self.enabled = enabled
        dist_rank, dist_world = _distributed_rank()
        self.rank = dist_rank if rank is None else rank
        self.world_size = dist_world if world_size is None else world_size
        run_id = check_run_id(run_name) if run_name is not None else _new_run_id(algorithm)
        self.run_id = _shared_run_id(run_id, self.world_size)
        self.log_dir = Path(log_dir)
        self.run_dir = self.log_dir / self.run_id
        self.clip_eps = clip_eps
        self.clip_eps_high = clip_eps_high
        self.max_turn_rows = max_turn_rows
        self._recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=window)
        self._module_names: list[str] = []
        self._module_params: list[list[nn.Parameter]] = []
        self._step = -1
        self._errors = 0
        self._warned: set[str] = set()
        self._dropped_reported = 0
        self._closed = False
        self.trainer_family: str | None = None  # the family log_scalars(names="auto") maps with
        self._meta: dict[str, Any] = {
            "run_id": self.run_id,
            "algorithm": algorithm,
            "seed": storable_seed(torch.initial_seed() if seed is None else seed),
            "config": dict(config or {}),
            "schema_version": SCHEMA_VERSION,
            "status": "running",
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "world_size": self.world_size,
            "host": socket.gethostname(),
            "versions": {
                "sorl_monitor": __version__,
                "python": platform.python_version(),
                "torch": torch.__version__,
                "pyarrow": pa.__version__,
            },
        }
        self._writer: ParquetStreamWriter | None = None
        self.notifier = (Notifier(notify) if isinstance(notify, str) else notify) if self.rank == 0 else None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._writer = ParquetStreamWriter(
            self.run_dir,
            self.rank,
            flush_interval_s=flush_interval_s,
            flush_rows=flush_rows,
            max_pending_rows=max_pending_rows,
            compact_parts=32 if compact else 0,
        )
        if self._writer.refused:  # a second monitor on this run and rank: never let it overwrite the first
            self._warn_once(
                "dropped",
                f"sorl-monitor writes nothing: {self._writer.refused}; give each monitor its own run name "
                "or rank (rows logged here are counted as dropped)",
            )
        elif self.rank == 0:
            write_json_atomic(self.run_dir / RUN_FILE, self._meta)
        atexit.register(self._close_at_exit)
        _LIVE.add(self)
        _handle_sigterm()

    # ------------------------------------------------------------------ attach
    def watch(self, model: nn.Module, modules: Mapping[str, nn.Module] | None = None) -> Monitor:
        """Track grad and parameter norms of ``model``, per top-level module (``module_group``) or per ``modules``."""
        groups: dict[str, list[nn.Parameter]] = {}
        if modules is None:
            for name, param in model.named_parameters():
                if param.requires_grad:
                    groups.setdefault(module_group(name), []).append(param)
        else:
            for name, module in modules.items():
                groups[name] = [p for p in module.parameters() if p.requires_grad]
        self._module_names = [name for name, params in groups.items() if params]
        self._module_params = [groups[name] for name in self._module_names]
        return self

    # ------------------------------------------------------------------ log
    def log_update(
        self,
        *,
        logp: Tensor,
        old_logp: Tensor,
        mask: Tensor,
        turn_ids: Tensor | None = None,
        ref_logp: Tensor | None = None,
        logits: Tensor | None = None,
        entropy: Tensor | None = None,
        advantages: Tensor | None = None,
        values: Tensor | None = None,
        returns: Tensor | None = None,
        rewards: Tensor | None = None,
        group_ids: Tensor | None = None,
        sample_ids: Tensor | None = None,
        grad_norm: float | Tensor | None = None,
        step: int | None = None,
        iteration: int | None = None,
        ppo_epoch: int = 0,
        minibatch: int = 0,
        policy_lag: int = 0,
        extra: Mapping[str, Any] | None = None,
        log_turns: bool = True,
    ) -> dict[str, float]:
        """Log one optimiser update: token- and turn-level metrics, grad norms, and ``extra`` scalars.

        Call it after ``backward()`` and before clipping, or pass ``grad_norm`` = the pre-clip norm that
        ``clip_grad_norm_`` returned (module norms are then rescaled to pre-clip). Returns the step's
        scalars as floats (for progress bars). ``log_turns=False`` keeps the turn-level scalars but
        writes no ``turns`` rows for this update (e.g. to log turns of one update per rollout). Never raises.
        """
        if not self.enabled or self._closed:
            return {}
        started = time.perf_counter()
        try:
            return self._log_update(
                logp=logp, old_logp=old_logp, mask=mask, turn_ids=turn_ids, ref_logp=ref_logp, logits=logits,
                entropy=entropy, advantages=advantages, values=values, returns=returns, rewards=rewards,
                group_ids=group_ids, sample_ids=sample_ids, grad_norm=grad_norm, step=step,
                iteration=iteration, ppo_epoch=ppo_epoch, minibatch=minibatch, policy_lag=policy_lag,
                extra=extra or {}, started=started, log_turns=log_turns,
            )  # fmt: skip
        except Exception as error:  # noqa: BLE001 - monitoring must never crash training
            self._fail("log_update", error)
            return {}

    def _log_update(
        self,
        *,
        extra: Mapping[str, Any],
        started: float,
        sample_ids: Tensor | None,
        log_turns: bool,
        **kw: Any,
    ) -> dict[str, float]:
        keys = self._keys(
            kw.pop("step"),
            kw.pop("iteration"),
            kw.pop("ppo_epoch"),
            kw.pop("minibatch"),
            kw.pop("policy_lag"),
        )
        user_grad_norm = kw.pop("grad_norm")
        metrics = update_metrics(
            kw["logp"], kw["old_logp"], kw["mask"], turn_ids=kw["turn_ids"], ref_logp=kw["ref_logp"],
            logits=kw["logits"], entropy=kw["entropy"], advantages=kw["advantages"], values=kw["values"],
            returns=kw["returns"], rewards=kw["rewards"], group_ids=kw["group_ids"], clip_eps=self.clip_eps,
            clip_eps_high=self.clip_eps_high, max_turn_rows=self.max_turn_rows,
        )  # fmt: skip
        device = kw["logp"].device
        dtype = next(iter(metrics.scalars.values())).dtype

        # one flat tensor: scalars | tensor extras | module grad/param norms | turn block | sample ids
        scalar_names = list(metrics.scalars)
        pieces = [torch.stack(list(metrics.scalars.values())).to(dtype)]
        tensor_extras = {metric_column(column_name(k)): v for k, v in extra.items() if isinstance(v, Tensor)}
        if tensor_extras:
            pieces.append(
                torch.stack([v.detach().reshape(()).to(device, dtype) for v in tensor_extras.values()])
            )
        n_modules = len(self._module_params)
        if n_modules:
            grad_norms, param_norms = module_norms(self._module_params)
            pieces += [grad_norms.to(device, dtype), param_norms.to(device, dtype)]
        turn_block = torch.stack([metrics.turns[c] for c in TURN_COLUMNS] + [metrics.turn_valid.to(dtype)])
        pieces.append(turn_block.flatten())
        if sample_ids is not None:
            pieces.append(sample_ids.detach().to(device, dtype).flatten())
        host = torch.cat([p.flatten() for p in pieces]).cpu().numpy()  # the one device→host transfer

        offset = 0
        row: dict[str, Any] = dict(keys)
        row.update(zip(scalar_names, host[: len(scalar_names)].tolist(), strict=True))
        offset += len(scalar_names)
        row.update(zip(tensor_extras, host[offset : offset + len(tensor_extras)].tolist(), strict=True))
        offset += len(tensor_extras)
        module_grads = module_params = None
        if n_modules:
            module_grads = host[offset : offset + n_modules]
            module_params = host[offset + n_modules : offset + 2 * n_modules]
            offset += 2 * n_modules
            current = float(np.sqrt(np.square(module_grads).sum()))
            if user_grad_norm is not None:
                pre_clip = float(user_grad_norm)
                row["grad_norm"] = pre_clip
                row["grad_norm_clipped"] = current
                if current > 0:
                    module_grads = module_grads * (pre_clip / current)
            else:
                row["grad_norm"] = current
            row["param_norm"] = float(np.sqrt(np.square(module_params).sum()))
        elif user_grad_norm is not None:
            row["grad_norm"] = float(user_grad_norm)
        block = host[offset : offset + turn_block.numel()].reshape(turn_block.shape)
        offset += turn_block.numel()
        ids = host[offset:] if sample_ids is not None else None
        for name, value in extra.items():
            if not isinstance(value, Tensor):
                row[metric_column(column_name(name))] = value

        if log_turns:
            self._submit_turns(keys, block, ids)
        if module_grads is not None and module_params is not None:
            self._submit_modules(keys, module_grads, module_params)
        row["monitor_ms"] = (time.perf_counter() - started) * 1e3
        self._finish_step(row)
        return {k: v for k, v in row.items() if isinstance(v, float | int) and k not in KEYS}

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
        (``names.guess_family``; the first call whose keys name one fixes ``trainer_family`` for the run);
        a family (``"trl"``, ``"verl"``, … ``names.NAME_TABLES``) or a ``{trainer name: column}`` mapping
        forces a table; ``None`` maps nothing. Unmapped names become snake_case columns; a name that becomes
        a key column's is stored as ``metric_<key>`` (``schema.metric_column``); values that are not scalars
        (lists, multi-element tensors) are left out.
        """
        if not self.enabled or self._closed:
            return
        try:
            if names == "auto":
                if self.trainer_family is None:
                    self.trainer_family = guess_family(scalars)
                names = self.trainer_family
            row: dict[str, Any] = self._keys(step, iteration, ppo_epoch, minibatch, policy_lag)
            row.update((metric_column(k), v) for k, v in map_metrics(scalars, names).items())
            self._finish_step(row)
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
        if not self.enabled or self._closed or not grad_norms:
            return
        try:
            keys = self._keys(self._step if step is None else step, None, 0, 0, 0, advance=False)
            params = param_norms or {}
            rows = [
                {**keys, "module": str(name), "grad_norm": float(grad),
                 "param_norm": float(params.get(name, float("nan")))}
                for name, grad in grad_norms.items()
            ]  # fmt: skip
            self._writer_submit("modules", rows, len(rows))
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
        if not self.enabled or self._closed:
            return
        try:
            if severity not in SEVERITIES:
                raise ValueError(f"severity must be one of {SEVERITIES}, not {severity!r}")
            row = self._keys(self._step if step is None else step, None, 0, 0, 0, advance=False)
            row.update(kind=kind, detector=detector, severity=severity, value=float(value),
                       threshold=float(threshold), message=message)  # fmt: skip
            self._writer_submit("alerts", [row], 1)
            if self.notifier is not None:
                self.notifier.alert(self.run_id, row)
        except Exception as error:  # noqa: BLE001
            self._fail("log_alert", error)

    # ------------------------------------------------------------------ read back / lifecycle
    def recent_steps(self) -> pa.Table:
        """The last ``window`` steps rows as an Arrow table (for detectors running live over DuckDB)."""
        return pa.Table.from_pylist(list(self._recent))

    @property
    def last_step(self) -> int:
        """The most recent step logged (−1 before the first)."""
        return self._step

    def writer_stats(self) -> WriterStats:
        """Rows written and dropped so far."""
        return self._writer.stats() if self._writer else WriterStats()

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until everything logged so far is on disk (True on success)."""
        return self._writer.flush(timeout) if self._writer else True

    def update_run_info(self, **fields: Any) -> None:
        """Merge ``fields`` into ``run.json`` (rank 0, unless its writer was refused; atomic rewrite)."""
        self._meta.update(fields)
        if self.enabled and self.rank == 0 and not (self._writer is not None and self._writer.refused):
            try:
                write_json_atomic(self.run_dir / RUN_FILE, self._meta)
            except Exception as error:  # noqa: BLE001
                self._fail("run.json", error)

    def close(self, status: str | None = None, *, compact: bool = True) -> None:
        """Flush and stop the writer, and mark the run ``status`` in ``run.json`` (idempotent); by default
        ``terminated`` once this process got SIGTERM, else ``finished``. ``compact=False`` skips the last
        merge of small parts (as on SIGTERM)."""
        if self._closed or not self.enabled:
            self._closed = True
            return
        self._closed = True
        _LIVE.discard(self)
        status = ending_status(None) if status is None else status
        if self._writer is not None:
            self._writer.close(compact=compact)
            stats = self._writer.stats()
            if stats.rows_dropped:
                self._warn_once(
                    "dropped", f"sorl-monitor dropped {stats.rows_dropped} rows ({stats.last_error})"
                )
        self.update_run_info(
            status=status,
            finished_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            last_step=self._step,
        )
        if self.notifier is not None:
            if status != "finished":
                self.notifier.send(f"[sorl] {self.run_id} ended {status} at step {self._step}")
            self.notifier.close()
        atexit.unregister(self._close_at_exit)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: Any) -> None:
        self.close(ending_status(exc_type))

    # ------------------------------------------------------------------ internals
    def _close_at_exit(self) -> None:
        # the interpreter sets sys.last_type for an uncaught exception before atexit runs (exc_info is empty)
        self.close(ending_status(getattr(sys, "last_type", None)))

    def _terminate(self, *, exiting: bool) -> None:
        """SIGTERM: what was logged goes to disk and ``run.json`` says ``terminated``; closed if ``exiting``
        (else the handler chained to decides, and the run may go on logging)."""
        if self._closed:
            return
        if exiting:
            self.close("terminated", compact=False)
            return
        self.flush(TERMINATE_TIMEOUT_S)
        self.update_run_info(status="terminated", last_step=self._step)

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
        current = self._step + (1 if advance else 0) if step is None else _key("step", step, 64)
        if advance:
            self._step = current
        return {
            "run_id": self.run_id,
            "rank": self.rank,
            "step": current,
            "iteration": current if iteration is None else _key("iteration", iteration, 64),
            "ppo_epoch": _key("ppo_epoch", ppo_epoch, 32),
            "minibatch": _key("minibatch", minibatch, 32),
            "policy_lag": _key("policy_lag", policy_lag, 32),
            "wall_time": time.time(),
        }

    def _submit_turns(self, keys: Mapping[str, Any], block: np.ndarray, ids: np.ndarray | None) -> None:
        valid = block[-1] > 0
        rows, turn = np.nonzero(valid)
        n = len(rows)
        if n == 0:
            return
        columns: dict[str, Any] = {
            k: pa.repeat(v, n) if isinstance(v, str) else np.full(n, v) for k, v in keys.items()
        }
        columns["sample_id"] = (ids[rows] if ids is not None else rows).astype(np.int64)
        columns["turn_idx"] = turn.astype(np.int32)
        for index, name in enumerate(TURN_COLUMNS):
            values = block[index][valid]
            if name == "n_tokens":
                values = values.astype(np.int32)
            elif name == "turn_clipped":
                values = values > 0
            columns[name] = values
        self._writer_submit("turns", columns, n)

    def _submit_modules(self, keys: Mapping[str, Any], grads: np.ndarray, params: np.ndarray) -> None:
        rows = [
            {**keys, "module": name, "grad_norm": float(g), "param_norm": float(p)}
            for name, g, p in zip(self._module_names, grads, params, strict=True)
        ]
        self._writer_submit("modules", rows, len(rows))

    def _finish_step(self, row: dict[str, Any]) -> None:
        dropped = self._writer.rows_dropped if self._writer is not None else 0
        row["monitor_dropped_rows"] = float(dropped)
        row["monitor_errors"] = float(self._errors)
        if dropped > self._dropped_reported:
            self._dropped_reported = dropped
            reason = self.writer_stats().last_error
            self._warn_once("dropped", f"sorl-monitor is dropping rows ({reason}); training goes on")
        self._recent.append(row)
        self._writer_submit("steps", [row], 1)

    def _writer_submit(self, table: str, payload: Any, n_rows: int) -> None:
        if self._writer is not None:
            self._writer.submit(table, payload, n_rows)

    def _fail(self, where: str, error: Exception) -> None:
        self._errors += 1
        self._warn_once(
            where, f"sorl-monitor {where} failed ({type(error).__name__}: {error}); training goes on"
        )

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warn(message, stacklevel=3)
