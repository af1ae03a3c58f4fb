"""A nested, stable layout of a ``GraphSpec``, drawn as SVG for the graph canvas.

One graphviz call over the whole graph (clusters and all) moved every box whenever one group
opened, ranked the layers by whatever edges pulled hardest (a rope table read by every layer
zig-zagged sixteen layers over the canvas) and, when its ranking failed on nested clusters,
fell back to a global ranking that took most of a minute. Here every group's inside is laid
out on its own, as a flat graph of its children (ops, closed groups, and open groups as boxes):

- Each open group is first laid out by ``dot`` as a *skeleton*: every child at the size it has
  when closed. The skeleton depends only on what the group holds, never on which of its
  children are open, so it is computed once per group and cached (a module-level cache keyed
  by its DOT text; all the missing skeletons of a drawing go to one ``dot`` call).
- An open child grows in place from the skeleton's top-left corner: the children in ranks
  below move down by what it grew, those to its right in its rank move right, nothing above
  or to the left of it moves. The same happens one level up, with the group's own box. So
  opening or closing a group moves nothing above or to the left of it, and what is below or
  to the right moves only by the group's change in size.
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
    closed: tuple[float, float] = (0.0, 0.0)   # its size when closed: its room in the skeleton
    children: list = field(default_factory=list)
    w: float = 0.0
    h: float = 0.0
    x: float = 0.0     # top-left, relative to the parent's content, then absolute
    y: float = 0.0


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
            title, content = sub[-1], sub
            while not inside.get(content) and len(kids.get(content, [])) == 1:
                content = kids[content][0]
                title += f" {content[-1]}"
            children = build(content)
            title = f"{title} · {spec.sizes.get(sub, 0)} ops"
            items.append(Item(key_of[sub], min(c.order for c in children), title=title,
                              colour=G._group_colour(content), children=children,
                              tooltip=f"{'/'.join(sub)} (click the title to collapse)",
                              closed=node_size(spec.closed.get(sub, title))))
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


def skeleton_dot(items: list[Item], edges: dict[tuple[int, int], list]) -> str:
    """DOT for one group's children (indices into ``items``) at their closed sizes."""
    lines = ["digraph L { rankdir=TB; nodesep=0.3; ranksep=0.35; "
             'node [shape=box, fixedsize=true, label=""]; '
             'edge [fontname="Helvetica", fontsize=9];']
    for k, it in enumerate(items):
        w, h = it.closed
        lines.append(f'n{k} [id="n{k}", width={w / 72:.3f}, height={h / 72:.3f}];')
    succ: dict[int, set] = {}
    for a, b in edges:
        if a < b:
            succ.setdefault(a, set()).add(b)
    for k, ((a, b), es) in enumerate(edges.items()):
        loose = b < a or _reaches(succ, a, b)
        label = _edge_label(es)
        attrs = f'id="e{k}", label="{G.dot_quote(label)}"' if label else f'id="e{k}"'
        if loose:
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
    for k, ((a, b), es) in enumerate(edges.items()):
        ia, ib = items[a], items[b]
        dashed = all(d for _, d in es)
        key = f"{ia.key}->{ib.key}"
        pts, arrow, texts = skel["edges"].get(k, ([], [], []))
        sa, sb = skel["nodes"].get(a), skel["nodes"].get(b)
        same = all(s is not None and max(abs(it.x - s[0]), abs(it.w - s[2]), abs(it.h - s[3])) < 0.5
                   for it, s in ((ia, sa), (ib, sb)))
        if same and pts:
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
        """Every group title's box (open groups' titles, closed groups' first lines)."""
        out = {}

        def walk(items):
            for it in items:
                if it.node is None:
                    out[it.key] = (it.x + PAD, it.y + 4, text_width(it.title, TITLE_FONT),
                                   TITLE_FONT * 1.2)
                elif it.node.op is None:
                    line = it.node.label.split("\n")[0]
                    w = text_width(line, NODE_FONT)
                    n = len(it.node.label.split("\n"))
                    top = it.y + it.h / 2 - n * NODE_FONT * 1.2 / 2
                    out[it.key] = (it.x + it.w / 2 - w / 2, top, w, NODE_FONT * 1.2)
                walk(it.children)
        walk(self.items)
        return out


def layout(spec: G.GraphSpec) -> Layout | None:
    """The nested layout of ``spec``; None when ``dot`` is missing or fails."""
    root = tree(spec)
    chain: dict[str, list[str]] = {}
    groups: dict[str, list[Item]] = {"": root}

    def walk(items, prefix):
        for it in items:
            if it.node is not None:
                chain[it.key] = prefix + [it.key]
            else:
                groups[it.key] = it.children
                walk(it.children, prefix + [it.key])
    walk(root, [])
    index = {g: {it.key: k for k, it in enumerate(items)} for g, items in groups.items()}
    edges: dict[str, dict] = {g: {} for g in groups}
    for s, d, label, dashed in spec.edges:
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
    order = list(groups)
    dots = {g: skeleton_dot(groups[g], edges[g]) for g in order if len(groups[g]) > 1}
    laid = skeletons(list(dots.values()))
    if laid is None:
        return None
    skel = dict(zip(dots, laid))
    placed: dict[str, list] = {}

    def size(items: list[Item], g: str) -> tuple[float, float]:
        for it in items:
            if it.node is not None:
                it.w, it.h = it.closed
            else:
                cw, ch = size(it.children, it.key)
                it.w = max(cw + 2 * PAD, title_width(it.title))
                it.h = TITLE_H + ch + PAD
        if g not in skel:                       # one child: nothing to lay out
            items[0].x = items[0].y = 0.0
            placed[g] = []
            return items[0].w, items[0].h
        w, h, placed[g] = place(items, edges[g], skel[g])
        return w, h

    width, height = size(root, "")
    out: list[Edge] = []

    def absolute(items: list[Item], g: str, ox: float, oy: float):
        for e in placed[g]:
            out.append(Edge([(x + ox, y + oy) for x, y in e.points],
                            [(x + ox, y + oy) for x, y in e.arrow],
                            [(x + ox, y + oy, t, a) for x, y, t, a in e.texts], e.dashed, e.key))
        for it in items:
            it.x += ox
            it.y += oy
            if it.node is None:
                absolute(it.children, it.key, it.x + PAD, it.y + TITLE_H)
    absolute(root, "", MARGIN, MARGIN)
    return Layout(root, out, width + 2 * MARGIN, height + 2 * MARGIN)


# -- SVG ----------------------------------------------------------------------------------------
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _text(s: str) -> str:
    return html.escape(_CONTROL.sub("\u2400", s))


def _rect(x, y, w, h, r=4.0) -> str:
    return (f"M{x + r:.1f},{y:.1f}H{x + w - r:.1f}Q{x + w:.1f},{y:.1f} {x + w:.1f},{y + r:.1f}"
            f"V{y + h - r:.1f}Q{x + w:.1f},{y + h:.1f} {x + w - r:.1f},{y + h:.1f}H{x + r:.1f}"
            f"Q{x:.1f},{y + h:.1f} {x:.1f},{y + h - r:.1f}V{y + r:.1f}Q{x:.1f},{y:.1f} "
            f"{x + r:.1f},{y:.1f}Z")


def to_svg(lay: Layout) -> str:
    """The layout as SVG, in graphviz's shapes (``g.node`` and ``g.cluster`` with the keys as
    ids, ``g.edge``), which is what the canvas and its tests read."""
    W, H = lay.width, lay.height
    clusters, nodes = [], []

    def walk(items):
        for it in items:
            if it.node is None:
                clusters.append(
                    f'<g id="{it.key}" class="cluster"><title>{_text(it.tooltip)}</title>'
                    f'<path fill="none" stroke="{it.colour}" stroke-dasharray="5,2" '
                    f'd="{_rect(it.x, it.y, it.w, it.h)}"/><text x="{it.x + PAD:.1f}" '
                    f'y="{it.y + 16:.1f}" font-size="{TITLE_FONT:g}" fill="#333">'
                    f"{_text(it.title)}</text></g>")
                walk(it.children)
            else:
                n = it.node
                lines = n.label.split("\n")
                top = it.y + it.h / 2 - len(lines) * NODE_FONT * 1.2 / 2
                texts = "".join(
                    f'<text text-anchor="middle" x="{it.x + it.w / 2:.1f}" '
                    f'y="{top + (j + 1) * NODE_FONT * 1.2 - 3:.1f}" font-size="{NODE_FONT:g}">'
                    f"{_text(line)}</text>" for j, line in enumerate(lines))
                nodes.append(
                    f'<g id="{n.key}" class="node"><title>{_text(n.tooltip)}</title>'
                    f'<path fill="{n.fill}" stroke="{n.border}" stroke-width="{n.width:g}" '
                    f'd="{_rect(it.x, it.y, it.w, it.h)}"/>{texts}</g>')
    walk(lay.items)
    edges = []
    for e in lay.edges:
        if not e.points:
            continue
        (x0, y0), rest = e.points[0], e.points[1:]
        d = f"M{x0:.1f},{y0:.1f}C" + " ".join(f"{x:.1f},{y:.1f}" for x, y in rest)
        dash = ' stroke-dasharray="5,2"' if e.dashed else ""
        arrow = " ".join(f"{x:.1f},{y:.1f}" for x, y in e.arrow)
        texts = "".join(f'<text text-anchor="{a}" x="{x:.1f}" y="{y:.1f}" '
                        f'font-size="{EDGE_FONT:g}" fill="#444">{_text(t)}</text>'
                        for x, y, t, a in e.texts)
        edges.append(f'<g class="edge"><title>{_text(e.key)}</title><path fill="none" '
                     f'stroke="#666"{dash} d="{d}"/><polygon fill="#666" stroke="#666" '
                     f'points="{arrow}"/>{texts}</g>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W:.0f}pt" height="{H:.0f}pt" '
            f'viewBox="0 0 {W:.1f} {H:.1f}"><g id="graph0" class="graph" '
            'font-family="Helvetica,Arial,sans-serif"><rect width="100%" height="100%" '
            'fill="white"/>' + "".join(clusters) + "".join(edges) + "".join(nodes) + "</g></svg>")


def svg(spec: G.GraphSpec) -> str | None:
    """The nested layout of ``spec`` as SVG, or None when ``dot`` is missing or fails."""
    lay = layout(spec)
    return None if lay is None else to_svg(lay)
