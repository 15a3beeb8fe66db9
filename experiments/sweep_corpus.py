"""The collapse sweep's open-loop runs as more detector corpus: the trainer's 8 × 4 reuse, outside make_corpus's grid.

    python experiments/sweep_corpus.py SWEEP_FOLDER... --out reuse_corpus
    python experiments/detector_eval.py --corpus experiments/corpus reuse_corpus

``SWEEP_FOLDER`` is a folder of ``experiments/collapse_sweep.py`` runs (e.g. ``sweep_runs/v2/default``).
Each run is copied compactly (``make_corpus.export``) under its setting's name,
``<algo>[_nodc]-r<epochs>x<minibatches>-st<staleness>-lr<lr>[-anneal]-s<seed>`` (``_nodc``: dual-clip
off; ``-anneal``: the lr decays to 0), so ``detector_eval`` scores it leave-one-setting-out beside the
grid. The name holds only those knobs: a run whose name is already in ``--out`` is not copied again, so
copy sweeps that differ in other knobs to separate folders. A run with CTN on ``auto`` is left out: its
guard switches on the detectors' own warnings, so whether it collapses is not independent of the alarms
being scored. Nothing is retrained and nothing injected: these are the sweep's runs as they ran.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_corpus import export, setting_name  # noqa: E402


def corpus_name(run: dict) -> str | None:
    """The corpus run id of one sweep run (its ``runs`` row, config parsed); None for an auto-CTN run."""
    from sorl_monitor.trainer.algorithms import get_algorithm

    config = run["config"]
    if (config.get("ctn") or get_algorithm(config["algo"]).default_ctn) == "auto":
        return None
    algo = config["algo"] + ("_nodc" if config.get("dual_clip") is None else "")
    reuse = f"{config['epochs']}x{config['minibatches']}"
    anneal = "-anneal" if config.get("anneal_lr") else ""
    return f"{setting_name(algo, reuse, config['staleness'], config['lr'])}{anneal}-s{config['seed']}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="folders of collapse_sweep runs")
    parser.add_argument("--out", type=Path, required=True, help="where the compact copies go")
    args = parser.parse_args(argv)
    missing = [str(f) for f in args.folders if not f.is_dir()]
    if missing:
        print(f"error: not a folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    for folder in args.folders:
        written = export(folder, args.out, corpus_name)
        print(f"{folder}: {len(written)} runs → {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
