"""A plotly chart that redraws in place, so a live update keeps the viewer's zoom and legend choices.

``st.plotly_chart`` gives its element an identity made of the figure itself: each live update mounts a
new chart and the zoom resets. This component keeps one chart per key and hands it each new figure;
its page (``index.html``) calls ``Plotly.react``, which keeps what the viewer changed while the
figure's ``uirevision`` stays the same. Streamlit serves a component's folder as it is, so the folder
served is a private copy of ``index.html`` beside the plotly.js that ships with plotly (offline).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import plotly
import streamlit.components.v1 as components

_PAGE = Path(__file__).with_name("index.html")
_PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def _served_folder() -> str:
    folder = Path(tempfile.mkdtemp(prefix="sorl-live-chart-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    shutil.copyfile(_PAGE, folder / "index.html")
    shutil.copyfile(_PLOTLY_JS, folder / "plotly.min.js")
    return str(folder)


_component = components.declare_component("live_chart", path=_served_folder())


def live_chart(spec: str, key: str, revision: int = 0) -> None:
    """Draw the plotly figure ``spec`` (``Figure.to_json()``) in the chart called ``key``; ``revision``
    (the data's version) is kept on the chart element for tests that wait for a redraw."""
    _component(spec=spec, revision=revision, key=key, default=None)
