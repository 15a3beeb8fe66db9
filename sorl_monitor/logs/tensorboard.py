"""TensorBoard event files (``events.out.tfevents.*``), read with the ``tensorboard`` package's own reader.

As TensorBoard does, every folder that holds event files is one run (its files read in name order, which
is the order they were written in). Scalars come from ``simple_value`` (``SummaryWriter.add_scalar``,
TF1 summaries) and from one-element numeric tensors (TF2 ``tf.summary.scalar``, ``add_scalar(...,
new_style=True)``); tags whose plugin is not ``scalars`` (histograms, images, text) are skipped. A record
still being written at the end of a live file is left for the next read. Needs the optional extra
``sorl-monitor[import]``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sorl_monitor.logs.table import NO_STEPS, ForeignRun, LogFormatError, foreign_run, pivot

MARKER = "tfevents"
"""Event files are named ``events.out.tfevents.<time>.<host>…``."""
SCALARS_PLUGIN = "scalars"
INSTALL_HINT = "reading TensorBoard logs needs the tensorboard package: pip install 'sorl-monitor[import]'"


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
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
        from tensorboard.compat.proto import event_pb2
        from tensorboard.util import tensor_util
    except ImportError:
        raise LogFormatError(INSTALL_HINT) from None
    plugins: dict[str, str] = {}
    parse = event_pb2.Event.FromString
    for record in RawEventFileLoader(str(file)).Load():
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
