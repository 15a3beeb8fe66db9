"""A plotly chart that redraws in place, so a live update keeps the viewer's zoom and legend choices.

``st.plotly_chart`` gives its element an identity made of the figure itself: each live update mounts a
new chart and the zoom resets. This component keeps one chart per key and hands it each new figure;
its page (``index.html``) calls ``Plotly.react``, which keeps what the viewer changed while the
figure's ``uirevision`` stays the same. Streamlit serves a component's folder as it is, so the folder
served holds a copy of ``index.html`` beside plotly.js (``_PLOTLY_JS``; it works offline), in the user's
cache folder, named after both so every server reuses it. plotly.js is there twice: gzipped once
(``plotly.min.js.gz``, which Streamlit serves as it is and the page unzips) and plain (for a browser that
cannot unzip a stream): Streamlit gzips any other component file again on every request, 0.15–0.2 s of a
core for plotly.js's 1.5 MB, on the path of every first paint.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import plotly
import streamlit.components.v1 as components

_PAGE = Path(__file__).with_name("index.html")
BUNDLE_ENV = "SORL_DASHBOARD_PLOTLY_BUNDLE"
"""``full`` serves plotly's whole plotly.js (4.8 MB) instead of the cartesian bundle (for benchmarks)."""
_CARTESIAN_JS = Path(__file__).with_name("plotly-cartesian.min.js")
_FULL_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
_PLOTLY_JS = _FULL_JS if os.environ.get(BUNDLE_ENV) == "full" or not _CARTESIAN_JS.exists() else _CARTESIAN_JS
"""plotly.js as the chart's page loads it: the cartesian bundle shipped here (plotly.js-cartesian-dist-min
4.1.1, MIT, ``LICENSE-plotly.txt``: scatter, heatmap, box, … — every trace the figures draw; 1.5 MB, so a
first visit parses a third of the full bundle), else the full one that ships with plotly."""


def _served_folder() -> str:
    digest = hashlib.sha256(_PAGE.read_bytes() + _PLOTLY_JS.name.encode() + plotly.__version__.encode())
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
    shutil.copyfile(_PLOTLY_JS, staging / "plotly.min.js")
    (staging / "plotly.min.js.gz").write_bytes(gzip.compress(_PLOTLY_JS.read_bytes(), 9, mtime=0))
    if staging != folder:
        try:
            staging.rename(folder)
        except OSError:  # another server made it meanwhile
            shutil.rmtree(staging, ignore_errors=True)
    return str(folder)


_component = components.declare_component("live_chart", path=_served_folder())


def live_chart(spec: str, key: str, revision: int = 0) -> None:
    """Draw the plotly figure ``spec`` (``Figure.to_json()``) in the chart called ``key``; ``revision``
    (the data's version) is kept on the chart element for tests that wait for a redraw."""
    _component(spec=spec, revision=revision, key=key, default=None)
