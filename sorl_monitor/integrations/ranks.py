"""Multi-rank queries moved to ``sorl_monitor.ranks`` (the read side); this path keeps working for older imports."""

from sorl_monitor.ranks import *  # noqa: F403
