"""One bad value or file costs that value or file, never the log or the folder (issue 27, item 6): a cell
that is no number, a verl step beyond 64 bits, a file that does not read beside others. Values synthetic."""

from __future__ import annotations

import json
import struct

import pytest

from sorl_monitor.logs import LogWarning
from sorl_monitor.read.query import CorruptPartWarning, QueryError, open_runs

ROWS = [{"step": step, "loss": 0.5, "reward": 0.1} for step in range(6)]


def with_bad_loss(text: str) -> list[dict]:
    return [{**row, "loss": text} if row["step"] == 3 else row for row in ROWS]


@pytest.mark.parametrize("bad", ["N/A", "oops"])
@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_a_cell_that_is_no_number_is_null_with_one_warning_naming_file_and_step(tmp_path, kind, bad):
    rows = with_bad_loss(bad)
    log = tmp_path / f"log.{kind}"
    if kind == "jsonl":
        log.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        log.write_text(
            "step,loss,reward\n" + "".join(f"{r['step']},{r['loss']},{r['reward']}\n" for r in rows)
        )
    with pytest.warns(
        LogWarning, match=rf"{log}: 1 cells of loss are not numbers, read as null \(first: step 3"
    ):
        with open_runs(log) as runs:
            losses = runs.sql("SELECT loss FROM steps ORDER BY step").column("loss").to_pylist()
    assert losses == [0.5, 0.5, 0.5, None, 0.5, 0.5]  # guards against one bad value failing the whole log


def test_a_verl_step_beyond_64_bits_leaves_out_that_line_in_place(tmp_path):
    log = tmp_path / "verl.jsonl"
    steps = [1, 2**63, 3]
    log.write_text("".join(json.dumps({"step": s, "data": {"actor/pg_loss": 0.1}}) + "\n" for s in steps))
    with pytest.warns(LogWarning, match=r"verl.jsonl: 1 rows with a step that is not a 64-bit whole number"):
        with open_runs(log, "verl") as runs:
            assert runs.sql("SELECT step FROM steps ORDER BY step").column("step").to_pylist() == [1, 3]


def foreign_tfrecord(path):
    """A TFRecord file with valid framing whose record is not a TensorBoard ``Event``."""
    masked_crc32c = pytest.importorskip("tensorboard.compat.tensorflow_stub.pywrap_tensorflow").masked_crc32c
    payload = b"\xff\xff\xff\xff"
    header = struct.pack("<Q", len(payload))
    path.write_bytes(
        header
        + struct.pack("<I", masked_crc32c(header))
        + payload
        + struct.pack("<I", masked_crc32c(payload))
    )


def test_one_bad_log_in_a_folder_is_skipped_with_a_warning_and_the_rest_read(tmp_path):
    (tmp_path / "good.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    (tmp_path / "sub").mkdir()
    foreign_tfrecord(tmp_path / "sub" / "events.out.tfevents.1.host")
    with pytest.warns(CorruptPartWarning, match=r"skipping .*sub.*: .* is not a TensorBoard event file"):
        with open_runs(tmp_path) as runs:
            assert (
                runs.sql("SELECT count(*) AS n FROM steps").column("n")[0].as_py() == 6
            )  # guards against one bad file failing the tree


def test_a_bad_log_named_by_its_own_path_is_still_an_error(tmp_path):
    foreign_tfrecord(tmp_path / "events.out.tfevents.1.host")
    with pytest.raises(QueryError, match="is not a TensorBoard event file"):
        open_runs(tmp_path / "events.out.tfevents.1.host")
