"""A log holding more than one training session: a restart is a run of its own, a resume is stitched, two
runs written in turn are told apart, and a line cut short costs its last value, each with a warning naming
the file and the line (synthetic logs)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from sorl_monitor.logs import LogWarning, read_log


def verl_lines(steps, score, prefix="(TaskRunner pid=1) ") -> list[str]:
    return [
        f"{prefix}step:{s} - actor/entropy:0.5 - critic/score/mean:{score(s):.3f} - response_length/mean:100.0"
        for s in steps
    ]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def read_warned(path: Path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = read_log(path)
    return runs, [str(w.message) for w in caught if issubclass(w.category, LogWarning)]


def rewards(run) -> dict[int, float]:
    return {row["step"]: row["reward_mean"] for row in run.steps.to_pylist()}


def test_a_verl_console_restarted_from_step_one_is_two_runs(tmp_path):
    lines = (
        verl_lines(range(1, 141), lambda s: 0.5)
        + ["Traceback: CUDA error"]
        + verl_lines(range(1, 101), lambda s: 0.2, prefix="(TaskRunner pid=2) ")
    )
    runs, said = read_warned(write(tmp_path / "job.log", lines))
    assert [(r.run_id, r.steps.num_rows) for r in runs] == [("job+1", 140), ("job+2", 100)]
    assert set(rewards(runs[0]).values()) == {0.5} and set(rewards(runs[1]).values()) == {0.2}
    assert any("job.log" in w and "line 142" in w and "2 runs" in w for w in said), said


def test_a_resume_from_a_checkpoint_is_stitched_and_said(tmp_path):
    lines = verl_lines(range(1, 61), lambda s: 0.5) + verl_lines(range(41, 101), lambda s: 0.7)
    runs, said = read_warned(write(tmp_path / "job.log", lines))
    (run,) = runs
    got = rewards(run)
    assert sorted(got) == list(range(1, 101))
    assert got[40] == 0.5 and got[41] == 0.7 and got[60] == 0.7
    assert any("resumed at line 61 from step 41" in w and "20 earlier lines" in w for w in said), said


def test_two_jobs_writing_one_file_in_turn_are_two_runs(tmp_path):
    lines = [
        line
        for s in range(1, 101)
        for line in (*verl_lines([s], lambda _: 0.8), *verl_lines([s], lambda _: 0.1))
    ]
    runs, said = read_warned(write(tmp_path / "tee.log", lines))
    assert [r.steps.num_rows for r in runs] == [100, 100]
    assert set(rewards(runs[0]).values()) == {0.8} and set(rewards(runs[1]).values()) == {0.1}
    assert any("in turn" in w and "tee.log" in w for w in said), said


def test_a_value_cut_before_a_restart_is_left_out_not_read_as_zero(tmp_path):
    lines = verl_lines(range(1, 61), lambda s: 0.8)
    lines.append("(TaskRunner pid=1) step:61 - actor/entropy:0.5 - critic/score/mean:0")  # cut in 0.8
    lines += verl_lines(range(1, 50), lambda s: 0.3, prefix="(TaskRunner pid=2) ")
    runs, said = read_warned(write(tmp_path / "cut.log", lines))
    assert rewards(runs[0])[61] is None
    assert any("cut short" in w and "line 61" in w for w in said), said


def test_a_cut_line_with_the_restart_joined_to_it_gives_each_step_its_own_values(tmp_path):
    lines = verl_lines(range(1, 6), lambda s: 0.8)
    cut = verl_lines([6], lambda s: 0.8)[0].split(" - response_length")[0][:-2]  # "…score/mean:0."
    lines.append(cut + verl_lines([1], lambda s: 0.3, "(TaskRunner pid=2) ")[0])
    lines += verl_lines(range(2, 40), lambda s: 0.3, prefix="(TaskRunner pid=2) ")
    runs, _ = read_warned(write(tmp_path / "joined.log", lines))
    assert [r.steps.num_rows for r in runs] == [6, 39]
    assert rewards(runs[0])[6] is None and rewards(runs[1])[1] == 0.3


def test_a_step_beyond_64_bits_costs_its_line_only(tmp_path):
    lines = verl_lines(range(1, 30), lambda s: 0.5) + [f"step:{2**64} - critic/score/mean:0.5"]
    (run,), said = read_warned(write(tmp_path / "huge.log", lines))
    assert run.steps.num_rows == 29
    assert any("beyond 2^63" in w and "line 30" in w for w in said), said


def hf_dicts(count: int, reward: float, epoch_per_dict: float = 0.01) -> list[str]:
    return [
        str({"loss": 0.1, "reward": reward, "kl": 0.01, "epoch": round((k + 1) * epoch_per_dict, 4)})
        for k in range(count)
    ]


def test_a_trainer_console_started_again_is_two_runs(tmp_path):
    lines = [
        "logging_steps=10",
        *hf_dicts(120, 0.6),
        "  0%|          | 0/36000 [00:00<?, ?it/s]",
        *hf_dicts(99, 0.4),
    ]
    runs, said = read_warned(write(tmp_path / "trl.log", lines))
    assert [(r.run_id, r.steps.num_rows) for r in runs] == [("trl+1", 120), ("trl+2", 99)]
    assert max(runs[1].steps.column("step").to_pylist()) == 990  # not 2,190: its own numbering
    assert any("trl.log" in w and "line 123" in w for w in said), said


def test_a_trainer_console_printing_every_dict_twice_keeps_its_steps(tmp_path):
    lines = ["logging_steps=10", *[line for line in hf_dicts(50, 0.6) for line in (line, line)]]
    (run,), said = read_warned(write(tmp_path / "twice.log", lines))
    assert run.steps.num_rows == 50 and max(run.steps.column("step").to_pylist()) == 500
    assert any("printed twice" in w and "50 log dicts" in w for w in said), said


@pytest.mark.parametrize("kind", ["jsonl", "trainer_state"])
def test_structured_logs_restarted_in_one_file_are_two_runs(tmp_path, kind):
    rows = [{"step": s, "reward": 0.5, "loss": 0.1} for s in range(1, 41)]
    rows += [{"step": s, "reward": 0.2, "loss": 0.1} for s in range(1, 31)]
    if kind == "jsonl":
        path = write(tmp_path / "m.jsonl", [json.dumps(row) for row in rows])
    else:
        path = tmp_path / "trainer_state.json"
        path.write_text(json.dumps({"log_history": [{**row, "epoch": 0.1} for row in rows]}))
    runs, said = read_warned(path)
    assert [r.steps.num_rows for r in runs] == [40, 30]
    assert any("goes back" in w for w in said), said


# ------------------------------------------------------------------ one bad row costs one row (issue 44, item 8)
@pytest.mark.parametrize("bad", ['"27"', "27.5"])
def test_one_jsonl_row_with_a_text_or_fractional_step_costs_that_row(tmp_path, bad):
    lines = [json.dumps({"step": k, "reward": 0.5, "loss": 0.1}) for k in range(1, 41)]
    lines[26] = lines[26].replace('"step": 27', f'"step": {bad}')
    (run,), said = read_warned(write(tmp_path / "m.jsonl", lines))
    steps = run.steps.column("step").to_pylist()
    if bad == '"27"':  # text that is a whole number is that step
        assert steps == list(range(1, 41))
    else:  # guards against a cut line making the whole log unreadable
        assert 27 not in steps and run.steps.num_rows == 39
        assert any("m.jsonl" in w and "row 27" in w for w in said), said


@pytest.mark.parametrize("damage", ["nul", "utf16"])
def test_a_nul_byte_or_a_utf16_stretch_does_not_hide_a_console_log(tmp_path, damage):
    data = ("\n".join(verl_lines(range(1, 101), lambda s: 0.5)) + "\n").encode()
    cut = data.index(b"\n", 300) + 1
    extra = b"\0" if damage == "nul" else "note: written by another tool\n".encode("utf-16-le")
    path = tmp_path / "verl.log"
    path.write_bytes(data[:cut] + extra + data[cut:])
    (run,), _ = read_warned(path)  # guards against a merged log read as no format
    assert run.format == "verl-console" and run.steps.num_rows == 100


# ------------------------------------------------------------------------------- a wide line (issue 44, item 9)
def child_cost(path: Path) -> tuple[float, int]:
    """CPU seconds and peak resident kilobytes of ``sorl postmortem`` on ``path`` in a child process."""
    import resource
    import subprocess
    import sys

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code = "import sys; from cli.main import app; sys.argv = ['sorl', 'postmortem', sys.argv[1]]; app()"
    subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return cpu, after.ru_maxrss


@pytest.mark.slow
def test_a_line_of_60000_cells_costs_little_more_than_a_narrow_log(tmp_path, record_measurement):
    narrow = verl_lines(range(1, 51), lambda s: 0.5)
    wide = narrow[:-1] + ["step:50 - " + " - ".join(f"m/x{i}:{i * 0.001:.3f}" for i in range(60000))]
    narrow_cpu, narrow_kb = child_cost(write(tmp_path / "narrow.log", narrow))
    wide_path = write(tmp_path / "wide.log", wide)
    assert wide_path.stat().st_size > 1_000_000
    wide_cpu, wide_kb = child_cost(wide_path)
    record_measurement(narrow_cpu_s=round(narrow_cpu, 2), wide_cpu_s=round(wide_cpu, 2),
                       narrow_max_rss_mb=narrow_kb // 1024, wide_max_rss_mb=wide_kb // 1024)  # fmt: skip
    # guards against DuckDB reading all 60,000 columns: the run keeps 2,000 of them
    assert wide_cpu < 4 * narrow_cpu + 2, (wide_cpu, narrow_cpu)
    assert wide_kb - narrow_kb < 200 * 1024, (wide_kb, narrow_kb)
