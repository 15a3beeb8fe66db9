"""Every knob of the bundled trainer in one dataclass (TOML-loadable), checked before training starts."""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sorl_monitor.diagnose.detectors.config import DetectorConfig
from sorl_monitor.diagnose.detectors.config import config_from_mapping as detector_config
from sorl_monitor.remedy.ctn import CTN_DEFAULTS, coef_max_for
from sorl_monitor.settings import coerce, field_kinds, parse_assignments
from sorl_monitor.trainer.env import TaskConfig
from sorl_monitor.trainer.policy import PolicyConfig

CTN_MODES = ("off", "on", "auto")
CTN_ANCHORS = ("behaviour", "proximal")
CTN_CLIP_LEVELS = ("surrogate", "token", "proximal")
LOG_TURNS = ("all", "first", "none")


@dataclass
class TrainConfig:
    """The bundled trainer's configuration. Defaults: the off-policy setting in which token PPO collapses."""

    algo: str = "ppo"
    """ppo | turn_ppo | s_ppo | so_ppo (= st_ppo) | grpo | so_grpo"""
    ctn: str | None = None
    """off | on | auto; default: on for s_ppo / so_ppo / so_grpo, off otherwise."""
    ctn_coef: float = CTN_DEFAULTS.ctn_coef
    """λ of CTN: loss += λ · clip_fraction · KL_k3 (the starting and lowest λ when it adapts); default 32."""
    ctn_target_clip: float | None = CTN_DEFAULTS.ctn_target_clip
    """Adaptive λ: hold the clip fraction CTN multiplies near this target (λ doubles above 1.5× it, halves
    below it / 1.5, between ``ctn_coef`` and ``ctn_coef_max``, once per rollout batch); None: fixed λ."""
    ctn_coef_max: float | None = CTN_DEFAULTS.ctn_coef_max
    """Adaptive λ's upper bound; default (None): 128 for the algorithms with a critic, 32 for GRPO and SO-GRPO
    (``remedy.ctn.CTN_COEF_MAX``; ``ctn_coef`` where that is larger)."""
    ctn_raise_unclipped: bool = False
    """Adaptive λ: double it only when the batch's CTN updates had a mean gradient norm (before clipping) at
    most ``max_grad_norm``: once updates are clipped, a larger λ only trades policy gradient for CTN's pull."""
    ctn_clip_level: str = "surrogate"
    """Whose clip fraction CTN multiplies: the surrogate's ratio (token, or turn w̄_k) | token (r_t always) |
    proximal (the token ratio ``π_θ/π_prox`` to the learner as this batch's updates began: only the drift this
    batch's reuse made, not the rollouts' staleness; pair it with ``ctn_anchor = "proximal"``)."""
    ctn_kl_cap: float | None = CTN_DEFAULTS.ctn_kl_cap
    """Bound CTN's k3 gradient: beyond ``r = c`` (and below ``1/c``) the KL continues linearly in ``log r``;
    None: plain k3 (gradient ``r − 1``, unbounded for stale ratios)."""
    ctn_quiet_updates: int = CTN_DEFAULTS.ctn_quiet_updates
    """auto: updates without a tripped detector before CTN goes off again; default 1024 (32 rollout
    iterations at 8 × 4 reuse). The detectors judge rises over a run's own quiet level, so they go quiet once
    a rise settles even though the drift remains (how 1024 was chosen: docs/results.md)."""
    ctn_auto_start: str = CTN_DEFAULTS.ctn_auto_start
    """auto: whether CTN is on from the first update (on, the default: armed, then off after
    ``ctn_quiet_updates`` quiet updates and on again at a warning) or waits for the detectors' first warning
    (off). On removes the staleness echo of a first batch without CTN (docs/trainer.md)."""
    ctn_guard_every: int | None = None
    """auto: updates between the guard's looks at the detectors (4: once per epoch, so CTN can switch within
    a rollout batch); None, the default: once per rollout batch."""
    ctn_anchor: str = "behaviour"
    """What CTN's KL pulls back to: behaviour (π_old, the rollout's policy; the default) | proximal (the
    learner when the batch's updates began; differs from π_old only with stale rollouts)."""
    seed: int = 0
    iterations: int = 100
    """Rollout iterations; each makes ``epochs × minibatches`` optimizer updates (monitor steps)."""
    episodes: int = 128
    group_size: int = 8
    """Episodes per question (GRPO groups; the other algorithms see the same batches)."""
    epochs: int = 8
    minibatches: int = 4
    staleness: int = 4
    """The behaviour policy is this many iterations older than the learner (stale rollouts)."""
    lr: float = 6e-4
    warmup_iterations: int = 0
    """Raise the learning rate linearly from ``lr / warmup_iterations`` to ``lr`` over the first iterations."""
    anneal_lr: bool = True
    """Decay the learning rate linearly from ``lr`` to 0 over the iterations (CleanRL's ``anneal_lr``; the
    Hugging Face Trainer's default schedule, which TRL inherits; verl's default is constant); default on."""
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    dual_clip: float | None = 3.0
    """Dual-clip bound c on negative advantages (verl's ``clip_ratio_c`` and its default); None: off (TRL's
    and OpenRLHF's default); default 3."""
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    kl_ref_coef: float = 0.0
    max_grad_norm: float = 1.0
    gamma: float = 1.0
    gae_lambda: float = 1.0
    whiten: bool = True
    turn_ratio: str = "geomean"
    """geomean: the geometric form w̄_k = exp(mean_t log r_t) | mean: the arithmetic form mean_t r_t, the one the
    monitor logs (both: docs/schema.md, "The turn ratio"). With the mean, one outlier token lifts its whole
    turn's ratio; the geometric mean damps it. Default geomean (why: docs/trainer.md)."""
    temperature: float = 1.0
    warmstart_steps: int = 300
    warmstart_error_rate: float = 0.4
    warmstart_lr: float = 3e-3
    warmstart_stuck_nll: float | None = 0.5
    """A warm start whose demonstrations' cross-entropy (mean of its last 20 batches) is still above this at
    ``warmstart_steps`` has not learnt them: it goes on (at most 3×) until that mean is at most
    ``warmstart_target_nll``; None: exactly ``warmstart_steps``. Default 0.5: a slow seed sits on a plateau
    near 1.0 nats before it falls to the floor (≈ 0.25); docs/trainer.md."""
    warmstart_target_nll: float = 0.3
    warmstart_cache: str | None = "~/.cache/sorl-monitor"
    """Folder where warm-started policies are kept (keyed by every setting that shapes them); None: no cache."""
    threads: int = 1
    log_dir: str = "runs"
    run_name: str | None = None
    log_turns: str = "all"
    """all | first (the first update of each iteration: small logs) | none"""
    task: TaskConfig = field(default_factory=TaskConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    detectors: DetectorConfig = field(default_factory=DetectorConfig)
    """The detector settings the CTN guard (``ctn=auto``) uses; TOML ``[detectors]``, ``--set detectors.x=…``."""

    @property
    def ctn_mode(self) -> str:
        from sorl_monitor.trainer.algorithms import get_algorithm

        return self.ctn if self.ctn is not None else get_algorithm(self.algo).default_ctn

    @property
    def coef_max(self) -> float:
        """``ctn_coef_max``, or where it is None the default bound of the algorithm's advantage."""
        from sorl_monitor.trainer.algorithms import get_algorithm

        critic = get_algorithm(self.algo).critic
        return coef_max_for(self.ctn_coef_max, "critic" if critic else "group", self.ctn_coef)

    def check(self) -> TrainConfig:
        """Raise ``ValueError`` naming the first bad knob; return self."""
        from sorl_monitor.trainer.algorithms import get_algorithm

        get_algorithm(self.algo)
        if self.ctn is not None and self.ctn not in CTN_MODES:
            raise ValueError(f"ctn must be one of {', '.join(CTN_MODES)}, not {self.ctn!r}")
        if self.ctn_auto_start not in ("on", "off"):
            raise ValueError(f"ctn_auto_start must be 'on' or 'off', not {self.ctn_auto_start!r}")
        if self.ctn_anchor not in CTN_ANCHORS:
            raise ValueError(f"ctn_anchor must be one of {', '.join(CTN_ANCHORS)}, not {self.ctn_anchor!r}")
        if self.turn_ratio not in ("mean", "geomean"):
            raise ValueError(f"turn_ratio must be 'mean' or 'geomean', not {self.turn_ratio!r}")
        if self.log_turns not in LOG_TURNS:
            raise ValueError(f"log_turns must be one of {', '.join(LOG_TURNS)}, not {self.log_turns!r}")
        positive = {"iterations": self.iterations, "episodes": self.episodes, "group_size": self.group_size,
                    "epochs": self.epochs, "minibatches": self.minibatches, "threads": self.threads}  # fmt: skip
        if self.ctn_guard_every is not None:
            positive["ctn_guard_every"] = self.ctn_guard_every
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be at least 1, not {value}")
        if self.episodes % self.group_size:
            raise ValueError(
                f"episodes ({self.episodes}) must be a multiple of group_size ({self.group_size})"
            )
        if self.episodes % self.minibatches:
            raise ValueError(
                f"episodes ({self.episodes}) must be a multiple of minibatches ({self.minibatches})"
            )
        non_negative = {"staleness": self.staleness, "ctn_coef": self.ctn_coef, "vf_coef": self.vf_coef,
                        "ent_coef": self.ent_coef, "kl_ref_coef": self.kl_ref_coef,
                        "warmstart_steps": self.warmstart_steps, "warmup_iterations": self.warmup_iterations}  # fmt: skip
        for name, value in non_negative.items():
            if not value >= 0 or math.isinf(value):
                raise ValueError(f"{name} must be a finite number ≥ 0, not {value}")
        for name, value in {"lr": self.lr, "warmstart_lr": self.warmstart_lr, "max_grad_norm": self.max_grad_norm,
                            "temperature": self.temperature}.items():  # fmt: skip
            if not 0 < value < math.inf:
                raise ValueError(f"{name} must be a finite number > 0, not {value}")
        for name, value in {"clip_eps": self.clip_eps, "clip_eps_high": self.clip_eps_high}.items():
            if value is not None and not 0 < value < 1:
                raise ValueError(f"{name} must be in (0, 1), not {value}")
        for name, value in {"gamma": self.gamma, "gae_lambda": self.gae_lambda,
                            "warmstart_error_rate": self.warmstart_error_rate}.items():  # fmt: skip
            if not 0 <= value <= 1:
                raise ValueError(f"{name} must be in [0, 1], not {value}")
        if self.dual_clip is not None and not 1 < self.dual_clip < math.inf:
            raise ValueError(f"dual_clip must be a finite number > 1, not {self.dual_clip}")
        for name, value in {"warmstart_stuck_nll": self.warmstart_stuck_nll,
                            "warmstart_target_nll": self.warmstart_target_nll}.items():  # fmt: skip
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"{name} must be a finite number > 0, not {value}")
        if self.ctn_kl_cap is not None and not 1 < self.ctn_kl_cap < math.inf:
            raise ValueError(f"ctn_kl_cap must be a finite number > 1, not {self.ctn_kl_cap}")
        if self.ctn_target_clip is not None and not 0 < self.ctn_target_clip < 1:
            raise ValueError(f"ctn_target_clip must be in (0, 1), not {self.ctn_target_clip}")
        if not self.coef_max >= self.ctn_coef:
            raise ValueError(
                f"ctn_coef_max ({self.coef_max:g}) must be at least ctn_coef ({self.ctn_coef:g})"
            )
        if self.ctn_clip_level not in CTN_CLIP_LEVELS:
            raise ValueError(
                f"ctn_clip_level must be one of {', '.join(CTN_CLIP_LEVELS)}, not {self.ctn_clip_level!r}"
            )
        if self.ctn_quiet_updates < 1:
            raise ValueError(f"ctn_quiet_updates must be at least 1, not {self.ctn_quiet_updates}")
        self.task.check()
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


TABLES = {"task": TaskConfig, "policy": PolicyConfig}
"""The nested tables of a ``TrainConfig`` besides ``[detectors]``."""


def _typed(cls: type, values: dict[str, Any], where: str) -> dict[str, Any]:
    """``values`` checked against ``cls``'s fields and converted to their types (TOML values or ``--set`` text)."""
    kinds = field_kinds(cls)
    unknown = sorted(set(values) - set(kinds))
    if unknown:
        raise ValueError(f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} in {where}; "
                         f"known: {', '.join(kinds)}")  # fmt: skip
    return {name: coerce(f"setting in {where}:", name, kinds[name], raw) for name, raw in values.items()}


def config_from_mapping(values: dict[str, Any], where: str = "the config") -> TrainConfig:
    """A ``TrainConfig`` from a (TOML) mapping with optional ``[task]``, ``[policy]`` and ``[detectors]`` tables."""
    values = dict(values)
    tables = {
        name: _typed(cls, dict(values.pop(name, {}) or {}), f"[{name}] of {where}")
        for name, cls in TABLES.items()
    }
    detectors = detector_config(dict(values.pop("detectors", {}) or {}))
    top = _typed(TrainConfig, values, where)
    return TrainConfig(**top, task=TaskConfig(**tables["task"]), policy=PolicyConfig(**tables["policy"]),
                       detectors=detectors)  # fmt: skip


def with_settings(cfg: TrainConfig, assignments: Iterable[str]) -> TrainConfig:
    """``cfg`` with ``--set name=value`` applied (``task.x``, ``policy.x``, ``detectors.x`` for the tables)."""
    values = {**dataclasses.asdict(cfg), "detectors": {}}
    for name, raw in parse_assignments(assignments).items():
        table, _, key = name.rpartition(".")
        if table and table not in (*TABLES, "detectors"):
            raise ValueError(
                f"unknown settings table {table!r} in --set {name}; known: task, policy, detectors"
            )
        (values[table] if table else values)[key] = raw
    detector_values = values.pop("detectors")
    result = config_from_mapping(values, "--set")
    return dataclasses.replace(result, detectors=detector_config(detector_values, cfg.detectors))


def load_config(path: str | Path) -> TrainConfig:
    """Read a TOML file of ``TrainConfig`` fields; ``ValueError`` with a one-line reason when it is bad."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file not found: {path}")
    try:
        values = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid TOML: {error}") from None
    return config_from_mapping(values, str(path))
