"""Post-mortems of every run under a folder as one verdict table, on this machine or on Ray.

    table = fleet_verdicts("runs/", engine="local", jobs=2)      # or engine="ray", address="auto"
    write_verdicts(table, "runs/verdicts.parquet")

Each run found under the root (a Parquet run folder at any depth, named by its path below the root, or
another tool's log, ``logs.find_logs``) is one *target*; a root without any is an error naming it. Targets are judged in chunks; a chunk is one task (a process of the
local pool, or a Ray task) that opens each of its runs alone (``open_runs(target)``: a task reads only its
runs) and runs ``postmortem.postmortem`` on each. Both engines call the same ``judge_targets``, so they
give the same table. A run that cannot be read is a row with ``status = 'error'`` and the one-line reason,
never a failed fleet.

The table (``VERDICT_COLUMNS``) is written atomically next to the runs as ``verdicts.parquet``: ``sorl
runs`` and the dashboard read it instead of judging every run again, and ``sorl query`` shows it as the
``verdicts`` view. Rows carry the fingerprint of the run's files (``source_mtime``), so a refresh
(``--watch``) judges again only the runs that changed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from sorl_monitor.diagnose.postmortem.config import load_configs
from sorl_monitor.diagnose.postmortem.judge import postmortem
from sorl_monitor.logs import is_run_dir
from sorl_monitor.read.query import (
    TABLES,
    CorruptPartWarning,
    QueryError,
    SharedDatabase,
    default_memory_limit,
    find_foreign_logs,
    open_runs,
)
from sorl_monitor.read.verdict_table import VERDICT_COLUMNS, sorted_verdicts, verdict_table
from sorl_monitor.storage import (
    ListedObject,
    StorageError,
    is_remote,
    local_copy,
    mirror_down,
    remote_run_listings,
)

ENGINES = ("local", "ray")
POSTMORTEM_TABLES = ("steps", "turns", "alerts")
"""The tables ``postmortem`` reads: a task makes views of these only, with ``steps`` (read by ~10 of the
post-mortem's statements) copied into memory once (``open_runs(materialize=…)``). A post-mortem that read
another table would fail on every run (its view missing), never judge it on empty rows."""
UNREAD_TABLES = tuple(t for t in TABLES if t not in POSTMORTEM_TABLES)
"""Tables a task never downloads from object storage (``modules``)."""
DOWNLOAD_THREADS = 4
"""Runs of a chunk in object storage downloaded at once, ahead of their post-mortems: a run's network waits
overlap the DuckDB work of the runs before it."""


@dataclass(frozen=True)
class Target:
    """One run to judge: a Parquet run folder or a log file/folder, and when its files last changed; for a
    run in object storage, its objects as the fleet's one LIST found them (its task lists nothing again;
    ``storage.mirror_down(listing=...)``), without those of tables a post-mortem does not read. ``run_id``:
    the run id its row takes, for a Parquet run in a sub-folder (its path below the root, ``exp1/run``)."""

    path: str
    mtime: float | None
    objects: tuple[ListedObject, ...] = ()
    run_id: str | None = None


def find_targets(
    root: str | os.PathLike[str], fmt: str | None = None, storage_options: Mapping[str, str] | None = None
) -> list[Target]:
    """Every run under ``root`` (a folder of runs and logs, or one run; or an object-store prefix, whose
    targets stay URIs so that each task reads only its run from the store), each its own target. Parquet
    runs are found at any depth; ``QueryError`` (naming ``root``) where there is none."""
    if is_remote(root):
        targets = [
            Target(
                run.uri,
                run.mtime,
                tuple(o for o in run.objects if o[0].partition("/")[0] not in UNREAD_TABLES),
                run.name if "/" in run.name else None,
            )
            for run in remote_run_listings(os.fspath(root), storage_options)
        ]
    else:
        root_path = Path(root)
        if not root_path.exists():
            raise QueryError(f"no such file or directory: {root_path}")
        found = {str(p): _nested_id(p, root_path) for p in runs_below(root_path, fmt)}
        for source in find_foreign_logs([root_path], fmt):
            found.setdefault(str(source.path.resolve()), None)
        targets = [Target(p, _mtime(Path(p)), run_id=run_id) for p, run_id in found.items()]
    if not targets:
        raise QueryError(
            f"no runs found under {os.fspath(root)} (a run is a folder with run.json or steps/, at any depth, "
            "or a log: see docs/logs.md)"
        )
    return targets


def runs_below(root: Path, fmt: str | None = None) -> list[Path]:
    """The Parquet run folders at or under ``root``, at any depth (a run's own folders are not searched;
    hidden folders and links to folders are not entered, a link to a run is a run), by path."""
    if fmt not in (None, "sorl") or not root.is_dir():
        return []
    if is_run_dir(root):
        return [root.resolve()]
    found = []
    for folder, children, _ in os.walk(root):
        kept = []
        for child in sorted(c for c in children if not c.startswith(".")):
            path = Path(folder) / child
            if is_run_dir(path):
                found.append(path.resolve())
            else:
                kept.append(child)
        children[:] = kept
    return list(dict.fromkeys(found))


def _nested_id(run: Path, root: Path) -> str | None:
    """A run's path below ``root`` where it sits in a sub-folder (``exp1/run``); else ``None`` (its own id)."""
    try:
        relative = run.relative_to(root.resolve()).as_posix()
    except ValueError:  # a link to a run elsewhere
        return None
    return relative if "/" in relative else None


def _mtime(path: Path) -> float | None:
    """The newest modification time of a file, or of any file in a folder (its runs' parts)."""
    try:
        if path.is_file():
            return path.stat().st_mtime
        return max((f.stat().st_mtime for f in path.rglob("*") if f.is_file()), default=None)
    except OSError:
        return None


def judge_targets(
    targets: Sequence[Target],
    fmt: str | None = None,
    settings: Sequence[str] = (),
    config_file: str | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The verdict rows of ``targets``, each opened alone; the one task both engines run. ``config_file``
    (TOML) and ``settings`` (``name=value``) as ``postmortem.load_configs``; ``storage_options`` for targets
    in object storage: those are downloaded on ``DOWNLOAD_THREADS`` threads ahead of their turn
    (``_download``, from the objects their target lists) and judged as their local copies. The run sets work one after
    another in one DuckDB database (``query.SharedDatabase``), each with its own views."""
    configs = load_configs(config_file, settings)
    now = dt.datetime.now(dt.UTC)
    rows = []
    remote = [target for target in targets if is_remote(target.path)]
    folders = [
        str(Path(t.path).resolve()) for t in targets if not is_remote(t.path) and Path(t.path).is_dir()
    ]
    folders += [str(local_copy(target.path).resolve()) for target in remote]
    scratch = tempfile.mkdtemp(prefix="sorl-fleet-")
    try:
        with contextlib.ExitStack() as stack:
            pool = stack.enter_context(concurrent.futures.ThreadPoolExecutor(DOWNLOAD_THREADS))
            downloads = {t.path: pool.submit(_download, t.path, t.objects, storage_options) for t in remote}
            stack.callback(_cancel, downloads)
            database = stack.enter_context(
                SharedDatabase(
                    threads=1, memory_limit=default_memory_limit(), scratch=scratch, folders=folders
                )
            )
            for target in targets:
                path = target.path
                base = {"path": path, "source_mtime": target.mtime, "updated_at": now}
                try:
                    source = downloads[path].result() if path in downloads else path
                    judged = list(_judge(source, fmt, configs, storage_options, database))
                    if target.run_id is not None and len(judged) == 1:
                        judged[0]["run_id"] = target.run_id
                    for row in judged:
                        if path in downloads and row.get("error"):
                            row["error"] = _as_uri(row["error"], path)
                        rows.append({**base, **row})
                except Exception as error:  # noqa: BLE001 - one bad run is a row, never a failed fleet
                    name = target.run_id or path.rstrip("/").rpartition("/")[2]
                    message = _one_line(error)
                    if path in downloads:
                        message = _as_uri(message, path)
                    rows.append({**base, "run_id": name, "status": "error", "error": message})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return rows


def _as_uri(message: str, uri: str) -> str:
    """``message`` naming the run as the user named it (its URI), not its local copy."""
    message = message.replace(str(local_copy(uri).resolve()), uri.rstrip("/"))
    return message.replace(str(local_copy(uri)), uri.rstrip("/"))


def _download(uri: str, objects: Sequence[ListedObject], storage_options: Mapping[str, str] | None) -> str:
    """The local copy of a run in object storage, brought up to date without the tables a post-mortem does
    not read (``storage.mirror_down``, from ``objects`` as the fleet listed them where there are any); its
    path is what the task opens."""
    try:
        listing = objects or None
        return str(mirror_down(uri, storage_options, skip_folders=UNREAD_TABLES, listing=listing))
    except StorageError as error:
        raise QueryError(str(error)) from None


def _cancel(downloads: Mapping[str, concurrent.futures.Future[str]]) -> None:
    """Drop the downloads not started (a task stopped early waits for none of them)."""
    for future in downloads.values():
        future.cancel()


def _judge(
    path: str,
    fmt: str | None,
    configs: tuple[Any, ...],
    storage_options: Mapping[str, str] | None,
    database: SharedDatabase,
) -> list[dict[str, Any]]:
    """The verdict row of each run at ``path`` (``postmortem``, on views of the tables it reads), as judged.

    ``steps`` is copied into memory once; where that copy fails (a part whose footer reads but whose pages do
    not), the run is judged again over views, whose queries skip such a part (``sorl postmortem``'s way), and
    each row names the parts left out in ``error``."""
    try:
        return _judged(path, fmt, configs, storage_options, database, materialize=("steps",))
    except QueryError:
        raise
    except Exception:  # noqa: BLE001 - e.g. DuckDB's "don't know what type", naming no file
        return _judged(path, fmt, configs, storage_options, database, materialize=())


def _judged(
    path: str,
    fmt: str | None,
    configs: tuple[Any, ...],
    storage_options: Mapping[str, str] | None,
    database: SharedDatabase,
    *,
    materialize: tuple[str, ...],
) -> list[dict[str, Any]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CorruptPartWarning)  # each row names its skipped parts instead
        with open_runs(
            path,
            fmt,
            threads=1,
            storage_options=dict(storage_options or {}),
            tables=POSTMORTEM_TABLES,
            materialize=materialize,
            database=database,
            interruptible=False,
        ) as run_set:
            try:
                run_ids = run_set.sql("SELECT run_id FROM runs ORDER BY run_id").column(0).to_pylist()
                rows = [_verdict_row(postmortem(run_set, run_id, *configs)) for run_id in run_ids]
            except Exception as error:  # noqa: BLE001 - said with the parts left out, which may be why
                if skipped := _skipped(run_set.skipped_parts()):
                    raise QueryError(f"{_one_line(error)}; {skipped}") from None
                raise
            for row in rows:
                row["error"] = _skipped(run_set.skipped_parts(row["run_id"]))
    return rows


def _skipped(parts: Sequence[Any]) -> str | None:
    """``left out N unreadable parts (first's path: reason)``, or ``None`` for none."""
    if not parts:
        return None
    return f"left out {len(parts)} unreadable part{'s' if len(parts) > 1 else ''} ({parts[0].path}: {parts[0].reason})"


def _verdict_row(verdict: Any) -> dict[str, Any]:
    families = getattr(verdict, "families_rising", None)
    if isinstance(families, list | tuple):
        families = ", ".join(str(f) for f in families)
    return {
        "run_id": verdict.run_id,
        "algorithm": verdict.algorithm,
        "status": verdict.status,
        "collapse_step": verdict.collapse_step,
        "first_critical": verdict.first_critical,
        "lead_time": verdict.lead_time,
        "root_cause": verdict.root_cause,
        "families_rising": families,
        "last_step": verdict.last_step,
        "updates": verdict.updates,
        "error": None,
    }


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:500]


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def fleet_verdicts(
    root: str | os.PathLike[str],
    *,
    engine: str = "local",
    jobs: int | None = None,
    address: str | None = None,
    fmt: str | None = None,
    settings: Sequence[str] = (),
    config_file: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, str] | None = None,
    chunk_size: int = 8,
    previous: pa.Table | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> pa.Table:
    """The verdict table of every run under ``root`` (``VERDICT_COLUMNS``), most urgent first.

    ``engine``: ``local`` (a pool of ``jobs`` processes, default the machine's cores) or ``ray`` (one Ray
    task per chunk; ``address`` as ``ray.init`` takes it, default a local Ray of ``jobs`` CPUs). Rows of
    ``previous`` whose run files have not changed since are kept, not judged again. ``progress(done, total)``
    is called as chunks finish.
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    load_configs(config_file, settings)  # a bad setting fails here, in one line, not in every task
    if engine == "local" and address is not None:
        raise ValueError("--address is for the ray engine")
    config = None if config_file is None else str(config_file)
    with contextlib.ExitStack() as stack:
        if engine == "ray" and previous is None and (is_remote(root) or Path(root).exists()):
            # Ray's processes start while the runs are listed (a path that is not there fails at once)
            lister = stack.enter_context(concurrent.futures.ThreadPoolExecutor(1))
            listing = lister.submit(find_targets, root, fmt, storage_options)
            stack.enter_context(_ray_session(jobs, address))
            targets = listing.result()
        else:
            targets = find_targets(root, fmt, storage_options)
        kept, todo = _unchanged(previous, targets)
        work = chunks(todo, max(1, chunk_size))
        options = (fmt, tuple(settings), config, dict(storage_options or {}))
        job = _Job(work, options, jobs, address, progress, len(todo))
        if engine == "local":
            rows = _run_local(job)
        elif not work:  # a refresh with nothing changed starts no Ray
            rows = []
        else:
            with _ray_session(jobs, address):
                rows = _run_ray(job)
    return sorted_verdicts(pa.concat_tables([kept, verdict_table(rows)]))


def _unchanged(previous: pa.Table | None, targets: list[Target]) -> tuple[pa.Table, list[Target]]:
    """The rows of ``previous`` whose target still exists unchanged, and the targets to judge."""
    if previous is None or previous.num_rows == 0:
        return verdict_table([]), targets
    previous = previous.select(VERDICT_COLUMNS.names).cast(VERDICT_COLUMNS)
    seen = {
        (row["path"], row["source_mtime"]) for row in previous.select(["path", "source_mtime"]).to_pylist()
    }
    fresh = {t.path for t in targets if (t.path, t.mtime) in seen and t.mtime is not None}
    keep = [row for row in previous.to_pylist() if row["path"] in fresh and row["status"] != "error"]
    kept_paths = {row["path"] for row in keep}
    return verdict_table(keep), [t for t in targets if t.path not in kept_paths]


@dataclass(frozen=True)
class _Job:
    """The chunks to judge, ``judge_targets``' options after the chunk, and how to run and report them."""

    work: list[Sequence[Target]]
    options: tuple[Any, ...]
    jobs: int | None
    address: str | None
    progress: Callable[[int, int], None] | None
    total: int

    def report(self, rows: list[dict[str, Any]]) -> None:
        if self.progress is not None:
            self.progress(len({row["path"] for row in rows}), self.total)


def _run_local(job: _Job) -> list[dict[str, Any]]:
    jobs = job.jobs or os.cpu_count() or 1
    rows: list[dict[str, Any]] = []
    if jobs == 1 or len(job.work) <= 1:
        for chunk in job.work:
            rows += judge_targets(chunk, *job.options)
            job.report(rows)
        return rows
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(judge_targets, chunk, *job.options) for chunk in job.work]
        for future in concurrent.futures.as_completed(futures):
            rows += future.result()
            job.report(rows)
    return rows


@contextlib.contextmanager
def _ray_session(jobs: int | None, address: str | None) -> Iterator[None]:
    """Ray, connected: a local Ray of ``jobs`` CPUs started here (or the cluster at ``address``) and shut
    down at the end; a Ray already connected (in this process, or an outer ``_ray_session``) is used as it is."""
    try:
        import ray
    except ModuleNotFoundError:
        raise ValueError("the ray engine needs Ray: pip install 'sorl-monitor[fleet]'") from None
    if ray.is_initialized():
        yield
        return
    init: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
    if address is None:
        init["num_cpus"] = jobs or os.cpu_count() or 1
    ray.init(address=address, **init)
    try:
        yield
    finally:
        ray.shutdown()


def _run_ray(job: _Job) -> list[dict[str, Any]]:
    """The chunks as Ray tasks (in a ``_ray_session``), rows gathered as they finish."""
    import ray

    task = ray.remote(num_cpus=1)(judge_targets)
    pending = [task.remote(list(chunk), *job.options) for chunk in job.work]
    rows: list[dict[str, Any]] = []
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        rows += ray.get(done[0])
        job.report(rows)
    return rows
