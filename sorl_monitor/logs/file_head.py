"""Looking at the start of a file, without reading it all: what kind of text it is and its first record."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sorl_monitor.logs.input_limits import json_loads

HEAD_BYTES = 1 << 16


def head(path: Path, size: int = HEAD_BYTES) -> bytes:
    """The first ``size`` bytes of a file (``b""`` if it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(size)
    except OSError:
        return b""


def text_kind(start: bytes) -> str | None:
    """``json`` (one JSON document: ``[`` or a multi-line ``{``), ``jsonl`` (a JSON object on the first line),
    ``csv`` (a header line with a comma), or ``None`` (binary or anything else)."""
    if b"\0" in start:
        return None
    try:
        text = start.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = start[: start.rfind(b"\n") + 1].decode("utf-8-sig", errors="replace")
    stripped = text.lstrip()
    if stripped.startswith("["):
        return "json"
    if stripped.startswith("{"):
        return "jsonl" if isinstance(first_json_line(start), dict) else "json"
    first_line = text.split("\n", 1)[0]
    return "csv" if "," in first_line else None


def first_json_line(start: bytes) -> Any:
    """The first non-blank line parsed as JSON, or ``None``."""
    for line in start.split(b"\n"):
        if line.strip():
            try:
                return json_loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError):
                return None
    return None


def first_list_item(start: bytes) -> Any:
    """The first element of a JSON list that starts within ``start``, or ``None``."""
    text = start.decode("utf-8-sig", errors="replace").lstrip()[1:].lstrip()
    try:
        return json.JSONDecoder().raw_decode(text)[0]
    except (json.JSONDecodeError, RecursionError):
        return None


def csv_header(start: bytes) -> list[str]:
    """The cells of a CSV file's first line."""
    lines = start.decode("utf-8-sig", errors="replace").splitlines()  # at \n and \r: a bar's redraws too
    return next(csv.reader(io.StringIO(lines[0] if lines else "")), [])


def complete_lines(path: Path, last_line_complete: Callable[[bytes], bool]) -> bytes:
    """A text file's content, without a last line that has no newline yet unless ``last_line_complete`` says it
    is whole (a file still being written ends in half a line; a finished one may just lack the newline)."""
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1
    if cut == len(data) or last_line_complete(data[cut:]):
        return data
    return data[:cut]
