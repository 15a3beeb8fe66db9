"""Alerts out: post alert onsets, CTN switches and collapse verdicts to a chat webhook.

    mon = Monitor("runs", notify="https://hooks.slack.com/services/…")   # or a Discord webhook URL
    sorl watch runs/exp1 --notify https://discord.com/api/webhooks/…

Each event is one HTTP POST of ``{"text": …, "content": …}``: Slack's incoming webhooks read ``text``,
Discord's read ``content``, and each ignores the other. Posting never blocks or fails training: events
go into a bounded queue (a full queue drops the event, counted in ``dropped``) that one background
thread sends, at most one post per ``min_interval_s``, each with a ``timeout_s``; a failed post is
counted in ``errors`` and warned about once. ``close()`` (also run on SIGTERM by ``Monitor``) sends what
is queued within one total deadline, ``close_timeout_s`` (2 s): what is not sent by then is counted in
``dropped``, so a webhook that never answers holds the process 2 s at most, not ``timeout_s`` per alert.
The URL is checked when the notifier is made (``check_url``).
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from sorl_monitor.settings import check_setting
from sorl_monitor.warn import WarnOnce

ALERT_SEVERITIES = ("warning", "critical")
"""Alert severities that are posted (``info`` alerts are not)."""


class NotifyWarning(RuntimeWarning):
    """A webhook post failed; training goes on."""


def message_payload(text: str) -> bytes:
    """The JSON body of one post: Slack's ``text`` and Discord's ``content`` (Discord allows 2000 characters)."""
    return json.dumps({"text": text, "content": text[:2000]}).encode()


def alert_text(run_id: str, alert: Mapping[str, Any]) -> str:
    """One line for an ``alerts`` row: a detector firing or a guard action (CTN on/off, stop)."""
    step = alert.get("step")
    if alert.get("kind") == "action":
        return f"[sorl] {run_id} step {step}: {alert.get('detector')}: {alert.get('message')}"
    return (
        f"[sorl] {run_id} step {step}: {str(alert.get('severity')).upper()} {alert.get('detector')}: "
        f"{alert.get('message')}"
    )


def collapse_text(run_id: str, step: int | None, reason: str) -> str:
    """One line for a collapse verdict."""
    return f"[sorl] {run_id}: COLLAPSE at step {step} ({reason})"


class OnsetFilter:
    """What an alert *onset* is: the first alert of each streak of a detector, and each escalation to critical.

    Alerts are fed in step order; a streak ends when the detector has not fired for more than ``gap_steps``
    steps. ``timeline.alert_onsets`` feeds it logged-block positions instead of steps, with a gap of one.
    """

    def __init__(self, gap_steps: int = 8) -> None:
        self.gap_steps = gap_steps
        self._last: dict[str, tuple[int, str]] = {}

    def is_onset(self, detector: str, step: int, severity: str) -> bool:
        """Whether this alert starts a streak of ``detector`` (or escalates it to critical); it joins the streak."""
        previous = self._last.get(detector)
        self._last[detector] = (step, severity)
        if previous is None or step - previous[0] > self.gap_steps:
            return True
        return severity == "critical" and previous[1] != "critical"


def check_url(url: object) -> str:
    """``url`` if it is an ``http``/``https`` URL with a host (scheme in any case); a one-line ``ValueError``
    otherwise (bytes, another scheme, no host, spaces or control characters)."""
    if not isinstance(url, str):
        raise ValueError(f"notify URL must be text (str), not {type(url).__name__}")
    shown = repr(url[:40]) + ("…" if len(url) > 40 else "")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ValueError(f"notify URL holds a space or a control character: {shown}")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError as error:
        raise ValueError(f"notify URL does not parse ({error}): {shown}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError(f"notify URL must be http:// or https:// with a host, not {shown}")
    return url


class Notifier:
    """Posts text events to one webhook URL from a background thread (see the module docstring).

    Args:
        url: an ``http://`` or ``https://`` webhook URL (Slack, Discord, or anything taking that JSON).
        min_interval_s: at least this long between two posts (rate limit).
        timeout_s: per post.
        max_queue: events waiting to be sent; more are dropped and counted.
        close_timeout_s: ``close()`` sends what is queued within this many seconds in all; the rest is dropped.
        gap_steps: an alert of a detector quiet for more than this many steps is a new onset.
    """

    def __init__(
        self,
        url: str,
        *,
        min_interval_s: float = 1.0,
        timeout_s: float = 5.0,
        max_queue: int = 100,
        gap_steps: int = 8,
        close_timeout_s: float = 2.0,
    ) -> None:
        self.url = check_url(url)
        check_setting("min_interval_s", min_interval_s, least=0)
        check_setting("timeout_s", timeout_s, above=0)
        check_setting("max_queue", max_queue, least=1, integer=True)
        check_setting("close_timeout_s", close_timeout_s, least=0)
        self.min_interval_s = min_interval_s
        self.timeout_s = timeout_s
        self.close_timeout_s = close_timeout_s
        self.sent = 0
        self.dropped = 0
        self.errors = 0
        self.onsets = OnsetFilter(gap_steps)
        self._queue: queue.Queue[str | None] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._deadline: float | None = None
        """Set by ``close()``: posts after it are not made, and the one in flight then is counted dropped."""
        self._abandoned = False
        self._accepted = 0
        self._rejected = 0
        self._warn_once = WarnOnce(NotifyWarning)

    def send(self, text: str) -> bool:
        """Queue ``text`` for posting; ``False`` (and counted in ``dropped``) if the queue is full or closed."""
        with self._lock:
            if self._closed:
                return False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sorl-notify", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait(text)
            with self._lock:
                self._accepted += 1
            return True
        except queue.Full:
            with self._lock:
                self._rejected += 1
                self.dropped += 1
            return False

    def alert(self, run_id: str, alert: Mapping[str, Any]) -> bool:
        """Queue an ``alerts`` row if it is a guard action or the onset of a warning or critical alert."""
        if alert.get("kind") != "action":
            severity = str(alert.get("severity"))
            if severity not in ALERT_SEVERITIES or not self.onsets.is_onset(
                str(alert.get("detector")), int(alert.get("step") or 0), severity
            ):
                return False
        return self.send(alert_text(run_id, alert))

    def close(self) -> None:
        """Send what is queued within ``close_timeout_s`` in all, then stop; what is left is counted in
        ``dropped`` (a post in flight at the deadline too: the thread, a daemon, is not waited for)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._deadline = time.monotonic() + self.close_timeout_s
            thread = self._thread
        if thread is None:
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=max(0.0, self._deadline - time.monotonic()))
        thread.join(max(0.0, self._deadline - time.monotonic()))
        with self._lock:
            if (
                thread.is_alive()
            ):  # past the deadline: whatever was accepted and not sent or failed is dropped
                self._abandoned = True
                self.dropped = self._rejected + self._accepted - self.sent - self.errors

    def _left_s(self) -> float:
        """Seconds to the close deadline (infinite before ``close()``)."""
        return float("inf") if self._deadline is None else self._deadline - time.monotonic()

    def _run(self) -> None:
        last_post = -float("inf")
        while (text := self._queue.get()) is not None:
            pause = last_post + self.min_interval_s - time.monotonic()
            if pause > 0:
                time.sleep(max(0.0, min(pause, self._left_s())))
            timeout = min(self.timeout_s, self._left_s())
            outcome = "dropped"
            if timeout > 0:
                last_post = time.monotonic()
                try:
                    self._post(text, timeout)
                    outcome = "sent"
                except Exception as error:  # noqa: BLE001 - a webhook must never stop training
                    outcome = f"{type(error).__name__}: {error}"
            with self._lock:
                if self._abandoned:  # close() counted this one
                    return
                if outcome == "sent":
                    self.sent += 1
                    continue
                if outcome == "dropped":
                    self.dropped += 1
                    continue
                self.errors += 1
            self._warn_once(
                "post", f"sorl-monitor: webhook post failed ({outcome}); later failures are counted"
            )

    def _post(self, text: str, timeout_s: float) -> None:
        request = urllib.request.Request(
            self.url,
            data=message_payload(text),
            headers={"Content-Type": "application/json", "User-Agent": "sorl-monitor"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read(1024)
