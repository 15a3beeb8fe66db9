"""A run's verdict in words, for its status line: status, collapse step, the critical alert that warned of it,
the root cause in plain words. No Streamlit here (tested without a page).

Statuses are rendered from their names (``not_judged`` → "not judged"), so a status the post-mortem adds
later shows without a change here; only the colour knows a few: red for ``ALARMING``, green for ``healthy``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sorl_monitor.diagnose.postmortem import Verdict

ALARMING = ("collapsing", "diverging", "collapsed")
"""Statuses that need a look first, most urgent first (the sidebar and the first page order runs by them)."""
CALM = ("healthy",)


def status_words(status: str) -> str:
    """``not_judged`` → ``not judged``."""
    return status.replace("_", " ").replace("-", " ").strip() or "unknown"


def colored_status(status: str) -> str:
    """The status in words, red when alarming, green when healthy, grey otherwise (Streamlit markdown)."""
    words = plain(status_words(status))
    if status in ALARMING:
        return f":red[**{words}**]"
    if status in CALM:
        return f":green[**{words}**]"
    return f":gray[**{words}**]"


def event_step(verdict: Verdict) -> tuple[str, int] | None:
    """The step the verdict is about and what happened there: collapse, else divergence (when the verdict
    carries one), else ``None``."""
    if verdict.collapse_step is not None:
        return "collapse", verdict.collapse_step
    for name in ("divergence_step", "diverge_step"):
        step = getattr(verdict, name, None)
        if isinstance(step, int):
            return "divergence", step
    return None


def warning_alert(onsets: Sequence[dict[str, Any]], event: int, block_steps: int) -> dict[str, Any] | None:
    """The first critical onset of the streak that ran into ``event`` (a streak still firing within a block of
    it); when none ran into it, the last critical onset before it. ``None``: no critical alert before it."""
    before = [o for o in onsets if o["severity"] == "critical" and o["step"] <= event]
    running = [o for o in before if o.get("last", o["step"]) + block_steps >= event]
    if running:
        return min(running, key=lambda o: o["step"])
    return max(before, key=lambda o: o["step"]) if before else None


def _streak_alert(verdict: Verdict) -> dict[str, Any] | None:
    """The alert the post-mortem counts a collapse's lead time from (``Verdict.warned_by``), at the collapse step
    minus the lead: the CLI and ``sorl demo`` tell the same story."""
    if verdict.warned_by is None or verdict.lead_time is None:
        return None
    return {**verdict.warned_by, "step": verdict.collapse_step - verdict.lead_time}


def verdict_line(verdict: Verdict, onsets: Sequence[dict[str, Any]], block_steps: int) -> str:
    """``status · collapsed at step C · first critical: detector at step S (N steps before; message) ·
    root cause: explanation`` (markdown); a healthy run says what its alerts were."""
    event = event_step(verdict)
    parts = [] if event is not None and verdict.status == "collapsed" else [colored_status(verdict.status)]
    if event is not None:
        what, step = event
        parts.append(f":red[**{'collapsed' if what == 'collapse' else 'diverged'} at step {step}**]")
        alert = warning_alert(onsets, step, block_steps) if what != "collapse" else _streak_alert(verdict)
        last = verdict.last_critical_before_fall if what == "collapse" else None
        if alert is None and last is not None:
            parts.append(
                f"no critical alert ran into it; the last before it: {last['detector']} at step {last['step']}"
                f" ({step - last['step']} steps before)"
            )
        elif alert is None:
            parts.append("no critical alert before it")
        else:
            lead = step - alert["step"]
            message = f"; {escape(alert['message'])}" if alert.get("message") else ""
            parts.append(
                f"first critical: {alert['detector']} at step {alert['step']} ({lead} steps before{message})"
            )
    if verdict.root_cause:
        parts.append(f"root cause: {escape(verdict.explanation or status_words(verdict.root_cause))}")
    elif event is None:
        critical = [o for o in onsets if o["severity"] == "critical"]
        parts.append(
            f"{len(critical)} critical alert streak{'s' if len(critical) != 1 else ''}, no collapse"
            if critical
            else "no critical alert"
        )
    return " · ".join(parts)


NAME_MARKUP = "\\`*_[]()<>#!|~$:{}"
"""Characters escaped in a name shown in markdown (``plain``): every one markdown or Streamlit reads as markup."""


def plain(text: str) -> str:
    """A name (run id, algorithm, status) shown as it is in Streamlit markdown, on one line: no link, colour,
    emphasis, LaTeX or line break from what it holds."""
    text = " ".join(str(text).split())
    return "".join("\\" + char if char in NAME_MARKUP else char for char in text)


def escape(text: str) -> str:
    """``text`` shown as it is in Streamlit markdown (no LaTeX from ``$``, no emphasis from ``*``)."""
    for char in ("\\", "$", "*", "`", "[", "]"):
        text = text.replace(char, "\\" + char)
    return text
