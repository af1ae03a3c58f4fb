"""The schedule view: isl's schedule tree as nested collapsible HTML, the generated loop code,
and an iteration-space plot (statement instances for small bound values, dependence arrows,
colour by execution order) with a slider per bound."""
from __future__ import annotations

import html
import math
import re

from tempo_lab.ir.vmap import vdims
from tempo_lab.schedule import Exec, walk
from tempo_lab.schedule.loops import Fetch, For, Free, If, Offload, Seq, While
from tempo_lab.symbolic import TRUE, Slice

from .base import FigureSlot, slider_grid, stage_view
from .palette import HIGHLIGHT, TEMPLATE, place_title
from .search import INLINE_KINDS, op_code_name, op_title

MAX_INSTANCES = 4000
MAX_ARROWS = 600
AGGREGATE_ABOVE = 40   # more statements than this: one marker per group and point
ONCE = -1.5            # the x of the column of ops that run once, outside every loop
_STMT = re.compile(r"\bop(\d+)\[")
_BAND = re.compile(r"\bop(\d+)\[[^\]]*\] -> \[\((.*?)\)\]")
_CONST_LINE = re.compile(r"= (const|dimval)\(")
OPEN_DEPTH = 2         # tree nodes open down to this depth (and wherever the selection is)


# -- schedule tree ------------------------------------------------------------------------------
def _constant(sdg, i: int) -> bool:
    return i in sdg.ops and sdg.ops[i].kind in INLINE_KINDS


def _labels(sdg, text: str, constants: bool = True) -> list[str]:
    ids = sorted({int(m) for m in _STMT.findall(text)})
    return [op_title(sdg.ops[i]) if i in sdg.ops else f"op{i}" for i in ids
            if constants or not _constant(sdg, i)]


def tree_node_html(sdg, node, depth: int = 0, highlight: int | None = None,
                   constants: bool = False) -> str:
    """One isl schedule-tree node (and its children) as ``<details>``; statements are named by
    their ops' names and ids, band members grouped by the expression they schedule with.
    Nodes whose statements include ``highlight`` are marked and open; without
    ``constants``, a filter of constants only is left out (and constants from the lists)."""
    import islpy as isl

    kind = node.get_type()
    T = isl.schedule_node_type
    name = str(kind).split(".")[-1]
    involved = highlight is not None and f"op{highlight}[" in str(
        node.get_domain() if kind != T.filter else node.filter_get_filter())
    if kind == T.domain:
        head = f"domain: {len(_labels(sdg, str(node.domain_get_domain())))} statements"
    elif kind == T.band:
        n = node.band_n_member()
        coin = [int(node.band_member_get_coincident(i)) for i in range(n)]
        head = (f"band: {n} member{'s' * (n != 1)}"
                f"{', permutable' if node.band_get_permutable() else ''}, coincident {coin}")
    elif kind == T.filter:
        labels = _labels(sdg, str(node.filter_get_filter()), constants)
        if not labels and not involved:
            return ""       # constants only
        head = "filter: " + ", ".join(labels[:8]) + (f" … (+{len(labels) - 8})"
                                                     if len(labels) > 8 else "")
    else:
        head = name
    body = []
    if kind == T.band:
        mupa = node.band_get_partial_schedule()
        for i in range(node.band_n_member()):
            groups: dict[str, list[str]] = {}
            for op, expr in _BAND.findall(str(mupa.get_union_pw_aff(i))):
                if constants or not _constant(sdg, int(op)):
                    groups.setdefault(expr, []).append(int(op))
            items = "; ".join(f"<code>{html.escape(e)}</code> ← "
                              + html.escape(", ".join(op_title(sdg.ops[o]) if o in sdg.ops
                                                      else f"op{o}" for o in sorted(ids)))
                              for e, ids in sorted(groups.items()))
            body.append(f"<div>member {i}: {items}</div>")
    for i in range(node.n_children()):
        child = node.child(i)
        if child.get_type() == T.leaf:
            continue
        body.append(tree_node_html(sdg, child, depth + 1, highlight, constants))
    opened = " open" if depth < OPEN_DEPTH or involved else ""
    summary = f"<code>{html.escape(head)}</code>"
    if involved:
        summary = f'<mark class="tempo-lab-tree-mark" style="background:#ffd8d8">{summary}</mark>'
    return (f'<details{opened} class="tempo-lab-tree-node" style="margin-left:{min(depth, 1)}em">'
            f"<summary>{summary}</summary>{''.join(body)}</details>")


def tree_html(schedule, highlight: int | None = None, constants: bool = False) -> str:
    tree = schedule.tree
    if not hasattr(tree, "get_root"):
        return f"<pre>{html.escape(str(tree))}</pre>"
    root = tree_node_html(schedule.sdg, tree.get_root(), 0, highlight, constants)
    return f'<div class="tempo-lab-tree">{root}</div>'


def code_lines(schedule, constants: bool = False) -> list[tuple[str, frozenset]]:
    """The loop code, one ``(line, ops it runs or frees)`` per line, ops named by their
    names and ids (``q·%934``). Without ``constants``, constants are not statements of their
    own: a scalar one is written as its value where it is read. A schedule read back by
    ``tl.load`` has its code as text: constants' lines are left out of it."""
    sdg = schedule.sdg
    if not hasattr(schedule, "ast"):
        return [(line, frozenset()) for line in schedule.code().splitlines()
                if constants or not _CONST_LINE.search(line)]
    hidden = set() if constants else {i for i in sdg.ops if _constant(sdg, i)}

    def name(i: int) -> str:
        if i not in sdg.ops:
            return f"%{i}"
        op = sdg.ops[i]
        value = op.attrs.get("value") if i in hidden and op.kind == "const" else None
        if value is not None and op.type.shape == ():
            return f"{float(value):.6g}"
        return op_code_name(op)

    def stmt(node: Exec) -> str:
        op = sdg.ops[node.op]
        at = dict(zip(op.domain, node.args))
        reads = []
        for e in sdg.in_edges(op.id):
            idx = ", ".join(str(x.substitute(at)) for x in e.index)
            r = f"{name(e.src)}[{idx}]" if idx else name(e.src)
            if e.cond != TRUE:
                r += f" if {e.cond.substitute(at)}"
            reads.append(r)
        args = ", ".join(map(str, node.args))
        head = f"{name(op.id)}[{args}]" if args else name(op.id)
        return f"{head} = {op.kind}({', '.join(reads)})"

    out: list[tuple[str, frozenset]] = []

    def emit(node, depth: int):
        pad = "  " * depth
        if isinstance(node, Seq):
            for n in node.body:
                emit(n, depth)
        elif isinstance(node, For):
            step = f" step {node.step}" if node.step != 1 else ""
            until = (f" until {name(node.done)}[{node.at}]" if isinstance(node, While)
                     else "")
            head = f"{pad}for {node.var} in {node.lo}..{node.hi}{step}{until}:"
            if node.dim and node.dim != node.var:
                head += f"  # {node.dim}"
            out.append((head, frozenset([node.done]) if isinstance(node, While)
                        else frozenset()))
            emit(node.body, depth + 1)
        elif isinstance(node, If):
            out.append((f"{pad}if {node.cond}:", frozenset()))
            emit(node.then, depth + 1)
            if node.orelse is not None:
                out.append((f"{pad}else:", frozenset()))
                emit(node.orelse, depth + 1)
        elif isinstance(node, Exec):
            if node.op not in hidden:
                out.append((pad + (stmt(node) if node.op in sdg.ops else
                                   f"{name(node.op)}[{', '.join(map(str, node.args))}]"),
                            frozenset([node.op])))
        elif isinstance(node, (Free, Offload, Fetch)):
            ops = [o for o in node.ops if o not in hidden]
            if ops:
                out.append((f"{pad}{type(node).__name__.lower()} "
                            f"{', '.join(name(o) for o in ops)}", frozenset(ops)))

    emit(schedule.ast, 0)
    return out


def code_html(schedule, highlight: int | None = None, constants: bool = False) -> str:
    """The loop code (``code_lines``); lines that run or free the highlighted op are
    marked."""
    out = []
    for line, ops in code_lines(schedule, constants):
        text = html.escape(line)
        if highlight is not None and highlight in ops:
            text = f'<mark style="background:#ffd8d8">{text}</mark>'
        out.append(text)
    return ('<pre class="tempo-lab-code" style="max-height:420px;overflow:auto;font-size:85%">'
            + "\n".join(out) + "</pre>")


# -- iteration space ---------------------------------------------------------------------------
def instances(schedule, bounds: dict[str, int], limit: int = MAX_INSTANCES):
    """``(order, op id, point)`` for every statement instance the loop AST runs under
    ``bounds``, in execution order (at most ``limit``)."""
    out = []
    for node, point in walk(schedule.ast, dict(bounds)):
        if isinstance(node, Exec):
            out.append((len(out), node.op, point))
            if len(out) >= limit:
                break
    return out


def _read_points(e, env) -> list[tuple]:
    """The producer points a read at ``env`` touches (ranges expanded)."""
    axes = []
    for x in e.index:
        if isinstance(x, Slice):
            axes.append(range(x.start.evaluate(env), x.stop.evaluate(env)))
        else:
            axes.append([x.evaluate(env)])
    pts = [()]
    for ax in axes:
        pts = [p + (v,) for p in pts for v in ax]
    return pts


def loop_dims(sdg) -> list:
    """The dims some op still loops over (a vectorised dim is an axis of values, not a loop)."""
    return [d for d in sdg.dims if any(d in op.domain for op in sdg.ops.values())]


def _lanes(op) -> tuple[str, int]:
    """The vectorised dims an op's values carry and how many points they hold at once."""
    names = vdims(op)
    n = 1
    for s in op.type.shape[:len(names)]:
        n *= s if isinstance(s, int) else 1
    return ", ".join(names), n


def iteration_space(schedule, bounds: dict[str, int], highlight: int | None = None,
                    aggregate: bool | None = None):
    """Positions, orders and dependence segments of the plot, as plain data: x is the
    innermost loop dim, y the other loop dims flattened; each statement (or, with
    ``aggregate``, each top-level group of ``widgets.graph.group_paths``: the default above
    ``AGGREGATE_ABOVE`` statements) has a fixed offset in a cell. Ops outside every loop
    (run once) sit in a column of their own at x = ``ONCE``."""
    sdg = schedule.sdg
    dims = loop_dims(sdg)
    inner, outer = (dims[-1], dims[:-1]) if dims else (None, [])
    runs = instances(schedule, bounds)
    stmts = sorted({op for _, op, _ in runs})
    if aggregate is None:
        aggregate = len(stmts) > AGGREGATE_ABOVE
    if aggregate:
        from .graph import group_paths

        paths = group_paths(sdg)
        key = {op: paths[op][0] for op in stmts}
    else:
        key = {op: op for op in stmts}
    keys = sorted(set(key.values()), key=str)
    per_row = max(1, math.ceil(math.sqrt(len(keys) or 1)))
    slot = {k: j for j, k in enumerate(keys)}

    def place(op_id, point):
        vals = {d.name: v for d, v in zip(sdg.ops[op_id].domain, point)}
        k = slot[key[op_id]]
        dx = ((k % per_row) + 0.5) / per_row * 0.8 - 0.4
        dy = ((k // per_row) + 0.5) / per_row * 0.8 - 0.4
        if not vals:
            return ONCE + dx, dy
        x = vals.get(inner.name, 0) if inner is not None else 0
        y = 0
        for d in outer:
            y = y * max(1, bounds.get(d.bound.name, 1)) + vals.get(d.name, 0)
        return x + dx, y + dy

    where = {(op, pt): place(op, pt) for _, op, pt in runs}
    cells: dict[tuple, dict] = {}
    for k, op, pt in runs:
        xy = where[(op, pt)]
        cell = cells.get(xy) if aggregate else None
        if cell is None:
            cell = cells.setdefault(xy if aggregate else (k,), {
                "order": k, "op": op, "ops": [], "point": pt, "xy": xy, "group": key[op],
                "lanes": _lanes(sdg.ops[op])})
        cell["ops"].append(op)
    pts = list(cells.values())
    arrows = []
    for _, op, pt in runs:
        env = dict(bounds)
        env.update((d.name, v) for d, v in zip(sdg.ops[op].domain, pt))
        for e in sdg.in_edges(op):
            if highlight is not None and highlight not in (e.src, e.dst):
                continue
            try:
                if not e.cond.evaluate(env):
                    continue
                reads = _read_points(e, env)
            except Exception:  # noqa: BLE001 - an index the plot cannot evaluate is skipped
                continue
            for rp in reads:
                src = where.get((e.src, rp))
                if src is None or (aggregate and highlight is None and src[0] < ONCE + 1):
                    continue
                dst = where[(op, pt)]
                loop_carried = round(src[0]) != round(dst[0]) or round(src[1]) != round(dst[1])
                if highlight is not None or loop_carried:
                    arrows.append((src, dst))
            if len(arrows) >= MAX_ARROWS:
                break
    axis_names = (inner.name if inner is not None else "", ", ".join(d.name for d in outer))
    return pts, arrows[:MAX_ARROWS], axis_names


def row_ticks(rows: int, room: float, label: float = 18) -> list[int]:
    """The rows the y axis labels: every row while each label has ``label`` px of the
    ``room`` px the axis has, else every 2nd, 5th, 10th, 20th... row. Why: PPO's loops
    over (i, e, m) put 96 rows on 350 px, and a tick per row (``dtick=1``) wrote 96 labels
    over each other. A third of the room is kept for the margin plotly's autorange adds
    around large markers."""
    fits = max(1, int(room / 1.5 / label))
    step = next(s for k in range(12) for s in (10 ** k, 2 * 10 ** k, 5 * 10 ** k)
                if math.ceil(rows / s) <= fits)
    return list(range(0, rows, step))


def iteration_figure(schedule, bounds: dict[str, int], highlight: int | None = None):
    """Statement instances coloured by execution order with dependence arrows (loop-carried
    ones, or every read of the highlighted op); a ``go.Figure``. A statement over vectorised
    dims is a vertical bar (its lanes run at once); above ``AGGREGATE_ABOVE`` statements one
    marker stands for a group's statements at a point, sized by their number."""
    import plotly.graph_objects as go

    sdg = schedule.sdg
    pts, arrows, (xname, yname) = iteration_space(schedule, bounds, highlight)
    grouped = any(len(p["ops"]) > 1 or p["group"] != p["op"] for p in pts)
    fig = go.Figure()
    ax, ay = [], []
    for (x0, y0), (x1, y1) in arrows:
        ax += [x0, x1, None]
        ay += [y0, y1, None]
    fig.add_trace(go.Scatter(x=ax, y=ay, mode="lines", name="dependences",
                             line=dict(color="rgba(120,120,120,0.45)", width=1),
                             hoverinfo="skip"))
    fig.update_layout(annotations=[  # one layout update: add_annotation per arrow is slow
        dict(x=x1, y=y1, ax=x0, ay=y0, xref="x", yref="y", axref="x", ayref="y", text="",
             showarrow=True, arrowhead=2, arrowsize=1, arrowwidth=1,
             arrowcolor="rgba(120,120,120,0.6)") for (x0, y0), (x1, y1) in arrows[:150]])

    def text(p):
        op = sdg.ops[p["op"]]
        at = ", ".join(f"{d}={v}" for d, v in zip(op.domain, p["point"])) or "once"
        head = (f"{p['group']}: {len(p['ops'])} statements" if grouped else
                f"{op_title(op)} ({op.kind})")
        lanes, n = p["lanes"]
        vec = f"<br>vector over {lanes} ({n} lanes at once)" if lanes else ""
        return f"{head} [{at}]{vec}<br>order {p['order']}"

    def size(p):
        base = 11 if highlight in p["ops"] else 7
        return base + (min(12, 2 * math.log2(len(p["ops"]))) if grouped else 0) \
            + (min(10, 2 * math.log2(p["lanes"][1])) if p["lanes"][0] else 0)

    fig.add_trace(go.Scatter(
        x=[p["xy"][0] for p in pts], y=[p["xy"][1] for p in pts], mode="markers",
        name="instances", hovertext=[text(p) for p in pts], hoverinfo="text",
        customdata=[p["op"] for p in pts],
        marker=dict(size=[size(p) for p in pts],
                    symbol=["line-ns-open" if p["lanes"][0] else "circle" for p in pts],
                    color=[p["order"] for p in pts], colorscale="Viridis",
                    colorbar=dict(title="execution order"),
                    line=dict(color=[HIGHLIGHT if highlight in p["ops"] else
                                     "rgba(0,0,0,0)" for p in pts], width=2))))
    b = ", ".join(f"{k}={v}" for k, v in bounds.items())
    xs = sorted({round(p["xy"][0]) for p in pts if p["xy"][0] > ONCE + 1})
    once = any(p["xy"][0] < ONCE + 1 for p in pts)
    vec = sorted({d for p in pts for d in p["lanes"][0].split(", ") if d})  # each dim once
    notes = ([f"vectorised over {', '.join(vec)}: bars"] if vec else []) + (
        ["one marker per group and point"] if grouped else [])
    rows = 1 + max((round(p["xy"][1]) for p in pts), default=-1)
    # the bounds and notes as the subtitle, in lines that fit the chart at a 900-px window
    # (about 390 px wide there): on one line they were cut off; each line more is as much
    # taller, so that the plot keeps its 350 px
    place_title(fig, f"iteration space ({len(pts)} markers)",
                " · ".join([b] + (["; ".join(notes)] if notes else [])))
    margin = dict(l=50, r=10, t=fig.layout.margin.t, b=40)
    height = 350 + margin["t"] + margin["b"]
    fig.update_layout(template=TEMPLATE, height=height, showlegend=False,
                      xaxis=dict(title=xname, tickvals=([ONCE] if once else []) + xs,
                                 ticktext=(["once"] if once else []) + [str(x) for x in xs]),
                      yaxis=dict(title=yname, autorange="reversed",
                                 tickvals=row_ticks(rows, height - margin["t"] - margin["b"])),
                      margin=margin)
    return fig


def small_bounds(bounds: dict[str, int], cap: int = 6) -> dict[str, int]:
    """Bound values small enough to draw every instance."""
    return {k: max(1, min(int(v), cap)) for k, v in bounds.items()}


class ScheduleView:
    """Tree, code and iteration space; ``select(op_id)`` marks the op in code and plot."""

    def __init__(self, schedule, bounds: dict[str, int] | None = None,
                 constants: bool = False):
        import ipywidgets as W

        self.schedule, self.selected = schedule, None
        self.constants = W.Checkbox(value=constants, description="show constants",
                                    indent=False, layout=W.Layout(width="auto"))
        self.constants.add_class("tempo-lab-constants")
        self.constants.observe(lambda _: self._redraw_text(), "value")
        bounds = bounds or {d.bound.name: 4 for d in schedule.sdg.dims}
        self.bounds = small_bounds(bounds)
        self.sliders = {k: W.IntSlider(value=v, min=1, max=max(12, v), description=k,
                                       continuous_update=False) for k, v in self.bounds.items()}
        for s in self.sliders.values():
            s.observe(lambda _: self._bounds_changed(), "value")
        self.code = W.HTML(code_html(schedule, None, constants))
        self.tree = W.HTML(tree_html(schedule, None, constants))
        self.plot = None
        if hasattr(schedule, "ast"):
            self.plot = FigureSlot(iteration_figure(schedule, self.bounds),
                                   "tempo-lab-iteration")
            space = W.VBox([slider_grid(self.sliders.values()), self.plot.widget])
        else:   # a schedule read back by tl.load keeps its code and tree, not its loop AST
            space = W.HTML("<i>a loaded schedule has no loop AST: compile the program to see "
                           "its iteration space</i>")
        inner = W.Tab(children=[W.VBox([self.code]), W.VBox([self.tree]), space])
        for k, t in enumerate(("loop code", "isl schedule tree", "iteration space")):
            inner.set_title(k, t)
        self.widget = W.VBox([W.HBox([W.HTML(f"<code>{html.escape(repr(schedule))}</code>"),
                                      self.constants]), inner])
        self.widget.add_class("tempo-lab-schedule")

    def _bounds_changed(self):
        self.bounds = {k: s.value for k, s in self.sliders.items()}
        if self.plot is not None:
            self.plot.show(iteration_figure(self.schedule, self.bounds, self.selected))

    def _redraw_text(self):
        self.code.value = code_html(self.schedule, self.selected, self.constants.value)
        self.tree.value = tree_html(self.schedule, self.selected, self.constants.value)

    def select(self, op_id: int | None):
        self.selected = None if op_id is None or op_id < 0 else op_id
        self._redraw_text()
        if self.plot is not None:
            self.plot.show(iteration_figure(self.schedule, self.bounds, self.selected))


def explore_schedule(schedule, bounds=None):
    sv = ScheduleView(schedule, bounds)
    view = stage_view([sv.widget], schedule._repr_html_(), "tempo-lab-schedule-view")
    view.schedule_view = sv
    return view
