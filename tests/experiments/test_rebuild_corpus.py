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


def test_added_columns_join_on_the_step_and_leave_the_copy_as_it_was(tmp_path):
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    copy = tmp_path / "copy"
    shutil.copytree(CORPUS / "ppo-r1x4-st0-lr3e-4-s0", copy)
    (part,) = (copy / "steps").glob("*/*.parquet")
    before = pq.read_table(part).drop_columns(["clip_frac_active"])
    pq.write_table(before, part)
    steps = before.column("step").to_pylist()
    rebuilt = tmp_path / "rebuilt" / "steps" / "rank=0"
    rebuilt.mkdir(parents=True)
    reversed_steps = steps[::-1]  # another row order: the join is on the step
    pq.write_table(pa.table({"step": reversed_steps, "clip_frac_active": [s / 1000 for s in reversed_steps],
                             "value_mean": [1.0] * len(steps)}), rebuilt / "part-0.parquet")  # fmt: skip
    assert rebuild.add_columns(copy, tmp_path / "rebuilt", ["clip_frac_active"]) == ["clip_frac_active"]
    after = pq.read_table(part)
    assert after.drop_columns(["clip_frac_active"]).equals(before)
    assert after.schema.field("clip_frac_active").type == pa.float32()
    assert after.column("clip_frac_active").to_pylist() == [
        float(pa.scalar(s / 1000, pa.float32()).as_py()) for s in steps
    ]
    assert rebuild.add_columns(copy, tmp_path / "rebuilt", ["clip_frac_active"]) == []  # already there
