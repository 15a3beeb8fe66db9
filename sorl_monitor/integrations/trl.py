"""Token- and turn-level metrics from TRL's ``GRPOTrainer``: a mixin that taps its loss inputs.

TRL computes the per-token ratios inside ``GRPOTrainer._compute_loss`` and logs only their summaries,
so a callback never sees them. ``TokenTapMixin`` overrides two methods and copies no loss code:

- ``_get_per_token_logps_and_entropies``: while the loss runs, keep what it returns (``per_token_logps``
  and ``entropies`` of the current policy);
- ``_compute_loss``: run TRL's loss unchanged, then hand that micro-batch's ``per_token_logps``,
  ``old_per_token_logps`` (TRL's ``per_token_logps.detach()`` when it skipped them, as on-policy),
  ``ref_per_token_logps``, ``advantages`` and ``completion_mask × tool_mask`` to ``SorlCallback``,
  which logs one row per optimizer update. Turns are the contiguous runs of 1 in that mask: in TRL's
  multi-turn tool loop, tool outputs are 0 in ``tool_mask``, so each model turn is one ``turns`` row.

    mon = Monitor("runs", algorithm="grpo")
    trainer = MonitoredGRPOTrainer(model=path, reward_funcs=reward, args=config, train_dataset=data, monitor=mon)
    trainer.train()

Keys of each update (TRL's micro-step counter ``_step`` at its first micro-batch; ``g`` = gradient
accumulation steps, ``s`` = ``steps_per_generation``, ``μ`` = ``num_iterations``):
``iteration = _step // (s·μ)`` (generation batch), ``ppo_epoch = (_step // s) % μ`` (reuse pass),
``minibatch = (_step % s) // g``, ``policy_lag = (_step % (s·μ)) // g`` (0 when on-policy).
"""

from __future__ import annotations

from typing import Any

from trl import GRPOTrainer

from sorl_monitor.integrations.batches import TokenBatch
from sorl_monitor.integrations.hf import SorlCallback
from sorl_monitor.monitor import Monitor


def update_keys(
    micro_step: int, steps_per_generation: int, num_iterations: int, accumulation: int
) -> dict[str, int]:
    """``iteration, ppo_epoch, minibatch, policy_lag`` of the update holding TRL micro-step ``micro_step``."""
    generate_every = steps_per_generation * num_iterations
    return {
        "iteration": micro_step // generate_every,
        "ppo_epoch": (micro_step // steps_per_generation) % num_iterations,
        "minibatch": (micro_step % steps_per_generation) // accumulation,
        "policy_lag": (micro_step % generate_every) // accumulation,
    }


def tapped_batch(
    inputs: dict[str, Any], per_token_logps: Any, entropies: Any, keys: dict[str, int]
) -> TokenBatch:
    """The micro-batch ``_compute_loss`` trained on, from its ``inputs`` and the log-probs it computed."""
    mask = inputs["completion_mask"]
    if "tool_mask" in inputs:
        mask = mask * inputs["tool_mask"]
    old = inputs.get("old_per_token_logps")
    on_policy = old is None
    return TokenBatch.detached(
        logp=per_token_logps,
        old_logp=per_token_logps if on_policy else old,
        mask=mask,
        advantages=inputs["advantages"],
        entropy=entropies,
        ref_logp=inputs.get("ref_per_token_logps"),
        iteration=keys["iteration"],
        ppo_epoch=keys["ppo_epoch"],
        minibatch=keys["minibatch"],
        policy_lag=0 if on_policy else keys["policy_lag"],
    )


class TokenTapMixin:
    """Mix into a ``GRPOTrainer`` (subclass) before it: ``class T(TokenTapMixin, GRPOTrainer)``.

    Pass ``monitor=`` to the constructor, or a ``SorlCallback`` in ``callbacks=``; the tap feeds that
    callback. A failing tap warns once and training goes on.
    """

    _sorl_capture: dict[str, Any] | None = None

    def __init__(self, *args: Any, monitor: Monitor | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        callbacks = self.callback_handler.callbacks  # type: ignore[attr-defined]
        found = [c for c in callbacks if isinstance(c, SorlCallback)]
        if found:
            self.sorl_callback = found[0]
            if monitor is not None:
                self.sorl_callback.monitor = monitor
        else:
            self.sorl_callback = SorlCallback(monitor)
            self.add_callback(self.sorl_callback)  # type: ignore[attr-defined]

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
        output = super()._get_per_token_logps_and_entropies(*args, **kwargs)  # type: ignore[misc]
        if self._sorl_capture is not None and not self._sorl_capture:
            self._sorl_capture["logps"], self._sorl_capture["entropies"] = output[0], output[1]
        return output

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        capture: dict[str, Any] | None = {} if self.model.training else None  # type: ignore[attr-defined]
        self._sorl_capture = capture
        try:
            loss = super()._compute_loss(model, inputs)  # type: ignore[misc]
        finally:
            self._sorl_capture = None
        if capture:
            self._tap(inputs, capture)
        return loss

    def _tap(self, inputs: dict[str, Any], capture: dict[str, Any]) -> None:
        try:
            keys = update_keys(
                self._step,  # type: ignore[attr-defined]
                self.args.steps_per_generation,  # type: ignore[attr-defined]
                self.num_iterations,  # type: ignore[attr-defined]
                self.args.gradient_accumulation_steps,  # type: ignore[attr-defined]
            )
            batch = tapped_batch(inputs, capture["logps"], capture["entropies"], keys)
            self.sorl_callback.add_update(self.state.global_step + 1, batch)  # type: ignore[attr-defined]
        except Exception as error:  # noqa: BLE001 - the tap must never break training
            self.sorl_callback.warn_once("tap", f"GRPO token tap failed ({type(error).__name__}: {error})")


class MonitoredGRPOTrainer(TokenTapMixin, GRPOTrainer):
    """TRL's ``GRPOTrainer`` with the token tap: takes ``monitor=`` besides GRPOTrainer's arguments."""
