"""Object storage as a log dir: runs written to and read from ``s3://bucket/prefix`` (any ``pyarrow.fs`` URI).

Writing (``Monitor("s3://bucket/runs")``): the writer streams parts to a local staging folder exactly as to
a local log dir, and ``RunUploader`` copies each finished file to the store from a thread of its own:
every part is one object, uploaded once and visible only when complete (a reader never sees half a part);
a part merged away by compaction is deleted from the store only after the merged part is there; ``run.json``
is copied whenever it changes. A store that is down never blocks training: the files wait in staging and go
up when it answers again (failures are counted in ``stats()``).

One writer per (run, rank) without ``flock``: a lease object ``<run>/_writers/rank=R.json`` names the
writer and is renewed on every upload round. A writer that finds another writer's lease younger than
``LEASE_S`` is refused (it writes nothing, as a refused local writer); after writing its own lease it
reads it back once before writing anything else, so of two writers started together one is refused.
(S3 has no compare-and-swap that ``pyarrow.fs`` exposes: two writers whose write and read-back interleave
exactly can both pass; docs/fleet.md says so.)

Reading (``open_runs("s3://bucket/runs")``): ``mirror_down`` copies the objects under the URI into a local
cache (``SORL_CACHE_DIR``, default ``~/.cache/sorl-monitor/objects``), downloading only objects that are new
or changed and removing files whose objects are gone; the query layer then reads the copy as a local
folder, and ``refresh()`` mirrors again. DuckDB needs no extension (nothing is downloaded at run time).

Credentials and endpoint: the usual AWS variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION``/``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL``/``AWS_ENDPOINT_URL_S3``),
or ``storage_options`` (``sorl --storage-option key=value``): ``endpoint_override``, ``scheme``,
``access_key``, ``secret_key``, ``session_token``, ``region``, ``anonymous``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs

LEASE_S = 60.0
"""A writer's lease older than this is taken to be a dead writer's: another writer may take the rank."""
LEASE_FOLDER = "_writers"
SKIPPED_SUFFIXES = (".tmp", ".lock")
"""Local files never uploaded: files being written, and the local writer's lock."""
RUN_MARKERS = ("run.json", "steps", "turns", "modules", "alerts")
"""What makes a folder in the store a run (``logs.detect.is_run_dir``'s rule, by name)."""
_STORAGE_OPTIONS: dict[str, str] = {}
"""Process-wide defaults for ``storage_options`` (the CLI's ``--storage-option``)."""


class StorageError(Exception):
    """A store that cannot be reached or named (one line: URI and reason)."""


def is_remote(path: str | os.PathLike[str]) -> bool:
    """True for a URI with a scheme other than ``file`` (``s3://b/p``, ``gs://b/p``)."""
    text = os.fspath(path)
    return "://" in text and not text.startswith("file://")


def set_default_storage_options(options: Mapping[str, str]) -> None:
    """Options every later ``filesystem`` call starts from (what ``sorl --storage-option`` sets)."""
    _STORAGE_OPTIONS.clear()
    _STORAGE_OPTIONS.update(options)


def default_storage_options() -> dict[str, str]:
    """The options ``set_default_storage_options`` set (to hand to another process)."""
    return dict(_STORAGE_OPTIONS)


def parse_storage_options(assignments: list[str] | None) -> dict[str, str]:
    """``["endpoint_override=127.0.0.1:9000", …]`` → a dict; ``ValueError`` on an item without ``=``."""
    options = {}
    for item in assignments or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--storage-option takes key=value, not {item!r}")
        options[key.strip()] = value.strip()
    return options


def filesystem(uri: str, storage_options: Mapping[str, str] | None = None) -> tuple[pafs.FileSystem, str]:
    """The ``pyarrow.fs`` filesystem of ``uri`` and the path inside it (``bucket/prefix``, no slash at the end)."""
    options = {**_STORAGE_OPTIONS, **(storage_options or {})}
    parsed = urlparse(uri)
    path = (parsed.netloc + parsed.path).rstrip("/")
    if not parsed.netloc:
        raise StorageError(f"{uri}: no bucket in the URI")
    if parsed.scheme == "s3":
        return _s3(options), path
    if options:
        raise StorageError(f"{uri}: storage options are only read for s3:// URIs")
    try:
        fs, inner = pafs.FileSystem.from_uri(uri)
    except (pafs.ArrowInvalid, OSError, ValueError) as error:  # type: ignore[attr-defined]
        raise StorageError(f"{uri}: {str(error).splitlines()[0]}") from None
    return fs, inner.rstrip("/")


def _s3(options: Mapping[str, str]) -> pafs.S3FileSystem:
    env = os.environ
    endpoint = (
        options.get("endpoint_override") or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    )
    scheme = options.get("scheme")
    if endpoint and "://" in endpoint:
        scheme = scheme or endpoint.split("://", 1)[0]
        endpoint = endpoint.split("://", 1)[1]
    kwargs: dict[str, Any] = {
        "endpoint_override": endpoint or None,
        "scheme": scheme or "https",
        "region": options.get("region")
        or env.get("AWS_REGION")
        or env.get("AWS_DEFAULT_REGION")
        or "us-east-1",
        "allow_bucket_creation": True,
        "connect_timeout": float(options.get("connect_timeout", 5)),
        "request_timeout": float(options.get("request_timeout", 30)),
    }
    if options.get("anonymous", "").lower() in ("1", "true", "yes"):
        kwargs["anonymous"] = True
    elif options.get("access_key") or options.get("secret_key"):
        kwargs["access_key"] = options.get("access_key")
        kwargs["secret_key"] = options.get("secret_key")
        kwargs["session_token"] = options.get("session_token")
    try:
        return pafs.S3FileSystem(**kwargs)
    except (ValueError, OSError) as error:
        raise StorageError(f"s3: {str(error).splitlines()[0]}") from None


def cache_root() -> Path:
    """This machine's copies of object-store runs: ``objects/`` (mirrored for reading) and ``staging/`` (written
    here, then uploaded); ``SORL_CACHE_DIR``, else ``~/.cache/sorl-monitor``."""
    return Path(os.environ.get("SORL_CACHE_DIR") or Path.home() / ".cache" / "sorl-monitor")


def local_copy(uri: str) -> Path:
    """The local folder ``mirror_down`` keeps ``uri``'s objects in."""
    parsed = urlparse(uri)
    return cache_root() / "objects" / parsed.scheme / parsed.netloc / parsed.path.strip("/")


# ---------------------------------------------------------------------------------------------- reading
def mirror_down(
    uri: str,
    storage_options: Mapping[str, str] | None = None,
    *,
    skip_folders: Collection[str] = (),
    listing: Sequence[ListedObject] | None = None,
) -> Path:
    """Copy the objects under ``uri`` to ``local_copy(uri)``: new and changed ones, each to a temporary file
    and then renamed (a local reader never sees half a file); files whose objects are gone are removed.

    One LIST of the prefix (a HEAD only where it lists nothing: ``uri`` is one object, or nothing); objects
    under a folder named in ``skip_folders`` (a table a reader will not read, e.g. ``modules``) are neither
    downloaded nor removed. ``listing``: the objects under ``uri`` as a LIST of a prefix above it found them
    (``remote_runs(..., objects=True)``), used instead of a LIST of its own; where one of them is gone when
    fetched (compacted away since), the prefix is listed again and mirrored from that listing."""
    if listing is not None:
        fs, root = filesystem(uri, storage_options)
        objects = [pafs.FileInfo(f"{root}/{key}", pafs.FileType.File, size=size, mtime=mtime)
                   for key, size, mtime in listing]  # fmt: skip
        if objects and _mirror_objects(fs, root, objects, uri, skip_folders, single=False, stale_ok=False):
            return local_copy(uri)
    fs, root = filesystem(uri, storage_options)
    single = False
    try:
        objects = _listed(fs, root)
        if not objects:
            info = fs.get_file_info(root)
            if info.type == pafs.FileType.File:
                objects, single = [info], True
            elif info.type == pafs.FileType.NotFound:
                raise StorageError(f"no such bucket or prefix: {uri}")
    except OSError as error:
        raise StorageError(f"{uri}: {str(error).splitlines()[0]}") from None
    _mirror_objects(fs, root, objects, uri, skip_folders, single=single, stale_ok=True)
    local = local_copy(uri)
    return local.parent / Path(root).name if single else local


def _mirror_objects(
    fs: pafs.FileSystem,
    root: str,
    objects: Sequence[pafs.FileInfo],
    uri: str,
    skip_folders: Collection[str],
    *,
    single: bool,
    stale_ok: bool,
) -> bool:
    """Bring ``local_copy(uri)`` up to ``objects`` (listed under ``root``); False, with nothing removed, where
    an object is gone when fetched and ``stale_ok`` is false (the listing is older than the store)."""
    local = local_copy(uri)
    base = root.rpartition("/")[0] if single else root
    folder = local.parent if single else local
    skipped = {LEASE_FOLDER, *skip_folders}
    wanted = set()
    for obj in objects:
        relative = obj.path[len(base) :].lstrip("/")
        if not relative or skipped.intersection(relative.split("/")[:-1]):
            continue
        target = folder / relative
        wanted.add(target)
        if not _download(fs, obj, target, uri):
            if not stale_ok:
                return False
            wanted.discard(target)
    if not single and local.is_dir():
        for file in local.rglob("*"):
            keep = file in wanted or skipped.intersection(file.relative_to(local).parts[:-1])
            if file.is_file() and not keep:
                file.unlink(missing_ok=True)
    return True


def _listed(fs: pafs.FileSystem, root: str) -> list[pafs.FileInfo]:
    """The objects under ``root`` (one LIST); none where ``root`` is an object or nothing."""
    try:
        found = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [i for i in found if i.type == pafs.FileType.File]


def _download(fs: pafs.FileSystem, obj: pafs.FileInfo, target: Path, uri: str) -> bool:
    """Bring ``target`` up to ``obj`` (already there if its size and time match): False if the object is gone
    (compacted away between listing and reading)."""
    if target.is_file() and target.stat().st_size == obj.size and _stamp(target) >= _mtime(obj):
        return True
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".download")
    try:
        with fs.open_input_stream(obj.path) as source, open(tmp, "wb") as sink:
            while chunk := source.read(1 << 22):
                sink.write(chunk)
    except FileNotFoundError:
        tmp.unlink(missing_ok=True)
        return False
    except OSError as error:
        tmp.unlink(missing_ok=True)
        raise StorageError(f"{uri}: {str(error).splitlines()[0]}") from None
    os.replace(tmp, target)
    os.utime(target, (_mtime(obj), _mtime(obj)))
    return True


def _mtime(info: pafs.FileInfo) -> float:
    return info.mtime.timestamp() if info.mtime is not None else 0.0


def _stamp(path: Path) -> float:
    return path.stat().st_mtime


def remote_runs(uri: str, storage_options: Mapping[str, str] | None = None) -> list[tuple[str, float]]:
    """The runs and log files directly under ``uri`` in the store, as ``(uri, newest object's mtime)``: a run
    is a folder holding ``run.json`` or a table folder (``steps/``, ``turns/``…); a file is a log."""
    return [(run.uri, run.mtime) for run in remote_run_listings(uri, storage_options)]


ListedObject = tuple[str, int, float]
"""An object as a LIST found it: its key below a run's URI, its size in bytes, its mtime (seconds)."""


@dataclass(frozen=True)
class RemoteRun:
    """A run (or log file) in the store, from one LIST of a prefix above it: its URI, its newest object's
    mtime, and its objects (``mirror_down(listing=...)`` fetches them without listing again; empty for a
    log that is one object)."""

    uri: str
    mtime: float
    objects: tuple[ListedObject, ...]


def remote_run_listings(uri: str, storage_options: Mapping[str, str] | None = None) -> list[RemoteRun]:
    """``remote_runs`` with each run's objects: one LIST of ``uri`` for all of them."""
    fs, root = filesystem(uri, storage_options)
    try:
        objects = [
            i for i in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
            if i.type == pafs.FileType.File
        ]  # fmt: skip
    except OSError as error:
        raise StorageError(f"{uri}: {str(error).splitlines()[0]}") from None
    newest: dict[str, float] = {}
    is_run: dict[str, bool] = {}
    listed: dict[str, list[ListedObject]] = {}
    for obj in objects:
        head, _, rest = obj.path[len(root) :].lstrip("/").partition("/")
        if not head or head.startswith(".") or head == "verdicts.parquet":
            continue
        newest[head] = max(newest.get(head, 0.0), _mtime(obj))
        second = rest.split("/", 1)[0]
        is_run[head] = is_run.get(head, False) or not rest or second in RUN_MARKERS
        if rest:
            listed.setdefault(head, []).append((rest, obj.size, _mtime(obj)))
    return [
        RemoteRun(f"{uri.rstrip('/')}/{name}", newest[name], tuple(listed.get(name, ())))
        for name in sorted(newest)
        if is_run[name]
    ]


# ---------------------------------------------------------------------------------------------- writing
@dataclass
class UploadStats:
    """What ``RunUploader`` did: objects uploaded and deleted, upload rounds that failed, the last error."""

    uploaded: int = 0
    deleted: int = 0
    failed_rounds: int = 0
    pending: int = 0
    last_error: str = ""


class RunUploader:
    """Copies one rank's staged run folder to ``<uri>/<run_id>`` from a background thread (module docstring)."""

    def __init__(
        self,
        uri: str,
        run_id: str,
        rank: int,
        staging: Path,
        *,
        interval_s: float = 2.0,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        self.fs, base = filesystem(uri, storage_options)
        self.remote_run = f"{base}/{run_id}"
        self.run_id = run_id
        self.rank = rank
        self.staging = staging
        self.interval_s = interval_s
        self.writer_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.lease = f"{self.remote_run}/{LEASE_FOLDER}/rank={rank}.json"
        self.stats = UploadStats()
        self._uploaded: dict[str, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._round_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.refused = ""
        """Why this writer uploads nothing ("" when it does): another writer holds the lease of this rank."""

    # ---- lease
    def acquire(self) -> bool:
        """Take this rank's lease (``refused`` says why not). A store that does not answer is not a refusal:
        the lease is written on the first round that reaches it."""
        try:
            holder = self._read_lease()
            if holder and holder["writer"] != self.writer_id and time.time() - holder["renewed"] < LEASE_S:
                self.refused = f"run {self.run_id!r} rank {self.rank} is being written by {holder['writer']}"
                return False
            self._write_lease()
            time.sleep(0.2)
            holder = self._read_lease()
            if holder and holder["writer"] != self.writer_id:
                self.refused = f"run {self.run_id!r} rank {self.rank} is being written by {holder['writer']}"
                return False
        except OSError as error:
            self._failed(error)
        return True

    def _read_lease(self) -> dict[str, Any] | None:
        try:
            with self.fs.open_input_stream(self.lease) as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None

    def _write_lease(self) -> None:
        payload = {"writer": self.writer_id, "renewed": time.time(), "rank": self.rank}
        with self.fs.open_output_stream(self.lease) as f:
            f.write(json.dumps(payload).encode())

    # ---- thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"sorl-uploader-rank{self.rank}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.upload_round()

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the thread, then upload what is left, trying until ``timeout_s``; release the lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        deadline = time.monotonic() + timeout_s
        while not self.upload_round(final=True) and time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        if not self.stats.pending:
            try:
                self.fs.delete_file(self.lease)
            except OSError:
                pass

    def upload_round(self, final: bool = False) -> bool:
        """Upload new and changed files, then delete the objects of files compacted away; True if all went up."""
        if self.refused:
            return True
        with self._round_lock:
            try:
                local = self._local_files()
                changed = [(rel, stamp) for rel, stamp in local.items() if self._uploaded.get(rel) != stamp]
                parts_first = sorted(changed, key=lambda item: item[0].endswith(".json"))  # run.json last
                for rel, stamp in parts_first:
                    self._put(rel)
                    self._uploaded[rel] = stamp
                    self.stats.uploaded += 1
                for rel in sorted(set(self._uploaded) - set(local)):  # merged into a part already uploaded
                    try:
                        self.fs.delete_file(f"{self.remote_run}/{rel}")
                    except FileNotFoundError:
                        pass
                    del self._uploaded[rel]
                    self.stats.deleted += 1
                if not final:
                    self._write_lease()
                self.stats.pending = 0
                return True
            except OSError as error:
                self._failed(error)
                self.stats.pending = sum(
                    1 for rel, s in self._local_files().items() if self._uploaded.get(rel) != s
                )
                return False

    def _local_files(self) -> dict[str, tuple[int, int]]:
        files = {}
        for path in self.staging.rglob("*"):
            if not path.is_file() or path.name.endswith(SKIPPED_SUFFIXES) or path.name.startswith("."):
                continue
            rel = path.relative_to(self.staging).as_posix()
            if rel.endswith(".json") and self.rank != 0:
                continue  # run.json is rank 0's
            if "/" in rel and f"rank={self.rank}" not in rel.split("/"):
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            files[rel] = (stat.st_size, stat.st_mtime_ns)
        return files

    def _put(self, rel: str) -> None:
        data = (self.staging / rel).read_bytes()
        with self.fs.open_output_stream(f"{self.remote_run}/{rel}") as sink:
            sink.write(data)

    def _failed(self, error: BaseException) -> None:
        self.stats.failed_rounds += 1
        self.stats.last_error = str(error).splitlines()[0] if str(error) else type(error).__name__


def staging_dir(uri: str, rank: int) -> Path:
    """A fresh local log dir for one writer's runs under ``uri`` before they go up (the run is a folder in it)."""
    parsed = urlparse(uri)
    name = f"rank{rank}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return cache_root() / "staging" / parsed.scheme / parsed.netloc / parsed.path.strip("/") / name
