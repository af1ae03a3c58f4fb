"""The pass stepper: a slider over the PassTrace, the SDG before and after the chosen pass with
created / erased / rewritten ops coloured, and a table of every pass's time and size change.
Before and after are drawn from one layout (of the two graphs together), so that an op in both
is at the same place on both sides, and pan and zoom together."""
from __future__ import annotations

import html
import re

from . import graph as G
from .base import GraphPanel, stage_view


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


def pass_lines(trace) -> list[str]:
    """The table's rows as lines of text (the stepper's clickable list)."""
    out = []
    for k, row in enumerate(pass_rows(trace)):
        (o0, o1), (e0, e1) = row["ops"], row["edges"]
        why = f", {len(row['notes'])} why-not" if row["notes"] else ""
        out.append(f"{k:2} {row['pass']:<10} {row['seconds'] * 1e3:7.2f} ms  ops {o0}→{o1}  "
                   f"edges {e0}→{e1}  created {row['created']} erased {row['erased']} "
                   f"replaced {row['replaced']} rewritten {row['rewritten']}{why}")
    return out


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


class Union:
    """A pass's before and after as one graph (what the diff lays out): every op of either (an
    op in both as it was before), every edge of either, every output of either."""

    def __init__(self, before, after):
        self.ops = dict(sorted({**after.ops, **before.ops}.items()))
        self.edges, seen = [], set()
        for sdg in (before, after):
            for e in sdg.edges:
                key = (e.src, e.dst, G.edge_label(self, e))
                if key not in seen:
                    seen.add(key)
                    self.edges.append(e)
        self.outputs = dict(before.outputs)
        for name, i in after.outputs.items():      # an output the pass replaced: both kept
            if self.outputs.get(name, i) != i:
                name = f"{name} (after)"
            self.outputs[name] = i


def changed_groups(paths: dict, ops) -> set:
    """The groups holding one of ``ops`` (what a diff opens; the rest stays closed)."""
    return {paths[i][:j + 1] for i in ops if i in paths for j in range(len(paths[i]))}


def diff_specs(record, expanded=None, selected: int | None = None):
    """The drawings of a pass's before and after, both placed by one layout, that of the two
    graphs together (``Union``): an op in both is at the same place on both sides, an op
    erased or created has its place on one side and room left for it on the other. Erased and
    replaced ops are marked before, created ones after, rewritten ones on both; the groups
    holding none of them are closed (``expanded``: the groups open instead). Returns (before
    spec, after spec, the groups open)."""
    union = Union(record.before, record.after)
    paths = G.group_paths(union)
    mb, ma = pass_marks(record)
    if expanded is None:
        expanded = changed_groups(paths, set(mb) | set(ma))
    every = {p[:j + 1] for p in paths.values() for j in range(len(p))}
    # the ops marked on either side are drawn as nodes (not written inside their readers, as
    # constants are) on that side, so they have their own place in the layout of both
    frame = G.graph_spec(union, marks={**mb, **ma}, expanded=every, paths=paths, frame=False)
    out = []
    for sdg, marks in ((record.before, mb), (record.after, ma)):
        spec = G.graph_spec(sdg, marks=marks, expanded=expanded, paths=paths, frame=False,
                            highlight=selected if selected in sdg.ops else None)
        spec.frame = frame
        out.append(spec)
    return out[0], out[1], set(expanded)


def grouped_notes(record) -> list[dict]:
    """The pass's ``note`` events ("why not"), one entry per distinct reason: the reason, how
    many ops it held back, their kinds and the top-level groups (say the layers) they are in,
    most frequent first."""
    paths = G.group_paths(record.before)
    out: dict[str, dict] = {}
    for ev in record.events:
        if ev.kind != "note":
            continue
        reason = re.sub(r"^%\d+ \([\w.]+\): ", "", ev.note)
        entry = out.setdefault(reason, {"reason": reason, "count": 0, "kinds": {}, "groups": []})
        entry["count"] += 1
        op = record.before.ops.get(ev.op)
        if op is not None:
            entry["kinds"][op.kind] = entry["kinds"].get(op.kind, 0) + 1
            top = paths[op.id][0]
            if top not in entry["groups"]:
                entry["groups"].append(top)
    return sorted(out.values(), key=lambda e: -e["count"])


def _listed(names: list[str], most: int = 6) -> str:
    return ", ".join(names) if len(names) <= most else \
        f"{', '.join(names[:3])} … {names[-1]} ({len(names)} groups)"


def notes_html(record) -> str:
    """Where the pass declined, and why: one line per reason, with how many ops and where."""
    notes = grouped_notes(record)
    if not notes:
        return ""
    total = sum(e["count"] for e in notes)
    items = "".join(
        f"<li><b>{e['count']}×</b> {rst_html(e['reason'])}"
        + (f" <span style='color:#666'>({', '.join(f'{k} ×{n}' for k, n in e['kinds'].items())}"
           f"; in {html.escape(_listed(e['groups']))})</span>" if e["kinds"] else "")
        + "</li>" for e in notes)
    return (f'<details class="tempo-lab-why-not" open><summary>why not: {total} '
            f'op{"s" if total > 1 else ""} where {html.escape(record.name)} declined, '
            f'{len(notes)} reason{"s" if len(notes) > 1 else ""}</summary>'
            f'<ul style="margin:0">{items}</ul></details>')


def rst_html(text: str) -> str:
    """Docstring text as HTML: reST's ``literals`` and :role:`names` as code, the rest escaped."""
    out = html.escape(text)
    out = re.sub(r":\w+:`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"``(.+?)``|`([^`]+)`", lambda m: f"<code>{m.group(1) or m.group(2)}</code>",
                  out)


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
        self.opened = None       # the groups open in both graphs (None: those with changes)
        self.shown = None        # the pass they are open for
        sync = f"passes-{id(self)}"      # the two graphs pan and zoom together
        self.before = GraphPanel("before", on_toggle=self.toggle, sync=sync)
        self.after = GraphPanel("after", on_toggle=self.toggle, sync=sync)
        # the table's rows, clickable: choosing one steps to that pass
        self.rows = W.Select(options=[(line, k) for k, line in enumerate(pass_lines(trace))],
                             value=first if n else None, rows=min(max(n, 1), 12),
                             layout=W.Layout(width="100%"))
        self.rows.add_class("tempo-lab-pass-rows")
        W.link((self.rows, "value"), (self.slider, "value"))
        self.slider.observe(lambda _: self.refresh(), "value")
        half = W.Layout(width="50%", overflow="auto")
        self.widget = W.VBox([self.slider, self.title,
                              W.HBox([W.Box([self.before.widget], layout=half),
                                      W.Box([self.after.widget], layout=half)]),
                              W.HTML("<style>.tempo-lab-pass-rows select {font-family: "
                                     "monospace; font-size: 12px}</style><b>passes</b> "
                                     "(click a row to step to it)"), self.rows])
        self.widget.add_class("tempo-lab-passes")
        self.refresh()

    def refresh(self):
        if not self.trace.records:
            self.title.value = "<i>no pass ran (every pass switched off)</i>"
            return
        k = self.slider.value
        r = self.trace.records[k]
        from tempo_lab.passes.manager import REGISTRY

        doc = REGISTRY[r.name].doc if r.name in REGISTRY else ""
        # each side's legend (above its graph) says what the edit colours drawn there mean
        self.title.value = f"<b>{k}: {html.escape(r.name)}</b> — {rst_html(doc)}<br>{notes_html(r)}"
        # one layout for both sides (that of the two graphs together), the groups with
        # changes open, so that an op in both is at the same place on both sides
        fresh = self.shown != k
        before, after, self.opened = diff_specs(r, None if fresh else self.opened,
                                                self.selected)
        self.shown = k
        focus = self._first_change(r, before) if fresh else None
        self.before.show(before, self._in(r.before), fit=fresh, focus=focus)
        self.after.show(after, self._in(r.after), fit=fresh, focus=focus)
        if fresh:    # each side's search box finds the ops of both sides
            index = [list(row) for row in G.search_rows(Union(r.before, r.after))]
            for panel in (self.before, self.after):
                panel.index = index
                if panel.canvas is not None:
                    panel.canvas.index = index

    @staticmethod
    def _first_change(record, before):
        """Where the pass's first change is drawn (the box both sides open centred on): its
        box in the layout of both sides together, which places every op alike on both."""
        from .layout import frame_layout

        marks = pass_marks(record)
        changed = sorted(set(marks[0]) | set(marks[1]))
        if not changed or not G.dot_installed():
            return None
        lay = frame_layout(before.frame or before)
        boxes = {} if lay is None else lay.boxes()
        return next((boxes[f"op{i}"] for i in changed if f"op{i}" in boxes), None)

    def _in(self, sdg):
        return self.selected if self.selected in sdg.ops else None

    def toggle(self, key: str):
        """Open a closed group, or close an open one, on both sides."""
        path = self.before.spec.groups.get(key) or self.after.spec.groups.get(key)
        if path is None:
            return
        if path in self.opened:
            self.opened = {g for g in self.opened if g[:len(path)] != path}
        else:
            self.opened = self.opened | {path[:j + 1] for j in range(len(path))}
        self.refresh()

    def select(self, op_id: int | None):
        self.selected = None if op_id is None or op_id < 0 else op_id
        self.refresh()


def explore_passes(trace):
    st = PassStepper(trace)
    view = stage_view([st.widget], trace._repr_html_() + pass_table_html(trace),
                      "tempo-lab-passes-view")
    view.stepper = st
    return view
