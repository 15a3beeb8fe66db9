"""A fleet of thousands of runs made cheaply from the real sample runs, with the verdict table ``sorl fleet``
gives them: what ``benchmarks/bench_dashboard.py --fleet-runs`` measures, and the fleet the dashboard's tests
open (``tests/helpers/fleet_runs.py`` loads this file).

The sample runs (``sample_logs/``) are copied under the root and judged by the real ``sorl fleet``, which
writes ``ROOT/verdicts.parquet``. The other runs are *replicas*: run folders whose part files are hard
links to a sample run's (a ``run.json`` of their own names them ``<sample>-<i>``). Their rows still carry
the sample's run id, so ``sorl fleet`` would not judge them (the dashboard reads rows by run folder and
draws them); their verdict rows are their sample's row from the same ``sorl fleet``, under their own id and
path: the verdict of identical data.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from sorl_monitor.read.verdict_table import VERDICTS_FILE, read_verdicts, sorted_verdicts, write_verdicts

SAMPLE_LOGS = Path(__file__).resolve().parents[1] / "sample_logs"


def sample_runs() -> list[Path]:
    return sorted(p for p in SAMPLE_LOGS.iterdir() if (p / "run.json").is_file())


def make_fleet(root: Path, runs: int) -> Path:
    """``runs`` runs under ``root`` (the five sample runs, then replicas round robin) and their verdict table
    (``sorl fleet`` over the samples, a replica's row its sample's); ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    samples = sample_runs()
    for sample in samples:
        shutil.copytree(sample, root / sample.name)
    judge = [sys.executable, "-m", "sorl_monitor.cli.main", "fleet", str(root), "--jobs", "1"]
    done = subprocess.run(judge, capture_output=True, text=True, timeout=600)
    if done.returncode not in (0, 3):  # 3: some run collapsed
        raise RuntimeError(f"sorl fleet failed ({done.returncode}): {done.stderr[-2000:]}")
    judged = read_verdicts(root)
    assert judged is not None
    rows = judged.to_pylist()
    by_sample = {row["run_id"]: row for row in rows}
    for i in range(runs - len(samples)):
        sample = samples[i % len(samples)]
        run_id = f"{sample.name}-{i:05d}"
        replicate(sample, root / run_id, run_id)
        rows.append({**by_sample[sample.name], "run_id": run_id, "path": str((root / run_id).resolve())})
    write_verdicts(sorted_verdicts(pa.Table.from_pylist(rows, schema=judged.schema)), root / VERDICTS_FILE)
    return root


def replicate(sample: Path, target: Path, run_id: str) -> None:
    """``sample`` as a run called ``run_id`` at ``target``: its parts hard-linked, its ``run.json`` renamed."""
    for file in sample.rglob("*"):
        if file.is_dir():
            continue
        copy = target / file.relative_to(sample)
        copy.parent.mkdir(parents=True, exist_ok=True)
        if file.name == "run.json":
            copy.write_text(json.dumps({**json.loads(file.read_text()), "run_id": run_id}))
        else:
            os.link(file, copy)
