"""A plotly chart that redraws in place, so a live update keeps the viewer's zoom and legend choices.

``st.plotly_chart`` gives its element an identity made of the figure itself: each live update mounts a
new chart and the zoom resets. This component keeps one chart per key and hands it each new figure;
its page (``index.html``) calls ``Plotly.react``, which keeps what the viewer changed while the
figure's ``uirevision`` stays the same. Streamlit serves a component's folder as it is, so the folder
served holds a copy of ``index.html`` beside plotly.js (it works offline), in the user's cache folder,
named after both so every server reuses it. plotly.js is there twice: gzipped once (``plotly.min.js.gz``,
which Streamlit serves as it is and the page unzips) and plain (for a browser that cannot unzip a stream):
Streamlit gzips any other component file again on every request, plotly.js's 1.5 MB included, on the path of
every first paint.

Two bundles, two components (one served folder each): a figure whose traces are all in ``BASIC_TRACES``
(the overview, the gradients) is drawn by the chart that loads the basic bundle (1.2 MB to parse on a
first visit), any other (the turn heatmap, boxes) by the one that loads the cartesian bundle (1.5 MB).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import plotly
import streamlit.components.v1 as components

_PAGE = Path(__file__).with_name("index.html")
BUNDLE_ENV = "SORL_DASHBOARD_PLOTLY_BUNDLE"
"""``full`` serves plotly's whole plotly.js (4.8 MB) to every chart; ``cartesian`` the cartesian bundle to
every chart (no basic bundle); unset: each figure's smallest bundle (for benchmarks)."""
_BASIC_JS = Path(__file__).with_name("plotly-basic.min.js")
"""plotly.js-basic-dist-min 4.1.1 (npm, MIT, ``LICENSE-plotly.txt``): scatter, bar, pie."""
_CARTESIAN_JS = Path(__file__).with_name("plotly-cartesian.min.js")
"""plotly.js-cartesian-dist-min 4.1.1 (npm, MIT, ``LICENSE-plotly.txt``): scatter, heatmap, box, histograms, …"""
_FULL_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
BASIC_TRACES = frozenset({"scatter", "bar", "pie"})
"""The trace types the basic bundle draws."""


def _bundle(name: str) -> Path:
    """The plotly.js file served for the bundle ``name`` (``basic``, ``cartesian``), as ``BUNDLE_ENV`` says."""
    wanted = os.environ.get(BUNDLE_ENV)
    if wanted == "full":
        return _FULL_JS
    path = _CARTESIAN_JS if wanted == "cartesian" or name == "cartesian" else _BASIC_JS
    return path if path.exists() else _FULL_JS


_PLOTLY_JS = _bundle("cartesian")
"""plotly.js as the chart of any figure loads it (the turn heatmap's): the cartesian bundle shipped here."""


def _served_folder(plotly_js: Path = _PLOTLY_JS) -> str:
    digest = hashlib.sha256(_PAGE.read_bytes() + plotly_js.name.encode() + plotly.__version__.encode())
    digest = digest.hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sorl-monitor"
    folder = cache / f"live-chart-{digest}"
    if (folder / "plotly.min.js.gz").exists():
        return str(folder)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="live-chart-", dir=cache))
    except OSError:  # no writable cache folder: a private one for this process
        staging = folder = Path(tempfile.mkdtemp(prefix="sorl-live-chart-"))
    shutil.copyfile(_PAGE, staging / "index.html")
    shutil.copyfile(plotly_js, staging / "plotly.min.js")
    (staging / "plotly.min.js.gz").write_bytes(gzip.compress(plotly_js.read_bytes(), 9, mtime=0))
    if staging != folder:
        try:
            staging.rename(folder)
        except OSError:  # another server made it meanwhile
            shutil.rmtree(staging, ignore_errors=True)
    return str(folder)


_component = components.declare_component("live_chart", path=_served_folder())
_basic_component = components.declare_component("live_chart_basic", path=_served_folder(_bundle("basic")))


def basic_enough(trace_types: Iterable[str]) -> bool:
    """Whether the basic bundle draws every trace type of a figure (``scatter`` when a trace names none)."""
    return set(trace_types) <= BASIC_TRACES


def live_chart(spec: str, key: str, revision: int = 0, basic: bool = False) -> bool:
    """Draw the plotly figure ``spec`` (``Figure.to_json()``) in the chart called ``key``; ``revision``
    (the data's version) is kept on the chart element for tests that wait for a redraw. ``basic``: the
    figure's traces are all ``BASIC_TRACES`` (``basic_enough``), so its chart loads the smaller bundle; a
    key keeps one of the two (its chart is mounted again if it changes). True once the browser has drawn
    the chart (its page sends that once, after its first draw: a rerun of the fragment that holds it)."""
    component = _basic_component if basic else _component
    return bool(component(spec=spec, revision=revision, key=key, default=False))
