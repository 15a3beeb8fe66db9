"""One device→host copy per update: ``to_host`` packs a dict of tensors into one flat tensor and back."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor


def to_host(tensors: Mapping[str, Tensor], dtype: torch.dtype = torch.float64) -> dict[str, np.ndarray]:
    """``tensors`` as NumPy arrays of their shapes, through one device→host copy.

    Each is cast to ``dtype`` on the first one's device and flattened; the pieces are concatenated, the
    result is copied to the host once, and ``torch.split`` cuts it back by the pieces' sizes.
    """
    if not tensors:
        return {}
    device = next(iter(tensors.values())).device
    flat = [t.detach().to(device, dtype).reshape(-1) for t in tensors.values()]
    host = torch.split(torch.cat(flat).cpu(), [piece.numel() for piece in flat])
    return {
        name: piece.reshape(tensor.shape).numpy()
        for (name, tensor), piece in zip(tensors.items(), host, strict=True)
    }
