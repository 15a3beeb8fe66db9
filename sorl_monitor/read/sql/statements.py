"""The statements users send a run set (``RunSet.user_sql``): each over a snapshot of its views, in a sandbox
with a time and a memory limit.

``UserStatements.run`` takes a snapshot of the views (``Views.snapshot``: each view's ``SELECT`` and each
in-memory table, written once as an Arrow file in the run set's scratch folder), sends it with the
statement to a child from a ``sandbox.SandboxPool``, and maps what stops the child to a one-line
``QueryError``. The child has one DuckDB thread and holds no lock of the run set's, so a heavy statement
neither blocks a refresh nor takes the app's other cores.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import weakref
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as pa_ipc

from sorl_monitor.read.errors import QueryError
from sorl_monitor.read.sql.sandbox import (
    Request,
    SandboxError,
    SandboxLimit,
    SandboxPool,
    run_in_child,
    temp_folder,
)
from sorl_monitor.read.views import Views

USER_SQL_TIMEOUT_S = 120.0
"""Default time limit of a user's statement (``RunSet.user_sql``)."""


class UserStatements:
    """Users' statements over ``views``, each in a child process (see module docstring).

    ``lock`` is the run set's: the snapshot of the views is taken under it, so a statement sees the views
    of one refresh, and the Arrow files of replaced tables are deleted under it once no statement runs.
    """

    def __init__(self, views: Views, lock: threading.RLock, scratch: str) -> None:
        self._views = views
        self._lock = lock
        self._scratch = scratch
        self._serial = 0
        self._running = 0
        self._sandboxes = SandboxPool()
        weakref.finalize(self, self._sandboxes.close)

    def run(
        self,
        query: str,
        params: dict[str, Any] | None,
        *,
        timeout_s: float,
        max_rows: int | None,
        cancel: threading.Event | None,
    ) -> pa.Table:
        """The statement's rows (at most ``max_rows``). A time or memory limit hit, a cancel, a refused or
        bad statement is a one-line ``QueryError``; a ``SandboxError`` of kind ``read`` (a part compacted
        away or corrupt) is raised as is, for the caller to re-list the parts and try again."""
        try:
            return self._run_limited(query, params, timeout_s, max_rows, cancel)
        except SandboxLimit as stop:
            if stop.reason == "time":
                raise QueryError(f"query stopped at its time limit of {timeout_s:g} s") from None
            if stop.reason == "memory":
                raise QueryError(f"query stopped at its memory limit of {self._views.memory_limit}") from None
            raise QueryError("query stopped") from None
        except SandboxError as error:
            if error.kind == "memory":
                raise QueryError(f"query stopped at its memory limit of {self._views.memory_limit}") from None
            if error.kind == "refused":
                raise QueryError(str(error)) from None
            if error.kind != "read":  # bad SQL, a bad value, or a child that died
                raise QueryError(f"bad SQL: {error}") from None
            raise

    def _run_limited(
        self,
        query: str,
        params: dict[str, Any] | None,
        timeout_s: float,
        max_rows: int | None,
        cancel: threading.Event | None,
    ) -> pa.Table:
        with self._lock:
            self._serial += 1
            self._running += 1
            serial = self._serial
            tables, views = self._views.snapshot()
        table_files = []
        for name, (data, table_serial) in tables.items():
            path = os.path.join(self._scratch, f"table-{table_serial}.arrow")
            if not os.path.exists(path):
                _write_arrow_file(data, path)
            table_files.append((name, path))
        request = Request(
            query=query,
            params=params,
            max_rows=max_rows,
            memory_limit=self._views.memory_limit,
            temp_dir=temp_folder(self._scratch, serial),
            allowed=self._views.allowed,
            tables=table_files,
            views=views,
            result_path=os.path.join(self._scratch, f"result-{serial}.arrow"),
        )
        try:
            return run_in_child(
                self._sandboxes.take(),
                request,
                timeout_s=timeout_s,
                memory_limit_bytes=self._views.memory_limit_bytes,
                cancel=cancel,
            )
        finally:
            shutil.rmtree(request.temp_dir, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(request.result_path)
            self._remove_old_table_files()

    def _remove_old_table_files(self) -> None:
        """Delete the Arrow files of tables replaced since, once no statement may still read them."""
        with self._lock:
            self._running -= 1
            if self._running:
                return
            current = {f"table-{serial}.arrow" for _, serial in self._views.snapshot()[0].values()}
            for path in Path(self._scratch).glob("table-*.arrow"):
                if path.name not in current:
                    path.unlink(missing_ok=True)

    def close(self) -> None:
        self._sandboxes.close()


def _write_arrow_file(data: pa.Table, path: str) -> None:
    """``data`` as an Arrow file at ``path``, written under another name and renamed into place."""
    partial = f"{path}.{threading.get_ident()}.partial"
    with pa_ipc.new_file(partial, data.schema) as writer:
        writer.write_table(data)
    os.replace(partial, path)
