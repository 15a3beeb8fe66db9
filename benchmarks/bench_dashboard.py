"""Dashboard speed as a viewer sees it, in headless Chromium: navigation → drawn overview, and how soon a live
refresh shows a part just written.

    python benchmarks/bench_dashboard.py [--turn-rows 1000000] [--repeats 5] [--refreshes 10]
    python benchmarks/bench_dashboard.py --skip-live-run --bundles auto,cartesian,full [--hogs 2]
    python benchmarks/bench_dashboard.py --skip-live-run --baseline ../main --phases   # before/after, interleaved
    python benchmarks/bench_dashboard.py --skip-live-run --skip-sample-logs --fleet-runs 2000

``sorl dashboard`` is started by the real CLI on a free 127.0.0.1 port; each navigation opens a new browser
context (no cache, no cookies: a viewer's first visit), and the overview counts as drawn once plotly drew
its chart (the browser's own clocks: the page's navigation start to the chart's first ``Plotly.react``
done). Measured:

* ``sample_logs/`` (five runs of the bundled trainer, 1,600 updates each since 2026-11-24; 1,280 before), one run and all five overlaid;
  with ``--phases``, when each phase of a first paint ended (page, Streamlit's scripts, websocket, the chart's
  frame, plotly.js fetched and run, the figure drawn); with ``--baseline CHECKOUT``, that checkout's dashboard
  too, visit by visit in turn with this one's (the same load for both);
* with ``--fleet-runs N``, a folder of N runs (the sample runs replicated) holding ``sorl fleet``'s verdict
  table: the run list is read from the table and only the most urgent run is opened;
* a run of ~1 M turn rows written here by the real ``Monitor`` from random batches (64 episodes × 8 turns
  per update; the values are noise, the sizes and the Parquet layout are a real run's), the monitor left
  open so the run is live: the first viewer after the server started (every part read) and later viewers;
* live refresh: the monitor logs and flushes one more update (a new part), and the time from ``flush()``
  returning to the page drawing that step, with ``--refresh 0.5`` (the default) and ``--refresh 1``.

Goals (issue 13): navigation → drawn overview ≤ 2 s on ``sample_logs/``, ≤ 3 s on the 1 M-turn-row run;
a refresh visible ≤ 1 s after the part is written. Printed, not asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from playwright.sync_api import Browser, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fleet_runs import make_fleet  # noqa: E402  (benchmarks/fleet_runs.py, beside this script)

from sorl_monitor import Monitor, WriterConfig  # noqa: E402
from sorl_monitor.dashboard.live_chart import BUNDLE_ENV  # noqa: E402
from sorl_monitor.diagnose.live import LiveRuns  # noqa: E402
from sorl_monitor.read.run_list import VerdictList  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHART = ".st-key-overview iframe"
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
            ppo_epoch=(mon.last_step + 1) % 4, policy_lag=(mon.last_step + 1) % 4,
        )  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def dashboard(
    log_dir: Path, log: Path, refresh_s: float = 0.5, checkout: Path = ROOT, python: str = sys.executable
) -> Iterator[str]:
    """``sorl dashboard LOG_DIR`` of ``checkout`` (run by ``python``) on a free port while the block runs; its URL."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")])),
    }
    command = [
        python,
        "-m",
        "sorl_monitor.cli.main",
        "dashboard",
        str(log_dir),
        "--port",
        str(port),
        "--refresh",
        str(refresh_s),
    ]
    with log.open("w") as out:
        server = subprocess.Popen(command, cwd=checkout, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"the dashboard did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.terminate()
        server.wait(timeout=30)


def time_to_overview(browser: Browser, url: str) -> float:
    """Seconds from navigation to the overview drawn, in a fresh browser context, by the browser's clocks: the
    page's navigation start to the chart's first ``Plotly.react`` done (``sorl-chart-drawn``)."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    page = context.new_page()
    page.goto(url)
    page.frame_locator(CHART).locator(".main-svg").first.wait_for(timeout=120_000)
    frame = page.locator(CHART).element_handle().content_frame()
    frame.wait_for_function("performance.getEntriesByName('sorl-chart-drawn').length > 0", timeout=30_000)
    drawn = frame.evaluate(
        "performance.timeOrigin + performance.getEntriesByName('sorl-chart-drawn')[0].startTime"
    )
    elapsed = (drawn - page.evaluate("performance.timeOrigin")) / 1000
    context.close()
    return elapsed


PHASES = (
    ("page shell (HTML received)", "shell"),
    ("Streamlit's scripts run (DOMContentLoaded)", "dom"),
    ("first websocket message", "ws_first"),
    ("figure message received", "ws_spec"),
    ("chart frame created", "frame"),
    ("plotly.js fetched", "plotly_fetched"),
    ("plotly.js parsed and run", "plotly_parsed"),
    ("figure handed to the chart", "spec"),
    ("figure drawn", "drawn"),
)
"""The phases of a first paint, in the order they usually end (``overview_phases``)."""


def overview_phases(browser: Browser, url: str) -> dict[str, float]:
    """Seconds from navigation start to the end of each phase of ``PHASES`` in a fresh browser context: the
    page's and the chart frame's performance timelines (the frame's marks ``sorl-plotly-parsed``,
    ``sorl-spec-received``, ``sorl-chart-drawn``), and the websocket's frames by wall clock (the largest one
    carries the figure)."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    page = context.new_page()
    frames: list[tuple[float, int]] = []
    page.on(
        "websocket",
        lambda ws: ws.on("framereceived", lambda payload: frames.append((time.time() * 1000, len(payload)))),
    )
    page.goto(url)
    page.frame_locator(CHART).locator(".main-svg").first.wait_for(timeout=120_000)
    frame = page.locator(CHART).element_handle().content_frame()
    frame.wait_for_function("performance.getEntriesByName('sorl-chart-drawn').length > 0", timeout=30_000)
    origin = page.evaluate("performance.timeOrigin")
    nav = page.evaluate("performance.getEntriesByType('navigation')[0].toJSON()")
    inner = frame.evaluate(
        """() => {
        const at = (name) => (performance.getEntriesByName(name)[0] || {startTime: null});
        const js = performance.getEntriesByType('resource').find((e) => e.name.includes('plotly.min.js'));
        return {origin: performance.timeOrigin, plotly_fetched: js ? js.responseEnd : null,
                plotly_parsed: at('sorl-plotly-parsed').startTime, spec: at('sorl-spec-received').startTime,
                drawn: at('sorl-chart-drawn').startTime};
        }"""
    )
    context.close()
    shift = inner["origin"] - origin  # the frame's clock starts when it is created
    phases = {"shell": nav["responseEnd"], "dom": nav["domContentLoadedEventEnd"], "frame": shift}
    for name in ("plotly_fetched", "plotly_parsed", "spec", "drawn"):
        phases[name] = None if inner[name] is None else inner[name] + shift
    if frames:
        phases["ws_first"] = frames[0][0] - origin
        phases["ws_spec"] = max(frames, key=lambda f: f[1])[0] - origin
    return {name: value / 1000 for name, value in phases.items() if value is not None}


CHART_PAGE = "component/sorl_monitor.dashboard.live_chart.live_chart/index.html"


def chart_page_ready(browser: Browser, base: str) -> float:
    """Seconds from navigation to plotly.js run (``window.Plotly``) on the live chart's page alone, in a fresh
    browser context (its own fetch of plotly.js, as a first visit's chart frame)."""
    context = browser.new_context()
    page = context.new_page()
    page.goto(base + CHART_PAGE)
    page.wait_for_function("window.Plotly !== undefined", polling=10, timeout=120_000)
    ready = page.evaluate("performance.now()") / 1000
    context.close()
    return ready


def breakdown(browser: Browser, url: str, label: str, repeats: int) -> None:
    """The median end of each first-paint phase over ``repeats`` fresh visits to ``url``."""
    samples = [overview_phases(browser, url) for _ in range(repeats)]
    print(f"{label}: phases of a first paint, median end (s) after navigation start, n={repeats}", flush=True)
    for title, name in PHASES:
        values = [s[name] for s in samples if name in s]
        if values:
            print(f"  {title:<60} {statistics.median(values):.2f}", flush=True)


def last_step_drawn(step: int) -> str:
    """JS: true once the chart's first curve (the reward; its last point is always drawn) reaches ``step``."""
    return (
        "(() => { const c = document.getElementById('chart'); const d = c && c._fullData && c._fullData[0];"
        f" return Boolean(d && d.x && d.x.length && d.x[d.x.length - 1] >= {step}); }})()"
    )


def refresh_latency(browser: Browser, url: str, mon: Monitor, refreshes: int) -> list[float]:
    """Seconds from a new part on disk (``flush()`` returned) to the page drawing its step, ``refreshes`` times."""
    page = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()
    page.goto(url)
    page.frame_locator(CHART).locator(".main-svg").first.wait_for(timeout=120_000)
    frame = page.locator(CHART).element_handle().content_frame()
    generator = torch.Generator().manual_seed(7)
    latencies = []
    for index in range(refreshes):
        time.sleep(0.37 * (index % 3) + 0.5)  # land at different points of the refresh cycle
        log_updates(mon, 1, generator)
        mon.flush()
        written = time.perf_counter()
        frame.wait_for_function(last_step_drawn(mon.last_step), polling=20, timeout=30_000)
        latencies.append(time.perf_counter() - written)
    page.context.close()
    return latencies


def median(values: list[float]) -> str:
    return (
        f"{statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f}, n={len(values)})"
    )


def measure(label: str, samples: Callable[[], float], repeats: int) -> None:
    values = [samples() for _ in range(repeats)]
    print(f"{label:<62} {median(values)}", flush=True)


def sample_logs(
    browser: Browser,
    scratch: Path,
    repeats: int,
    bundle: str = "auto",
    phases: bool = False,
    baseline: Path | None = None,
) -> None:
    """Navigation → drawn overview on ``sample_logs/`` with plotly.js ``bundle``: ``auto`` (each figure's
    smallest: the basic bundle for the overview, since 2026-11-26), ``cartesian`` (for every chart) or
    ``full`` (plotly's whole bundle, as before). With ``baseline`` (another checkout,
    with its own ``.venv``), its dashboard is measured too, interleaved visit by visit with this one's, so
    both see the same load."""
    os.environ.pop(BUNDLE_ENV, None)
    if bundle != "auto":
        os.environ[BUNDLE_ENV] = bundle
    tag = f"[{bundle} plotly.js]"
    checkouts = {"": (ROOT, sys.executable)}
    if baseline is not None:
        checkouts = {" (this checkout)": checkouts[""], f" (baseline {baseline.name})": (
            baseline, str(baseline / ".venv" / "bin" / "python"))}  # fmt: skip
    with contextlib.ExitStack() as stack:
        bases = {
            name: stack.enter_context(
                dashboard(
                    ROOT / "sample_logs", scratch / f"sample-{bundle}{i}.log", checkout=root, python=python
                )
            )
            for i, (name, (root, python)) in enumerate(checkouts.items())
        }
        for name, base in bases.items():
            first = time_to_overview(browser, f"{base}?runs=token-ppo")
            print(
                f"{'sample_logs, first viewer after the server started ' + tag + name:<62} {first:.2f} s",
                flush=True,
            )
        if phases:
            for name, base in bases.items():
                breakdown(browser, f"{base}?runs=token-ppo", f"sample_logs, one run {tag}{name}", repeats)
        if len(bases) > 1:  # the chart's page alone: its plotly.js path, with less of the rest's noise
            ready: dict[str, list[float]] = {name: [] for name in bases}
            for _ in range(3 * repeats):
                for name, base in bases.items():
                    ready[name].append(chart_page_ready(browser, base))
            for name, samples in ready.items():
                print(f"{f'the chart page alone → plotly.js run{name}':<62} {median(samples)}", flush=True)
        every = "&".join(
            f"runs={r}" for r in sorted(p.name for p in (ROOT / "sample_logs").iterdir() if p.is_dir())
        )
        for what, query in (("one run (token-ppo)", "runs=token-ppo"), ("five runs overlaid", every)):
            values: dict[str, list[float]] = {name: [] for name in bases}
            for _ in range(repeats):
                for name, base in bases.items():
                    values[name].append(time_to_overview(browser, f"{base}?{query}"))
            for name, samples in values.items():
                print(f"{f'sample_logs, {what} {tag}{name}':<62} {median(samples)}", flush=True)


def fleet(browser: Browser, scratch: Path, runs: int, repeats: int, server_cost: bool = False) -> None:
    """Navigation → drawn overview on a folder of ``runs`` runs holding ``sorl fleet``'s verdict table (the
    sample runs replicated by hard links, ``benchmarks/fleet_runs.py``): a bare address, which opens on
    the most urgent run; the run list comes from the table, and only that run is opened."""
    started = time.perf_counter()
    root = make_fleet(scratch / "fleet", runs)
    print(f"{runs:,} runs made (hard links) and their verdict table (sorl fleet over the samples) in "
          f"{time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
    if server_cost:
        fleet_server_cost(root)
    with dashboard(root, scratch / "fleet.log") as base:
        first = time_to_overview(browser, base)
        print(f"{f'{runs:,} runs, first viewer after the server started':<62} {first:.2f} s", flush=True)
        measure(
            f"{runs:,} runs, a bare address (the most urgent run)",
            lambda: time_to_overview(browser, base),
            repeats,
        )


def fleet_server_cost(root: Path) -> None:
    """What the server reads before a first page of the fleet at ``root``: the run list from the verdict table
    and the one run opened, against every run opened (``LiveRuns.refresh``) and listed (``run_infos``: the
    collapse label of each), as without a verdict table. Seconds of wall time, in this process."""
    started = time.perf_counter()
    listed = VerdictList(root)
    listed.refresh()
    print(
        f"{f'{len(listed.runs):,} runs, the list from the verdict table':<62} {time.perf_counter() - started:.2f} s"
    )
    started = time.perf_counter()
    with contextlib.closing(LiveRuns(root, run_paths=[listed.runs[0].path])) as live:
        live.refresh()
        live.run_states()
    print(
        f"{'  + the most urgent run opened (LiveRuns run_paths)':<62} {time.perf_counter() - started:.2f} s"
    )
    started = time.perf_counter()
    with contextlib.closing(LiveRuns(root)) as live:
        live.refresh()
        print(
            f"{'without the table: every run opened (LiveRuns.refresh)':<62} {time.perf_counter() - started:.1f} s"
        )
        started = time.perf_counter()
        live.run_states()
        print(
            f"{'  + every run listed (run_infos: collapse label of each)':<62} {time.perf_counter() - started:.1f} s"
        )


def live_run(browser: Browser, scratch: Path, turn_rows: int, repeats: int, refreshes: int) -> None:
    log_dir = scratch / "logs"
    mon = Monitor(log_dir, RUN, {"note": "bench_dashboard: random batches"}, algorithm="ppo",
                  writer=WriterConfig(flush_interval_s=0.5, max_pending_rows=10_000_000))  # fmt: skip
    mon.watch(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)))
    started = time.perf_counter()
    log_updates(mon, -(-turn_rows // (EPISODES * TURNS)), torch.Generator().manual_seed(0))
    mon.flush()
    parts = {t: len(list((log_dir / RUN / t).glob("rank=*/part-*.parquet"))) for t in ("steps", "turns")}
    print(f"wrote {mon.last_step + 1} updates ({turn_rows:,} turn rows) in "
          f"{time.perf_counter() - started:.0f} s; parts {parts}", flush=True)  # fmt: skip
    try:
        with dashboard(log_dir, scratch / "bench.log") as base:
            url = f"{base}?runs={RUN}"
            first = time_to_overview(browser, url)
            print(f"{'1 M turn rows, first viewer after the server started':<62} {first:.2f} s", flush=True)
            measure("1 M turn rows, a later viewer", lambda: time_to_overview(browser, url), repeats)
            latencies = refresh_latency(browser, url, mon, refreshes)
            print(
                f"{'live refresh: part written → drawn (--refresh 0.5, the default)':<62} {median(latencies)}"
            )
        with dashboard(log_dir, scratch / "bench-slow.log", refresh_s=1.0) as base:
            latencies = refresh_latency(browser, f"{base}?runs={RUN}", mon, refreshes)
            print(f"{'live refresh: part written → drawn (--refresh 1)':<62} {median(latencies)}", flush=True)
    finally:
        mon.close()


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """``count`` processes spinning on a core each while the block runs (a loaded machine)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    if count:
        print(f"{count} CPU hog process{'es' if count > 1 else ''} running", flush=True)
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turn-rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--refreshes", type=int, default=10)
    parser.add_argument("--skip-sample-logs", action="store_true", help="measure only the 1 M-turn-row run")
    parser.add_argument("--skip-live-run", action="store_true", help="measure only sample_logs/")
    parser.add_argument("--bundles", default="auto", help="plotly.js bundles to compare: auto,cartesian,full")
    parser.add_argument("--phases", action="store_true", help="also break a first paint down into phases")
    parser.add_argument(
        "--baseline", type=Path, help="another checkout (with its .venv) measured interleaved"
    )
    parser.add_argument(
        "--fleet-runs", type=int, default=0, help="also a folder of this many runs with a verdict table"
    )
    parser.add_argument(
        "--fleet-server-cost",
        action="store_true",
        help="with --fleet-runs: the server's reads, with and without the table (minutes)",
    )
    parser.add_argument("--hogs", type=int, default=0, help="busy processes (one core each) while measuring")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"needs Chromium at {CHROMIUM} (make browser installs Debian's)")
    torch.set_num_threads(1)
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    with contextlib.ExitStack() as stack:
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-dashboard-"))
        playwright = stack.enter_context(sync_playwright())
        stack.enter_context(cpu_hogs(args.hogs))
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        if not args.skip_sample_logs:
            for bundle in args.bundles.split(","):
                sample_logs(browser, Path(scratch), args.repeats, bundle.strip(), args.phases, args.baseline)
        if args.fleet_runs:
            fleet(browser, Path(scratch), args.fleet_runs, args.repeats, args.fleet_server_cost)
        if not args.skip_live_run:
            live_run(browser, Path(scratch), args.turn_rows, args.repeats, args.refreshes)
        browser.close()
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
