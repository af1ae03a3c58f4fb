"""``PlotlyChart``: a plotly figure as a small anywidget, the views' one way to show a chart.

Why not ``go.FigureWidget``, which drew blank charts about one time in four: its ``_esm`` is a
5 MB bundle (plotly.js inside) sent and evaluated once per chart, and it sends the figure as
updates *after* the widget is opened. anywidget gives each model 2 s to load its ESM and,
past that, silently drops every later message for the model, so a slow load (a busy kernel
machine) left empty axes for good; in a test that delays large scripts by 2.5 s, 15 of 15
FigureWidgets drew blank and 0 of 15 of these. Here the ESM is a few KB, the figure is in the
widget's opening state, and plotly.js (the copy plotly ships, no CDN) reaches the page once
per kernel through one shared, view-less ``PlotlyJS`` model. A chart in a hidden tab draws
when the tab opens, at the tab's width."""
from __future__ import annotations

import pathlib

import anywidget
import ipywidgets
import traitlets

ESM = pathlib.Path(__file__).with_name("chart.js").read_text(encoding="utf-8")  # text: canvas.py
CSS = ".tl-plotly { width: 100%; }\n"


class PlotlyJS(ipywidgets.Widget):
    """plotly.min.js as one binary buffer; no view. One per kernel (``plotly_js()``), shared
    by every chart: closing a view leaves it open (``base.close_tree``)."""

    shared = True

    source = traitlets.Bytes(b"").tag(sync=True)
    version = traitlets.Unicode("").tag(sync=True)


_LOADER: list[PlotlyJS] = []    # the kernel's one loader, made on first use


def plotly_js() -> PlotlyJS:
    if not _LOADER or _LOADER[0].comm is None:   # closed (Widget.close_all()): a new one
        import plotly
        from plotly.offline import get_plotlyjs

        _LOADER[:] = [PlotlyJS(source=get_plotlyjs().encode(), version=plotly.__version__)]
    return _LOADER[0]


def figure_json(fig) -> str:
    import plotly.io as pio

    return pio.to_json(fig, validate=False, remove_uids=False)


class PlotlyChart(anywidget.AnyWidget):
    """``figure``: a ``go.Figure`` (or dict); assigning a new one redraws in place.
    ``on_click(callback, trace=None)``: ``callback(trace, points, state)`` like plotly's
    ``trace.on_click`` (``points.point_inds``, ``.xs``, ``.ys``, ``.trace_index``)."""

    _esm = ESM
    _css = CSS
    figure_json = traitlets.Unicode("{}").tag(sync=True)
    config = traitlets.Dict({}).tag(sync=True)
    loader = traitlets.Instance(PlotlyJS).tag(sync=True, **ipywidgets.widget_serialization)

    def __init__(self, fig=None, css_class: str = "", **kwargs):
        import plotly.graph_objects as go

        self._figure = go.Figure(fig) if fig is not None else go.Figure()
        kwargs.setdefault("figure_json", figure_json(self._figure))   # in the comm_open state
        kwargs.setdefault("loader", plotly_js())
        if css_class:
            kwargs.setdefault("_dom_classes", (css_class,))
        super().__init__(**kwargs)
        self._click_callbacks: list = []
        self.on_msg(self._on_msg)

    @property
    def figure(self):
        return self._figure

    @figure.setter
    def figure(self, fig):
        import plotly.graph_objects as go

        self._figure = go.Figure(fig)
        self.figure_json = figure_json(self._figure)

    def on_click(self, callback, trace: int | None = None):
        """Call ``callback(trace, points, state)`` for clicks on trace index ``trace`` (negative
        counts from the end; None: any trace)."""
        self._click_callbacks.append((callback, trace))

    def _on_msg(self, _widget, content, _buffers):
        if not isinstance(content, dict) or content.get("event") != "click":
            return
        from plotly.callbacks import Points

        by_trace: dict[int, list] = {}
        for p in content.get("points", []):
            by_trace.setdefault(int(p["curve"]), []).append(p)
        data = self._figure.data
        for k, pts in by_trace.items():
            if not 0 <= k < len(data):
                continue
            points = Points(point_inds=[p["point"] for p in pts], xs=[p.get("x") for p in pts],
                            ys=[p.get("y") for p in pts], trace_name=data[k].name,
                            trace_index=k)
            for callback, want in self._click_callbacks:
                if want is None or want % len(data) == k:
                    callback(data[k], points, None)
