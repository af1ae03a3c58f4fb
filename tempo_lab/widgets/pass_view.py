"""The pass stepper: a slider over the PassTrace, the SDG before and after the chosen pass with
created / erased / rewritten ops coloured, and a table of every pass's time and size change."""
from __future__ import annotations

import html

from . import graph as G
from .base import GraphPanel, stage_view
from .palette import EDIT_COLOURS


def pass_rows(trace) -> list[dict]:
    """One row per pass: name, seconds, ops and edges before/after, counts of each edit."""
    rows = []
    for r in trace.records:
        row = {"pass": r.name, "seconds": r.seconds,
               "ops": (len(r.before.ops), len(r.after.ops)),
               "edges": (len(r.before.edges), len(r.after.edges))}
        for kind in ("created", "erased", "replaced", "rewritten"):
            row[kind] = r.count(kind)
        row["notes"] = [ev.note for ev in r.events if ev.kind == "note"]
        rows.append(row)
    return rows


def pass_table_html(trace, current: int | None = None) -> str:
    head = ("<tr><th>#</th><th>pass</th><th>time</th><th>ops</th><th>edges</th>"
            "<th>created</th><th>erased</th><th>replaced</th><th>rewritten</th>"
            "<th>why not</th></tr>")
    body = []
    for k, row in enumerate(pass_rows(trace)):
        style = ' style="background:#fff3cd"' if k == current else ""
        (o0, o1), (e0, e1) = row["ops"], row["edges"]
        body.append(f"<tr{style}><td>{k}</td><td>{html.escape(row['pass'])}</td>"
                    f"<td>{row['seconds'] * 1e3:.2f} ms</td><td>{o0}→{o1} ({o1 - o0:+d})</td>"
                    f"<td>{e0}→{e1} ({e1 - e0:+d})</td><td>{row['created']}</td>"
                    f"<td>{row['erased']}</td><td>{row['replaced']}</td>"
                    f"<td>{row['rewritten']}</td><td>{len(row['notes']) or ''}</td></tr>")
    return (f'<table class="tempo-lab-pass-table" style="font-size:90%">{head}'
            f'{"".join(body)}</table>')


def pass_marks(record) -> tuple[dict[int, str], dict[int, str]]:
    """(marks on the before graph, marks on the after graph): erased and replaced ops before,
    created ops after, rewritten ops on both."""
    before, after = {}, {}
    for ev in record.events:
        if ev.kind in ("erased", "replaced") and ev.op in record.before.ops:
            before.setdefault(ev.op, "erased")
        elif ev.kind == "created" and ev.op in record.after.ops:
            after[ev.op] = "created"
        elif ev.kind == "rewritten":
            if ev.op in record.before.ops:
                before[ev.op] = "rewritten"
            if ev.op in record.after.ops:
                after[ev.op] = "rewritten"
    return before, after


def notes_html(record, limit: int = 12) -> str:
    """Where the pass declined, and why (its ``note`` events), as a short list."""
    notes = [ev.note for ev in record.events if ev.kind == "note"]
    if not notes:
        return ""
    items = "".join(f"<li><code>{html.escape(n)}</code></li>" for n in notes[:limit])
    more = f"<li>… {len(notes) - limit} more</li>" if len(notes) > limit else ""
    return (f'<details class="tempo-lab-why-not" open><summary>why not: {len(notes)} '
            f'place{"s" if len(notes) > 1 else ""} where {html.escape(record.name)} declined'
            f'</summary><ul style="margin:0">{items}{more}</ul></details>')


def legend_html() -> str:
    return " ".join(f'<span style="background:{c};padding:0 .4em">{k}</span>'
                    for k, c in EDIT_COLOURS.items() if k != "replaced")


class PassStepper:
    """Slider over the passes; ``select(op_id)`` highlights an op in both graphs."""

    def __init__(self, trace):
        import ipywidgets as W

        self.trace, self.selected = trace, None
        n = len(trace.records)
        first = next((k for k, r in enumerate(trace.records) if r.events), 0)  # one that did work
        self.slider = W.IntSlider(value=first, min=0, max=max(n - 1, 0), description="pass",
                                  disabled=n == 0, continuous_update=False)
        self.title = W.HTML()
        self.before, self.after = GraphPanel("before"), GraphPanel("after")
        self.table = W.HTML()
        self.slider.observe(lambda _: self.refresh(), "value")
        half = W.Layout(width="50%", overflow="auto")
        self.widget = W.VBox([self.slider, self.title,
                              W.HBox([W.Box([self.before.widget], layout=half),
                                      W.Box([self.after.widget], layout=half)]),
                              W.HTML("<b>passes</b>"), self.table])
        self.widget.add_class("tempo-lab-passes")
        self.refresh()

    def refresh(self):
        if not self.trace.records:
            self.title.value = "<i>no pass ran (every pass switched off)</i>"
            self.table.value = ""
            return
        k = self.slider.value
        r = self.trace.records[k]
        from tempo_lab.passes.manager import REGISTRY

        doc = REGISTRY[r.name].doc if r.name in REGISTRY else ""
        self.title.value = (f"<b>{k}: {html.escape(r.name)}</b> — {html.escape(doc)}<br>"
                            f"{legend_html()}{notes_html(r)}")
        mb, ma = pass_marks(r)
        self.before.show(G.graph_spec(r.before, marks=mb, highlight=self._in(r.before)))
        self.after.show(G.graph_spec(r.after, marks=ma, highlight=self._in(r.after)))
        self.table.value = pass_table_html(self.trace, k)

    def _in(self, sdg):
        return self.selected if self.selected in sdg.ops else None

    def select(self, op_id: int | None):
        self.selected = None if op_id is None or op_id < 0 else op_id
        self.refresh()


def explore_passes(trace):
    st = PassStepper(trace)
    view = stage_view([st.widget], trace._repr_html_() + pass_table_html(trace),
                      "tempo-lab-passes-view")
    view.stepper = st
    return view
