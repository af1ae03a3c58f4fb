"""Building blocks shared by the views: a VBox that also carries static HTML (shown by
nbconvert and GitHub, which cannot run widgets), a slot that shows a plotly figure as a
``PlotlyChart``, and a graph panel that draws an SDG as SVG or, without ``dot``, as plotly."""
from __future__ import annotations

import html

from . import graph as G
from .palette import HIGHLIGHT


def _ipywidgets():
    import ipywidgets

    return ipywidgets


def stage_view(children, static_html: str, css_class: str):
    """A VBox of ``children`` whose MIME bundle also has ``text/html``: a live kernel renders
    the widget, a static renderer falls back to ``static_html``."""
    W = _ipywidgets()

    class StageView(W.VBox):
        def close(self):
            """Close this view and every widget in it (a notebook that makes many views can
            give their memory back: ipywidgets keeps a widget until it is closed)."""
            close_tree(self)

        def __del__(self):  # at interpreter exit: only this widget, as ipywidgets does
            W.Widget.close(self)

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


def close_tree(widget) -> None:
    """Close a widget and every widget it holds (children, layout, style, any widget-valued
    trait) but those ``shared`` between views: ipywidgets keeps each one (and the SVG or
    figure it holds) alive in its registry until it is closed, even once nothing shows it."""
    W = _ipywidgets()
    if widget.comm is None:  # closed already
        return
    for name in widget.keys:
        value = getattr(widget, name, None)
        for inner in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(inner, W.Widget) and not getattr(inner, "shared", False):
                close_tree(inner)
    W.Widget.close(widget)


def slider_grid(sliders) -> object:
    """Sliders side by side, each at least 300 px wide, wrapping to the next row rather than
    squashing their tracks to nothing (PPO has six bounds). Each fills its cell by the
    grid's stretch (width ``auto``): at ``100%`` its margin came on top of the cell's width
    and the grid scrolled sideways by those 2 px (a stray scrollbar under the sliders)."""
    W = _ipywidgets()
    for s in sliders:
        s.layout.width = "auto"
        s.style.description_width = "initial"
    return W.GridBox(list(sliders), layout=W.Layout(
        width="100%", grid_template_columns="repeat(auto-fill, minmax(300px, 1fr))",
        grid_gap="2px 16px"))


class FigureSlot:
    """Shows ``go.Figure`` payloads in one ``PlotlyChart`` (``chart.py``) updated in place."""

    def __init__(self, fig, css_class: str = ""):
        from .chart import PlotlyChart

        self.widget = PlotlyChart(fig, css_class)
        self.figure = fig

    def show(self, fig):
        self.figure = fig
        self.widget.figure = fig


class GraphPanel:
    """One SDG drawing that re-renders from a ``GraphSpec``: graphviz's SVG on a navigable
    canvas when ``dot`` is installed, else a plotly layered layout. A click on an op calls
    ``on_pick(op id)``, on a group ``on_toggle(group key)``; ``index`` feeds the type-ahead;
    panels with the same ``sync`` name pan and zoom together."""

    def __init__(self, title: str = "", on_pick=None, on_toggle=None, index=(), height=600,
                 query=None, sync: str = ""):
        W = _ipywidgets()
        self.title, self.on_pick, self.on_toggle, self.sync = title, on_pick, on_toggle, sync
        self.index, self.height, self.query = [list(row) for row in index], height, query
        self.note = W.HTML()
        self.box = W.Box(layout=W.Layout(width="100%"))
        self.widget = W.VBox([self.note, self.box])
        self.widget.add_class("tempo-lab-graph-panel")
        self.svg: str | None = None
        self.figure = None
        self.canvas = None
        self._slot: FigureSlot | None = None
        self._dot: str | None = None

    def show(self, spec: G.GraphSpec, selected: int | None = None, fit: bool = False,
             focus=None):
        """Draw ``spec``; ``fit``: the canvas fits the new drawing (expand or collapse all)
        rather than keeping its view; ``focus``: a box (x, y, w, h) the fitted view is centred
        on instead, zoomed in until labels read."""
        from .layout import svg as nested_svg

        self.spec = spec
        too_big = len(spec.nodes) > G.DOT_LIMIT
        head = f"<b>{html.escape(self.title)}</b> " if self.title else ""
        self.note.value = head + G.legend_html(spec) + G.hidden_html(spec)
        dot = None if too_big else G.to_dot(spec)
        if dot is not None and spec.frame is not None and spec.frame is not spec:
            dot += G.to_dot(spec.frame)      # where it is placed: drawn again when that changes
        if dot is not None and dot != self._dot:
            self.svg = nested_svg(spec)      # each group laid out on its own (layout.py)
        self._dot = dot
        if dot is not None and self.svg is not None:
            self.figure = None
            canvas = self._canvas()
            with canvas.hold_sync():
                if fit:
                    canvas.refit += 1
                canvas.focus = list(focus) if focus else []
                canvas.svg = self.svg
            self.canvas.selected = -1 if selected is None else selected
            self.box.children = (self.canvas,)
            return
        self.svg = None
        for n in spec.nodes:
            if n.op is not None and n.op == selected:
                n.border, n.width = HIGHLIGHT, 3.5
        self.figure = G.graph_figure(spec, self.title)
        if self._slot is None:
            self._slot = FigureSlot(self.figure)
            if self.on_pick is not None or self.on_toggle is not None:
                self._slot.widget.on_click(self._clicked, trace=-1)   # the ops' markers
        else:
            self._slot.show(self.figure)
        self.note.value = (head + f"<i>{G.no_svg_reason(spec)}: plotly layout instead.</i> "
                           + G.legend_html(spec)
                           + G.hidden_html(spec))
        self.box.children = (self._slot.widget,)

    def _canvas(self):
        if self.canvas is None:
            from .canvas import GraphCanvas

            self.canvas = GraphCanvas(index=self.index, height=self.height, sync=self.sync)
            self.canvas.add_class("tempo-lab-graph-canvas")
            if self.on_pick is not None:
                self.canvas.observe(lambda ch: self.on_pick(None if ch.new < 0 else ch.new),
                                    "selected")
            if self.on_toggle is not None:
                self.canvas.on_toggle(self.on_toggle)
            if self.query is not None:     # the box's Shift+Enter marks, as the text widget
                import traitlets

                traitlets.link((self.query, "value"), (self.canvas, "query"))
        return self.canvas

    def _clicked(self, trace, points, state):
        for i in points.point_inds:
            custom = trace.customdata[i]
            if custom is None:
                continue
            group = G.group_of(int(custom))
            if group is not None and self.on_toggle is not None:
                self.on_toggle(group)
            elif custom >= 0 and self.on_pick is not None:
                self.on_pick(int(custom))
