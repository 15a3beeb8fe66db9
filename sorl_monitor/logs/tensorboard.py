"""TensorBoard event files (``events.out.tfevents.*``), read with the ``tensorboard`` package's own reader.

As TensorBoard does, every folder that holds event files is one run (its files read in name order, which
is the order they were written in). Scalars come from ``simple_value`` (``SummaryWriter.add_scalar``,
TF1 summaries) and from one-element numeric tensors (TF2 ``tf.summary.scalar``, ``add_scalar(...,
new_style=True)``); tags whose plugin is not ``scalars`` (histograms, images, text) are skipped. A record
still being written at the end of a live file is left for the next read. Needs the optional extra
``sorl-monitor[import]``.
"""

from __future__ import annotations

import mmap
import struct
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from sorl_monitor.logs.table import NO_STEPS, ForeignRun, LogFormatError, LogWarning, foreign_run, pivot

MARKER = "tfevents"
"""Event files are named ``events.out.tfevents.<time>.<host>…``."""
SCALARS_PLUGIN = "scalars"
INSTALL_HINT = "reading TensorBoard logs needs the tensorboard package: pip install 'sorl-monitor[import]'"
RESYNC_BYTES = 1 << 20
"""How far past a corrupt record the reader looks for the next record that checks out."""
MAX_RECORD_BYTES = 1 << 30
"""A record length above this is taken for damage, not data."""


def is_event_file(path: Path) -> bool:
    return MARKER in path.name and path.is_file()


def event_files(folder: Path) -> list[Path]:
    """The event files directly in ``folder``, in name order."""
    return sorted(p for p in folder.iterdir() if is_event_file(p))


def read(path: Path, name: str) -> list[ForeignRun]:
    """The run in an event file, or in a folder's event files."""
    files = event_files(path) if path.is_dir() else [path]
    steps: list[int] = []
    tags: list[str] = []
    values: list[float] = []
    wall: list[float] = []
    for file in files:
        _read_scalars(file, steps, tags, values, wall)
    if not steps:
        return [foreign_run(path, "tensorboard", name, NO_STEPS)]
    table = pivot(np.array(steps, np.int64), tags, np.array(values), np.array(wall))
    return [foreign_run(path, "tensorboard", name, table)]


def _read_scalars(
    file: Path, steps: list[int], tags: list[str], values: list[float], wall: list[float]
) -> None:
    """Append every scalar point of one event file to the lists."""
    try:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
        from tensorboard.util import tensor_util
    except ImportError:
        raise LogFormatError(INSTALL_HINT) from None
    plugins: dict[str, str] = {}
    parse = event_pb2.Event.FromString
    gaps: list[tuple[int, int | None, int]] = []
    before = len(steps)
    for record in _records(file, masked_crc32c, gaps, lambda: len(steps) - before):
        try:
            event = parse(record)
        except Exception:  # noqa: BLE001 - a record that is not an Event (a foreign TFRecord file)
            raise LogFormatError(f"{file} is not a TensorBoard event file") from None
        if not event.HasField("summary"):
            continue
        for value in event.summary.value:
            if value.metadata.plugin_data.plugin_name:
                plugins[value.tag] = value.metadata.plugin_data.plugin_name
            kind = value.WhichOneof("value")
            if kind == "simple_value":
                number = value.simple_value
            elif kind == "tensor" and plugins.get(value.tag, SCALARS_PLUGIN) == SCALARS_PLUGIN:
                array = tensor_util.make_ndarray(value.tensor)
                if array.size != 1 or not np.issubdtype(array.dtype, np.number):
                    continue
                number = float(array.reshape(()))
            else:
                continue
            steps.append(event.step)
            tags.append(value.tag)
            values.append(number)
            wall.append(event.wall_time)
    _warn_gaps(file, gaps, steps[before:])


_HEADER = struct.Struct("<QI")  # record length, masked CRC32C of the length's 8 bytes


def _records(
    file: Path,
    crc: Callable[[bytes], int],
    gaps: list[tuple[int, int | None, int]],
    points_read: Callable[[], int],
) -> Iterator[bytes]:
    """The records of a TFRecord file (length, its CRC, data, the data's CRC), every CRC checked.

    A record being written at the end of a live file is left for the next read. A record that does not
    check out with more bytes after it is damage: the bytes up to the next record that checks out (looked
    for over ``RESYNC_BYTES``) are skipped, and ``(start, end or None if none was found, points read
    before)`` is added to ``gaps``. (TensorBoard's own loader stops at the damage, silently.)
    """
    with open(file, "rb") as handle:
        if not handle.seek(0, 2):
            return
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            size, offset = len(data), 0
            while offset + _HEADER.size <= size:
                length, length_crc = _HEADER.unpack_from(data, offset)
                header_ok = crc(data[offset : offset + 8]) == length_crc and length <= MAX_RECORD_BYTES
                end = offset + _HEADER.size + length + 4
                if header_ok and end > size:
                    return  # still being written
                start = offset + _HEADER.size
                if (
                    header_ok
                    and crc(data[start : start + length]) == struct.unpack_from("<I", data, end - 4)[0]
                ):
                    yield data[start : start + length]
                    offset = end
                    continue
                found = _next_record(data, offset + 1, crc)
                gaps.append((offset, found, points_read()))
                if found is None:
                    return
                offset = found


def _next_record(data: mmap.mmap, offset: int, crc: Callable[[bytes], int]) -> int | None:
    """The first offset at or after ``offset`` (within ``RESYNC_BYTES``) where a whole record checks out."""
    size = len(data)
    for at in range(offset, min(size - _HEADER.size, offset + RESYNC_BYTES) + 1):
        length, length_crc = _HEADER.unpack_from(data, at)
        end = at + _HEADER.size + length + 4
        if end > size or crc(data[at : at + 8]) != length_crc:
            continue
        if crc(data[at + _HEADER.size : end - 4]) == struct.unpack_from("<I", data, end - 4)[0]:
            return at
    return None


def _warn_gaps(file: Path, gaps: list[tuple[int, int | None, int]], steps: list[int]) -> None:
    """One warning per damaged stretch of an event file: where it is, and the steps around it."""
    size = file.stat().st_size
    for start, end, read_before in gaps:
        before = f"step {steps[read_before - 1]}" if read_before else "the start"
        if end is None:
            warnings.warn(
                f"{file}: damaged record at byte {start}; the {size - start} bytes from there do not read "
                f"(every step after {before} is lost)",
                LogWarning,
                stacklevel=5,
            )
            continue
        after = f"step {steps[read_before]}" if read_before < len(steps) else "the end"
        warnings.warn(
            f"{file}: {end - start} damaged bytes at byte {start} skipped, read on from byte {end} "
            f"(points between {before} and {after} are lost)",
            LogWarning,
            stacklevel=5,
        )
