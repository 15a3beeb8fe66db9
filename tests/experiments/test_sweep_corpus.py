"""experiments/sweep_corpus.py: the collapse sweep's open-loop runs copied as corpus runs named after their
setting, auto-CTN runs left out; on SYNTHETIC runs logged through the real Monitor."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from sorl_monitor import WriterConfig
from sorl_monitor.read.query import open_runs
from sorl_monitor.write.monitor import Monitor
from tests.helpers.synthetic import KEYS, stable_rows

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("sweep_corpus", ROOT / "experiments" / "sweep_corpus.py")
sweep_corpus = importlib.util.module_from_spec(spec)
sys.modules["sweep_corpus"] = sweep_corpus
spec.loader.exec_module(sweep_corpus)

DEFAULTS = {"epochs": 8, "minibatches": 4, "staleness": 4, "lr": 5e-4, "dual_clip": 3.0, "ctn": None}


def sweep_run(log_dir: Path, name: str, **config) -> None:
    """One SYNTHETIC sweep run: stable rows and a trainer config in run.json."""
    with Monitor(log_dir, name, config={**DEFAULTS, **config}, algorithm=config["algo"],
                 writer=WriterConfig(flush_interval_s=0.05)) as mon:  # fmt: skip
        for row in stable_rows(40):
            mon.log_scalars(row["step"], {k: v for k, v in row.items() if k not in KEYS},
                            iteration=row["iteration"], names=None)  # fmt: skip


def test_corpus_name_is_the_setting_and_seed_and_none_for_auto_ctn():
    name = sweep_corpus.corpus_name
    row = lambda **c: {"config": {**DEFAULTS, "seed": 10, **c}}  # noqa: E731
    assert name(row(algo="ppo")) == "ppo-r8x4-st4-lr5e-4-s10"
    assert name(row(algo="ppo", dual_clip=None)) == "ppo_nodc-r8x4-st4-lr5e-4-s10"
    assert name(row(algo="so_ppo", staleness=8, lr=3e-4)) == "so_ppo-r8x4-st8-lr3e-4-s10"
    assert name(row(algo="ppo", anneal_lr=True)) == "ppo-r8x4-st4-lr5e-4-anneal-s10"
    assert name(row(algo="ppo", ctn="auto")) is None
    assert name(row(algo="so_ppo", ctn="auto")) is None
    assert name(row(algo="so_ppo", ctn="off")) == "so_ppo-r8x4-st4-lr5e-4-s10"


def test_cli_copies_open_loop_runs_under_their_setting_names_and_skips_auto(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep_run(sweep, "ppo-s10", algo="ppo", seed=10)
    sweep_run(sweep, "ppo-auto-s10", algo="ppo", seed=10, ctn="auto")
    out = tmp_path / "corpus"
    assert sweep_corpus.main([str(sweep), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["ppo-r8x4-st4-lr5e-4-s10"]
    info = json.loads((out / "ppo-r8x4-st4-lr5e-4-s10" / "run.json").read_text())
    assert info["setting"] == "ppo-r8x4-st4-lr5e-4" and info["config"]["epochs"] == 8
    with open_runs(out) as runs:
        ids = runs.sql("SELECT DISTINCT run_id FROM steps").column(0).to_pylist()
        count = runs.sql("SELECT count(*) FROM steps").column(0).to_pylist()[0]
    assert ids == ["ppo-r8x4-st4-lr5e-4-s10"] and count == 40
    assert sweep_corpus.main([str(sweep), "--out", str(out)]) == 0  # already there: nothing rewritten
    assert "0 runs" in capsys.readouterr().out.splitlines()[-1]


def test_cli_bad_folder_is_one_line_and_exit_2(tmp_path, capsys):
    assert sweep_corpus.main([str(tmp_path / "missing"), "--out", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err.startswith("error: not a folder")
