"""The trainers' metric name tables moved to ``sorl_monitor.names``; this path keeps working for older imports."""

from sorl_monitor.names import *  # noqa: F403
