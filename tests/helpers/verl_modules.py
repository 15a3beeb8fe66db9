"""verl's loss registry and ``Tracking`` for tests where verl is not installed.

``register_policy_loss``/``get_policy_loss_fn`` are copied from verl/trainer/ppo/core_algos.py and
``Tracking``'s constructor signature, ``logger`` dict and ``log`` from verl/utils/tracking.py
(volcengine/verl @ b178a3cd); backends other than the ones added to ``logger`` are left out.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

from tests.helpers.verl_reference import compute_policy_loss_vanilla


def _core_algos() -> types.ModuleType:
    module = types.ModuleType("verl.trainer.ppo.core_algos")
    registry: dict = {}

    def register_policy_loss(name):
        def decorator(func):
            registry[name] = func
            return func

        return decorator

    def get_policy_loss_fn(name):
        if name not in registry:
            raise ValueError(f"Unsupported loss mode: {name}. Supported modes are: {list(registry.keys())}")
        return registry[name]

    module.POLICY_LOSS_REGISTRY = registry
    module.register_policy_loss = register_policy_loss
    module.get_policy_loss_fn = get_policy_loss_fn
    register_policy_loss("vanilla")(compute_policy_loss_vanilla)
    return module


def _tracking() -> types.ModuleType:
    module = types.ModuleType("verl.utils.tracking")

    class Tracking:
        def __init__(self, project_name, experiment_name, default_backend="console", config=None):
            self.logger = {}

        def log(self, data, step, backend=None):
            for default_backend, logger_instance in self.logger.items():
                if backend is None or default_backend in backend:
                    logger_instance.log(data=data, step=step)

        def finish(self, exit_code=0):
            """Like verl 0.9's: it finishes only the backends it knows by name, so not a "sorl" one."""

    module.Tracking = Tracking
    return module


def install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import verl…`` give the real verl if installed, else these stand-ins (undone after the test)."""
    if importlib.util.find_spec("verl") is None:
        modules = {
            "verl": types.ModuleType("verl"),
            "verl.trainer": types.ModuleType("verl.trainer"),
            "verl.trainer.ppo": types.ModuleType("verl.trainer.ppo"),
            "verl.trainer.ppo.core_algos": _core_algos(),
            "verl.utils": types.ModuleType("verl.utils"),
            "verl.utils.tracking": _tracking(),
        }
        for name, module in modules.items():
            monkeypatch.setitem(sys.modules, name, module)
    tracking = sys.modules.get("verl.utils.tracking") or importlib.import_module("verl.utils.tracking")
    for name in ("__init__", "finish"):  # restored after the test
        monkeypatch.setattr(tracking.Tracking, name, getattr(tracking.Tracking, name))
