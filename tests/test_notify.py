"""Alerts out: webhook posts from ``Monitor(notify=…)``, ``Notifier`` and ``sorl watch --notify``, against a
local HTTP server on 127.0.0.1 that answers a bounded number of requests and stops by itself."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import torch
from typer.testing import CliRunner

from sorl_monitor import Monitor, WriterConfig
from sorl_monitor.cli.main import app
from sorl_monitor.notify import Notifier, NotifyWarning, OnsetFilter


class Hook:
    """A webhook on 127.0.0.1: records up to ``limit`` posts (answering ``status`` once ``hold``, if given,
    is set: until then a post gets no answer), then stops; it also stops after ``lifetime_s`` whatever
    happens."""

    def __init__(
        self,
        limit: int = 10,
        status: int = 200,
        hold: threading.Event | None = None,
        lifetime_s: float = 10.0,
    ):
        self.posts: list[tuple[float, dict]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.posts.append((time.monotonic(), json.loads(body)))
                if hold is not None:
                    hold.wait(lifetime_s)
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.server.timeout = 0.2
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        deadline = time.monotonic() + lifetime_s

        def serve() -> None:
            while len(self.posts) < limit and time.monotonic() < deadline:
                self.server.handle_request()
            self.server.server_close()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def texts(self) -> list[str]:
        return [body["text"] for _, body in self.posts]


def test_a_monitor_posts_alert_onsets_guard_actions_and_a_failed_end(tmp_path):
    hook = Hook()
    mon = Monitor(tmp_path, "run1", notify=Notifier(hook.url, min_interval_s=0))
    for step in range(3):  # one streak: only its first alert is posted
        mon.log_alert("clip_rise", "warning", "clip fraction rising", step=step)
    mon.log_alert("clip_rise", "critical", "clip fraction far above its quiet level", step=3)  # escalation
    mon.log_alert("clip_rise", "warning", "rising again", step=20)  # a new streak
    mon.log_alert("entropy_drop", "info", "a note", step=20)  # info: not posted
    mon.log_alert("ctn_on", "info", "CTN on: clip_rise (warning)", step=21, kind="action")
    mon.close("failed")
    assert hook.texts() == [
        "[sorl] run1 step 0: WARNING clip_rise: clip fraction rising",
        "[sorl] run1 step 3: CRITICAL clip_rise: clip fraction far above its quiet level",
        "[sorl] run1 step 20: WARNING clip_rise: rising again",
        "[sorl] run1 step 21: ctn_on: CTN on: clip_rise (warning)",
        "[sorl] run1 ended failed at step -1",
    ]
    assert all(body["content"] == body["text"] for _, body in hook.posts)  # Discord reads content


def test_only_rank_0_posts(tmp_path):
    assert Monitor(tmp_path, "r1", rank=1, world_size=2, notify="http://127.0.0.1:9/hook").notifier is None


def test_posts_are_rate_limited():
    hook = Hook()
    notifier = Notifier(hook.url, min_interval_s=0.5)
    for i in range(3):
        notifier.send(f"event {i}")
    notifier.close()
    times = [t for t, _ in hook.posts]
    assert hook.texts() == ["event 0", "event 1", "event 2"]
    # the webhook's clock: each post's arrival may lag by a busy machine's scheduling (0.2 s allowed); posts
    # that are not rate limited arrive back to back, milliseconds apart
    assert min(b - a for a, b in zip(times, times[1:], strict=False)) >= 0.5 - 0.2


def test_a_slow_webhook_never_blocks_the_caller_and_a_full_queue_drops_events():
    answer = threading.Event()  # the webhook answers no post until the test sets it
    hook = Hook(hold=answer, lifetime_s=60)
    notifier = Notifier(hook.url, min_interval_s=0, max_queue=2, timeout_s=60)
    accepted: list[bool] = []
    sender = threading.Thread(
        target=lambda: accepted.extend(notifier.send(f"event {i}") for i in range(50)), daemon=True
    )
    try:
        sender.start()
        sender.join(timeout=30)
        # all 50 sends returned while the webhook held its first post unanswered: a send that waited for a
        # post would wait until the test lets the webhook answer (a yes or no, not a speed)
        assert not sender.is_alive() and len(accepted) == 50, len(accepted)
        assert len(hook.posts) <= 1 and notifier.sent == 0
    finally:
        answer.set()
    notifier.close()
    assert sum(accepted) == len(hook.posts) == notifier.sent and notifier.dropped == 50 - sum(accepted) > 0


def test_failed_posts_are_counted_and_warned_about_once():
    hook = Hook(status=500)
    notifier = Notifier(hook.url, min_interval_s=0)
    with pytest.warns(NotifyWarning, match="webhook post failed") as warned:
        for i in range(3):
            notifier.send(f"event {i}")
        notifier.close()
    assert notifier.errors == 3 and notifier.sent == 0 and len(warned) == 1


def test_close_waits_at_most_the_timeout_for_a_webhook_that_never_answers():
    answer = threading.Event()  # set only at the end: the webhook never answers while the notifier waits
    hook = Hook(hold=answer, lifetime_s=30)
    notifier = Notifier(hook.url, timeout_s=0.3)  # close's own deadline: 2 s
    try:
        notifier.send("event")
        time.sleep(0.1)
        with pytest.warns(NotifyWarning, match="timed out"):
            notifier.close()
    finally:
        answer.set()
    # the post failed by its 0.3 s timeout and close() returned as the thread ended: a post that ignored its
    # timeout would still be in flight at close's 2 s deadline and counted dropped, not failed
    assert notifier.errors == 1 and notifier.dropped == 0 and len(hook.posts) == 1


def test_a_url_that_is_not_http_is_refused():
    with pytest.raises(ValueError, match="http"):
        Notifier("file:///etc/passwd")


def test_onsets_are_streak_starts_and_escalations():
    onsets = OnsetFilter(gap_steps=2)
    fired = [(0, "warning"), (1, "warning"), (2, "critical"), (3, "critical"), (9, "warning")]
    assert [onsets.is_onset("kl_rise", step, severity) for step, severity in fired] == [
        True,
        False,
        True,
        False,
        True,
    ]


def test_sorl_watch_posts_the_events_it_prints(tmp_path):
    with Monitor(tmp_path, "watched", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        for step in range(3):
            logp = -torch.rand(2, 8)
            mon.log_update(logp=logp, old_logp=logp, mask=torch.ones(2, 8), step=step)
        mon.log_alert("ctn_on", "info", "CTN on: kl_rise (warning)", step=2, kind="action")
    hook = Hook()
    result = CliRunner().invoke(
        app,
        [
            "watch",
            str(tmp_path / "watched"),
            "--interval",
            "0.05",
            "--max-seconds",
            "5",
            "--notify",
            hook.url,
        ],
    )
    assert result.exit_code == 0, result.output
    assert hook.texts() == ["[sorl] watched step 2: ctn_on: CTN on: kl_rise (warning)"]


def test_sorl_watch_refuses_a_url_that_is_not_http(tmp_path):
    result = CliRunner().invoke(app, ["watch", str(tmp_path), "--notify", "ftp://example.invalid/x"])
    assert result.exit_code == 2 and "http" in result.output


def test_sorl_watch_posts_a_collapse_verdict(tmp_path):
    with Monitor(tmp_path, "diverged", writer=WriterConfig(flush_interval_s=0.05)) as mon:
        for step in range(40):
            mon.log_scalars(
                step, {"reward_mean": 1.0, "loss": 0.5 if step < 32 else float("nan")}, names=None
            )
    hook = Hook()
    result = CliRunner().invoke(
        app, ["watch", str(tmp_path / "diverged"), "--max-seconds", "5", "--notify", hook.url]
    )
    assert result.exit_code == 0, result.output
    assert "[sorl] diverged: COLLAPSE at step 32 (nonfinite_loss)" in hook.texts()
