"""Warnings that never raise into training: ``warn``, and ``WarnOnce`` for a warning per cause.

Under a filter that turns warnings into exceptions (``python -W error``) the message goes to stderr
instead, as ``<Category>: <message>``. Light: no torch, so settings readers and the CLI use it too.
"""

from __future__ import annotations

import contextlib
import sys
import warnings


class MonitorWarning(RuntimeWarning):
    """Monitoring lost data or failed; training goes on."""


def warn(message: str, stacklevel: int = 1, category: type[Warning] = MonitorWarning) -> None:
    """Issue ``category`` (default ``MonitorWarning``) without ever raising into the caller."""
    try:
        warnings.warn(message, category, stacklevel=stacklevel + 1)
    except Exception:  # noqa: BLE001 - e.g. python -W error: the warning became an exception
        with contextlib.suppress(Exception):
            print(f"{category.__name__}: {message}", file=sys.stderr)


class WarnOnce:
    """``warn`` at most once per ``key`` (one per owner: a monitor, a callback, a loss tap, a notifier)."""

    def __init__(self, category: type[Warning] = MonitorWarning) -> None:
        self.category = category
        self.keys: set[str] = set()

    def __call__(self, key: str, message: str, stacklevel: int = 1) -> None:
        if key not in self.keys:
            self.keys.add(key)
            warn(message, stacklevel + 1, self.category)
