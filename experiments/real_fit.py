"""Fit the critical levels of the detectors a real run's collapse shows in (entropy, length, the score against the
optimized reward, the reward's own fall) on the real dev set, scored leave-one-source-out.

    python experiments/real_fit.py [--manifest experiments/real_logs/manifest.jsonl] [--shared ../shared/real_logs]

For every labelled run, each fitted detector's values are computed once with every level open (``detect`` with
the warning levels at −inf), and the rest of the verdict once with the fitted detectors off (``real_eval``'s
flagged / false alarm with those criticals at inf). A level set then *flags* a collapse when the rest of the
verdict does, or the whole log's verdict is not healthy and a fitted detector passes its level at or before
alarm-by (``real_eval``'s rule), and raises a *false alarm* on a healthy
run when the rest does or a fitted detector passes its level anywhere. The rule (stated before the scan): the
level set with the most collapses flagged among those with at most ``MAX_FALSE_ALARMS`` of the healthy runs
alarmed; among ties, each detector keeps its shipped level where that level is in a tied set, else takes the
highest tied level (fewest alarms). (The first scan broke ties by the highest levels alone, which switched off
detectors that cost nothing here for want of a collapse they would catch in time; the change was made before
any level was committed, and both outcomes are in docs/results.md.) Leave-one-source-out: for each source (a repository),
fit on the others and score that source; the table is the sum. The levels to ship are the fit on all sources.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import warnings
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import real_eval  # noqa: E402

from sorl_monitor.diagnose.detectors import DETECTOR_NAMES, DetectorConfig, detect  # noqa: E402
from sorl_monitor.logs import LogWarning  # noqa: E402
from sorl_monitor.read.query import open_runs  # noqa: E402

GRID: dict[str, tuple[float, ...]] = {
    "entropy_rise": (4.0, 6.0, 8.0, 12.0, 16.0, math.inf),
    "entropy_collapse": (0.9, 0.95, 0.98, 0.99, 0.995, math.inf),
    "length_collapse": (0.8, 0.9, 0.95, 0.98, math.inf),
    "reward_hacking": (0.3, 0.4, 0.5, 0.6, 0.7, math.inf),
    "reward_drop": (0.3, 0.4, 0.5, 0.6, math.inf),
}
"""The levels tried per detector (``inf``: off)."""
MAX_FALSE_ALARMS = 0.05


def open_config() -> DetectorConfig:
    """Every fitted detector's warning level at −inf (each block's value is reported), criticals off."""
    return DetectorConfig().replace(
        **{f"{d}_warning": -math.inf for d in GRID}, **{f"{d}_critical": math.inf for d in GRID}
    )


def fitted_off() -> DetectorConfig:
    return DetectorConfig().replace(**{f"{d}_critical": math.inf for d in GRID})


def case_values(case: real_eval.Case, path: Path) -> dict[str, float]:
    """Per fitted detector, the largest value at or before alarm-by (a collapse) or anywhere (a healthy run)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LogWarning)
        with open_runs(path) as runs:
            run_id = real_eval.run_id_for(runs, case)
            alerts = detect(runs, open_config(), run_id, detectors=list(GRID)).to_pylist()
    best = dict.fromkeys(GRID, -math.inf)
    for alert in alerts:
        if case.label == "collapsed" and case.alarm_by is not None and alert["step"] > case.alarm_by:
            continue
        if alert["value"] is not None and math.isfinite(alert["value"]):
            best[alert["detector"]] = max(best[alert["detector"]], alert["value"])
    return best


def score(cases: list[dict], levels: dict[str, float]) -> tuple[int, int, int, int]:
    """(collapses flagged, collapses, healthy runs alarmed, healthy runs) under ``levels``."""
    flagged = alarmed = collapsed = healthy = 0
    for case in cases:
        fires = any(case["values"][d] > levels[d] for d in GRID)
        if case["label"] == "collapsed":
            collapsed += 1
            flagged += case["base"] or (fires and case["status_nonzero"])
        else:
            healthy += 1
            alarmed += case["base"] or fires
    return flagged, collapsed, alarmed, healthy


def fit(cases: list[dict]) -> dict[str, float]:
    """The rule: most collapses flagged with at most MAX_FALSE_ALARMS of healthy runs alarmed; among ties, the
    shipped levels where they tie, else the highest (module docstring)."""
    shipped = DetectorConfig()
    admissible: list[tuple[int, dict[str, float]]] = []
    for combo in itertools.product(*GRID.values()):
        levels = dict(zip(GRID, combo, strict=True))
        flagged, _, alarmed, healthy = score(cases, levels)
        if not healthy or alarmed / healthy <= MAX_FALSE_ALARMS:
            admissible.append((flagged, levels))
    if not admissible:
        return dict.fromkeys(GRID, math.inf)
    most = max(flagged for flagged, _ in admissible)
    tied = [levels for flagged, levels in admissible if flagged == most]

    def preference(levels: dict[str, float]) -> tuple:
        kept = sum(levels[d] == getattr(shipped, f"{d}_critical") for d in GRID)
        return (kept, sum(min(v, 1e9) for v in levels.values()))

    return max(tied, key=preference)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, default=real_eval.MANIFEST)
    parser.add_argument("--shared", type=Path, default=real_eval.SHARED)
    args = parser.parse_args(argv)
    assert set(GRID) <= set(DETECTOR_NAMES)
    rows = []
    for case in real_eval.labelled_cases(args.manifest, args.shared):
        path = real_eval.path_of(case, args.manifest, args.shared)
        if path is None or case.label not in ("collapsed", "healthy"):
            continue
        real_eval.judge(case, path, fitted_off())
        if case.error:
            continue
        base = case.flagged if case.label == "collapsed" else case.false_alarm
        rows.append({"source": case.source, "name": Path(case.file).name + (f"#{case.run}" if case.run else ""),
                     "label": case.label, "alarm_by": case.alarm_by, "base": base,
                     "status_nonzero": real_eval.EXIT_CODES[case.status] != 0, "values": case_values(case, path)})  # fmt: skip
    print(f"# Real dev set: {len(rows)} labelled runs, fitted detectors: {', '.join(GRID)}\n")
    base = score(rows, dict.fromkeys(GRID, math.inf))
    print(
        f"With the fitted detectors off: {base[0]}/{base[1]} collapses flagged, {base[2]}/{base[3]} healthy alarmed"
    )
    totals = [0, 0, 0, 0]
    print("\n| held-out source | levels fitted on the others | flagged | alarmed |\n|---|---|---|---|")
    by_source = defaultdict(list)
    for row in rows:
        by_source[row["source"]].append(row)
    for source, held in sorted(by_source.items()):
        levels = fit([r for r in rows if r["source"] != source])
        got = score(held, levels)
        totals = [a + b for a, b in zip(totals, got, strict=True)]
        shown = ", ".join(f"{d} {v:g}" for d, v in levels.items())
        print(f"| {source} | {shown} | {got[0]}/{got[1]} | {got[2]}/{got[3]} |")
    print(
        f"\nLeave-one-source-out: {totals[0]}/{totals[1]} collapses flagged, {totals[2]}/{totals[3]} healthy alarmed"
    )
    shipped = fit(rows)
    whole = score(rows, shipped)
    print(f"Fit on every source (the levels to ship): {json.dumps(shipped)}; in sample {whole[0]}/{whole[1]}, "
          f"{whole[2]}/{whole[3]}")  # fmt: skip
    for row in rows:
        marks = {d: round(v, 3) for d, v in row["values"].items() if v > -math.inf}
        print(f"  {row['label']:9} base={'yes' if row['base'] else 'no ':3} {row['name'][:70]}: {marks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
