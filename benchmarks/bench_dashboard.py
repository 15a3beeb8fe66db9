"""Dashboard cost: first render and live refresh on a run with ~1 M turn rows.

    python benchmarks/bench_dashboard.py [--turn-rows 1000000] [--new-updates 20] [--log-dir DIR]

The run is written here by the real ``Monitor`` from random batches (64 episodes × 8 turns per update,
so 512 turn rows per update; the values are noise, the sizes and the Parquet layout are a real
run's), with a short flush interval and small parts (``--rows-per-part``) so it has hundreds of part files,
as a long run has. Timings are of the
Streamlit script itself, run by ``AppTest`` (what the server does per page load or fragment rerun; the
browser's drawing is not included), after one warm-up page on a tiny run so that module imports are
not counted:

* first render — a new viewer opens the view, nothing cached: every part file is read;
* refresh — ``--new-updates`` more updates land (new part files), then the page reruns: only the
  new parts are read (what the live fragment does every few seconds);
* idle rerun — nothing new.

The Alerts view's post-mortem runs in a background thread; the page waits for it at most
``VERDICT_WAIT_S`` and then shows it on a later rerun: its cost is printed on its own.

Goals (issue 4): first render ≤ 2 s, refresh ≤ 1 s. DuckDB uses the machine's cores (2 in CI).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from dashboard.alerts_view import VERDICT_WAIT_S  # noqa: E402
from dashboard.common import LOG_DIR_ENV  # noqa: E402
from sorl_monitor import Monitor  # noqa: E402
from sorl_monitor.dashboard_data import LiveRuns  # noqa: E402
from sorl_monitor.views import overview_figure, turn_heatmap_figure  # noqa: E402

APP = ROOT / "dashboard" / "app.py"
EPISODES, TURNS, TURN_TOKENS, ENV_TOKENS = 64, 8, 6, 2
RUN = "bench-1m"


def log_updates(mon: Monitor, updates: int, generator: torch.Generator) -> None:
    """``updates`` updates of random batches: EPISODES episodes of TURNS turns (policy tokens, then env tokens)."""
    turn = [1] * TURN_TOKENS + [0] * ENV_TOKENS
    mask = torch.tensor([turn * TURNS] * EPISODES)
    for _ in range(updates):
        logp = -torch.rand(mask.shape, generator=generator)
        mon.log_update(
            logp=logp, old_logp=logp + 0.2 * torch.randn(mask.shape, generator=generator), mask=mask,
            advantages=torch.randn(EPISODES, generator=generator), rewards=torch.rand(EPISODES, generator=generator),
            ppo_epoch=mon.last_step % 4, policy_lag=mon.last_step % 4,
        )  # fmt: skip


def write_run(log_dir: Path, turn_rows: int, flush_s: float, rows_per_part: int) -> Monitor:
    """An open monitor whose run already holds ``turn_rows`` turn rows (the caller logs more, then closes)."""
    generator = torch.Generator().manual_seed(0)
    mon = Monitor(log_dir, RUN, {"note": "bench_dashboard: random batches"}, algorithm="ppo",
                  flush_interval_s=flush_s, flush_rows=rows_per_part, max_pending_rows=10_000_000)  # fmt: skip
    mon.watch(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)))
    started = time.perf_counter()
    log_updates(mon, -(-turn_rows // (EPISODES * TURNS)), generator)
    mon.flush()
    print(f"wrote {mon.last_step + 1} updates in {time.perf_counter() - started:.1f} s")
    return mon


def page_time(view: str) -> tuple[float, AppTest]:
    """Seconds of one page run of ``view`` on a fresh session (AppTest runs the script like the server)."""
    app = AppTest.from_file(str(APP), default_timeout=600)
    app.query_params["view"] = view
    app.query_params["runs"] = [RUN]
    started = time.perf_counter()
    app.run()
    elapsed = time.perf_counter() - started
    if app.exception or app.error:
        raise SystemExit(f"{view}: the page failed: {[e.value for e in (*app.exception, *app.error)]}")
    return elapsed, app


def rerun_time(app: AppTest) -> float:
    started = time.perf_counter()
    app.run()
    return time.perf_counter() - started


def count_parts(run_dir: Path) -> dict[str, int]:
    return {t: len(list((run_dir / t).glob("rank=*/part-*.parquet"))) for t in ("steps", "turns", "modules")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turn-rows", type=int, default=1_000_000)
    parser.add_argument("--new-updates", type=int, default=20, help="updates landing between refreshes")
    parser.add_argument("--flush-s", type=float, default=0.05, help="the writer's flush interval")
    parser.add_argument("--rows-per-part", type=int, default=2048, help="the writer's flush_rows")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--log-dir", type=Path, default=None, help="keep the run here (default: a temp dir)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    scratch = tempfile.TemporaryDirectory(prefix="bench-dashboard-")
    log_dir = args.log_dir or Path(scratch.name) / "logs"

    warm = Path(scratch.name) / "warmup"
    with Monitor(warm, "warmup", flush_interval_s=0.05) as tiny:
        log_updates(tiny, 3, torch.Generator().manual_seed(1))
    os.environ[LOG_DIR_ENV] = str(warm)
    AppTest.from_file(str(APP), default_timeout=600).run()

    mon = write_run(log_dir, args.turn_rows, args.flush_s, args.rows_per_part)
    os.environ[LOG_DIR_ENV] = str(log_dir)
    live = LiveRuns(log_dir)
    live.refresh()
    turn_rows = sum(live.turn_cells(RUN).column("turns").to_pylist())
    print(
        f"run: {live.steps(RUN).num_rows} updates, {turn_rows:,} turn rows, parts {count_parts(log_dir / RUN)}"
    )
    live.close()

    first, refresh, idle = {}, {}, {}
    for view in ("Overview", "Turns", "Gradients", "Alerts & verdict"):
        firsts, refreshes, idles = [], [], []
        for _ in range(args.repeats):
            st.cache_resource.clear()
            elapsed, app = page_time(view)
            firsts.append(elapsed)
            log_updates(mon, args.new_updates, torch.Generator().manual_seed(len(firsts)))
            mon.flush()
            time.sleep(1.1)  # past LiveRuns' refresh throttle
            refreshes.append(rerun_time(app))
            time.sleep(1.1)
            idles.append(rerun_time(app))
        first[view], refresh[view], idle[view] = map(statistics.median, (firsts, refreshes, idles))
    mon.close()

    live = LiveRuns(log_dir)
    started = time.perf_counter()
    live.refresh()
    read_s = time.perf_counter() - started
    started = time.perf_counter()
    overview = overview_figure([live.curves(RUN)])
    overview_s = time.perf_counter() - started
    started = time.perf_counter()
    heatmap = turn_heatmap_figure(live.turn_cells(RUN))
    heatmap_s = time.perf_counter() - started
    started = time.perf_counter()
    live.verdict(RUN)
    verdict_s = time.perf_counter() - started
    live.close()

    print(f"\nmedian of {args.repeats}, seconds (goal: first render ≤ 2, refresh ≤ 1)")
    print(f"{'view':<18} {'first render':>13} {'refresh':>9} {'idle rerun':>11}")
    for view in first:
        print(f"{view:<18} {first[view]:>13.2f} {refresh[view]:>9.2f} {idle[view]:>11.2f}")
    print(
        f"\npieces: read every part + reduce turns {read_s:.2f} s; overview figure {overview_s:.2f} s "
        f"({len(overview.to_json()) / 1e6:.1f} MB JSON); turn heatmap {heatmap_s:.2f} s "
        f"({len(heatmap.to_json()) / 1e6:.1f} MB JSON); post-mortem (background, the page waits ≤ "
        f"{VERDICT_WAIT_S:g} s for it) {verdict_s:.2f} s"
    )
    scratch.cleanup()


if __name__ == "__main__":
    main()
