"""What the console-log readers share: the text of a captured console, lines as a terminal would show them.

A captured console holds ANSI colour codes (Ray colours its ``(TaskRunner pid=…)`` prefixes), carriage
returns (tqdm redraws its bar in place with ``\\r``) and lines of anything else; ``console_lines`` gives the
text with colour codes removed, split at ``\\n`` and ``\\r``.
"""

from __future__ import annotations

import re
from pathlib import Path

from sorl_monitor.logs.file_head import head

ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")
"""An ANSI control sequence (colour, cursor movement): ESC ``[``, parameters, one final byte."""
SCAN_BYTES = 1 << 20
"""How far into a text file detection looks for a console log's first metrics line (configuration dumps and
model-loading messages come first)."""


def console_text(data: bytes) -> str:
    """``data`` as text, ANSI sequences and NUL bytes removed (bytes that are not UTF-8 replaced): a NUL from a
    crash, or a stretch a tool wrote as UTF-16, costs nothing but those bytes."""
    return ANSI.sub(b"", data.replace(b"\0", b"")).decode("utf-8", errors="replace")


def console_lines(data: bytes) -> list[str]:
    """The lines of a captured console, split at ``\\n``, ``\\r\\n`` and lone ``\\r`` (tqdm's redraws)."""
    return re.split(r"\r\n|\r|\n", console_text(data))


TEXT_SHARE = 0.95
"""A head with NUL bytes is text when, without them, at least this share of it is printable (a UTF-16 stretch
or a stray NUL in a console log); else it is binary."""


def scan_head(path: Path) -> bytes:
    """The first ``SCAN_BYTES`` of a file without NUL bytes, or ``b""`` when it is not text (``TEXT_SHARE``)."""
    start = head(path, SCAN_BYTES)
    if b"\0" not in start:
        return start
    stripped = start.replace(b"\0", b"")
    text = stripped.decode("utf-8", errors="replace")
    printable = sum(ch.isprintable() or ch in "\n\r\t\x1b" for ch in text)
    return stripped if text and printable >= TEXT_SHARE * len(text) else b""
