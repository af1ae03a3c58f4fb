"""One ``explore`` entry point: a graph picture for graph stages, the stage's own sectioned
HTML for every stage. Without graphviz's ``dot`` program the picture is left out, not an error."""
from __future__ import annotations

import html


def svg_of(dot_source: str) -> str | None:
    """Render DOT to an SVG string, or None when the ``dot`` program is not installed."""
    import graphviz

    try:
        svg = graphviz.Source(dot_source).pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound:
        return None
    return svg[svg.find("<svg"):]


def explore(stage):
    """An ipywidgets view of ``stage``: for graphs the picture above the sections."""
    import ipywidgets as W

    parts = []
    if hasattr(stage, "to_dot"):
        svg = svg_of(stage.to_dot())
        note = ("<p><i>graphviz's <code>dot</code> program is not installed: no picture "
                "(Debian: apt-get install graphviz)</i></p>")
        parts.append(W.HTML(f'<div style="overflow:auto;max-height:600px">{svg}</div>'
                            if svg else note))
    parts.append(W.HTML(stage._repr_html_()))
    box = W.VBox(parts)
    box.add_class("tempo-lab-explore")
    box.layout.border = "1px solid #ddd"
    box.tooltip = html.escape(repr(stage))
    return box
