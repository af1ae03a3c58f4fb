"""Building blocks shared by the views: a VBox that also carries static HTML (shown by
nbconvert and GitHub, which cannot run widgets), a slot that shows a plotly figure as a
``FigureWidget``, and a graph panel that draws an SDG as SVG or, without ``dot``, as plotly."""
from __future__ import annotations

import html

from . import graph as G


def _ipywidgets():
    import ipywidgets

    return ipywidgets


def stage_view(children, static_html: str, css_class: str):
    """A VBox of ``children`` whose MIME bundle also has ``text/html``: a live kernel renders
    the widget, a static renderer falls back to ``static_html``."""
    W = _ipywidgets()

    class StageView(W.VBox):
        def _repr_mimebundle_(self, **kwargs):
            bundle = super()._repr_mimebundle_(**kwargs) or {}
            if isinstance(bundle, tuple):
                bundle = bundle[0]
            bundle = dict(bundle)
            bundle["text/html"] = self.static_html
            return bundle

    box = StageView(list(children))
    box.static_html = static_html
    box.add_class("tempo-lab-explore")
    box.add_class(css_class)
    return box


def static_html(stage, svg: str | None = None) -> str:
    """The static form of a view: the graph picture (if any) above the stage's sections."""
    return (G.svg_html(svg) if svg else "") + stage._repr_html_()


class FigureSlot:
    """Shows ``go.Figure`` payloads in one ``FigureWidget`` that is updated in place."""

    def __init__(self, fig, css_class: str = ""):
        import plotly.graph_objects as go

        self.widget = go.FigureWidget(fig)
        if css_class:
            self.widget.add_class(css_class)
        self.figure = fig

    def show(self, fig):
        self.figure = fig
        with self.widget.batch_update():
            self.widget.data = ()
            self.widget.add_traces(list(fig.data))
            self.widget.layout = fig.layout


class GraphPanel:
    """One SDG drawing that re-renders from a ``GraphSpec``: SVG in an HTML widget when
    ``dot`` is installed, else a plotly layered layout (clicking a node calls ``on_pick``)."""

    def __init__(self, title: str = "", on_pick=None):
        W = _ipywidgets()
        self.title, self.on_pick = title, on_pick
        self.note = W.HTML()
        self.box = W.Box(layout=W.Layout(width="100%"))
        self.widget = W.VBox([self.note, self.box])
        self.widget.add_class("tempo-lab-graph-panel")
        self.svg: str | None = None
        self.figure = None
        self._slot: FigureSlot | None = None

    def show(self, spec: G.GraphSpec):
        W = _ipywidgets()
        too_big = len(spec.nodes) > G.DOT_LIMIT
        self.svg = None if too_big else G.svg_of(G.to_dot(spec))
        head = f"<b>{html.escape(self.title)}</b> " if self.title else ""
        self.note.value = head + G.hidden_html(spec)
        if self.svg is not None:
            self.figure = None
            if not self.box.children or not isinstance(self.box.children[0], W.HTML):
                self.box.children = (W.HTML(),)
            self.box.children[0].value = G.svg_html(self.svg)
            return
        self.figure = G.graph_figure(spec, self.title)
        if self._slot is None:
            self._slot = FigureSlot(self.figure)
            if self.on_pick is not None:
                self._slot.widget.data[-1].on_click(self._clicked)
        else:
            self._slot.show(self.figure)
            if self.on_pick is not None:
                self._slot.widget.data[-1].on_click(self._clicked)
        why = (f"{len(spec.nodes)} nodes are more than graphviz lays out quickly "
               f"({G.DOT_LIMIT}); collapse regions for the SVG picture" if too_big else
               "graphviz's <code>dot</code> program is not installed (Debian: apt-get install "
               "graphviz)")
        self.note.value = head + f"<i>{why}: plotly layout instead.</i> " + G.hidden_html(spec)
        self.box.children = (self._slot.widget,)

    def _clicked(self, trace, points, state):
        for i in points.point_inds:
            op = trace.customdata[i]
            if op is not None and op >= 0:
                self.on_pick(int(op))
