"""What the console-log readers share: the text of a captured console, lines as a terminal would show them.

A captured console holds ANSI colour codes (Ray colours its ``(TaskRunner pid=…)`` prefixes), carriage
returns (tqdm redraws its bar in place with ``\\r``) and lines of anything else; ``console_lines`` gives the
text with colour codes removed, split at ``\\n`` and ``\\r``.
"""

from __future__ import annotations

import re
from pathlib import Path

from sorl_monitor.logs.sniff import head

ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")
"""An ANSI control sequence (colour, cursor movement): ESC ``[``, parameters, one final byte."""
SCAN_BYTES = 1 << 20
"""How far into a text file detection looks for a console log's first metrics line (configuration dumps and
model-loading messages come first)."""


def console_text(data: bytes) -> str:
    """``data`` as text, ANSI sequences removed (bytes that are not UTF-8 replaced)."""
    return ANSI.sub(b"", data).decode("utf-8", errors="replace")


def console_lines(data: bytes) -> list[str]:
    """The lines of a captured console, split at ``\\n``, ``\\r\\n`` and lone ``\\r`` (tqdm's redraws)."""
    return re.split(r"\r\n|\r|\n", console_text(data))


def scan_head(path: Path) -> bytes:
    """The first ``SCAN_BYTES`` of a file, or ``b""`` when it is not text (a NUL byte in it)."""
    start = head(path, SCAN_BYTES)
    return b"" if b"\0" in start else start
