"""Calibrate ``diverging`` (how many families above their quiet levels together make a critical alert) on the corpus.

    python experiments/fit_diverging.py --corpus experiments/corpus [--corpus more_runs …]

Uses ``experiments/detector_eval.py``'s machinery with one fitted threshold, ``diverging_critical`` (the count of
families, ``DetectorConfig.diverging_critical``: critical above it), every other threshold at the shipped defaults.
Scored leave-one-setting-out: for each setting, the count is chosen on the other settings' runs (best recall at a
false-alarm rate ≤ 5 % there) and applied to that setting's runs. Printed beside the same scoring with
``diverging`` off, so the table says what the joint detector adds. The fit on the whole corpus is the default
to ship; the per-fold choices show how stable it is.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "experiments"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import detector_eval  # noqa: E402

from sorl_monitor.diagnose.detectors import DetectorConfig, detect, load_config  # noqa: E402
from sorl_monitor.read.query import open_runs  # noqa: E402

COUNTS = (1.0, 2.0, 3.0, 4.0, 5.0, math.inf)
"""``diverging_critical`` values tried: critical from 2, 3, 4, 5, 6 families together, or off."""


def per_count(corpus: list[str], config: DetectorConfig) -> list[str]:
    """For each count of families, on the whole corpus: collapses where that many rise together at or before
    the fall's start, and stable runs where they ever do (recovered dips left out)."""
    probe = config.replace(diverging_warning=0.0, diverging_critical=math.inf)
    with open_runs(corpus) as runs:
        labelled = detector_eval.labels(runs, config)
        fired = detect(runs, probe, detectors=["diverging"]).to_pylist()
    first: dict[tuple[str, int], int] = {}
    for row in fired:
        for count in range(1, 7):
            if row["value"] >= count:
                first.setdefault((row["run_id"], count), row["step"])
    collapsing = [r for r in labelled if r.collapse_step is not None]
    stable = [r for r in labelled if r.collapse_step is None and not r.dipped]
    lines = []
    for count in range(1, 7):
        seen = sum(first.get((r.run_id, count), math.inf) <= r.collapse_step for r in collapsing)
        false = sum((r.run_id, count) in first for r in stable)
        lines.append(
            f"{count} families or more: {seen}/{len(collapsing)} collapses, {false}/{len(stable)} stable runs"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", nargs="+", required=True, help="folders of bundled-trainer runs")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="name=value")
    args = parser.parse_args(argv)
    config = load_config(None, args.overrides)
    detector_eval.FITTED.clear()  # nothing fitted: every threshold at its default, diverging off
    off = detector_eval.evaluate_corpus(args.corpus, config.replace(diverging_critical=math.inf))
    detector_eval.FITTED["diverging_critical"] = COUNTS
    result = detector_eval.evaluate_corpus(args.corpus, config)
    loso = result["scores"][0]
    loso.method = "with diverging, leave-one-setting-out"
    baseline = off["scores"][0]
    baseline.method = "diverging off (the other criticals at their defaults)"
    print(detector_eval.markdown(f"Corpus: {len(result['runs'])} runs, {result['settings']} settings",
                                 [loso, baseline]))  # fmt: skip
    folds = Counter(fit["diverging_critical"] for fit in result["fits"].values())
    print(f"\nfolds' choice of diverging_critical: {dict(folds)}")
    print(f"fit on the whole corpus: {result['fit_on_all']}")
    print(f"missed: {', '.join(loso.missed) or 'none'}")
    print(f"false alarms: {', '.join(loso.false) or 'none'}")
    print("\nhow often several families rise together (whole corpus):")
    print("\n".join(per_count(args.corpus, config)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
