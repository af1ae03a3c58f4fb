"""What to draw of an SDG (visible ops, collapsed regions, labelled edges) and two ways to draw
it: graphviz SVG when the ``dot`` program exists, a layered plotly layout when it does not.

One ``GraphSpec`` feeds both renderers, so search, filters, collapsing and highlights behave
the same whichever is used."""
from __future__ import annotations

import html
from dataclasses import dataclass, field

from tempo_lab.symbolic import TRUE

from .palette import (
    EDIT_COLOURS,
    HIGHLIGHT,
    MATCH,
    TEMPLATE,
    category_colour,
    domain_colour,
    region_of,
)

COLLAPSE_ABOVE = 80     # graphs with more ops start with their large regions collapsed
REGION_LIMIT = 12       # ... namely the regions with more ops than this
DOT_LIMIT = 160         # more nodes than this take graphviz minutes: plotly layout instead


@dataclass
class Node:
    key: str            # DOT node name: n<op id> or r<region index>
    label: str
    fill: str
    region: str
    op: int | None = None
    border: str = "#555555"
    width: float = 1.0
    tooltip: str = ""


@dataclass
class GraphSpec:
    nodes: list[Node] = field(default_factory=list)
    edges: list[tuple[str, str, str, bool]] = field(default_factory=list)  # src, dst, label, dashed
    regions: dict[str, str] = field(default_factory=dict)   # region -> colour
    hidden: list[str] = field(default_factory=list)         # what is not drawn, in words

    @property
    def ops(self) -> list[int]:
        return [n.op for n in self.nodes if n.op is not None]


def edge_label(sdg, e) -> str:
    """The dependence expression of an edge (``t - 1``, ``0:t + 1``), empty for identity reads."""
    parts = []
    if e.index and not e.is_identity(sdg.ops[e.src]):
        parts.append(e.index_str())
    if e.cond != TRUE:
        parts.append(f"if {e.cond}")
    return "\n".join(parts)


def default_collapsed(sdg, collapse_above: int = COLLAPSE_ABOVE) -> set[str]:
    """Regions collapsed when a view opens: none for small graphs, the big ones otherwise."""
    if len(sdg.ops) <= collapse_above:
        return set()
    sizes: dict[str, int] = {}
    for op in sdg.ops.values():
        sizes[region_of(op)] = sizes.get(region_of(op), 0) + 1
    return {r for r, n in sizes.items() if n > REGION_LIMIT}


def matches(sdg, query: str) -> list[int]:
    """Ops whose name, label or kind contains ``query`` (case-insensitive)."""
    q = query.strip().lower()
    if not q:
        return []
    return [op.id for op in sdg.ops.values()
            if q in op.label.lower() or q in op.kind.lower() or q in (op.name or "").lower()]


def graph_spec(sdg, *, highlight: int | None = None, search: str = "", kind: str | None = None,
               collapsed=None, marks: dict[int, str] | None = None) -> GraphSpec:
    """Decide what to draw. ``collapsed`` regions become one summary node each, except for the
    ops that are highlighted, searched for or marked (those stay visible); ``kind`` keeps only
    ops of that kind. Everything left out is counted in ``hidden``."""
    marks = marks or {}
    collapsed = default_collapsed(sdg) if collapsed is None else set(collapsed)
    found = set(matches(sdg, search))
    keep = found | set(marks) | ({highlight} if highlight is not None else set())
    spec = GraphSpec()
    region_keys: dict[str, str] = {}
    where: dict[int, str] = {}     # op id -> node key it is drawn as
    folded: dict[str, list[int]] = {}
    filtered = 0
    outputs = {i: n for n, i in sdg.outputs.items()}
    for op in sdg.ops.values():
        region = region_of(op)
        spec.regions.setdefault(region, domain_colour(region.strip("()")))
        if kind and op.kind != kind and op.id not in keep:
            filtered += 1
            continue
        if region in collapsed and op.id not in keep:
            key = region_keys.setdefault(region, f"r{len(region_keys)}")
            folded.setdefault(region, []).append(op.id)
            where[op.id] = key
            continue
        label = f"{op.label} {op.kind}\n{op.type}"
        if op.id in outputs:
            label += f"\n→ {outputs[op.id]}"
        node = Node(f"n{op.id}", label, category_colour(op.category), region, op.id,
                    tooltip=f"{op.label} = {op.kind} over {region} @ {op.loc}")
        if op.id in marks:
            node.fill = EDIT_COLOURS.get(marks[op.id], node.fill)
        if op.id in found:
            node.border, node.width = MATCH, 2.5
        if op.id == highlight:
            node.border, node.width = HIGHLIGHT, 3.5
        spec.nodes.append(node)
        where[op.id] = node.key
    for region, ids in folded.items():
        kinds: dict[str, int] = {}
        for i in ids:
            kinds[sdg.ops[i].kind] = kinds.get(sdg.ops[i].kind, 0) + 1
        top = ", ".join(f"{k}×{n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])[:3])
        spec.nodes.append(Node(region_keys[region], f"{region}: {len(ids)} ops collapsed\n{top}",
                               "#f4f4f4", region, border=domain_colour(region.strip("()")),
                               width=2.0, tooltip=f"{len(ids)} ops of region {region}"))
        spec.hidden.append(f"{len(ids)} ops of region {region} collapsed")
    if filtered:
        spec.hidden.append(f"{filtered} ops of other kinds than {kind!r} hidden")
    agg: dict[tuple[str, str], list] = {}
    for e in sdg.edges:
        s, d = where.get(e.src), where.get(e.dst)
        if s is None or d is None or s == d:
            continue
        agg.setdefault((s, d), []).append(e)
    for (s, d), es in agg.items():
        if len(es) == 1:
            label = edge_label(sdg, es[0])
        else:
            labels = sorted({edge_label(sdg, e) for e in es} - {""})
            label = f"{len(es)} reads" + (f"\n{labels[0]}" if len(labels) == 1 else "")
        dashed = all(sdg.ops[e.dst].kind == "merge" for e in es)
        spec.edges.append((s, d, label, dashed))
    return spec


# -- graphviz ---------------------------------------------------------------------------------
def _q(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def to_dot(spec: GraphSpec) -> str:
    """DOT for a spec: one dashed cluster per region, op ids as SVG element ids (``op3``)."""
    lines = ["digraph SDG {", '  rankdir=TB; node [shape=box, style="rounded,filled", '
             'fontname="Helvetica", fontsize=10]; edge [fontname="Helvetica", fontsize=9];']
    by_region: dict[str, list[Node]] = {}
    for n in spec.nodes:
        by_region.setdefault(n.region, []).append(n)
    for k, region in enumerate(sorted(by_region, key=lambda r: (r.count(",") + (r != "()"), r))):
        lines.append(f'  subgraph cluster_{k} {{ label="{_q(region)}"; style=dashed; '
                     f'color="{spec.regions[region]}";')
        for n in by_region[region]:
            ident = f"op{n.op}" if n.op is not None else f"region{n.key[1:]}"
            lines.append(f'    {n.key} [id="{ident}", label="{_q(n.label)}", '
                         f'fillcolor="{n.fill}", color="{n.border}", penwidth={n.width}, '
                         f'tooltip="{_q(n.tooltip)}"];')
        lines.append("  }")
    for s, d, label, dashed in spec.edges:
        style = ", style=dashed" if dashed else ""
        lines.append(f'  {s} -> {d} [label="{_q(label)}"{style}];')
    lines.append("}")
    return "\n".join(lines)


def svg_of(dot_source: str) -> str | None:
    """Render DOT to an SVG string, or None when the ``dot`` program is not installed."""
    import graphviz

    try:
        svg = graphviz.Source(dot_source).pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound:
        return None
    return svg[svg.find("<svg"):]


def svg_html(svg: str, max_height: int = 640) -> str:
    return (f'<div class="tempo-lab-graph" style="overflow:auto;max-height:{max_height}px;'
            f'border:1px solid #eee">{svg}</div>')


def hidden_html(spec: GraphSpec) -> str:
    if not spec.hidden:
        return ""
    return ('<div class="tempo-lab-hidden" style="color:#555;font-size:90%">Not drawn: '
            + html.escape("; ".join(spec.hidden))
            + " (pick regions to expand, or search for ops to show them)</div>")


# -- plotly fallback ----------------------------------------------------------------------------
def layered_positions(spec: GraphSpec) -> dict[str, tuple[float, float]]:
    """A layered layout without graphviz: longest-path layers from the sources (cycles, which
    always pass through a placeholder, are broken at the lowest remaining node), then one
    barycentre sweep to order each layer."""
    keys = [n.key for n in spec.nodes]
    preds: dict[str, list[str]] = {k: [] for k in keys}
    succs: dict[str, list[str]] = {k: [] for k in keys}
    for s, d, _, _ in spec.edges:
        preds[d].append(s)
        succs[s].append(d)
    indeg = {k: len(set(preds[k])) for k in keys}
    layer: dict[str, int] = {}
    ready = [k for k in keys if indeg[k] == 0]
    while len(layer) < len(keys):
        if not ready:
            ready = [next(k for k in keys if k not in layer)]
        k = ready.pop(0)
        if k in layer:
            continue
        layer[k] = max((layer[p] + 1 for p in preds[k] if p in layer), default=0)
        for d in set(succs[k]):
            indeg[d] -= 1
            if indeg[d] == 0 and d not in layer:
                ready.append(d)
    rows: dict[int, list[str]] = {}
    for k in keys:
        rows.setdefault(layer[k], []).append(k)
    pos: dict[str, tuple[float, float]] = {}
    for y in sorted(rows):
        row = rows[y]
        if y:
            def bary(k):
                xs = [pos[p][0] for p in preds[k] if p in pos]
                return sum(xs) / len(xs) if xs else 0.0
            row.sort(key=bary)
        width = len(row) - 1
        for x, k in enumerate(row):
            pos[k] = (x - width / 2, -y)
    return pos


def graph_figure(spec: GraphSpec, title: str = ""):
    """The spec as a plotly figure (a ``go.Figure``): nodes coloured like the SVG, edges as
    lines with their dependence expressions at the midpoints; ``customdata`` holds op ids."""
    import plotly.graph_objects as go

    pos = layered_positions(spec)
    ex, ey, lx, ly, lt = [], [], [], [], []
    for s, d, label, _ in spec.edges:
        (x0, y0), (x1, y1) = pos[s], pos[d]
        ex += [x0, x1, None]
        ey += [y0, y1, None]
        if label:
            lx.append((x0 + x1) / 2)
            ly.append((y0 + y1) / 2)
            lt.append(label.replace("\n", "<br>"))
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line=dict(color="#999", width=1),
                             hoverinfo="skip", name="reads"))
    fig.add_trace(go.Scatter(x=lx, y=ly, mode="text", text=lt, textfont=dict(size=9,
                             color="#555"), hoverinfo="skip", name="dependences"))
    fig.add_trace(go.Scatter(
        x=[pos[n.key][0] for n in spec.nodes], y=[pos[n.key][1] for n in spec.nodes],
        mode="markers+text", text=[n.label.split("\n")[0] for n in spec.nodes],
        textposition="middle center", textfont=dict(size=9),
        hovertext=[html.escape(n.label).replace("\n", "<br>") for n in spec.nodes],
        hoverinfo="text", customdata=[-1 if n.op is None else n.op for n in spec.nodes],
        marker=dict(symbol="square", size=[34 if n.op is not None else 44 for n in spec.nodes],
                    color=[n.fill for n in spec.nodes],
                    line=dict(color=[n.border for n in spec.nodes],
                              width=[n.width for n in spec.nodes])),
        name="ops"))
    height = 160 + 70 * (1 + max((-y for _, y in pos.values()), default=0))
    fig.update_layout(template=TEMPLATE, title=title or None, showlegend=False,
                      height=min(int(height), 900), margin=dict(l=10, r=10, t=40, b=10),
                      xaxis=dict(visible=False), yaxis=dict(visible=False))
    return fig
