"""One rank's run copied up to object storage from a thread of its own (``Monitor("s3://bucket/runs")``).

The writer streams parts to a local staging folder exactly as to a local log dir; ``RunUploader`` copies each
finished file to ``<uri>/<run_id>``: every part is one object, uploaded once and visible only when complete; a
part merged away by compaction is deleted from the store only after the merged part is there; ``run.json``
(rank 0's) is copied whenever it changes. A store that does not answer never blocks training: the files wait
in staging and go up when it answers again.

Nothing goes up before the first contact with the store (``contact``), made as soon as it answers, even if
that is long after the start:

- **One writer per (run, rank)**, without ``flock``: a lease object ``<run>/_writers/rank=R.json`` names the
  writer and is renewed every round. A writer that finds another writer's lease younger than ``LEASE_S`` is
  refused; one that takes the lease reads it back before uploading anything, and reads it again before each
  renewal. A writer refused after it started (the store was down when it began) keeps its rows apart, in its
  staging folder, and says so; it never uploads over the other writer's objects. (``pyarrow.fs`` exposes no
  conditional write: two writers whose write and read-back interleave exactly can both pass the first check;
  the next renewal finds the loser.)
- **A resumed run continues its part numbers**: the parts an earlier session left for this rank are listed,
  and this session's parts go up numbered after them (the staging folder numbers from 0).

Problems are said as they happen, through ``report(key, message)`` (``Monitor`` warns once per key): a store
that refuses (bad key, no such bucket), fails, or has not answered ``SILENT_S`` seconds after the first try.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from sorl_monitor.schema import PART_NAME, TABLES
from sorl_monitor.storage import LEASE_FOLDER, cache_root, filesystem, local_copy, one_line

LEASE_S = 60.0
"""A writer's lease older than this is taken to be a dead writer's: another writer may take the rank."""
LEASE_SETTLE_S = 1.0
"""How long a writer waits between writing the lease and reading it back: two writers that both found the lease
free, and wrote theirs within this of each other, both see the later one, and only its writer goes on (the store
has no conditional write; a writer slower than this between its read and its write can still slip through, and
is stopped at its next renewal)."""
SKIPPED_SUFFIXES = (".tmp", ".lock")
"""Local files never uploaded: files being written, and the local writer's lock."""
SILENT_S = 3.0
"""A store that has not answered this long after the first try is reported (a request may take longer)."""
CONTACT_WAIT_S = 2.0
"""How long ``Monitor``'s constructor waits for the first contact (a refusal is then known at once)."""
REFUSALS = (
    "ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "NO_SUCH_BUCKET", "AccessDenied",
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoSuchBucket", "no such bucket", "curlCode: 6",
)  # fmt: skip
"""Errors that trying again will not cure: credentials, bucket, an endpoint whose name does not resolve."""

Report = Callable[[str, str], None]


@dataclass
class UploadStats:
    """What ``RunUploader`` did: objects uploaded and deleted, rounds that failed, files waiting, the last error,
    and why nothing goes up (``refused``: another writer holds this run and rank)."""

    uploaded: int = 0
    deleted: int = 0
    failed_rounds: int = 0
    pending: int = 0
    last_error: str = ""
    refused: str = ""


def is_refusal(reason: str) -> bool:
    """Whether a store error is one that trying again will not cure (``REFUSALS``)."""
    return any(marker in reason for marker in REFUSALS)


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
        report: Report | None = None,
    ) -> None:
        self.fs, base = filesystem(uri, storage_options, attempts=1)
        self.uri = f"{uri.rstrip('/')}/{run_id}"
        self.bucket = base.split("/", 1)[0]
        self.remote_run = f"{base}/{run_id}"
        self.run_id = run_id
        self.rank = rank
        self.staging = staging
        self.interval_s = interval_s
        self.writer_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.lease = f"{self.remote_run}/{LEASE_FOLDER}/rank={rank}.json"
        self.stats = UploadStats()
        self.report: Report = report or (lambda key, message: None)
        self._offsets: dict[str, int] | None = None  # part numbers of earlier sessions, once contacted
        self._answered = False  # the store answered this session
        self._first_try = threading.Event()  # the first contact was tried (answered or not)
        self._started = False  # the writer is writing: a refusal from now on is reported, not returned
        self._state = threading.Lock()
        self._uploaded: dict[str, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._round_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._silence: threading.Timer | None = None

    @property
    def refused(self) -> str:
        """Why this writer uploads nothing ("" when it does): another writer holds the lease of this rank."""
        return self.stats.refused

    # ---- thread
    def start(self, wait_s: float = CONTACT_WAIT_S) -> str:
        """Start the thread (its first round contacts the store at once) and wait up to ``wait_s`` for that
        contact; returns ``refused`` as then known."""
        self._silence = threading.Timer(SILENT_S, self._silent)
        self._silence.daemon = True
        self._silence.start()
        self._thread = threading.Thread(target=self._loop, name=f"sorl-uploader-rank{self.rank}", daemon=True)
        self._thread.start()
        self._first_try.wait(wait_s)
        with self._state:
            self._started = True
            return self.refused

    def _loop(self) -> None:
        self._round()
        while not self._stop.wait(self.interval_s):
            self._round()

    def _round(self) -> None:
        try:
            self.upload_round()
        except Exception as error:  # noqa: BLE001 - e.g. pyarrow's S3 finalized at exit: never a traceback
            self._failed(error)

    def _silent(self) -> None:
        if not self._answered and not self._stop.is_set():
            self.report(
                "store",
                f"sorl-monitor: {self.uri} has not answered in {SILENT_S:g} s ({self.stats.last_error or 'no reply'}); "
                f"rows are kept in {self.staging} and go up when it answers",
            )

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the thread, then upload what is left and release the lease. Tries until ``timeout_s`` when the
        store answered this session (an outage may end); once only when it never answered or refused."""
        self._stop.set()
        if self._silence is not None:
            self._silence.cancel()
        if self._thread is not None:
            self._thread.join(timeout_s if self._answered else min(timeout_s, SILENT_S))
            if self._thread.is_alive():  # held in a request to a store that does not answer: so would we be
                self.stats.pending = len(self._changed(self._local_files()))
                return
        deadline = time.monotonic() + timeout_s
        while not self.upload_round(final=True):
            if not self._answered or is_refusal(self.stats.last_error) or time.monotonic() >= deadline:
                break
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        if self._answered and not self.refused and not self.stats.pending:
            try:
                self.fs.delete_file(self.lease)
            except OSError:
                pass

    # ---- first contact
    def contact(self) -> bool:
        """Before anything goes up: take this rank's lease (or be refused) and find the parts earlier sessions
        of this run left (``_offsets``). True once done; False while the store does not answer."""
        if self._offsets is not None or self.refused:
            return True
        try:
            self._check_bucket()
            if self._take_lease():
                self._offsets = self._earlier_parts()
        except Exception as error:  # noqa: BLE001 - OSError from the store; ArrowInvalid once S3 is finalized
            self._failed(error)
            return False
        finally:
            self._first_try.set()
        self._answered = True
        return True

    def _check_bucket(self) -> None:
        """``FileNotFoundError`` where the bucket does not exist (a store may make one on the first PUT); a
        store that will not say (no permission on the bucket itself) is left to the requests that follow."""
        try:
            missing = self.fs.get_file_info(self.bucket).type == pafs.FileType.NotFound
        except OSError:
            return
        if missing:
            raise FileNotFoundError(f"no such bucket: {self.bucket}")

    def _take_lease(self) -> bool:
        holder = self._read_lease()
        if self._held_by_other(holder):
            return self._refuse(holder)
        self._write_lease()
        time.sleep(LEASE_SETTLE_S)
        holder = self._read_lease()
        return self._refuse(holder) if self._held_by_other(holder) else True

    def _held_by_other(self, holder: dict[str, Any] | None) -> bool:
        if not holder or holder.get("writer") == self.writer_id:
            return False
        renewed = holder.get("renewed")
        return isinstance(renewed, int | float) and time.time() - renewed < LEASE_S

    def _refuse(self, holder: dict[str, Any] | None) -> bool:
        writer = (holder or {}).get("writer", "another writer")
        with self._state:
            self.stats.refused = (
                f"run {self.run_id!r} rank {self.rank} in {self.uri} is being written by {writer}"
            )
            late = self._started
        if late:  # the writer is writing already: its rows stay in staging
            self.report(
                "refused",
                f"sorl-monitor uploads nothing: {self.refused}; this writer's rows are kept apart in "
                f"{self.staging}, not uploaded",
            )
        return False

    def _earlier_parts(self) -> dict[str, int]:
        """Each table's first free part number for this rank in the store (0 for a new run)."""
        offsets = {}
        for table in TABLES:
            folder = f"{self.remote_run}/{table}/rank={self.rank}"
            found = self.fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
            ends = [int(m.group(2) or m.group(1)) for i in found if (m := PART_NAME.match(i.base_name))]
            offsets[table] = max(ends, default=-1) + 1
        return offsets

    def _read_lease(self) -> dict[str, Any] | None:
        try:
            with self.fs.open_input_stream(self.lease) as f:
                holder = json.loads(f.read())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        return holder if isinstance(holder, dict) else None

    def _write_lease(self) -> None:
        payload = {"writer": self.writer_id, "renewed": time.time(), "rank": self.rank}
        with self.fs.open_output_stream(self.lease) as f:
            f.write(json.dumps(payload).encode())

    # ---- rounds
    def upload_round(self, final: bool = False) -> bool:
        """Upload new and changed files, then delete the objects of files compacted away; True if all went up
        (or nothing will: refused)."""
        with self._round_lock:
            first = self._offsets is None and not self.refused
            if not self.contact():
                self.stats.pending = len(self._changed(self._local_files()))
                return False
            if self.refused:
                self.stats.pending = len(self._local_files())
                return True
            try:
                if not first and not final:  # renew; a lease another writer took over stops this one
                    holder = self._read_lease()
                    if self._held_by_other(holder):
                        self._refuse(holder)
                        self.stats.pending = len(self._local_files())
                        return True
                    self._write_lease()
                local = self._local_files()
                for rel, stamp in sorted(self._changed(local), key=lambda i: i[0].endswith(".json")):
                    if self._put(rel):  # parts first, run.json last
                        self._uploaded[rel] = stamp
                        self.stats.uploaded += 1
                for rel in sorted(set(self._uploaded) - set(local)):  # merged into a part already uploaded
                    try:
                        self.fs.delete_file(self._remote(rel))
                    except FileNotFoundError:
                        pass
                    del self._uploaded[rel]
                    self.stats.deleted += 1
                self.stats.pending = 0
                self._answered = True
                return True
            except OSError as error:
                self._failed(error)
                self.stats.pending = len(self._changed(self._local_files()))
                return False

    def _changed(self, local: dict[str, tuple[int, int]]) -> list[tuple[str, tuple[int, int]]]:
        uploaded = dict(self._uploaded)
        return [(rel, stamp) for rel, stamp in local.items() if uploaded.get(rel) != stamp]

    def _remote(self, rel: str) -> str:
        """The object of a staged file: a part renumbered after the parts of earlier sessions."""
        folder, _, name = rel.rpartition("/")
        offset = (self._offsets or {}).get(rel.partition("/")[0], 0)
        match = PART_NAME.match(name)
        if match and offset:
            first = int(match.group(1)) + offset
            name = f"part-{first:06d}.parquet"
            if match.group(2) is not None:
                name = f"part-{first:06d}-{int(match.group(2)) + offset:06d}.parquet"
        return f"{self.remote_run}/{folder}/{name}" if folder else f"{self.remote_run}/{name}"

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

    def _put(self, rel: str) -> bool:
        """Upload one staged file; False if it is gone since it was listed (merged away by compaction)."""
        try:
            data = (self.staging / rel).read_bytes()
        except FileNotFoundError:
            return False
        with self.fs.open_output_stream(self._remote(rel)) as sink:
            sink.write(data)
        return True

    def _failed(self, error: BaseException) -> None:
        self.stats.failed_rounds += 1
        self.stats.last_error = one_line(error, short=True)
        if is_refusal(self.stats.last_error):
            advice = "check the credentials, endpoint and bucket"
        else:
            advice = "it may be down"
        self.report(
            "store",
            f"sorl-monitor cannot upload to {self.uri} ({self.stats.last_error}); {advice}. Rows are kept in "
            f"{self.staging} and go up when it answers; training goes on",
        )


def staging_dir(uri: str, rank: int) -> Path:
    """A fresh local log dir for one writer's runs under ``uri`` before they go up (the run is a folder in it)."""
    name = f"rank{rank}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return cache_root() / "staging" / local_copy(uri).relative_to(cache_root() / "objects") / name
