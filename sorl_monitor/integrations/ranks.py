"""Multi-rank queries moved to ``sorl_monitor.read.ranks`` (the read side); this path keeps working for older imports."""

from sorl_monitor.read.ranks import *  # noqa: F403
