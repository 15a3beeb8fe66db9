"""Runs read as they are written, with their alerts, timelines and verdicts: what the dashboard, ``sorl watch``
and the HTML report draw from.

    live = LiveRuns("runs/")          # nothing read yet; a missing or empty folder is not an error
    live.refresh()                    # list part files again, read only the parts not read before
    live.run_states()                 # name, algorithm, status (live/finished/…), last step, collapse
    live.curves("run-a")              # step rows and timeline (alert onsets, CTN spans, collapse)
    live.turn_cells("run-a")          # turn-level IS ratio per (step, turn index), reduced as read

The rows are read by ``read.live_tables.LiveTables``. The detectors run incrementally over new blocks only;
the collapse label over the run's rows in memory; the post-mortem in a background thread over the same
``RunSet``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sorl_monitor.diagnose.detectors.config import DetectorConfig
from sorl_monitor.diagnose.detectors.runner import FIRED_COLUMNS, ArrowDetector, with_columns
from sorl_monitor.diagnose.postmortem.config import PostmortemConfig
from sorl_monitor.diagnose.postmortem.judge import postmortem
from sorl_monitor.diagnose.postmortem.label import COLLAPSE_SQL, LABEL_COLUMNS, collapse_params
from sorl_monitor.diagnose.postmortem.verdict import Verdict
from sorl_monitor.diagnose.timeline import RunCurves, Timeline, alert_onsets, ctn_spans
from sorl_monitor.read.live_tables import LiveTables
from sorl_monitor.read.query import RunSet
from sorl_monitor.read.step_rows import column_values
from sorl_monitor.read.summary import STALE_AFTER_S

STATUS_LABELS = {
    "running": "live", "finished": "finished", "failed": "failed", "interrupted": "interrupted",
    "terminated": "terminated", "stale": "stale",
}  # fmt: skip
"""How a run's ``run.json`` status shows (``stale``: marked running but silent for long)."""


@dataclass
class LiveRunState:
    """One run as the run picker shows it: its state as read so far."""

    run_id: str
    path: str
    algorithm: str | None
    status: str
    """``live`` (still written), ``finished``, ``failed``, ``stale`` (marked running, silent for long), ``imported``."""
    updates: int
    last_step: int | None
    last_reward: float | None
    collapse_step: int | None
    idle_s: float | None

    @property
    def label(self) -> str:
        """``name · algorithm · status · step N`` (``collapsed at S`` when the collapse label fired)."""
        parts = [self.run_id, self.algorithm or "?", self.status]
        if self.collapse_step is not None:
            parts.append(f"collapsed at {self.collapse_step}")
        parts.append("no updates yet" if self.last_step is None else f"step {self.last_step}")
        return " · ".join(parts)


class LiveRuns(LiveTables):
    """``LiveTables`` with each run's detector alerts, collapse label, timeline and verdict; safe to share between
    threads.

    Args:
        source: what to read (``LiveTables``), and ``reading``, its other keywords (``fmt``, ``min_refresh_s``,
            ``log_options``, ``run_paths``).
        detector_config: thresholds for the alert onsets, the collapse label and the verdict.
        postmortem_config: the collapse label's and the verdict's own settings.
        verdict_every_s: while a run is written its post-mortem is recomputed at most this often.
    """

    def __init__(
        self,
        source: str | Path | RunSet,
        *,
        detector_config: DetectorConfig | None = None,
        postmortem_config: PostmortemConfig | None = None,
        verdict_every_s: float = 30.0,
        **reading: Any,
    ) -> None:
        super().__init__(source, **reading)
        self.detector_config = detector_config or DetectorConfig()
        self.postmortem_config = postmortem_config or PostmortemConfig()
        self.verdict_every_s = verdict_every_s
        self._con = duckdb.connect(config={"threads": 1})
        self._detector = ArrowDetector(self.detector_config)
        self._background = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="sorl-verdict"
        )
        self._pending_verdicts: dict[str, concurrent.futures.Future] = {}

    # ------------------------------------------------------------------ runs
    def run_ids(self) -> list[str]:
        """Every run found, in the order they were created."""
        return [state.run_id for state in self.run_states()]

    def run_states(self) -> list[LiveRunState]:
        """Each run's algorithm, status, updates, last step and reward, and collapse step."""
        with self._lock:
            if self._infos is None:
                return []
            now = time.time()
            ordered = self._infos.sort_by([("created_at", "ascending"), ("run_id", "ascending")])
            return [self._state(row, now) for row in ordered.to_pylist()]

    def _state(self, row: dict[str, Any], now: float) -> LiveRunState:
        steps = self.steps(row["run_id"])
        idle = None if row["last_write"] is None else max(0.0, now - row["last_write"])
        status = row["status"] or "unknown"
        if status == "running" and idle is not None and idle > STALE_AFTER_S:
            status = "stale"
        rewards = column_values(steps, "reward_mean")
        finite = rewards[np.isfinite(rewards)]
        return LiveRunState(
            run_id=row["run_id"],
            path=row["path"],
            algorithm=row["algorithm"],
            status=STATUS_LABELS.get(status, status),
            updates=steps.num_rows,
            last_step=pc.max(steps.column("step")).as_py() if steps.num_rows else None,
            last_reward=float(finite[-1]) if len(finite) else None,
            collapse_step=self.collapse_step(row["run_id"]),
            idle_s=idle,
        )

    def run_state(self, run_id: str) -> LiveRunState | None:
        return next((state for state in self.run_states() if state.run_id == run_id), None)

    # ------------------------------------------------------------------ detectors and timeline
    def detector_alerts(self, run_id: str) -> pa.Table:
        """The detectors' firings over the run's rows (``detect``'s columns), as ``detect`` finds them.

        Incremental: each call runs the detectors over the blocks from the one that held the last step
        checked (windows look back, never forward, so earlier blocks' firings stay; a block still being
        written when last checked is judged again on all its rows).
        """
        with self._lock:
            run = self._run(run_id)
            stored = run.memo.get("detect")
            if stored is not None and stored[0] == run.version:
                return stored[1][1]
            checked, found = stored[1] if stored is not None else (None, FIRED_COLUMNS.empty_table())
            rows = self.logged_steps(run_id)
            if rows.num_rows:
                block = self.detector_config.smooth_steps
                after = None if checked is None else (checked // block) * block - 1
                if after is not None:
                    found = found.filter(pc.less_equal(found.column("step"), after))
                found = pa.concat_tables([found, self._detector(rows, run_id, after_step=after)])
                checked = pc.max(rows.column("step")).as_py()
            run.memo["detect"] = (run.version, (checked, found))
            return found

    def collapse_step(self, run_id: str) -> int | None:
        """The step the collapse label fires at, or ``None``."""
        label = self.collapse_label(run_id)
        return None if label is None else label["collapse_step"]

    def collapse_label(self, run_id: str) -> dict[str, Any] | None:
        """The run's row of ``postmortem.COLLAPSE_SQL`` (``collapse_step``, ``collapse_reason``, …), or ``None``
        before the run logged a step."""
        return self._memo(run_id, "collapse", lambda run: self._collapse_label(run_id))

    def _collapse_label(self, run_id: str) -> dict[str, Any] | None:
        rows = self.logged_steps(run_id)
        if rows.num_rows == 0:
            return None
        self._con.register("steps", with_columns(rows, LABEL_COLUMNS, run_id))
        try:
            params = collapse_params(self.detector_config, self.postmortem_config, run_id)
            result = self._con.sql(COLLAPSE_SQL, params=params).to_arrow_table().to_pylist()
        finally:
            self._con.unregister("steps")
        return result[0] if result else None

    def timeline(self, run_id: str) -> Timeline:
        """Alert onsets (the trainer's logged alerts and the detectors' firings), CTN-on spans (the
        ``ctn_active`` column, else the guard's ``ctn_on``/``ctn_off`` actions) and the collapse step."""
        self._wanted(run_id, "alerts")
        return self._memo(run_id, "timeline", lambda run: self._timeline(run_id))

    def _timeline(self, run_id: str) -> Timeline:
        steps = self.steps(run_id)
        logged = self.alerts(run_id)
        is_action = pc.equal(logged.column("kind"), "action")
        fired = [*logged.filter(pc.invert(is_action)).to_pylist(), *self.detector_alerts(run_id).to_pylist()]
        unique = list({(row["step"], row["detector"]): row for row in fired}.values())
        step_list = steps.column("step").to_pylist()
        active = steps.column("ctn_active").to_pylist() if "ctn_active" in steps.column_names else []
        actions = [(row["step"], row["detector"]) for row in logged.filter(is_action).to_pylist()]
        return Timeline(
            alert_onsets(unique, step_list, self.detector_config.smooth_steps),
            ctn_spans(
                step_list, active if len(active) == len(step_list) else [None] * len(step_list), actions
            ),
            self.collapse_step(run_id),
        )

    def curves(self, run_id: str) -> RunCurves:
        """What the overview draws of the run: its step rows and its timeline."""
        return RunCurves(run_id, self.steps(run_id), self.timeline(run_id))

    def clip_eps(self, run_id: str) -> float:
        """The run's PPO clip ε (``clip_eps`` in its config), else the post-mortem's turn-ratio ε."""
        with self._lock:
            infos = self._infos
        rows = [] if infos is None else infos.filter(pc.equal(infos.column("run_id"), run_id)).to_pylist()
        config = json.loads(rows[0]["config"] or "{}") if rows else {}
        value = config.get("clip_eps") if isinstance(config, dict) else None
        return float(value) if isinstance(value, int | float) else self.postmortem_config.turn_ratio_eps

    # ------------------------------------------------------------------ verdict
    def verdict(self, run_id: str, wait_s: float | None = None) -> Verdict | None:
        """The newest post-mortem of ``run_id`` so far (``None`` before one is ready).

        The post-mortem (``sorl_monitor.diagnose.postmortem``, over the same ``RunSet``) runs in a background
        thread: started when none exists yet, and again when new rows arrived and the last one is
        ``verdict_every_s`` old. The call waits for a running one up to ``wait_s`` seconds (``None``:
        until it is done), then returns the newest finished verdict. Its error is raised here.
        """
        with self._lock:
            run = self._run(run_id)
            if self.steps(run_id).num_rows == 0:
                return None
            pending = self._collect_verdict(run_id)
            done = run.memo.get("verdict")
            due = done is None or (
                done[0] != run.version and time.monotonic() - done[1][0] >= self.verdict_every_s
            )
            if due and pending is None:
                pending = self._background.submit(self._postmortem, run_id, run.version)
                self._pending_verdicts[run_id] = pending
        if pending is not None:
            with contextlib.suppress(concurrent.futures.TimeoutError):
                pending.result(timeout=wait_s)
        with self._lock:
            self._collect_verdict(run_id)
            done = run.memo.get("verdict")
            return None if done is None else done[1][1]

    def verdict_pending(self, run_id: str) -> bool:
        """Whether a post-mortem of ``run_id`` is running in the background."""
        with self._lock:
            self._run(run_id)
            return self._collect_verdict(run_id) is not None

    def _collect_verdict(self, run_id: str) -> concurrent.futures.Future | None:
        """Keep a finished background post-mortem (raising its error); the one still running, if any."""
        pending = self._pending_verdicts.get(run_id)
        if pending is None or not pending.done():
            return pending
        del self._pending_verdicts[run_id]
        version, verdict = pending.result()
        self._run(run_id).memo["verdict"] = (version, (time.monotonic(), verdict))
        return None

    def _postmortem(self, run_id: str, version: int) -> tuple[int, Verdict]:
        assert self.run_set is not None
        return version, postmortem(self.run_set, run_id, self.detector_config, self.postmortem_config)

    def close(self) -> None:
        """Stop the background post-mortems and close the DuckDB connections (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._background.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._con.close()
            self._detector.close()
            self._close_run_set()
