"""Logged work whose host copy may still be in flight, finished in the order it was logged.

``Monitor.log_update`` adds an update with its ``transfer.HostCopy`` and the function that turns the host
arrays into rows; anything logged behind it (``log_scalars``, ``log_alert``, …) is added with no copy, so
every table keeps the order of the calls. ``drain`` finishes entries from the oldest while their copies
have landed, and waits only when told to (``keep``: at most that many may stay in flight).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sorl_monitor.write.transfer import HostCopy

MAX_IN_FLIGHT = 8
"""Updates that may wait for their copy before the oldest one is waited for (a bound on memory, reached
only when the caller runs this many updates ahead of the device)."""


@dataclass
class _Entry:
    copy: HostCopy | None
    finish: Callable[[dict[str, np.ndarray]], None]
    started: bool = False


class InFlight:
    """A FIFO of entries; ``on_error`` gets what a ``finish`` raised (the entry is then dropped)."""

    def __init__(self, on_error: Callable[[Exception], None], limit: int = MAX_IN_FLIGHT) -> None:
        self._entries: collections.deque[_Entry] = collections.deque()
        self._on_error = on_error
        self._limit = limit

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, copy: HostCopy, finish: Callable[[dict[str, np.ndarray]], None]) -> None:
        """Queue an update; its ``finish(arrays)`` runs once its copy has landed and those before it ran."""
        self._entries.append(_Entry(copy, finish))
        if len(self._entries) > self._limit:
            self.drain(keep=self._limit)

    def then(self, submit: Callable[[], None]) -> None:
        """Run ``submit`` now if nothing is in flight, else after every entry queued so far."""
        if self._entries:
            self._entries.append(_Entry(None, lambda _arrays: submit()))
        else:
            submit()

    def drain(self, keep: int | None = None) -> None:
        """Finish entries in order while their copies have landed; with ``keep``, first wait for the oldest
        copies until at most ``keep`` entries are left."""
        while self._entries:
            head = self._entries[0]
            if head.copy is not None and not head.copy.done():
                if keep is None or len(self._entries) <= keep:
                    return
                head.copy.wait()
            # marked before it runs and removed after it: a SIGTERM handler that drains meanwhile (on this
            # thread) neither runs it twice nor loses the entries behind it
            if not head.started:
                head.started = True
                try:
                    head.finish({} if head.copy is None else head.copy.arrays())
                except Exception as error:  # noqa: BLE001 - counted by the owner, never raised into training
                    self._on_error(error)
            if self._entries and self._entries[0] is head:
                self._entries.popleft()
