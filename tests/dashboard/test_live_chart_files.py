"""The live chart's served folder: its page and plotly.js, gzipped once (served as it is, unzipped by the page)
and plain (the page's fallback)."""

from __future__ import annotations

import gzip
from pathlib import Path

from sorl_monitor.dashboard import live_chart


def test_the_served_folder_holds_the_page_and_plotly_js_plain_and_gzipped_alike(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = Path(live_chart._served_folder())
    assert folder.parent == tmp_path / "sorl-monitor"
    plain = (folder / "plotly.min.js").read_bytes()
    assert plain == live_chart._PLOTLY_JS.read_bytes()
    assert gzip.decompress((folder / "plotly.min.js.gz").read_bytes()) == plain
    page = (folder / "index.html").read_text()
    assert 'fetch("plotly.min.js.gz")' in page and 'source = "plotly.min.js"' in page
    assert live_chart._served_folder() == str(folder), "made once, then reused"
