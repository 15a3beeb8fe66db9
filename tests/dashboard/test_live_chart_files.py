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


def test_each_bundle_has_its_own_served_folder_and_the_basic_one_is_smaller(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(live_chart.BUNDLE_ENV, raising=False)
    basic, cartesian = live_chart._bundle("basic"), live_chart._bundle("cartesian")
    assert basic.name == "plotly-basic.min.js" and cartesian.name == "plotly-cartesian.min.js"
    assert basic.stat().st_size < 0.85 * cartesian.stat().st_size
    for path in (basic, cartesian):
        folder = Path(live_chart._served_folder(path))
        assert (folder / "plotly.min.js").read_bytes() == path.read_bytes()
        assert gzip.decompress((folder / "plotly.min.js.gz").read_bytes()) == path.read_bytes()
    assert live_chart._served_folder(basic) != live_chart._served_folder(cartesian)
    for name in ("basic", "cartesian"):  # the vendored bundles say which package and version they are
        head = live_chart._bundle(name).read_text()[:200]
        assert f"plotly.js ({name} - minified) v4.1.1" in head and "MIT" in head


def test_a_figure_goes_to_the_basic_bundle_only_when_it_draws_every_trace(monkeypatch):
    assert live_chart.basic_enough(["scatter", "scatter", "bar"])
    assert not live_chart.basic_enough(["scatter", "heatmap"])
    assert not live_chart.basic_enough(["box"])
    monkeypatch.setenv(live_chart.BUNDLE_ENV, "cartesian")
    assert live_chart._bundle("basic").name == "plotly-cartesian.min.js"
    monkeypatch.setenv(live_chart.BUNDLE_ENV, "full")
    assert live_chart._bundle("basic") == live_chart._bundle("cartesian") == live_chart._FULL_JS
