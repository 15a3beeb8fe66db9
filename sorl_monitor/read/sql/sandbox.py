"""The sandbox: a child process that runs one statement, killed at its time or memory limit.

DuckDB checks for ``interrupt()`` between vectors, not inside one function call or while planning:
``SELECT length(repeat('x', 2000000000))`` and a 40,000-term ``OR`` ran on for minutes after their time
limit, and ``memory_limit`` does not bound a string built by ``repeat`` (docs/reliability.md). So a
user's statement runs here, in ``python -m sorl_monitor.read.sql.sandbox``: the parent sends a ``Request``
(the views' SQL, the in-memory tables as Arrow files, the statement) on stdin, the child answers one JSON
line on stdout and the rows as an Arrow file. The parent (``run_in_child``) kills the child at the
deadline, on ``cancel``, or once its anonymous resident memory passes the memory limit plus
``MEMORY_HEADROOM``. The child's DuckDB has one thread, so a heavy statement leaves the other cores to the
app, and the same confinement as the run set's connection (``confine``).

This module imports only the standard library, DuckDB and pyarrow, so the child starts quickly, and a spare
one is started ahead of each statement (``SandboxPool``).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.ipc as ipc

QUERY_MISTAKES = (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException)
"""Errors in the query itself; any other error may come from an unreadable part and triggers a full read."""
RESULT_ERRORS = (duckdb.ConversionException, duckdb.OutOfRangeException)
"""Errors in what a query computes (``to_timestamp`` out of range): reported, never retried."""
USER_SQL_THREADS = 1
"""DuckDB threads of a user's statement: the app keeps the machine's other cores."""
MEMORY_HEADROOM = 192 << 20
"""Anonymous memory a child may hold beyond the memory limit before it is killed: the interpreter, DuckDB
and pyarrow (~60 MiB idle) and what DuckDB allocates outside its buffer manager while it spills."""
POLL_S = 0.05
"""How often the parent checks the deadline, ``cancel`` and the child's memory."""


def confine(con: duckdb.DuckDBPyConnection, *, memory_limit: str, temp_dir: str, allowed: list[str]) -> None:
    """Lock a connection to reading the folders ``allowed``: no writes, no other files, no extensions,
    no ``SET``; DuckDB's ``memory_limit`` with spills (at most as large) in ``temp_dir``, a private folder
    (DuckDB lets SQL read its temp folder, by default ``./.tmp``)."""
    for setting, value in [
        ("memory_limit", memory_limit),
        ("max_temp_directory_size", memory_limit),
        ("temp_directory", temp_dir),
    ]:
        con.execute(f"SET {setting} = $value", {"value": value})
    con.execute("SET allowed_directories = $dirs", {"dirs": allowed})
    con.execute("SET enable_external_access = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET lock_configuration = true")


@dataclass
class Request:
    """What the child needs to run one statement over the run set's views, as the parent last built them."""

    query: str
    params: dict[str, Any] | None
    max_rows: int | None
    memory_limit: str
    temp_dir: str
    allowed: list[str]
    tables: list[tuple[str, str]] = field(default_factory=list)
    """In-memory tables: (name, Arrow file), registered before the views."""
    views: list[tuple[str, str]] = field(default_factory=list)
    """(name, ``SELECT …``) in the order they were created."""
    result_path: str = ""


class SandboxError(Exception):
    """The child's statement failed: ``kind`` is ``mistake`` (bad SQL or a bad value), ``memory`` (DuckDB's
    memory limit), ``refused`` (not one read-only statement), ``read`` (any other DuckDB error: perhaps an unreadable part) or ``crash``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class SandboxLimit(Exception):
    """The parent stopped the child: ``reason`` is ``time``, ``memory`` or ``cancel``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RefusedStatement(Exception):
    """Not one read-only statement (the message says why, in one line)."""


def check_read_only(query: str) -> None:
    """``RefusedStatement`` unless ``query`` is one read-only statement (``SELECT``, or ``EXPLAIN`` of one)."""
    if not query or not query.strip():
        raise RefusedStatement("empty SQL")
    try:
        statements = duckdb.extract_statements(query)
        kind = statement_kind(query) if len(statements) == 1 else None
    except duckdb.Error as error:
        raise RefusedStatement(f"bad SQL: {_first_line(error)}") from None
    if kind is None:
        raise RefusedStatement(f"give one statement, not {len(statements)}")
    if kind is not duckdb.StatementType.SELECT:
        raise RefusedStatement(
            f"only read-only queries (SELECT, EXPLAIN) are allowed; refused a {kind.name} statement"
        )


def statement_kind(query: str) -> duckdb.StatementType:
    """The type of a single statement; for ``EXPLAIN [ANALYZE] [(options)] X``, the type of ``X``.

    ``EXPLAIN ANALYZE`` runs the statement it explains, so ``EXPLAIN ANALYZE COPY … TO …`` writes a
    file: an EXPLAIN is only as read-only as what it explains.
    """
    statement = duckdb.extract_statements(query)[0]
    if statement.type is not duckdb.StatementType.EXPLAIN:
        return statement.type
    tokens = duckdb.tokenize(query)
    ends = [start for start, _ in tokens[1:]] + [len(query)]
    words = [
        (start, query[start:end].strip().upper())
        for (start, kind), end in zip(tokens, ends, strict=True)
        if kind is not duckdb.token_type.comment
    ]
    index = 1  # words[0] is EXPLAIN
    if index < len(words) and words[index][1] == "(":
        while index < len(words) and words[index][1] != ")":
            index += 1
        index += 1
    if index < len(words) and words[index][1] in {"ANALYZE", "ANALYSE"}:
        index += 1
    if index >= len(words):
        return duckdb.StatementType.EXPLAIN
    return statement_kind(query[words[index][0] :])


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _kind(error: BaseException) -> str:
    if isinstance(error, RefusedStatement):
        return "refused"
    if isinstance(error, QUERY_MISTAKES + RESULT_ERRORS):
        return "mistake"
    if isinstance(error, duckdb.OutOfMemoryException):
        return "memory"
    return "read" if isinstance(error, duckdb.Error) else "crash"


def run_request(request: Request) -> None:
    """Run ``request``'s statement here and write its rows (at most ``max_rows``) to ``result_path``."""
    check_read_only(request.query)
    con = duckdb.connect(config={"threads": USER_SQL_THREADS})
    confine(con, memory_limit=request.memory_limit, temp_dir=request.temp_dir, allowed=request.allowed)
    for name, path in request.tables:
        con.register(name, ipc.open_file(pa.memory_map(path)).read_all())
    for name, select in request.views:
        con.execute(f"CREATE VIEW {name} AS {select}")
    relation = con.sql(request.query, params=request.params or None)
    table = pa.table({}) if relation is None else (
        relation if request.max_rows is None else relation.limit(request.max_rows)
    ).to_arrow_table()  # fmt: skip
    with ipc.new_file(request.result_path, table.schema) as writer:
        writer.write_table(table)


def _die_with_parent() -> None:
    """End this process within a second of its parent's end (a killed app leaves no runaway statement)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="sorl-sql-parent", daemon=True).start()


def main() -> None:
    """The child: read one pickled ``Request`` on stdin, answer one JSON line on stdout."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it kills this process
    _die_with_parent()
    data = sys.stdin.buffer.read()
    if not data:  # the parent closed without a request (a spare never used)
        return
    try:
        run_request(pickle.loads(data))
        answer = {"ok": True}
    except Exception as error:  # noqa: BLE001 - every failure goes back to the parent as one line
        answer = {"ok": False, "kind": _kind(error), "message": _first_line(error)}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


def start_child() -> subprocess.Popen[bytes]:
    """A child waiting for its request (its imports done meanwhile)."""
    return subprocess.Popen(
        [sys.executable, "-m", "sorl_monitor.read.sql.sandbox"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )


_BYTES = re.compile(r"^\s*([0-9.]+)\s*([KMGTP]?i?B|bytes)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "BYTES": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40, "PIB": 1 << 50}  # fmt: skip


def memory_bytes(limit: str) -> int | None:
    """``"256MB"``, ``"244.1 MiB"`` as bytes; None for text in another form."""
    match = _BYTES.match(limit)
    if match is None:
        return None
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").upper()])


def anonymous_memory(pid: int) -> int | None:
    """A process's anonymous resident memory in bytes (``RssAnon``: what it allocated, not the files it
    maps); None where ``/proc`` does not say."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def run_in_child(
    child: subprocess.Popen[bytes],
    request: Request,
    *,
    timeout_s: float,
    memory_limit_bytes: int | None,
    cancel: threading.Event | None,
) -> pa.Table:
    """Send ``request`` to ``child`` and return its rows; ``SandboxLimit`` once the parent killed it (time,
    memory, cancel), ``SandboxError`` for a failure the child reported."""
    deadline = time.monotonic() + timeout_s
    ceiling = None if memory_limit_bytes is None else memory_limit_bytes + MEMORY_HEADROOM
    reason = None
    try:
        assert child.stdin is not None and child.stdout is not None
        with contextlib.suppress(BrokenPipeError):
            child.stdin.write(pickle.dumps(request))
            child.stdin.close()
        while child.poll() is None:
            if cancel is not None and cancel.is_set():
                reason = "cancel"
            elif time.monotonic() >= deadline:
                reason = "time"
            elif ceiling is not None and (anonymous_memory(child.pid) or 0) > ceiling:
                reason = "memory"
            if reason is not None:
                child.kill()
                child.wait()
                raise SandboxLimit(reason)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(POLL_S)
        answer_line = child.stdout.readline()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for pipe in (child.stdin, child.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]
    try:
        answer = json.loads(answer_line)
    except ValueError:
        raise SandboxError("crash", f"the query process ended with exit status {child.returncode}") from None
    if not answer["ok"]:
        raise SandboxError(answer["kind"], answer["message"])
    with pa.OSFile(request.result_path) as source:
        table = ipc.open_file(source).read_all()
    os.unlink(request.result_path)
    return table


class SandboxPool:
    """Children for a run set's user statements: one spare started ahead, so a statement does not wait for
    a fresh interpreter's imports."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spare: subprocess.Popen[bytes] | None = None
        self._closed = False

    def take(self) -> subprocess.Popen[bytes]:
        """A child for one statement (the spare, if it is alive), and a new spare started behind it."""
        with self._lock:
            child, self._spare = self._spare, None
            if child is None or child.poll() is not None:
                child = start_child()
            if not self._closed:
                self._spare = start_child()
            return child

    def close(self) -> None:
        """End the spare (it holds nothing: killed)."""
        with self._lock:
            self._closed = True
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.kill()
            spare.wait()
            for pipe in (spare.stdin, spare.stdout):
                with contextlib.suppress(OSError):
                    pipe.close()  # type: ignore[union-attr]


def temp_folder(scratch: str, serial: int) -> str:
    """A private spill folder for the ``serial``-th statement under a run set's scratch folder."""
    path = Path(scratch) / f"sql-{serial}"
    path.mkdir(mode=0o700, exist_ok=True)
    return str(path)


if __name__ == "__main__":
    main()
