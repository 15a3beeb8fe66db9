"""One device→host copy per update, queued without waiting: ``start_copy`` packs a dict of tensors into one
flat tensor, queues its copy into pinned host memory and records a CUDA event; ``HostCopy.arrays`` cuts it
back once the copy has landed.

On CUDA the copy is ``non_blocking`` into page-locked memory (``pin_memory``), so the calling thread goes on
queueing work while the copy waits its turn on the stream; ``HostCopy.done`` asks the event (no wait),
``HostCopy.wait`` blocks on it (counted in ``STATS.waits``). On the CPU the packed tensor is already host
memory: it is done at once. Other devices (MPS, XPU) copy with a blocking ``.cpu()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor


@dataclass
class TransferStats:
    """Counters of this process: ``copies`` packs moved to the host (``log_update`` makes one per update),
    ``waits`` times a caller blocked on a copy still in flight."""

    copies: int = 0
    waits: int = 0


STATS = TransferStats()


def _record_event(device: torch.device) -> Any:
    """A CUDA event recorded on ``device``'s current stream (after the queued copy); None off CUDA."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


class HostCopy:
    """An update's tensors on their way to the host: one flat buffer, the event that marks its copy done,
    and the names and shapes to cut it back into."""

    def __init__(self, buffer: Tensor, event: Any, shapes: list[tuple[str, torch.Size]]) -> None:
        self._buffer = buffer
        self._event = event
        self._shapes = shapes

    def done(self) -> bool:
        """Whether the copy has landed (asks the event; never waits)."""
        return self._event is None or bool(self._event.query())

    def wait(self) -> None:
        """Block until the copy has landed (a no-op once it has)."""
        if not self.done():
            STATS.waits += 1
            self._event.synchronize()
        self._event = None

    def arrays(self) -> dict[str, np.ndarray]:
        """The tensors as NumPy arrays of their shapes (waits for the copy if it is still in flight)."""
        self.wait()
        pieces = torch.split(self._buffer, [shape.numel() for _, shape in self._shapes])
        return {
            name: piece.reshape(shape).numpy()
            for (name, shape), piece in zip(self._shapes, pieces, strict=True)
        }


def start_copy(tensors: Mapping[str, Tensor], dtype: torch.dtype = torch.float64) -> HostCopy:
    """Queue ``tensors``' one device→host copy and return at once.

    Each is cast to ``dtype`` on the first one's device and flattened; the pieces are concatenated and the
    result copied into one host buffer (pinned, ``non_blocking`` on CUDA); an event marks the copy's end.
    """
    shapes = [(name, tensor.shape) for name, tensor in tensors.items()]
    STATS.copies += 1
    if not tensors:
        return HostCopy(torch.zeros(0, dtype=dtype), None, shapes)
    device = next(iter(tensors.values())).device
    flat = torch.cat([t.detach().to(device, dtype).reshape(-1) for t in tensors.values()])
    if device.type == "cpu":
        buffer = flat
    elif device.type == "cuda":
        buffer = torch.empty(flat.shape, dtype=dtype, pin_memory=True)
        buffer.copy_(flat, non_blocking=True)
    else:
        buffer = flat.cpu()
    return HostCopy(buffer, _record_event(device), shapes)


def to_host(tensors: Mapping[str, Tensor], dtype: torch.dtype = torch.float64) -> dict[str, np.ndarray]:
    """``tensors`` as NumPy arrays of their shapes, through one device→host copy (waits for it)."""
    if not tensors:
        return {}
    return start_copy(tensors, dtype).arrays()
