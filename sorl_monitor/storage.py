"""Object storage as a log dir: runs written to and read from ``s3://bucket/prefix`` (any ``pyarrow.fs`` URI).

Writing (``Monitor("s3://bucket/runs")``) is ``uploader.RunUploader``'s: parts are staged locally, then copied
up from a thread of its own, one writer per run and rank (a lease object in ``LEASE_FOLDER``).

Reading (``open_runs("s3://bucket/runs")``): ``mirror_down`` copies the objects under the URI into a local
cache (``SORL_CACHE_DIR``, default ``~/.cache/sorl-monitor/objects``), downloading only objects that are new
or changed and removing files whose objects are gone; the query layer then reads the copy as a local
folder, and ``refresh()`` mirrors again. DuckDB needs no extension (nothing is downloaded at run time).
``remote_run_listings`` finds the runs under a prefix at any depth in one LIST.

A URI names a bucket and a prefix: no ``.`` or ``..`` folder, no empty folder, no ``?`` or ``#`` (each is
refused with ``StorageError``, never read as something else). Credentials and endpoint: the usual AWS
variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``/
``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL``/``AWS_ENDPOINT_URL_S3``), or ``storage_options`` (``sorl
--storage-option key=value``), whose keys are ``STORAGE_OPTIONS``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs

LEASE_FOLDER = "_writers"
"""Where a run's writers keep their leases (``uploader``); never mirrored."""
RUN_FILE = "run.json"
TABLE_FOLDERS = ("steps", "turns", "modules", "alerts")
"""With ``RUN_FILE``, what makes a folder in the store a run (``logs.formats.is_run_dir``'s rule, by name)."""
VERDICTS_OBJECT = "verdicts.parquet"
"""The fleet's table at a root (``verdict_table.VERDICTS_FILE``): not a run."""
STORAGE_OPTIONS = {
    "endpoint_override": "host:port of an S3-compatible server",
    "scheme": "http or https",
    "access_key": "the key id",
    "secret_key": "the secret",
    "session_token": "a temporary session's token",
    "region": "the bucket's region",
    "anonymous": "true for a public bucket",
    "connect_timeout": "seconds",
    "request_timeout": "seconds",
}
"""The ``storage_options`` keys (``--storage-option key=value``) and what each takes."""
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
    """``["endpoint_override=127.0.0.1:9000", …]`` → a dict; ``ValueError`` on an item without ``=`` or a key
    that is not one of ``STORAGE_OPTIONS``."""
    options = {}
    for item in assignments or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--storage-option takes key=value, not {item!r}")
        options[key.strip()] = value.strip()
    try:
        check_storage_options(options)
    except StorageError as error:
        raise ValueError(str(error)) from None
    return options


def check_storage_options(options: Mapping[str, Any]) -> None:
    """``StorageError`` naming the first key that is not one of ``STORAGE_OPTIONS``, or a value it cannot take."""
    for key, value in options.items():
        if key not in STORAGE_OPTIONS:
            known = ", ".join(STORAGE_OPTIONS)
            raise StorageError(f"unknown storage option {key!r} (known: {known})")
        if key == "scheme" and str(value) not in ("http", "https"):
            raise StorageError(f"storage option scheme must be http or https, not {value!r}")
        if key.endswith("_timeout") and not _positive(value):
            raise StorageError(f"storage option {key} must be a number of seconds > 0, not {value!r}")


def _positive(value: Any) -> bool:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return 0 < number < float("inf")


def check_uri(uri: str) -> str:
    """``bucket/prefix`` of ``uri`` (no slash at the end), or ``StorageError`` where the URI is not a bucket and a
    plain prefix: no bucket, a ``.`` / ``..`` / empty folder, a ``?`` or ``#`` (no part of it is dropped)."""
    if "?" in uri or "#" in uri:
        raise StorageError(
            f"{uri}: an object-store URI takes no '?' or '#' (give the bucket and prefix only)"
        )
    parsed = urlparse(uri)
    if not parsed.netloc:
        raise StorageError(f"{uri}: no bucket in the URI")
    inner = parsed.path.removeprefix("/").rstrip("/")
    folders = inner.split("/") if inner else []
    if bad := [f for f in folders if f in ("", ".", "..")]:
        shown = "an empty folder (//)" if bad[0] == "" else f"a {bad[0]!r} folder"
        raise StorageError(
            f"{uri}: {shown} in an object-store prefix (object keys are not resolved like paths)"
        )
    return "/".join([parsed.netloc, *folders])


def one_line(error: BaseException, *, short: bool = False) -> str:
    """A store error in one line: its first line, without the request id; ``short``: from ``AWS Error`` on
    (the key and bucket it names are said by the caller)."""
    text = str(error).strip().splitlines()
    line = re.sub(r"\s*\(Request ID: [^)]*\)", "", text[0] if text else type(error).__name__)
    return line[line.index("AWS Error") :] if short and "AWS Error" in line else line


def filesystem(
    uri: str, storage_options: Mapping[str, str] | None = None, *, attempts: int = 3
) -> tuple[pafs.FileSystem, str]:
    """The ``pyarrow.fs`` filesystem of ``uri`` and the path inside it (``bucket/prefix``, no slash at the end);
    ``StorageError`` for a URI ``check_uri`` refuses or an unknown option. ``attempts``: tries per S3 request
    (a writer that tries again every round takes 1)."""
    options = {**_STORAGE_OPTIONS, **(storage_options or {})}
    path = check_uri(uri)
    check_storage_options(options)
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        return _s3(options, attempts), path
    if options:
        raise StorageError(f"{uri}: storage options are only read for s3:// URIs")
    try:
        fs, inner = pafs.FileSystem.from_uri(uri)
    except (pafs.ArrowInvalid, OSError, ValueError) as error:  # type: ignore[attr-defined]
        raise StorageError(f"{uri}: {one_line(error)}") from None
    return fs, inner.rstrip("/")


def _s3(options: Mapping[str, str], attempts: int) -> pafs.S3FileSystem:
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
        "allow_bucket_creation": False,
        "connect_timeout": float(options.get("connect_timeout", 5)),
        "request_timeout": float(options.get("request_timeout", 30)),
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=attempts),
    }
    if str(options.get("anonymous", "")).lower() in ("1", "true", "yes"):
        kwargs["anonymous"] = True
    elif options.get("access_key") or options.get("secret_key"):
        kwargs["access_key"] = options.get("access_key")
        kwargs["secret_key"] = options.get("secret_key")
        kwargs["session_token"] = options.get("session_token")
    try:
        return pafs.S3FileSystem(**kwargs)
    except (ValueError, OSError) as error:
        raise StorageError(f"s3: {one_line(error)}") from None


def cache_root() -> Path:
    """This machine's copies of object-store runs: ``objects/`` (mirrored for reading) and ``staging/`` (written
    here, then uploaded); ``SORL_CACHE_DIR``, else ``~/.cache/sorl-monitor``."""
    return Path(os.environ.get("SORL_CACHE_DIR") or Path.home() / ".cache" / "sorl-monitor")


def local_copy(uri: str) -> Path:
    """The local folder ``mirror_down`` keeps ``uri``'s objects in."""
    return cache_root() / "objects" / urlparse(uri).scheme / check_uri(uri)


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
        raise StorageError(f"{uri}: {one_line(error)}") from None
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
        raise StorageError(f"{uri}: {one_line(error)}") from None
    os.replace(tmp, target)
    os.utime(target, (_mtime(obj), _mtime(obj)))
    return True


def _mtime(info: pafs.FileInfo) -> float:
    return info.mtime.timestamp() if info.mtime is not None else 0.0


def _stamp(path: Path) -> float:
    return path.stat().st_mtime


def remote_runs(uri: str, storage_options: Mapping[str, str] | None = None) -> list[tuple[str, float]]:
    """The runs and log files under ``uri`` in the store (``remote_run_listings``), as ``(uri, newest object's
    mtime)``."""
    return [(run.uri, run.mtime) for run in remote_run_listings(uri, storage_options)]


ListedObject = tuple[str, int, float]
"""An object as a LIST found it: its key below a run's URI, its size in bytes, its mtime (seconds)."""


@dataclass(frozen=True)
class RemoteRun:
    """A run (or log file) in the store, from one LIST of a prefix above it: its URI, its newest object's
    mtime, its objects (``mirror_down(listing=...)`` fetches them without listing again; empty for a log
    that is one object), and its path below the prefix listed (``exp1/run``; "" for the prefix itself)."""

    uri: str
    mtime: float
    objects: tuple[ListedObject, ...]
    name: str = ""


def run_prefix(parts: Sequence[str]) -> int | None:
    """How many leading folders of an object key (split at ``/``) name the run holding it: the first folder
    followed by ``run.json`` or by a table folder with ``rank=R`` partitions (0: the prefix listed is itself a
    run); ``None`` if no run holds it."""
    for depth, part in enumerate(parts):
        if part == RUN_FILE and depth == len(parts) - 1:
            return depth
        if part in TABLE_FOLDERS and depth + 2 < len(parts) and parts[depth + 1].startswith("rank="):
            return depth
    return None


def remote_run_listings(uri: str, storage_options: Mapping[str, str] | None = None) -> list[RemoteRun]:
    """The runs under ``uri``, at any depth (``exp1/run``, ``exp2/run``: how experiments are arranged), and
    the log files directly under it, each with its objects: one LIST of ``uri`` for all of them. A folder
    or file whose name starts with ``.`` is left out, and so is the fleet's ``verdicts.parquet``."""
    fs, root = filesystem(uri, storage_options)
    try:
        objects = [
            i for i in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
            if i.type == pafs.FileType.File
        ]  # fmt: skip
    except OSError as error:
        raise StorageError(f"{uri}: {one_line(error)}") from None
    keyed = []
    for obj in objects:
        parts = obj.path[len(root) :].strip("/").split("/")
        if parts[0] and not any(p.startswith(".") for p in parts):
            keyed.append((parts, obj))
    runs = {"/".join(parts[:depth]) for parts, _ in keyed if (depth := run_prefix(parts)) is not None}
    newest: dict[str, float] = {}
    listed: dict[str, list[ListedObject]] = {}
    for parts, obj in keyed:
        name = _holder(parts, runs)
        if name is None and len(parts) == 1 and parts[0] != VERDICTS_OBJECT:
            name = parts[0]  # a log file directly under the prefix
        if name is None:
            continue
        newest[name] = max(newest.get(name, 0.0), _mtime(obj))
        rest = "/".join(parts[len(name.split("/")) if name else 0 :])
        if rest and name in runs:
            listed.setdefault(name, []).append((rest, obj.size, _mtime(obj)))
    base = uri.rstrip("/")
    return [
        RemoteRun(f"{base}/{name}" if name else base, newest[name], tuple(listed.get(name, ())), name)
        for name in sorted(newest)
    ]


def _holder(parts: Sequence[str], runs: Collection[str]) -> str | None:
    """The run among ``runs`` whose folder holds the object at ``parts`` (the outermost), or ``None``."""
    if "" in runs:
        return ""
    for depth in range(1, len(parts)):
        name = "/".join(parts[:depth])
        if name in runs:
            return name
    return None
