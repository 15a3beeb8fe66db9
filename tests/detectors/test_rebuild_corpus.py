"""experiments/rebuild_corpus.py: how a corpus run is retrained (its commit's defaults) and compared."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))  # the script imports make_corpus beside it
spec = importlib.util.spec_from_file_location("rebuild_corpus", ROOT / "experiments" / "rebuild_corpus.py")
rebuild = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rebuild)
CORPUS = ROOT / "experiments" / "corpus"


def test_a_grid_run_gets_its_commits_defaults_and_its_own_fields_win(tmp_path):
    run = tmp_path / "so_ppo-r4x4-st0-lr1e-3-s1"
    run.mkdir()
    config = {"algo": "so_ppo", "epochs": 4, "minibatches": 4, "staleness": 0, "lr": 1e-3, "iterations": 80,
              "ctn": None, "seed": 1, "anneal_lr": True}  # fmt: skip
    (run / "run.json").write_text(
        json.dumps({"config": config, "made_by": "benchmarks/make_corpus.py @ a2fc0c8"})
    )
    out, setting, overrides, seed, iterations = rebuild.job_of(run, "out")
    assert (out, setting, seed, iterations) == ("out", "so_ppo-r4x4-st0-lr1e-3", 1, 80)
    assert (
        overrides["turn_ratio"] == "mean" and overrides["ctn_coef"] == 1.0 and overrides["dual_clip"] is None
    )
    assert overrides["anneal_lr"] is True  # the run's own field over the commit's default
    assert "seed" not in overrides and "iterations" not in overrides


def test_a_later_run_keeps_todays_defaults(tmp_path):
    run = tmp_path / "ppo-hot-t1.1-lr1e-3-s0"
    run.mkdir()
    config = {"algo": "ppo", "lr": 1e-3, "temperature": 1.1, "iterations": 80, "seed": 0}
    (run / "run.json").write_text(
        json.dumps({"config": config, "made_by": "benchmarks/make_corpus.py @ f878ed6"})
    )
    overrides = rebuild.job_of(run, "out")[2]
    assert overrides == {"algo": "ppo", "lr": 1e-3, "temperature": 1.1}


def test_a_run_matches_itself_and_not_another():
    one, other = CORPUS / "ppo-r1x4-st0-lr3e-4-s0", CORPUS / "ppo-r1x4-st0-lr3e-4-s1"
    assert rebuild.compare(one, one) == 0.0
    assert rebuild.compare(one, other) > rebuild.TOLERANCE
