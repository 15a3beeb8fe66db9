"""One writer per run and rank: ``<run_dir>/.writer-rank<R>.lock``, held with ``flock`` while a writer lives.

A second writer of the same run and rank, in this process or another, does not get the lock: it writes
nothing and says why (``refused``), instead of overwriting the first one's parts. Where the lock file cannot
be made or the file system has no locks, the writer goes on unlocked.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path


def take_writer_lock(run_dir: Path, rank: int) -> tuple[int | None, str]:
    """``(fd, "")`` with this run's writer lock for ``rank`` held; ``(None, why)`` if another writer holds it;
    ``(None, "")`` where no lock can be taken (the writer goes on unlocked)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / f".writer-rank{rank}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None, ""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another writer"
        os.close(fd)
        return None, f"run {run_dir.name!r} rank {rank} is being written by {holder}"
    except OSError:
        os.close(fd)
        return None, ""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
    return fd, ""


def release_writer_lock(fd: int) -> None:
    """Let the lock go (also for a forked child holding a copy of ``fd``) and close it."""
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
