"""Per-module gradient and parameter norms (the ``modules`` table), for ``Monitor.watch`` and ``SorlCallback``.

Trainable parameters are grouped by top-level module (``module_group``); every group's norms come from one
batched call on the device (``metrics.module_norms``), with the parameter→group index built once per device
(no host data in the step). Norms read after clipping are rescaled to the
pre-clip total: clipping multiplies every gradient by one factor, so

    ‖g_m‖_pre = ‖g_m‖ · ‖g‖_pre / ‖g‖,   ‖g‖ = √(Σ_m ‖g_m‖²).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from sorl_monitor.write.metrics import group_index, module_norms

_NUMERIC = re.compile(r"^\d+$")


def module_group(parameter_name: str) -> str:
    """Top-level module a parameter belongs to: up to the first numeric part, else its first two parts.

    ``model.layers.3.mlp.up_proj.weight`` → ``model.layers.3``; ``model.embed_tokens.weight`` →
    ``model.embed_tokens``; ``lm_head.weight`` → ``lm_head``.
    """
    parts = parameter_name.split(".")[:-1] or parameter_name.split(".")
    for i, part in enumerate(parts):
        if _NUMERIC.match(part):
            return ".".join(parts[: i + 1])
    return ".".join(parts[:2])


def pre_clip_norms(
    grads: np.ndarray, params: np.ndarray, pre_clip: float | None
) -> tuple[np.ndarray, dict[str, float]]:
    """Module grad norms at the pre-clip total, and the step's ``grad_norm`` (pre-clip),
    ``grad_norm_clipped`` (as measured; only with ``pre_clip``) and ``param_norm`` = √(Σ_m ‖θ_m‖²).

    ``pre_clip`` None: the norms were read before clipping, and are kept as they are.
    """
    measured = float(np.sqrt(np.square(grads).sum()))
    if pre_clip is None:
        columns = {"grad_norm": measured}
    else:
        columns = {"grad_norm": pre_clip, "grad_norm_clipped": measured}
        if measured > 0:
            grads = grads * (pre_clip / measured)
    columns["param_norm"] = float(np.sqrt(np.square(params).sum()))
    return grads, columns


class ModuleNormTracker:
    """The named parameter groups of one model (groups without parameters are left out)."""

    def __init__(self, groups: Mapping[str, Sequence[nn.Parameter]] | None = None) -> None:
        groups = groups or {}
        self.names = [name for name, params in groups.items() if params]
        self.params = [list(groups[name]) for name in self.names]
        self._index: dict[torch.device, Tensor] = {}  # the group of each parameter, per device

    @classmethod
    def of(cls, model: nn.Module, modules: Mapping[str, nn.Module] | None = None) -> ModuleNormTracker:
        """``model``'s trainable parameters by ``module_group``, or by the given ``modules``."""
        groups: dict[str, list[nn.Parameter]] = {}
        if modules is None:
            for name, param in model.named_parameters():
                if param.requires_grad:
                    groups.setdefault(module_group(name), []).append(param)
        else:
            for name, module in modules.items():
                groups[name] = [p for p in module.parameters() if p.requires_grad]
        return cls(groups)

    def __len__(self) -> int:
        return len(self.names)

    def measure(self) -> tuple[Tensor, Tensor]:
        """Each group's ``(grad norms (M,), param norms (M,))`` in float32, on the parameters' device."""
        device = self.params[0][0].device
        if device not in self._index:  # once per device (a model moved after ``watch`` gets a new one)
            self._index[device] = group_index(self.params, device)
        return module_norms(self.params, self._index[device])

    def by_name(self, values: np.ndarray) -> dict[str, float]:
        """One value per group, by group name."""
        return dict(zip(self.names, values.tolist(), strict=True))
