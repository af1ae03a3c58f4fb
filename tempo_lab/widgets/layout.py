"""A nested, stable layout of a ``GraphSpec``, drawn as SVG for the graph canvas.

One graphviz call over the whole graph (clusters and all) moved every box whenever one group
opened, ranked the layers by whatever edges pulled hardest (a rope table read by every layer
zig-zagged sixteen layers over the canvas) and, when its ranking failed on nested clusters,
fell back to a global ranking that took most of a minute. Here every group's inside is laid
out on its own, as a flat graph of its children (ops, closed groups, and open groups as boxes):

- Each group is laid out by ``dot`` as a *skeleton*: its children as boxes at the size they
  have with everything in them open (innermost groups first). A skeleton depends only on what
  the group holds, so it is computed once and cached (a module-level cache keyed by its DOT
  text; the missing skeletons of one level of nesting go to one ``dot`` call).
- Every drawing is placed from the drawing with every group open (``GraphSpec.frame``): an
  op at its place, an open group at its box, a closed group filling its box (its ops drawn
  faint in it). So a group has the same room open or closed, and opening or closing it
  changes nothing outside it; the price is that a collapsed graph is as large as an
  expanded one.
- Edges are laid out at the innermost group holding both ends, between the children that hold
  them (one edge per pair of children, ``N reads``). Edges implied by a longer path of program
  order (a table made in ``layer0`` read by all sixteen layers) and edges back in program order
  (recurrences) do not rank anything (``constraint=false``), so a chain of layers is a
  vertical chain in program order whatever else they share.
- A box is at least as wide as its title, and titles sit in a band of their own at the top of
  their box, so titles never overlap one another.

``dot`` runs through ``tempo_lab.svg._dot`` (SVG output, under its time limit) and its SVG is
read back for positions; no ``dot`` or a ``dot`` failure gives ``None`` (the views then draw
with plotly, as before)."""
from __future__ import annotations

import html
import re
import subprocess
from collections import OrderedDict
from dataclasses import dataclass, field

from tempo_lab import svg as _svg

from . import graph as G

NODE_FONT, TITLE_FONT, EDGE_FONT = 10.0, 12.0, 9.0
PAD = 8.0          # between a group's border and what is inside it
TITLE_H = 22.0     # the band at the top of a group's box its title is written in
MARGIN = 6.0
GAP = 18.0         # between two children of one rank pushed apart by a growing one
CACHE = 4000       # skeletons kept


@dataclass
class Item:
    """A child in a group's layout: a drawn node (``node``) or an open group's box."""
    key: str
    order: int
    node: G.Node | None = None
    title: str = ""
    colour: str = ""
    tooltip: str = ""
    closed: tuple[float, float] = (0.0, 0.0)   # its room in its parent's skeleton
    children: list = field(default_factory=list)
    w: float = 0.0
    h: float = 0.0
    x: float = 0.0     # top-left, relative to the parent's content, then absolute
    y: float = 0.0
    keys: tuple = ()   # a group's key, and those of the groups drawn in the same box
    label: str = ""    # a group's label when closed (what its box must have room for)
    ghost: list = field(default_factory=list)   # a closed group: its ops' boxes, drawn faint


# -- text metrics (Helvetica / Arial advance widths, in ems) ------------------------------------
def _advance(ch: str) -> float:
    if ch in " .,:;'|!ijl":
        return 0.28
    if ch in "()[]{}ftrI-/\"":
        return 0.34
    if ch in "mwMW@%":
        return 0.86
    if ch.isupper():
        return 0.68
    if ch.isascii():
        return 0.56
    return 0.62     # × · ◦ → – …


def text_width(text: str, size: float) -> float:
    return sum(_advance(c) for c in text) * size


def node_size(label: str) -> tuple[float, float]:
    """A node's box (points) for its label: dot's margins and least size (54 x 36)."""
    lines = label.split("\n")
    w = max(text_width(line, NODE_FONT) for line in lines) + 18
    return max(54.0, round(w, 1)), max(36.0, round(len(lines) * NODE_FONT * 1.2 + 10, 1))


def title_width(title: str) -> float:
    return text_width(title, TITLE_FONT) + 2 * PAD


# -- the tree of groups -------------------------------------------------------------------------
def tree(spec: G.GraphSpec) -> list[Item]:
    """The root's children: nodes and open groups (a group holding only one open group is one
    box with both titles, as in ``to_dot``), each in program order."""
    key_of = {path: key for key, path in spec.groups.items()}
    inside: dict[tuple[str, ...], list] = {}
    for k, n in enumerate(spec.nodes):
        inside.setdefault(n.cluster, []).append((k, n))
    kids: dict[tuple[str, ...], list] = {}
    for c in sorted({n.cluster[:j] for n in spec.nodes for j in range(1, len(n.cluster) + 1)},
                    key=lambda p: int(key_of[p][1:])):
        kids.setdefault(c[:-1], []).append(c)

    def build(path: tuple[str, ...]) -> list[Item]:
        items = [Item(n.key, k, node=n, closed=node_size(n.label)) for k, n in inside.get(path, [])]
        for sub in kids.get(path, []):
            title, content, keys = spec.titles.get(sub, sub[-1]), sub, [key_of[sub]]
            while not inside.get(content) and len(kids.get(content, [])) == 1:
                content = kids[content][0]
                keys.append(key_of[content])
                title += f" {content[-1]}"
            children = build(content)
            title = f"{title} · {spec.sizes.get(sub, 0)} ops"
            items.append(Item(key_of[sub], min(c.order for c in children), title=title,
                              colour=G._group_colour(content), children=children,
                              tooltip=f"{'/'.join(sub)} (click the title to collapse)",
                              closed=node_size(spec.closed.get(sub, title)), keys=tuple(keys),
                              label=spec.closed.get(sub, title)))
        return sorted(items, key=lambda it: it.order)

    return build(())


# -- skeletons: dot on one group's children at their closed sizes -------------------------------
def _reaches(succ: dict[int, set], a: int, b: int) -> bool:
    """Whether b is reached from a by a path of two edges or more."""
    seen, todo = set(), [c for c in succ.get(a, ()) if c != b]
    while todo:
        n = todo.pop()
        if n == b:
            return True
        if n not in seen:
            seen.add(n)
            todo.extend(succ.get(n, ()))
    return False


def _loose(edges: dict) -> set:
    """The edges that rank nothing: back in program order (recurrences), or implied by a
    longer path (a table made in ``layer0`` and read by every layer)."""
    succ: dict[int, set] = {}
    for a, b in edges:
        if a < b:
            succ.setdefault(a, set()).add(b)
    return {(a, b) for a, b in edges if b < a or _reaches(succ, a, b)}


def skeleton_dot(items: list[Item], edges: dict[tuple[int, int], list]) -> str:
    """DOT for one group's children (indices into ``items``) at their closed sizes."""
    lines = ["digraph L { rankdir=TB; nodesep=0.3; ranksep=0.35; "
             'node [shape=box, fixedsize=true, label=""]; '
             'edge [fontname="Helvetica", fontsize=9];']
    for k, it in enumerate(items):
        w, h = it.closed
        lines.append(f'n{k} [id="n{k}", width={w / 72:.3f}, height={h / 72:.3f}];')
    loose = _loose(edges)
    for k, ((a, b), es) in enumerate(edges.items()):
        label = _edge_label(es)
        attrs = f'id="e{k}", label="{G.dot_quote(label)}"' if label else f'id="e{k}"'
        if (a, b) in loose:
            attrs += ", constraint=false, weight=0"
        lines.append(f"n{a} -> n{b} [{attrs}];")
    lines.append("}")
    return "\n".join(lines)


def _edge_label(es: list) -> str:
    """The label of the edges between two children: the edge's own when it is one read, else
    how many reads (the same whichever of the two children are open)."""
    n = sum(int(m.group(1)) if (m := re.match(r"(\d+) reads", lab)) else 1 for lab, _ in es)
    return es[0][0] if n == 1 else f"{n} reads"


_SKELETONS: OrderedDict[str, dict] = OrderedDict()
_RUNNER = None     # the dot runner the cache was filled by
_NUM = r"(-?[\d.]+(?:e-?\d+)?)"


def _parse(svg: str) -> dict:
    """Positions from dot's SVG of a skeleton: node boxes (top-left, size), edge splines,
    arrowheads and label lines, in the SVG's own (y down) coordinates."""
    m = re.search(r"translate\(" + _NUM + " " + _NUM + r"\)", svg)
    tx, ty = (float(m.group(1)), float(m.group(2))) if m else (0.0, 0.0)

    def pts(text):
        return [(float(x) + tx, float(y) + ty) for x, y in re.findall(_NUM + "," + _NUM, text)]

    nodes = {}
    for m in re.finditer(r'<g id="n(\d+)" class="node">.*?points="([^"]+)"', svg, re.S):
        p = pts(m.group(2))
        xs, ys = [x for x, _ in p], [y for _, y in p]
        nodes[int(m.group(1))] = (min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys))
    edges = {}
    for m in re.finditer(r'<g id="e(\d+)" class="edge">(.*?)</g>', svg, re.S):
        body = m.group(2)
        d = re.search(r' d="([^"]+)"', body)
        arrow = re.search(r'<polygon[^>]*points="([^"]+)"', body)
        texts = [(float(x) + tx, float(y) + ty, html.unescape(t)) for x, y, t in re.findall(
            r'<text[^>]*x="' + _NUM + '" y="' + _NUM + '"[^>]*>([^<]*)</text>', body)]
        edges[int(m.group(1))] = (pts(d.group(1)) if d else [],
                                  pts(arrow.group(1)) if arrow else [], texts)
    return {"nodes": nodes, "edges": edges}


def skeletons(dots: list[str]) -> list[dict] | None:
    """Each DOT's layout, from the cache or from one ``dot`` call for all that are missing;
    None when dot is missing, fails or runs out of time."""
    global _RUNNER
    if _RUNNER is not _svg._dot:      # another dot (a test's stand-in): nothing cached holds
        _SKELETONS.clear()
        _RUNNER = _svg._dot
    missing = list(dict.fromkeys(d for d in dots if d not in _SKELETONS))
    if missing:
        try:
            out = _svg._dot("\n".join(missing), _svg.DOT_SECONDS)
        except (FileNotFoundError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
            return None
        parts = [p for p in re.split(r"(?=<svg\b)", out) if p.startswith("<svg")]
        if len(parts) != len(missing):
            return None
        for d, part in zip(missing, parts):
            _SKELETONS[d] = _parse(part)
        while len(_SKELETONS) > CACHE:
            _SKELETONS.popitem(last=False)
    for d in dots:
        _SKELETONS.move_to_end(d)
    return [_SKELETONS[d] for d in dots]


# -- placing: skeleton positions, open groups grown in place -----------------------------------
@dataclass
class Edge:
    points: list          # a cubic spline: start, then three points per segment
    arrow: list           # the arrowhead's polygon
    texts: list           # (x, y, line, anchor)
    dashed: bool
    key: str
    group: str = ""       # the group it is laid out in ("": the top level)


def _grow(items: list[Item], skel: dict) -> list:
    """Place ``items`` (their ``w``, ``h`` set) from the skeleton: each keeps its skeleton
    top-left corner, moved down by what the ranks above it grew and right by what grew to its
    left in its rank. Returns the bands (top, bottom, shift,
    growth) that map the skeleton's y onto the placed one."""
    ranks: dict[float, list[int]] = {}
    for k in range(len(items)):
        x, y, w, h = skel["nodes"].get(k, (0.0, 0.0, *items[k].closed))
        ranks.setdefault(round(y + h / 2, 1), []).append(k)
    bands, shift = [], 0.0
    for centre in sorted(ranks):
        row = sorted(ranks[centre], key=lambda k: skel["nodes"].get(k, (0,))[0])
        top = min(skel["nodes"].get(k, (0, 0, 0, 0))[1] for k in row)
        bottom = max(sum(skel["nodes"].get(k, (0, 0, 0, 0))[1::2]) for k in row)
        cursor, reach = -1e9, bottom
        for k in row:
            x, y, _, _ = skel["nodes"].get(k, (0.0, 0.0, 0.0, 0.0))
            it = items[k]
            it.x, it.y = max(x, cursor + GAP), y + shift
            cursor = it.x + it.w
            reach = max(reach, y + it.h)
        bands.append((top, bottom, shift, reach - bottom))
        shift += reach - bottom
    return bands


def _map_y(bands: list, y: float) -> float:
    for _top, bottom, shift, _growth in bands:
        if y <= bottom:         # above the band (between it and the one before) or in it
            return y + shift
    return y + (bands[-1][2] + bands[-1][3] if bands else 0.0)


def _arrow(tip: tuple[float, float], fro: tuple[float, float]) -> list:
    dx, dy = tip[0] - fro[0], tip[1] - fro[1]
    n = (dx * dx + dy * dy) ** 0.5 or 1.0
    ux, uy = dx / n, dy / n
    bx, by = tip[0] - 9 * ux, tip[1] - 9 * uy
    return [tip, (bx - 3.5 * uy, by + 3.5 * ux), (bx + 3.5 * uy, by - 3.5 * ux), tip]


def _line(p, q) -> list:
    """A straight piece as one cubic segment (without its start)."""
    return [(p[0] + (q[0] - p[0]) / 3, p[1] + (q[1] - p[1]) / 3),
            (p[0] + 2 * (q[0] - p[0]) / 3, p[1] + 2 * (q[1] - p[1]) / 3), q]


def _fresh(a: Item, b: Item, sx: float, ex: float, items: list[Item], lanes: list):
    """A new spline from a to b, its arrowhead and a place for its label: straight down when b
    is below a and nothing is in between, else out of a's right side, down (or up) a lane
    right of everything beside the way, and into b's right side."""
    if b.y >= a.y + a.h - 1:
        s = (min(max(sx, a.x + 6), a.x + a.w - 6), a.y + a.h)
        tip = (min(max(ex, b.x + 6), b.x + b.w - 6), b.y)
        lo, hi = min(s[0], tip[0]) - 4, max(s[0], tip[0]) + 4
        if not any(it is not a and it is not b and it.x < hi and it.x + it.w > lo
                   and it.y < tip[1] and it.y + it.h > s[1] for it in items):
            end = (tip[0], tip[1] - 9)
            dy = max(end[1] - s[1], 10.0)
            pts = [s, (s[0], s[1] + dy / 2), (end[0], end[1] - dy / 2), end]
            mid = ((s[0] + end[0]) / 2, (s[1] + end[1]) / 2)
            return pts, _arrow(tip, end), mid
    top, bottom = min(a.y, b.y), max(a.y + a.h, b.y + b.h)
    beside = [it.x + it.w for it in items if it.y < bottom and it.y + it.h > top]
    lane = max(beside + [a.x + a.w, b.x + b.w]) + 14 + 5 * (len(lanes) % 8)
    lanes.append(lane)
    s = (a.x + a.w, a.y + a.h * (0.7 if b.y > a.y else 0.3))
    tip = (b.x + b.w, b.y + (min(b.h / 2, 14.0) if b.y > a.y else b.h * 0.7))
    end = (tip[0] + 9, tip[1])
    r = min(8.0, abs(end[1] - s[1]) / 2)
    down = 1 if end[1] > s[1] else -1
    c1, c2 = (lane - r, s[1]), (lane, s[1] + down * r)
    c3, c4 = (lane, end[1] - down * r), (lane - r, end[1])
    pts = [s, *_line(s, c1), (lane, s[1]), (lane, s[1]), c2, *_line(c2, c3),
           (lane, end[1]), (lane, end[1]), c4, *_line(c4, end)]
    return pts, _arrow(tip, end), (lane, (s[1] + end[1]) / 2)


def place(items: list[Item], edges: dict, skel: dict) -> tuple[float, float, list]:
    """Place one group's children (their sizes set) and its edges; returns the content's
    width, height and edges, relative to the content's top-left corner."""
    bands = _grow(items, skel)
    drawn, lanes = [], []
    loose = _loose(edges)
    for k, ((a, b), es) in enumerate(edges.items()):
        ia, ib = items[a], items[b]
        dashed = all(d for _, d in es)
        key = f"{ia.key}->{ib.key}"
        pts, arrow, texts = skel["edges"].get(k, ([], [], []))
        sa, sb = skel["nodes"].get(a), skel["nodes"].get(b)
        same = all(s is not None and max(abs(it.x - s[0]), abs(it.w - s[2]), abs(it.h - s[3])) < 0.5
                   for it, s in ((ia, sa), (ib, sb)))
        if same and pts and (a, b) not in loose:   # loose ones: in lanes, side by side
            drawn.append(Edge([(x, _map_y(bands, y)) for x, y in pts],
                              [(x, _map_y(bands, y)) for x, y in arrow],
                              [(x, _map_y(bands, y), t, "middle") for x, y, t in texts],
                              dashed, key))
            continue
        sx = pts[0][0] if pts else ia.x + ia.w / 2
        ex = arrow[0][0] if arrow else ib.x + ib.w / 2
        p, arr, (mx, my) = _fresh(ia, ib, sx, ex, items, lanes)
        label = _edge_label(es)
        lines = label.split("\n") if label else []
        drawn.append(Edge(p, arr, [(mx + 4, my + 11 * (j - len(lines) / 2) + 8, line, "start")
                                   for j, line in enumerate(lines)], dashed, key))
    xs = [it.x + it.w for it in items] + [x for e in drawn for x, _ in e.points]
    xs += [x + text_width(t, EDGE_FONT) for e in drawn for x, _, t, _ in e.texts]
    ys = [it.y + it.h for it in items] + [y for e in drawn for _, y in e.points]
    return max(xs, default=0.0), max(ys, default=0.0), drawn


@dataclass
class Layout:
    items: list          # the root's children, placed (absolute)
    edges: list          # every edge, absolute
    width: float
    height: float

    def boxes(self) -> dict[str, tuple[float, float, float, float]]:
        """Every node and group box: key -> (x, y, w, h), in the drawing's coordinates."""
        out = {}

        def walk(items):
            for it in items:
                out[it.key] = (it.x, it.y, it.w, it.h)
                walk(it.children)
        walk(self.items)
        return out

    def titles(self) -> dict[str, tuple[float, float, float, float]]:
        """Every group title's box (open groups' titles, closed groups' first lines): both
        are written centred in the band at the top of the group's box."""
        out = {}

        def walk(items):
            for it in items:
                if it.node is None:
                    w = text_width(it.title, TITLE_FONT)
                    out[it.key] = (it.x + it.w / 2 - w / 2, it.y + 4, w, TITLE_FONT * 1.2)
                elif it.node.op is None:
                    line = it.node.label.split("\n")[0]
                    w = text_width(line, TITLE_FONT)
                    out[it.key] = (it.x + it.w / 2 - w / 2, it.y + 4, w, TITLE_FONT * 1.2)
                walk(it.children)
        walk(self.items)
        return out


def _label_room(label: str) -> tuple[float, float]:
    """The least box a closed group's label needs: its first line as a title, the rest below."""
    lines = label.split("\n")
    w = max([title_width(lines[0])] + [text_width(x, NODE_FONT) + 2 * PAD for x in lines[1:]])
    return w, TITLE_H + len(lines[1:]) * NODE_FONT * 1.2 + PAD


def frame_layout(frame: G.GraphSpec) -> Layout | None:
    """Every node and group of ``frame`` (a drawing with every group open) placed: each
    group's inside laid out on its own by ``dot`` (cached), its children at their full sizes,
    innermost groups first. A group's box is the room it has open, closed or anything
    between; None when ``dot`` is missing or fails."""
    root = tree(frame)
    chain: dict[str, list[str]] = {}
    groups: dict[str, list[Item]] = {"": root}
    owner: dict[str, Item] = {}
    depth: dict[str, int] = {"": 0}

    def walk(items, prefix):
        for it in items:
            if it.node is not None:
                chain[it.key] = prefix + [it.key]
            else:
                groups[it.key], owner[it.key] = it.children, it
                depth[it.key] = len(prefix) + 1
                walk(it.children, prefix + [it.key])
    walk(root, [])
    index = {g: {it.key: k for k, it in enumerate(items)} for g, items in groups.items()}
    edges: dict[str, dict] = {g: {} for g in groups}
    for s, d, label, dashed in frame.edges:
        cs, cd = chain.get(s), chain.get(d)
        if cs is None or cd is None:
            continue
        k = 0
        while cs[k] == cd[k]:
            k += 1
        g = cs[k - 1] if k else ""
        edges[g].setdefault((index[g][cs[k]], index[g][cd[k]]), []).append((label, dashed))
    for g in edges:    # program order, so that the skeleton's DOT text is the same each time
        edges[g] = dict(sorted(edges[g].items()))
    placed: dict[str, list] = {}
    width = height = 0.0
    for level in sorted(set(depth.values()), reverse=True):     # innermost groups first
        todo = [g for g in groups if depth[g] == level]
        for g in todo:
            for it in groups[g]:
                if it.node is not None:
                    it.w, it.h = node_size(it.node.label)
                it.closed = (it.w, it.h)
        dots = {g: skeleton_dot(groups[g], edges[g]) for g in todo if len(groups[g]) > 1}
        laid = skeletons(list(dots.values()))
        if laid is None:
            return None
        skel = dict(zip(dots, laid))
        for g in todo:
            items = groups[g]
            if g in skel:
                w, h, placed[g] = place(items, edges[g], skel[g])
            else:                                   # one child: nothing to lay out
                items[0].x = items[0].y = 0.0
                w, h, placed[g] = items[0].w, items[0].h, []
            if g == "":
                width, height = w, h
                continue
            it = owner[g]
            lw, lh = _label_room(it.label)
            it.w = max(w + 2 * PAD, title_width(it.title), lw)
            it.h = max(TITLE_H + h + PAD, lh)
    out: list[Edge] = []

    def absolute(items: list[Item], g: str, ox: float, oy: float):
        for e in placed[g]:
            out.append(Edge([(x + ox, y + oy) for x, y in e.points],
                            [(x + ox, y + oy) for x, y in e.arrow],
                            [(x + ox, y + oy, t, a) for x, y, t, a in e.texts], e.dashed, e.key,
                            g))
        for it in items:
            it.x += ox
            it.y += oy
            if it.node is None:
                absolute(it.children, it.key, it.x + PAD, it.y + TITLE_H)
    absolute(root, "", MARGIN, MARGIN)
    return Layout(root, out, width + 2 * MARGIN, height + 2 * MARGIN)


def _ops_under(it: Item) -> list:
    out = []
    for c in it.children:
        if c.node is not None:
            out.append((c.x, c.y, c.w, c.h))
        else:
            out.extend(_ops_under(c))
    return out


def visible(frame: Layout, spec: G.GraphSpec) -> Layout:
    """What ``spec`` draws, where ``frame`` placed it: an op at its place, an open group at
    its box, a closed group filling its box (its ops' boxes drawn faint inside it, and the
    ops kept visible, a search hit or the selected op, drawn over it); the edges laid out in
    the top level and in the groups drawn open."""
    nodes = {n.key: n for n in spec.nodes}
    opened = {k for k in spec.groups if k not in nodes}
    shown: set[str] = {""}

    def walk(items: list[Item]) -> list[Item]:
        out = []
        for it in items:
            if it.node is not None:
                if it.key in nodes:
                    out.append(Item(it.key, it.order, node=nodes[it.key], w=it.w, h=it.h,
                                    x=it.x, y=it.y))
                continue
            inner = walk(it.children)
            closed = next((k for k in it.keys if k in nodes), None)
            if closed is not None:
                out.append(Item(closed, it.order, node=nodes[closed], w=it.w, h=it.h, x=it.x,
                                y=it.y, ghost=_ops_under(it), children=inner))
            elif it.key in opened:
                shown.add(it.key)
                out.append(Item(it.key, it.order, title=it.title, colour=it.colour,
                                tooltip=it.tooltip, children=inner, w=it.w, h=it.h, x=it.x,
                                y=it.y, keys=it.keys))
            else:                 # not drawn (a group of one op): what is in it is
                out.extend(inner)
        return out

    items = walk(frame.items)
    # the frame's edges that this drawing has: a pair of children of one group is joined when
    # some edge drawn joins what is in the one to what is in the other (a pass's after has
    # none of the edges into the ops it erased, though the frame of both sides has them)
    chain: dict[str, list[str]] = {}

    def trace(its, prefix):
        for it in its:
            here = prefix + [it.key]
            for k in it.keys or (it.key,):
                chain[k] = here
            trace(it.children, here)
    trace(frame.items, [])
    pairs = set()
    for s, d, _, _ in spec.edges:
        cs, cd = chain.get(s), chain.get(d)
        if cs is None or cd is None:
            continue
        k = 0
        while k < min(len(cs), len(cd)) and cs[k] == cd[k]:
            k += 1
        if k < min(len(cs), len(cd)):
            pairs.add(f"{cs[k]}->{cd[k]}")
    return Layout(items, [e for e in frame.edges if e.group in shown and e.key in pairs],
                  frame.width, frame.height)


def layout(spec: G.GraphSpec, frame: G.GraphSpec | None = None) -> Layout | None:
    """The layout of ``spec``: everything where ``frame`` (by default ``spec.frame``, the
    same drawing with every group open) places it, so that which groups are open moves
    nothing; None when ``dot`` is missing or fails."""
    lay = frame_layout(frame or spec.frame or spec)
    return None if lay is None else visible(lay, spec)


# -- SVG ----------------------------------------------------------------------------------------
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _text(s: str) -> str:
    return html.escape(_CONTROL.sub("\u2400", s))


def _rect(x, y, w, h, r=4.0) -> str:
    return (f"M{x + r:.1f},{y:.1f}H{x + w - r:.1f}Q{x + w:.1f},{y:.1f} {x + w:.1f},{y + r:.1f}"
            f"V{y + h - r:.1f}Q{x + w:.1f},{y + h:.1f} {x + w - r:.1f},{y + h:.1f}H{x + r:.1f}"
            f"Q{x:.1f},{y + h:.1f} {x:.1f},{y + h - r:.1f}V{y + r:.1f}Q{x:.1f},{y:.1f} "
            f"{x + r:.1f},{y:.1f}Z")


def _title(it: Item, text: str, fill: str = "#333") -> str:
    """A group's title, centred in the band at the top of its box, hanging from its top: drawn
    larger when zoomed out, it grows down into its own box (not up into the one above) and
    evenly to both sides (the middle of what a closed group draws stays on its box)."""
    return (f'<text text-anchor="middle" x="{it.x + it.w / 2:.1f}" y="{it.y + 5:.1f}" '
            f'dominant-baseline="hanging" font-size="{TITLE_FONT:g}" fill="{fill}">'
            f"{_text(text)}</text>")


def _edge_svg(e: Edge) -> str:
    (x0, y0), rest = e.points[0], e.points[1:]
    d = f"M{x0:.1f},{y0:.1f}C" + " ".join(f"{x:.1f},{y:.1f}" for x, y in rest)
    dash = ' stroke-dasharray="5,2"' if e.dashed else ""
    arrow = " ".join(f"{x:.1f},{y:.1f}" for x, y in e.arrow)
    texts = "".join(f'<text text-anchor="{a}" x="{x:.1f}" y="{y:.1f}" '
                    f'font-size="{EDGE_FONT:g}" fill="#444">{_text(t)}</text>'
                    for x, y, t, a in e.texts)
    return (f'<g class="edge"><title>{_text(e.key)}</title><path fill="none" '
            f'stroke="#666"{dash} d="{d}"/><polygon fill="#666" stroke="#666" '
            f'points="{arrow}"/>{texts}</g>')


def _node_svg(it: Item) -> str:
    n = it.node
    lines = n.label.split("\n")
    box = (f'<g id="{n.key}" class="node"><title>{_text(n.tooltip)}</title>'
           f'<path fill="{n.fill}" stroke="{n.border}" stroke-width="{n.width:g}" '
           f'd="{_rect(it.x, it.y, it.w, it.h)}"/>')
    if n.op is None:        # a closed group: its box, its ops faint, its label at the top
        ghost = "".join(f"M{x:.1f},{y:.1f}h{w:.1f}v{h:.1f}h{-w:.1f}Z" for x, y, w, h in it.ghost)
        if ghost:
            box += (f'<path class="tl-ghost" fill="#000" fill-opacity="0.07" '
                    f'pointer-events="none" d="{ghost}"/>')
        # black like an op's label: #333 read 3.2:1 on the red of the largest cost
        return box + _title(it, lines[0], "#000") + "".join(
            f'<text text-anchor="middle" x="{it.x + it.w / 2:.1f}" '
            f'y="{it.y + TITLE_H + (j + 1) * NODE_FONT * 1.2 - 3:.1f}" '
            f'font-size="{NODE_FONT:g}" fill="#000">{_text(line)}</text>'
            for j, line in enumerate(lines[1:])) + "</g>"
    top = it.y + it.h / 2 - len(lines) * NODE_FONT * 1.2 / 2
    return box + "".join(
        f'<text text-anchor="middle" x="{it.x + it.w / 2:.1f}" '
        f'y="{top + (j + 1) * NODE_FONT * 1.2 - 3:.1f}" font-size="{NODE_FONT:g}">'
        f"{_text(line)}</text>" for j, line in enumerate(lines)) + "</g>"


LEGEND_ROW = 16.0    # the height of a row of the legend drawn above the graph


def legend_svg(spec: G.GraphSpec, width: float) -> tuple[str, float]:
    """What the colours mean (``graph.legend_items``, the cost scale first), as an SVG group
    in rows above the drawing (at negative y, wrapped at ``width``, at least 320), and the
    height it takes. Why: the legend above the canvas is HTML, so that a downloaded or
    exported SVG had colours and nothing to say what they mean."""
    items = [(t, f, b, 11.0) for t, f, b in G.legend_items(spec)]
    if spec.heat:
        items.insert(0, (G.heat_legend(spec), "url(#tl-heat)", "#888", 80.0))
    if not items:
        return "", 0.0
    width = max(width, 320.0)
    out, x, row, on_row = [], text_width("colour:", NODE_FONT) + 12, 0, 0
    for text, fill, border, swatch in items:
        w = swatch + 4 + text_width(text, NODE_FONT) + 12
        if on_row and x + w > width:
            x, row, on_row = 6.0, row + 1, 0
        out.append((x, row, text, fill, border, swatch))
        x, on_row = x + w, on_row + 1
    height = (row + 1) * LEGEND_ROW + 8
    parts = [f'<text x="6" y="{-height + 4 + 11:.1f}" font-size="{NODE_FONT:g}" '
             'fill="#333">colour:</text>']
    for x, k, text, fill, border, swatch in out:
        y = -height + 4 + k * LEGEND_ROW
        parts.append(f'<rect x="{x:.1f}" y="{y + 2:.1f}" width="{swatch:g}" height="11" '
                     f'fill="{fill}" stroke="{border}"/><text x="{x + swatch + 4:.1f}" '
                     f'y="{y + 11:.1f}" font-size="{NODE_FONT:g}" fill="#333">'
                     f"{_text(text)}</text>")
    heat = (f'<defs><linearGradient id="tl-heat"><stop offset="0" stop-color="#ffffff"/>'
            f'<stop offset="1" stop-color="{G.heat(1.0)}"/></linearGradient></defs>'
            if spec.heat else "")
    return (f'<g class="tl-legend" font-family="Helvetica,Arial,sans-serif">{heat}'
            + "".join(parts) + "</g>"), height


def to_svg(lay: Layout, legend: tuple[str, float] = ("", 0.0)) -> str:
    """The layout as SVG, in graphviz's shapes (``g.node`` and ``g.cluster`` with the keys as
    ids, ``g.edge``), which is what the canvas and its tests read. A group's ``g.cluster``
    holds its box, its edges, what is drawn in it and, last, its title, so that its title is
    drawn over what is inside it (zoomed out, titles are drawn larger than their bands).
    ``legend`` (``legend_svg``) is drawn above the graph, in the view box of the file but not
    in ``data-box``, the drawing's own box, which the canvas fits to (it shows the legend in
    HTML above itself)."""
    W, H = lay.width, lay.height
    top = legend[1]
    edges: dict[str, list[Edge]] = {}
    for e in lay.edges:
        if e.points:
            edges.setdefault(e.group, []).append(e)
    out: list[str] = [_edge_svg(e) for e in edges.get("", [])]

    def walk(items):
        for it in items:
            if it.node is None:
                out.append(f'<g id="{it.key}" class="cluster"><title>{_text(it.tooltip)}</title>'
                           f'<path fill="none" stroke="{it.colour}" stroke-dasharray="5,2" '
                           f'd="{_rect(it.x, it.y, it.w, it.h)}"/>')
                out.extend(_edge_svg(e) for e in edges.get(it.key, []))
                walk(it.children)
                out.append(f"{_title(it, it.title)}</g>")
                continue
            out.append(_node_svg(it))
            walk(it.children)   # a closed group's ops kept in sight (a search hit), over it
    walk(lay.items)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W:.0f}pt" '
            f'height="{H + top:.0f}pt" viewBox="0 {-top:g} {W:.1f} {H + top:.1f}" '
            f'data-box="0 0 {W:.1f} {H:.1f}"><rect class="tl-bg" y="{-top:g}" width="100%" '
            'height="100%" fill="white"/><g id="graph0" class="graph" '
            'font-family="Helvetica,Arial,sans-serif">' + "".join(out) + "</g>"
            + legend[0] + "</svg>")


def svg(spec: G.GraphSpec) -> str | None:
    """The nested layout of ``spec`` as SVG, with its colour legend above it, or None when
    ``dot`` is missing or fails."""
    lay = layout(spec)
    return None if lay is None else to_svg(lay, legend_svg(spec, lay.width))
