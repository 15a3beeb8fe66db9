"""Checks every reader runs before trusting a file or a path: JSON nesting, path lengths, one cell's number.

A JSON line nested 30,000 levels deep crashes pyarrow's JSON reader (a segmentation fault) and makes
Python's ``json`` raise ``RecursionError``; a path with a component over 255 bytes makes every ``open``
raise ``OSError`` (errno 36). These guards turn each into an error of that value, in one line:

    json_loads(line)            # json.loads, but JSONDecodeError (JsonTooDeep) past MAX_JSON_DEPTH levels
    too_deep_lines(data)        # line numbers of a JSON-lines text nested past MAX_JSON_DEPTH
    check_path(path)            # ValueError naming the component over NAME_MAX bytes
    parse_number(text)          # float, or None for text that is no number (a cell's value, never the file's)
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

MAX_JSON_DEPTH = 200
"""Deepest nesting of arrays and objects read (a metric log needs < 10; Python's ``json`` fails near 1,000
less the caller's stack, pyarrow's reader crashes between 10,000 and 30,000)."""
NAME_MAX = 255
"""Longest path component, in bytes, that Linux and macOS file systems take."""
PATH_MAX = 4096
"""Longest path, in bytes, that Linux takes."""

_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKETS = b"[]{}"
_STEP = bytes.maketrans(_BRACKETS, b"\x01\xff\x01\xff")  # opening +1, closing -1 (as int8)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)


class JsonTooDeep(json.JSONDecodeError):
    """JSON nested deeper than ``MAX_JSON_DEPTH``: a ``JSONDecodeError`` so every reader's handler takes it."""

    def __init__(self, depth: int, limit: int) -> None:
        message = f"nested {depth} levels deep (at most {limit} are read)"
        super().__init__(message, "", 0)
        self.args = (message,)  # one line, without JSONDecodeError's "line 1 column 1 (char 0)"


def _as_bytes(data: bytes | bytearray | memoryview | str) -> bytes:
    return data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)


def json_depth(data: bytes | str) -> int:
    """The deepest nesting of ``[`` and ``{`` in a JSON text, brackets inside strings not counted (for a text
    with fewer opening brackets than ``MAX_JSON_DEPTH``, their count: a bound that is cheap to take)."""
    raw = _as_bytes(data)
    openers = raw.count(b"[") + raw.count(b"{")
    if openers <= MAX_JSON_DEPTH:
        return openers
    steps = np.frombuffer(_STRINGS.sub(b"", raw).translate(_STEP, _NOT_BRACKETS), np.int8)
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


def json_loads(data: bytes | str) -> Any:
    """``json.loads(data)``, refusing (``JsonTooDeep``) a text nested deeper than ``MAX_JSON_DEPTH``."""
    depth = json_depth(data)
    if depth > MAX_JSON_DEPTH:
        raise JsonTooDeep(depth, MAX_JSON_DEPTH)
    return json.loads(data)


def too_deep_lines(data: bytes) -> list[int]:
    """The 1-based numbers of the lines of a JSON-lines text nested deeper than ``MAX_JSON_DEPTH``."""
    if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH:
        return []
    return [
        number
        for number, line in enumerate(data.split(b"\n"), 1)
        if line.count(b"[") + line.count(b"{") > MAX_JSON_DEPTH and json_depth(line) > MAX_JSON_DEPTH
    ]


def check_path(path: str | os.PathLike[str]) -> None:
    """``ValueError`` (one line) for a path no file system takes: a component over ``NAME_MAX`` bytes, the
    whole over ``PATH_MAX`` bytes, or a NUL byte."""
    raw = os.fsencode(path)
    if b"\0" in raw:
        raise ValueError("a path holds a NUL byte")
    if len(raw) > PATH_MAX:
        raise ValueError(f"path too long: {len(raw)} bytes (at most {PATH_MAX}): {_shown(raw)}")
    for part in Path(os.fsdecode(raw)).parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise ValueError(
                f"file name too long: {len(os.fsencode(part))} bytes (at most {NAME_MAX}): {_shown(raw)}"
            )


def _shown(raw: bytes, width: int = 60) -> str:
    text = os.fsdecode(raw)
    return text if len(text) <= width else f"{text[: width // 2]}…{text[-width // 2 :]}"


def parse_number(text: str) -> float | None:
    """A cell's text as a number (``nan``, ``inf`` and integers beyond 64 bits included), or None."""
    try:
        return float(text)
    except (ValueError, OverflowError):
        return None
