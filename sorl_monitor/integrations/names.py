"""The trainers' metric name tables moved to ``sorl_monitor.metric_names``; this path keeps working for older imports."""

from sorl_monitor.metric_names import *  # noqa: F403
