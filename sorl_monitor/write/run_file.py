"""A run's identity and its ``run.json``, kept by the process that owns the run (``RunFile``).

``run.json``'s status: ``running`` from the start; ``finished`` on ``close()``, ``failed`` on an uncaught
exception, ``interrupted`` on Ctrl-C (``KeyboardInterrupt``), ``terminated`` on SIGTERM (what SLURM,
Kubernetes and torchrun send): everything logged is flushed first, then the signal does what it did
before (the handler that was installed is called, or the process ends by SIGTERM). A forked child's
copy of an open run is closed: it never writes to, or marks, its parent's run.
"""

from __future__ import annotations

import atexit
import datetime as dt
import os
import platform
import secrets
import signal
import socket
import sys
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import torch

from sorl_monitor import __version__
from sorl_monitor.schema import SCHEMA_VERSION, column_name
from sorl_monitor.write.part_files import write_json_atomic

TERMINATE_TIMEOUT_S = 20.0
"""How long a SIGTERM waits for the rows still queued to reach disk (SLURM and Kubernetes allow 30 s)."""


# ---------------------------------------------------------------------- identity
def distributed_rank() -> tuple[int, int]:
    """``(rank, world_size)`` from ``torch.distributed`` once initialised, else ``RANK``/``WORLD_SIZE``."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def new_run_id(algorithm: str | None) -> str:
    """``<date>-<time>[-<algorithm>]-<hex>``."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    middle = f"-{column_name(algorithm)}" if algorithm else ""
    return f"{stamp}{middle}-{secrets.token_hex(2)}"


def shared_run_id(run_id: str, world_size: int) -> str:
    """Rank 0's run id on every rank (a broadcast when torch.distributed is initialised)."""
    if world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        box = [run_id]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]
    return run_id


def storable_seed(seed: int | None) -> int | None:
    """``seed`` as a signed 64-bit int, which every run.json reader takes (``None`` if it is not a seed).

    torch's seeds run to 2⁶⁴ − 1; one ≥ 2⁶³ is stored as its two's complement ``seed − 2⁶⁴``, which
    ``torch.manual_seed`` maps back to the same seed.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not -(2**63) <= seed < 2**64:
        return None
    return int(seed) - 2**64 if seed >= 2**63 else int(seed)


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def run_fields(
    run_id: str,
    *,
    algorithm: str | None,
    seed: int | None,
    config: Mapping[str, Any] | None,
    world_size: int,
) -> dict[str, Any]:
    """A new run's ``run.json`` (status ``running``; ``seed`` defaults to ``torch.initial_seed()``)."""
    return {
        "run_id": run_id,
        "algorithm": algorithm,
        "seed": storable_seed(torch.initial_seed() if seed is None else seed),
        "config": dict(config or {}),
        "schema_version": SCHEMA_VERSION,
        "status": "running",
        "created_at": utc_now(),
        "world_size": world_size,
        "host": socket.gethostname(),
        "versions": {
            "sorl_monitor": __version__,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "pyarrow": pa.__version__,
        },
    }


# ---------------------------------------------------------------------- run.json and the process's end
class RunOwner(Protocol):
    """What the end of the process needs of the object writing a run (a ``Monitor``)."""

    @property
    def last_step(self) -> int: ...

    def flush(self, timeout: float = ...) -> bool: ...

    def update_run_info(self, **fields: Any) -> None: ...

    def close(self, status: str | None = None, *, compact: bool = True) -> None: ...


_OPEN: weakref.WeakSet[RunFile] = weakref.WeakSet()
"""The open runs of this process (flushed on SIGTERM, closed in a forked child)."""
_sigterm: dict[str, Any] = {"pid": None, "previous": None, "received": False}
"""Our SIGTERM handler: the process it is installed in, the handler it chains to, whether SIGTERM came."""


def ending_status(exc_type: type[BaseException] | None) -> str:
    """A run's status when its process ends with ``exc_type`` uncaught (``None``: normally):
    ``terminated`` once SIGTERM came, ``interrupted`` on ``KeyboardInterrupt``, ``failed`` on any other."""
    if _sigterm["received"]:
        return "terminated"
    if exc_type is None:
        return "finished"
    return "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed"


class RunFile:
    """``run.json`` of one run: its ``fields``, rewritten whole (atomically) on each change when ``writes``.

    With an ``owner``, the run is watched until ``close()``: at exit the owner is closed with
    ``ending_status``; on SIGTERM it is flushed and the run marked ``terminated``; in a forked child the
    copy is closed without touching the run's files (see the module docstring).
    """

    def __init__(
        self, path: Path, fields: Mapping[str, Any], *, writes: bool, owner: RunOwner | None = None
    ) -> None:
        self.path = path
        self.fields = dict(fields)
        self.writes = writes
        self.owner = owner
        self.closed = False
        if writes:
            write_json_atomic(path, self.fields)
        if owner is not None:
            atexit.register(self._close_at_exit)
            _OPEN.add(self)
            _handle_sigterm()

    def update(self, **fields: Any) -> None:
        """Merge ``fields`` and rewrite the file (errors propagate: the owner counts them)."""
        self.fields.update(fields)
        if self.writes:
            write_json_atomic(self.path, self.fields)

    def close(self) -> bool:
        """Stop watching the process's end; ``False`` if this was done already."""
        if self.closed:
            return False
        self.closed = True
        _OPEN.discard(self)
        atexit.unregister(self._close_at_exit)
        return True

    def _close_at_exit(self) -> None:
        # the interpreter sets sys.last_type for an uncaught exception before atexit runs (exc_info is empty)
        if self.owner is not None:
            self.owner.close(ending_status(getattr(sys, "last_type", None)))

    def _terminate(self, *, exiting: bool) -> None:
        """SIGTERM: what was logged goes to disk and ``run.json`` says ``terminated``; closed if ``exiting``
        (else the handler chained to decides, and the run may go on logging)."""
        if self.closed or self.owner is None:
            return
        if exiting:
            self.owner.close("terminated", compact=False)
            return
        self.owner.flush(TERMINATE_TIMEOUT_S)
        self.owner.update_run_info(status="terminated", last_step=self.owner.last_step)


def _on_sigterm(signum: int, frame: Any) -> None:
    """Flush every open run of this process and record ``terminated``, then let SIGTERM act as before."""
    previous = _sigterm["previous"]
    if _sigterm["pid"] == os.getpid():
        _sigterm["received"] = True
        for info in list(_OPEN):
            info._terminate(exiting=previous == signal.SIG_DFL)
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
    """In a forked child, the parent's open runs are closed without touching their files."""
    for info in list(_OPEN):
        info.closed = True
    _OPEN.clear()


os.register_at_fork(after_in_child=_close_copies_in_child)
