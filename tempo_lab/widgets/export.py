"""The dashboard as one standalone HTML file: every stage's view as it was on screen, readable
without a kernel, a server or a network (plotly.js is inlined from the installed package, the
SDG sits on the notebook's graph canvas)."""
from __future__ import annotations

import html
import json
import pathlib

from ..ir.sdg import showable
from . import graph as G
from .memory_view import memory_figure
from .pass_view import notes_html, pass_table_html
from .profile_view import compile_figure, estimated_kernels, icicle_figure, timeline_figure
from .schedule_view import code_html, tree_html

STYLE = """
body { font: 14px sans-serif; margin: 1.5em; color: #222; }
details { border: 1px solid #ddd; border-radius: 4px; margin: .6em 0; padding: .3em .8em; }
summary { font-weight: bold; cursor: pointer; font-size: 110%; }
.tempo-lab-graph { max-height: none !important; }
.tempo-lab-graph svg { max-width: 100%; height: auto; }
pre { white-space: pre-wrap; }
"""


def _figure(fig) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False)


def _canvas(svg: str, index) -> str:
    """The graph on the same canvas as in the notebook (zoom, pan, fit, search, select), its
    script given a stand-in for the widget model: the groups stay as exported."""
    from .canvas import CSS, ESM

    data = json.dumps({"svg": svg, "selected": -1, "index": index, "query": "", "view": [],
                       "height": 640}).replace("</", "<\\/")
    model = ("const data = " + data + "; const handlers = {};"
             "const model = {get: (k) => data[k], set: (k, v) => { data[k] = v; "
             "(handlers['change:' + k] || []).forEach((f) => f()); }, save_changes() {}, "
             "send() {}, on: (e, f) => { (handlers[e] = handlers[e] || []).push(f); }};")
    return (f"<style>{CSS}</style>"
            f"<div id='tl-sdg-canvas'></div><script type='module'>"
            f"{ESM}\n{model}"
            f"render({{model, el: document.getElementById('tl-sdg-canvas')}});</script>")


def _graph(sdg, spec) -> str:
    """The SDG's picture: the nested layout's SVG (``layout.py``, as on screen) on the graph
    canvas, else (no ``dot``, or ``dot`` failing on this graph) the plotly layout the views
    fall back to, with the reason; the page had no graph at all then, and said nothing."""
    from .layout import svg as nested_svg

    svg = nested_svg(spec)
    if svg:       # with what its colours mean and what it leaves out, as on screen
        return G.legend_html(spec) + G.hidden_html(spec) + _canvas(svg, G.search_rows(sdg))
    return (f"<p><i>{G.no_svg_reason(spec)}: plotly layout instead.</i></p>"
            + _figure(G.graph_figure(spec, "SDG")))


def dashboard_html(prog, run=None, sdg_spec=None) -> str:
    """The whole dashboard as an HTML document. ``sdg_spec``: the SDG as drawn on screen (the
    groups expanded there); the default opening view otherwise."""
    from plotly.offline import get_plotlyjs

    profile = None if run is None else run.profile
    parts = [("Program", prog._repr_html_() + ("" if run is None else run._repr_html_()))]
    parts.append(("SDG", _graph(prog.sdg, sdg_spec or G.graph_spec(prog.sdg))
                  + prog.sdg._repr_html_()))
    if prog.passes is not None:
        notes = "".join(notes_html(r) for r in prog.passes.records)
        parts.append(("Passes", pass_table_html(prog.passes) + notes))
    if prog.schedule is not None:
        parts.append(("Schedule", code_html(prog.schedule) + tree_html(prog.schedule)))
    if prog.memory is not None:
        parts.append(("Memory", _figure(memory_figure(prog.memory, profile))))
    if profile is not None:
        body = ""
        if prog.schedule is not None and profile.calls:
            kernels = estimated_kernels(prog.schedule, profile, run.bounds)
            body += _figure(timeline_figure(prog.sdg, kernels, estimated=True))
        body += _figure(icicle_figure(prog.sdg, profile)) + _figure(compile_figure(prog))
        parts.append(("Profile", body))
    # names with control characters shown as symbols (a NUL is not allowed in a page); the
    # bodies' scripts carry none raw, and plotly.js, which does, is left as it is
    sections = showable("".join(f"<details class='tl-section' open><summary>"
                                f"{html.escape(name)}</summary>{body}</details>"
                                for name, body in parts))
    title = showable(html.escape(repr(prog).split("\n")[0]))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{STYLE}</style><script>{get_plotlyjs()}</script></head><body>"
            f"<h2>tempo_lab · {title}</h2>{sections}</body></html>")


def save_html(prog, path, run=None, sdg_spec=None) -> pathlib.Path:
    """Write ``dashboard_html`` to ``path`` and return it."""
    path = pathlib.Path(path)
    path.write_text(dashboard_html(prog, run, sdg_spec), encoding="utf-8")
    return path
