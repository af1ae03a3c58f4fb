"""The graph canvas widget (anywidget): graphviz's SVG with zoom, pan, fit, click-to-select,
centre-on-selection, type-ahead search and keyboard shortcuts, all in ``graph_canvas.js``.

Why not cytoscape.js with an ELK layout: it would have to be bundled from npm into the package
(a build step with node, or a vendored copy), and graphviz, already the static renderer, lays
out SDGs well. The browser side here only moves a view box and reports clicks."""
from __future__ import annotations

import pathlib

import anywidget
import traitlets

# The scripts as text, not paths: anywidget watches a path's file and keeps every widget made
# from it alive (a strong callback per widget for hot reloading), so that closing a view gave
# nothing back (1.5 MiB per dashboard: its SVGs and figures).
# search.js (plain functions, the same search as search.py) goes first: one module.
ESM = "\n".join(pathlib.Path(__file__).with_name(f).read_text(encoding="utf-8")
                for f in ("search.js", "graph_canvas.js"))
CSS = pathlib.Path(__file__).with_name("graph_canvas.css").read_text(encoding="utf-8")


class GraphCanvas(anywidget.AnyWidget):
    """``svg``: graphviz output; ``selected``: the op id picked (-1: none), set by a click in the
    graph or from Python; ``index``: ``graph.search_rows`` for the search box; ``query``: words
    whose hits the graph keeps drawn and marked (Shift+Enter in the box); ``view``: the view
    box the browser shows, kept across redraws (but when ``refit`` changes with the drawing:
    then the new drawing is fitted); ``sync``: a name shared by canvases that pan and zoom
    together. A click on a group calls the ``on_toggle``
    callbacks with the group's key (``g3``)."""

    _esm = ESM
    _css = CSS
    svg = traitlets.Unicode("").tag(sync=True)
    selected = traitlets.Int(-1).tag(sync=True)
    index = traitlets.List([]).tag(sync=True)
    query = traitlets.Unicode("").tag(sync=True)
    view = traitlets.List([]).tag(sync=True)
    height = traitlets.Int(600).tag(sync=True)
    refit = traitlets.Int(0).tag(sync=True)   # bumped with a new svg: fit it, not keep the view
    # canvases with the same name pan and zoom together, in the browser (a pass's before and
    # after, drawn from one layout, show the same part of it)
    sync = traitlets.Unicode("").tag(sync=True)
    # a box (x, y, w, h, in the drawing's units) a fitted drawing is centred on instead, at a
    # zoom where labels read (a pass diff opens on its first change)
    focus = traitlets.List([]).tag(sync=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._toggles = []
        self.on_msg(self._message)

    def on_toggle(self, callback):
        self._toggles.append(callback)

    def _message(self, _widget, content, _buffers):
        key = content.get("toggle") if isinstance(content, dict) else None
        if isinstance(key, str):
            for callback in self._toggles:
                callback(key)
