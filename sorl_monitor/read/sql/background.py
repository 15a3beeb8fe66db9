"""Run a statement in the background, so a page keeps drawing, shows progress and can stop it.

    query = BackgroundQuery(run_set, "SELECT …", timeout_s=30, max_rows=10_001)
    while not query.done():
        ...                       # the caller stays responsive; query.cancel() stops the statement
    table = query.result()        # or QueryError (bad SQL, time or memory limit, stopped)

The statement runs through ``RunSet.user_sql``: read-only, in a child process with one DuckDB thread that
holds no lock of the run set (other readers never wait for it), killed at its time or memory limit or on
``cancel()``, at most ``max_rows`` rows fetched. It is waited for in a daemon thread: a process that exits
never waits for it.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa

from sorl_monitor.read.query import RunSet


class BackgroundQuery:
    """One statement of a user, started on creation (see module docstring)."""

    def __init__(self, run_set: RunSet, query: str, *, timeout_s: float, max_rows: int) -> None:
        self.timeout_s = timeout_s
        self.started = time.monotonic()
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._result: pa.Table | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(run_set, query, max_rows), name="sorl-user-sql", daemon=True
        )
        self._thread.start()

    def _run(self, run_set: RunSet, query: str, max_rows: int) -> None:
        try:
            self._result = run_set.user_sql(
                query, timeout_s=self.timeout_s, max_rows=max_rows, cancel=self._cancel
            )
        except BaseException as error:  # noqa: BLE001 - handed to the caller by result()
            self._error = error
        finally:
            self._done.set()

    def done(self, wait_s: float = 0.0) -> bool:
        """Whether the statement finished (waiting up to ``wait_s`` seconds for it)."""
        return self._done.wait(wait_s)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def cancel(self) -> None:
        """Stop the statement (its ``result()`` is then a ``QueryError``); nothing happens once it finished."""
        self._cancel.set()

    def result(self) -> pa.Table:
        """The rows (waiting for the statement to finish); ``QueryError`` on any problem."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result
