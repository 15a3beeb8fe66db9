"""Attach ``Monitor`` to trainers people already run (docs/attach.md); import the module you need.

- ``hf``: ``SorlCallback`` for ``transformers.Trainer`` and every TRL trainer.
- ``trl``: ``MonitoredGRPOTrainer`` / ``TokenTapMixin``, token and turn metrics from TRL's GRPO loss.
- ``verl``: ``MonitoredPolicyLoss`` / ``register_monitored_loss``, ``SorlTracking`` /
  ``install_tracking_backend``, ``ingest_verl_jsonl``.
- ``trackers``: adapters for the logging hooks of OpenRLHF, ROLL, SkyRL and prime-rl.
"""
