"""Post-mortem of one run: collapse label, alert timeline, lead time, and for a collapse its root cause and remedy.

    verdict = postmortem(open_runs("runs/"), "my-run")
    verdict.status, verdict.collapse_step, verdict.lead_time, verdict.root_cause, verdict.remedy

- ``config``: ``PostmortemConfig`` (the label's and the root cause's settings) and ``load_configs``, which reads
  them with the detectors' ``DetectorConfig`` from one TOML file and ``--set name=value`` overrides;
- ``label``: the collapse label (``COLLAPSE_SQL``): where the reward collapsed, where its fall started, how the
  log ends;
- ``alert_summary``: the detectors' firings per detector, and the streak of them that runs into the fall;
- ``evidence``: step and turn numbers over the window before the fall, the run's early levels, its inputs;
- ``causes``: each root cause's meaning and remedy, and ``attribute``, the rules that pick one;
- ``verdict``: ``Verdict``, what the CLI, the report and the dashboard show;
- ``judge``: ``postmortem()``, which puts them together.

The label, the statuses, the lead time and the root-cause rules are described once, in docs/detectors.md
("Collapse label, verdict, root cause"); each threshold is a field of ``PostmortemConfig``.
"""

from __future__ import annotations

from sorl_monitor.diagnose.postmortem.causes import CAUSES
from sorl_monitor.diagnose.postmortem.config import PostmortemConfig, load_configs
from sorl_monitor.diagnose.postmortem.judge import postmortem
from sorl_monitor.diagnose.postmortem.label import label_collapse
from sorl_monitor.diagnose.postmortem.verdict import STATUSES, Verdict

__all__ = [
    "CAUSES",
    "STATUSES",
    "PostmortemConfig",
    "Verdict",
    "label_collapse",
    "load_configs",
    "postmortem",
]
