"""Shared pieces of the deferred-copy tests: an event that lands only when told (a stand-in, on the CPU,
for a CUDA event whose copy is still queued) and a synthetic multi-turn PPO update to log."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from sorl_monitor.write import transfer


@dataclass
class HeldEvent:
    """``query()`` is False until ``land()`` or ``synchronize()`` (what ``torch.cuda.Event`` answers)."""

    landed: bool = False
    waited: int = 0

    def query(self) -> bool:
        return self.landed

    def synchronize(self) -> None:
        self.waited += 1
        self.landed = True

    def land(self) -> None:
        self.landed = True


@dataclass
class HeldEvents:
    """Every event recorded since ``hold`` patched ``transfer._record_event``, oldest first."""

    events: list[HeldEvent] = field(default_factory=list)

    def record(self, _device: torch.device) -> HeldEvent:
        self.events.append(HeldEvent())
        return self.events[-1]


def hold(monkeypatch: Any) -> HeldEvents:
    """From now on every host copy of this process stays in flight until its event lands."""
    held = HeldEvents()
    monkeypatch.setattr(transfer, "_record_event", held.record)
    return held


def synthetic_update(generator: torch.Generator, model: torch.nn.Module) -> dict[str, Any]:
    """A synthetic update (random log-probs, 3 turns per row, per-sequence advantages, rewards and group
    ids); runs ``model``'s backward so the watched modules have gradients. Keyword arguments of log_update."""
    batch, length = 4, 12
    logp = -torch.rand(batch, length, generator=generator) * 3
    old_logp = logp + 0.3 * torch.randn(batch, length, generator=generator)
    mask = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1]] * batch)
    model.zero_grad(set_to_none=True)
    loss = model(torch.randn(8, 4, generator=generator)).pow(2).mean()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    return dict(
        logp=logp,
        old_logp=old_logp,
        mask=mask,
        advantages=torch.randn(batch, generator=generator),
        rewards=torch.rand(batch, generator=generator),
        group_ids=torch.tensor([0, 0, 1, 1]),
        ref_logp=logp + 0.1 * torch.randn(batch, length, generator=generator),
        sample_ids=torch.arange(batch) + 100,
        grad_norm=grad_norm,
        extra={"loss": loss.detach(), "ctn_active": True, "lr": 1e-3, "success": torch.tensor(0.5)},
    )


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
