"""What to draw of an SDG (visible ops, collapsed regions, labelled edges) and two ways to draw
it: graphviz SVG when the ``dot`` program exists, a layered plotly layout when it does not.

One ``GraphSpec`` feeds both renderers, so search, filters, collapsing and highlights behave
the same whichever is used."""
from __future__ import annotations

import html
import weakref
from dataclasses import dataclass, field

from tempo_lab.ir.sdg import dot_quote
from tempo_lab.svg import DOT_SECONDS, dot_installed, svg_of  # noqa: F401  (the views' names)
from tempo_lab.symbolic import TRUE

from . import search as S
from .palette import (
    EDIT_COLOURS,
    HIGHLIGHT,
    MATCH,
    TEMPLATE,
    category_colour,
    domain_colour,
    region_of,
)
from .units import amount

VISIBLE = 60           # a view opens with groups expanded while at most this many nodes show
CHUNK = 40             # a group with more ops than this opens into runs of consecutive ops
DOT_LIMIT = 2000       # more nodes than this: a plotly layout (graphviz takes ~1 s per 1 000)
FOLD_AT = 3            # sibling groups alike: drawn as one box from this many ("fold repeats")


@dataclass
class Node:
    key: str            # DOT node name and SVG id: op<op id>, or g<group index> for a group
    label: str
    fill: str
    cluster: tuple[str, ...]   # the innermost expanded group it is drawn inside (a path)
    op: int | None = None
    border: str = "#555555"
    width: float = 1.0
    tooltip: str = ""


@dataclass
class GraphSpec:
    nodes: list[Node] = field(default_factory=list)
    edges: list[tuple[str, str, str, bool]] = field(default_factory=list)  # src, dst, label, dashed
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)  # g<k> -> group path
    sizes: dict[tuple[str, ...], int] = field(default_factory=dict)   # group path -> ops
    hidden: list[str] = field(default_factory=list)         # what is not drawn, in words
    legend: dict[str, str] = field(default_factory=dict)    # what a fill means -> its colour
    heat: str = ""      # the white-to-red scale's top, when nodes are coloured by a cost
    # every drawn group's label as a closed node (open ones too: the nested layout keeps the
    # room of a group's closed node in its parent, so that opening it moves nothing above it)
    closed: dict[tuple[str, ...], str] = field(default_factory=dict)
    # a folded series' title (``layer0…layer15 ×16``) by the path of its first member, which
    # stands for it (``repeats``)
    titles: dict[tuple[str, ...], str] = field(default_factory=dict)
    # the same drawing with every group open: the layout places every node and group where
    # the frame has it, so that opening or closing a group moves nothing outside it (the
    # pass diff gives both sides the frame of the two graphs together)
    frame: GraphSpec | None = field(default=None, repr=False, compare=False)

    @property
    def ops(self) -> list[int]:
        return [n.op for n in self.nodes if n.op is not None]

    @property
    def regions(self) -> list[str]:
        """The domains drawn, as clusters or collapsed groups."""
        return sorted({p[-1] for p in self.sizes if p[-1].startswith("(")})


def edge_label(sdg, e) -> str:
    """The dependence expression of an edge (``t - 1``, ``0:t + 1``), empty for identity reads."""
    parts = []
    if e.index and not e.is_identity(sdg.ops[e.src]):
        parts.append(e.index_str())
    if e.cond != TRUE:
        parts.append(f"if {e.cond}")
    return "\n".join(parts)


FOLDED_FRAMES = ("<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>", "<lambda>")
INLINE_KINDS = S.INLINE_KINDS   # drawn inside the ops that read them, not as nodes


def group_path(op) -> tuple[str, ...]:
    """Where an op sits in the views' hierarchy: its ``tl.scope`` path, then the user
    functions that called it (below the outermost frame; comprehensions and lambdas folded into
    the function around them) and the library call that made it, then its domain."""
    path = list(op.scope)
    for _, _, fn in op.loc.stack[1:]:
        name = fn.split(".<locals>.")[-1]
        if name not in FOLDED_FRAMES:
            path.append(f"{name}()")
    if op.loc.call:
        parts = op.loc.call.split(".")
        path.append(parts[-2] if parts[-1] == "__call__" else f"{parts[-1]}()")
    path.append(region_of(op))
    return tuple(path)


def group_paths(sdg) -> dict[int, tuple[str, ...]]:
    """``group_path`` of every op, less the groups that every op shares (a test function or
    ``main()`` around the whole program) and the groups that are all of their parent (a
    ``layer3`` scope holding only ``block()`` keeps the name ``layer3``), with a group that has
    more than ``CHUNK`` ops split into runs of consecutive ops (``%40–%79``), so that every
    group opens to a readable size."""
    paths = {i: group_path(op) for i, op in sdg.ops.items()}
    common = 0
    first = next(iter(paths.values()), ())
    while common < len(first) - 1 and all(len(p) > common + 1 and p[common] == first[common]
                                          for p in paths.values()):
        common += 1
    paths = _drop_wrappers({i: p[common:] for i, p in paths.items()})
    members: dict[tuple[str, ...], list[int]] = {}
    for i, p in paths.items():
        members.setdefault(p, []).append(i)
    for p, ids in members.items():
        if len(ids) > CHUNK:
            for k in range(0, len(ids), CHUNK):
                run = ids[k:k + CHUNK]
                for i in run:
                    paths[i] = p + (f"%{run[0]}–%{run[-1]}",)
    return paths


def _drop_wrappers(paths: dict[int, tuple[str, ...]]) -> dict[int, tuple[str, ...]]:
    """Remove each group that is the only thing inside its parent; domains (the last part of
    a path) always stay, they are what the clusters are coloured by."""
    depth = 1
    while depth < max((len(p) for p in paths.values()), default=0) - 1:
        inner: dict[tuple[str, ...], set] = {}
        for p in paths.values():
            if len(p) > depth:
                inner.setdefault(p[:depth], set()).add(
                    p[depth] if len(p) > depth + 1 else None)   # None: a domain
        lone = {g for g, kids in inner.items() if len(kids) == 1 and None not in kids}
        if lone:
            paths = {i: p[:depth] + p[depth + 1:] if p[:depth] in lone else p
                     for i, p in paths.items()}
        else:
            depth += 1
    return paths


def group_order(paths: dict[int, tuple[str, ...]]) -> dict[tuple[str, ...], int]:
    """Every group, numbered in program order (by its first op): the number is its key in the
    drawing (``g<k>``), the same whichever groups are open, so that the browser can keep a
    group where it was when it opens."""
    order: dict[tuple[str, ...], int] = {}
    for i in sorted(paths):
        for j in range(len(paths[i])):
            order.setdefault(paths[i][:j + 1], len(order))
    return order


def _items(paths: list[tuple[str, ...]], expanded: set) -> set:
    """What is drawn: per op, its first collapsed group, or the op (its index) itself."""
    out = set()
    for k, path in enumerate(paths):
        item = next((path[:j + 1] for j in range(len(path)) if path[:j + 1] not in expanded), k)
        out.add(item)
    return out


def default_expanded(sdg, limit: int = VISIBLE) -> set[tuple[str, ...]]:
    """Groups open when a view opens: level by level from the top, all the groups of a level
    at once while the nodes drawn stay within ``limit`` (so that sibling groups, say the
    layers of a model, look alike). A level that would draw no more nodes than the one above
    (each group holds one group only) opens only together with the level below it, so that a
    view never draws a box around a single box."""
    inline = inlined(sdg)
    paths = [p for i, p in group_paths(sdg).items() if i not in inline]
    expanded: set[tuple[str, ...]] = set()
    drawn = len(_items(paths, expanded))
    depth = 0
    while True:
        grown = set(expanded)
        while True:
            level = {p[:depth + 1] for p in paths if len(p) > depth and p[:depth] in
                     grown | {()}}
            if not level:
                return expanded
            grown |= level
            depth += 1
            if len(_items(paths, grown)) > drawn:
                break
        if len(_items(paths, grown)) > limit:
            return expanded
        expanded, drawn = grown, len(_items(paths, grown))


def all_groups(sdg) -> set[tuple[str, ...]]:
    """Every group of the drawing (what "expand all" opens)."""
    return {p[:j + 1] for p in group_paths(sdg).values() for j in range(len(p))}


def open_group(sdg, expanded, path: tuple[str, ...]) -> set[tuple[str, ...]]:
    """``expanded`` with ``path`` open, and the group inside it open too while it is the only
    thing there (opening a layer that holds one domain shows the layer's ops, not a box)."""
    inline = inlined(sdg)
    paths = {i: p for i, p in group_paths(sdg).items() if i not in inline}
    out = set(expanded) | {path}
    while True:
        inner = {p[:len(path) + 1] if len(p) > len(path) else i for i, p in paths.items()
                 if p[:len(path)] == path}      # the groups and ops drawn inside ``path``
        if len(inner) != 1 or not isinstance(next(iter(inner)), tuple):
            return out
        path = next(iter(inner))
        out.add(path)


def _constant_only(sdg) -> set[int]:
    """Ops computed from constants and dim values alone (a rope table, a shared scalar): the
    passes make such a value once, in the first layer that needs it, so it is no part of what
    a layer repeats (``layer0`` of a decoder holds its rope table, the other layers read it)."""
    reads: dict[int, set] = {}
    for e in sdg.edges:
        reads.setdefault(e.dst, set()).add(e.src)
    out = {i for i, op in sdg.ops.items() if op.kind in INLINE_KINDS and i not in reads}
    grown = True
    while grown:
        more = {i for i, r in reads.items() if i not in out and r <= out}
        out |= more
        grown = bool(more)
    return out


def _signature(sdg, paths, path, skip, ids) -> tuple:
    """The inside of group ``path`` up to names and ids: its ops (less ``skip``) in program
    order, each as its kind and where it sits in the nested groups (numbered by first
    appearance, not named), and the edges between them as pairs of positions. Two groups
    with one signature compute alike (their children too, recursively)."""
    ids = [i for i in ids if i not in skip]
    at = {i: k for k, i in enumerate(ids)}
    number: dict[tuple[str, ...], int] = {}
    rows = tuple((sdg.ops[i].kind, tuple(number.setdefault(paths[i][len(path):j + 1],
                                                           len(number))
                                         for j in range(len(path), len(paths[i]))))
                 for i in ids)
    edges = sorted((at[e.src], at[e.dst]) for e in sdg.edges if e.src in at and e.dst in at)
    return rows, tuple(edges)


def repeats(sdg) -> dict[tuple[str, ...], list[tuple[str, ...]]]:
    """Runs of at least ``FOLD_AT`` consecutive sibling groups with one ``_signature`` (the
    sixteen layers of a decoder written layer by layer), by their first member: found from
    what the groups compute, not from their names. Made once per SDG."""
    return _per_sdg(_REPEATS, sdg, lambda: _repeats(sdg))


def _repeats(sdg) -> dict[tuple[str, ...], list[tuple[str, ...]]]:
    paths = group_paths(sdg)
    order = group_order(paths)
    skip = _constant_only(sdg)
    under: dict[tuple[str, ...], list[int]] = {}
    for i in sorted(paths):
        for j in range(1, len(paths[i])):
            under.setdefault(paths[i][:j], []).append(i)
    siblings: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
    for g in sorted(under, key=order.get):
        if len([i for i in under[g] if i not in skip]) > 1:
            siblings.setdefault(g[:-1], []).append(g)
    found = {}
    for kids in siblings.values():
        sigs = [_signature(sdg, paths, g, skip, under[g]) for g in kids]
        k = 0
        while k < len(kids):
            n = next((n for n in range(k + 1, len(kids)) if sigs[n] != sigs[k]), len(kids))
            if n - k >= FOLD_AT:
                found[kids[k]] = kids[k:n]
            k = n
    return found


_REPEATS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def folded_ops(sdg) -> set[int]:
    """The ops of every run's later members: not drawn when the runs are folded."""
    later = {m for members in repeats(sdg).values() for m in members[1:]}
    return {i for i, p in group_paths(sdg).items() if any(p[:j] in later for j in
                                                          range(1, len(p)))}


def series_title(members: list[tuple[str, ...]]) -> str:
    return f"{members[0][-1]}…{members[-1][-1]} ×{len(members)}"


def inlined(sdg, keep=()) -> set[int]:
    """The constants drawn inside the ops that read them (see ``graph_spec``): those read by
    some op, not outputs and not asked to stay visible (``keep``)."""
    read = {e.src for e in sdg.edges}
    outputs = set(sdg.outputs.values())
    return {i for i, op in sdg.ops.items() if op.kind in INLINE_KINDS and i in read
            and i not in outputs and i not in keep}


def matches(sdg, query: str) -> list[int]:
    """Ops that match every term of ``query`` (``search.py``: whole words or name
    prefixes, ``kind:``, ``scope:``, ``line:``, ``/regex/``), best first: an exact name
    match first, constants last, then program order."""
    if not query.strip():
        return []
    return S.search(search_rows(sdg), query)


def search_index(sdg) -> list[tuple[int, str]]:
    """One line per op, as search shows it: title (name · id), kind, domain, where the user
    wrote it and the groups it is drawn in (scopes, functions, library calls)."""
    return [(row[0], row[1]) for row in search_rows(sdg)]


def search_rows(sdg) -> list[list]:
    """The rows the browser's search box and ``matches`` search (``search.search_rows``):
    ``[op id, line, "name kind", is a constant, fields]``; made once per SDG (it is
    immutable)."""
    return _per_sdg(_ROWS, sdg, lambda: S.search_rows(sdg, group_paths(sdg)))


def _per_sdg(table: weakref.WeakKeyDictionary, sdg, make):
    """``make()`` once per SDG (it is immutable), kept in ``table`` while the SDG lives; made
    again for an object that cannot be weakly referenced."""
    try:
        got = table.get(sdg)
    except TypeError:
        return make()
    if got is None:
        got = table[sdg] = make()
    return got


_ROWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def graph_spec(sdg, *, highlight: int | None = None, search: str = "", kind: str | None = None,
               expanded=None, marks: dict[int, str] | None = None, keep=(),
               weights: dict[int, float] | None = None, unit: str = "",
               frame: bool = True, paths: dict | None = None, fold: bool = False) -> GraphSpec:
    """Decide what to draw. Groups not in ``expanded`` become one node each, except for the ops
    that are highlighted, searched for, marked or in ``keep`` (those stay visible); ``kind``
    keeps only ops of that kind. Constants are written inside the ops that read them (as
    Netron and TensorBoard do: a scalar shared by every layer would otherwise draw an edge
    into each). Everything left out is counted in ``hidden``. ``weights`` (seconds or bytes
    per op, ``unit`` "s" or "B") colour the nodes from white to red and are written under
    their labels; a group node shows the sum of its ops'. Nodes and groups come in program
    order; a group's key (``g<k>``) is its ``group_order`` number. ``frame``: also make
    ``spec.frame``, the same drawing with every group open, which the layout places
    everything by. ``paths``: the groups of a larger graph this one is part of (``group_paths``
    of the union of a pass's before and after), so that a group has the same key in both.
    ``fold``: each run of ``repeats`` is drawn as its first member, titled for the run
    (``layer0…layer15 ×16``; ``spec.titles``), the other members' ops not drawn and their
    edges to and from the rest drawn to and from the first member's like ops; a run that
    holds a kept op (a search hit, the selected op) is drawn unfolded."""
    marks = marks or {}
    expanded = default_expanded(sdg) if expanded is None else set(expanded)
    if frame:
        every = all_groups(sdg) if paths is None else \
            {p[:j + 1] for p in paths.values() for j in range(len(p))}
        spec = graph_spec(sdg, highlight=highlight, search=search, kind=kind, expanded=every,
                          marks=marks, keep=keep, weights=weights, unit=unit, frame=False,
                          paths=paths, fold=fold)
        if expanded >= every:
            spec.frame = spec
            return spec
        out = graph_spec(sdg, highlight=highlight, search=search, kind=kind, expanded=expanded,
                         marks=marks, keep=keep, weights=weights, unit=unit, frame=False,
                         paths=paths, fold=fold)
        out.frame = spec
        return out
    found = set(matches(sdg, search))
    keep = found | set(marks) | set(keep) | ({highlight} if highlight is not None else set())
    spec = GraphSpec()
    where: dict[int, str] = {}     # op id -> node key it is drawn as
    folded: dict[tuple[str, ...], list[int]] = {}
    filtered = 0
    outputs = {i: n for n, i in sdg.outputs.items()}
    fold = fold and paths is None     # not on a pass's diff: both sides are drawn alike
    every_path = group_paths(sdg) if paths is None else paths
    order = group_order(every_path)
    paths = {i: every_path[i] for i in sdg.ops}
    reads: dict[int, list[int]] = {}
    for e in sdg.edges:
        reads.setdefault(e.dst, []).append(e.src)
    inline = inlined(sdg, keep)
    stands, member = _fold(sdg, paths, keep) if fold else ({}, {})
    for head, members in member.items():
        spec.titles[head] = series_title(members)
    member_of: dict[int, tuple] = {}     # op -> (its run, its member): the outermost run
    for head in sorted(member, key=len):
        for m in member[head]:
            for i, p in paths.items():
                if p[:len(m)] == m:
                    member_of.setdefault(i, (head, m))

    def output_mark(i: int) -> str:
        """How an output is marked (``→ y``); in a folded run, with the member it is in
        (``→ y (layer15)``), since one box or op is drawn for all of them."""
        return f"→ {outputs[i]}" + (f" ({member_of[i][1][-1]})" if i in member_of else "")

    # the program's outputs each group holds, marked on its box (closed) as on an op's label:
    # a folded run's box (and its groups and ops) also holds its later members' outputs, at
    # the place in the first member they are drawn as (``stands``)
    held: dict[tuple[str, ...], list[str]] = {}
    stood_for: dict[int, list[int]] = {}     # drawn op -> the outputs drawn as it
    for i in sorted(outputs):
        at = paths[i]
        if i in stands:
            like = stands[i]
            at = paths[like] if like is not None else member_of[i][0]
            if like is not None:
                stood_for.setdefault(like, []).append(i)
        for j in range(len(at)):
            held.setdefault(at[:j + 1], []).append(output_mark(i))
    first: dict[str, int] = {}     # node key -> first op id it stands for (program order)
    drawable: dict[tuple[str, ...], int] = {}
    for i, path in paths.items():
        for j in range(len(path) * (i not in inline and i not in stands)):
            drawable[path[:j + 1]] = drawable.get(path[:j + 1], 0) + 1
    for op in sdg.ops.values():
        path = paths[op.id]
        for j in range(len(path)):
            spec.sizes[path[:j + 1]] = spec.sizes.get(path[:j + 1], 0) + 1
        if op.id in inline or op.id in stands:    # stands: drawn as the first member's like op
            continue
        if kind and op.kind != kind and op.id not in keep:
            filtered += 1
            continue
        closed = next((path[:j + 1] for j in range(len(path)) if path[:j + 1] not in expanded),
                      None)
        if closed is not None and op.id not in keep and drawable[closed] > 1:
            key = f"g{order[closed]}"
            folded.setdefault(closed, []).append(op.id)
            where[op.id] = key
            first.setdefault(key, op.id)
            continue
        label = f"{S.op_title(op)} {op.kind}\n{op.type}"
        consts = [sdg.ops[i] for i in dict.fromkeys(reads.get(op.id, ())) if i in inline]
        label += "".join(f"\n◦ {_constant(c)}" for c in consts[:2])
        if len(consts) > 2:
            label += f"\n◦ {len(consts) - 2} more constants"
        if weights is not None:
            label += f"\n{amount(weights.get(op.id, 0.0), unit)}"
        label += "".join(f"\n{output_mark(i)}" for i in
                         ([op.id] if op.id in outputs else []) + stood_for.get(op.id, []))
        cluster = max((path[:j] for j in range(len(path) + 1) if path[:j] in expanded),
                      key=len, default=())
        node = Node(f"op{op.id}", label, category_colour(op.category), cluster, op.id,
                    tooltip=f"{S.op_title(op)} = {op.kind} over {region_of(op)} @ {op.loc.place}"
                    + "".join(f"\nreads {_constant(c)}" for c in consts))
        if op.id in marks:
            node.fill = EDIT_COLOURS.get(marks[op.id], node.fill)
        if op.id in found:
            node.border, node.width = MATCH, 2.5
        if op.id == highlight:
            node.border, node.width = HIGHLIGHT, 3.5
        spec.nodes.append(node)
        where[op.id] = node.key
        first[node.key] = op.id
    def closed_label(path, ids) -> str:
        kinds: dict[str, int] = {}
        for i in ids:
            kinds[sdg.ops[i].kind] = kinds.get(sdg.ops[i].kind, 0) + 1
        top = ", ".join(f"{k}×{n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])[:3])
        total = "" if weights is None else \
            f"\n{amount(sum(weights.get(i, 0.0) for i in ids), unit)} in all"
        marks = held.get(path, [])
        if len(marks) > 3:
            marks = marks[:2] + [f"→ {len(marks) - 2} more outputs"]
        return (f"{spec.titles.get(path, path[-1])}: {spec.sizes[path]} ops\n{top}{total}"
                + "".join(f"\n{m}" for m in marks))

    for path, ids in folded.items():
        key = f"g{order[path]}"
        spec.groups[key] = path
        spec.closed[path] = closed_label(path, ids)
        spec.nodes.append(Node(key, spec.closed[path],
                               "#f4f4f4", path[:-1], border=_group_colour(path), width=2.0,
                               tooltip=f"{spec.titles.get(path, '/'.join(path))}: "
                                       f"{spec.sizes[path]} ops "
                                       "(click to expand)"))
        spec.hidden.append(f"{len(ids)} ops of {'/'.join(path)} collapsed")
    spec.nodes.sort(key=lambda n: first[n.key])
    if weights is not None:
        value = {n.key: (weights.get(n.op, 0.0) if n.op is not None else
                         sum(weights.get(i, 0.0) for i in folded[spec.groups[n.key]]))
                 for n in spec.nodes}
        top = max(value.values(), default=0.0)
        for n in spec.nodes:
            n.fill = heat(value[n.key] / top if top > 0 else 0.0)
        spec.heat = amount(top, unit)
    else:
        for n in spec.nodes:
            if n.op is not None:
                op = sdg.ops[n.op]
                what = marks.get(n.op)
                spec.legend.setdefault(f"{what} by the pass" if what in EDIT_COLOURS else
                                       op.category, n.fill)
    if folded:
        spec.legend["a closed group: click to open"] = "#f4f4f4"
    opened = {n.cluster[:j] for n in spec.nodes for j in range(1, len(n.cluster) + 1)}
    for path in opened:
        spec.groups[f"g{order[path]}"] = path
    if opened:
        under: dict[tuple[str, ...], list[int]] = {}
        for i, path in paths.items():
            if i not in inline:
                for j in range(1, len(path) + 1):
                    if path[:j] in opened:
                        under.setdefault(path[:j], []).append(i)
        for path in opened:
            spec.closed[path] = closed_label(path, under.get(path, []))
    spec.groups = dict(sorted(spec.groups.items(), key=lambda kv: int(kv[0][1:])))
    if inline:
        spec.hidden.append(f"{len(inline)} constants written inside the ops that read them")
    if filtered:
        spec.hidden.append(f"{filtered} ops of other kinds than {kind!r} hidden")
    for i, like in stands.items():
        if like in where:
            where[i] = where[like]
    if member:
        spec.hidden.append(", ".join(f"{len(ms) - 1} groups like {h[-1]} drawn as it"
                                     for h, ms in member.items()))
    agg: dict[tuple[str, str], list] = {}
    for e in sdg.edges:
        s, d = where.get(e.src), where.get(e.dst)
        if s is None or d is None or s == d:
            continue
        ms, md = member_of.get(e.src), member_of.get(e.dst)
        if ms and md and ms[0] == md[0] and (ms[1] != md[1] or ms[1] != member[ms[0]][0]):
            continue     # between members of a folded run, or inside a later member
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


def _fold(sdg, paths, keep) -> tuple[dict[int, int | None], dict]:
    """For ``graph_spec(fold=True)``: each op of a folded run's later members -> the op at its
    place in the first member (by ``_signature``'s positions; None for the constant-only
    ops it leaves out), and the runs folded (first member -> members)."""
    skip = _constant_only(sdg)
    stands, runs = {}, {}
    for head, members in sorted(repeats(sdg).items(), key=lambda kv: len(kv[0])):
        inside = [[i for i in sorted(paths) if paths[i][:len(m)] == m] for m in members]
        if any(i in keep or i in stands for ids in inside for i in ids):   # or folded above
            continue
        runs[head] = members
        like = [i for i in inside[0] if i not in skip]
        for ids in inside[1:]:
            rest = [i for i in ids if i not in skip]
            stands.update({i: None for i in ids})
            stands.update(zip(rest, like))
    return stands, runs


def _constant(op) -> str:
    """A constant as written inside the op that reads it: its value when it is one number."""
    value = op.attrs.get("value")
    if op.type.shape == () and value is not None:
        return f"{S.op_title(op)} = {float(value):.6g}"
    return f"{S.op_title(op)} {op.kind} {op.type}"


def heat(fraction: float) -> str:
    """White for nothing to red for the largest cost drawn (square-root scale, so that small
    costs still show). The red is light enough for a node's black label to read on it (5.3:1;
    the darker red before gave 4.3:1, under the 4.5:1 of WCAG AA)."""
    f = min(max(fraction, 0.0), 1.0) ** 0.5
    r, g, b = (round(255 + (c - 255) * f) for c in (0xe3, 0x4a, 0x33))
    return f"#{r:02x}{g:02x}{b:02x}"


def _group_colour(path: tuple[str, ...]) -> str:
    """Domains keep their colour (as in ``sdg.to_dot()``); scopes, calls and runs are grey."""
    return domain_colour(path[-1].strip("()")) if path[-1].startswith("(") else "#888888"


# -- graphviz ---------------------------------------------------------------------------------
def to_dot(spec: GraphSpec) -> str:
    """DOT for a spec: one dashed cluster per expanded group, nested as the groups are (the
    cluster's SVG id is its group key), op and group nodes with their keys as SVG ids."""
    lines = ["digraph SDG {", '  rankdir=TB; node [shape=box, style="rounded,filled", '
             'fontname="Helvetica", fontsize=10]; edge [fontname="Helvetica", fontsize=9];']
    key_of = {path: key for key, path in spec.groups.items()}
    inside: dict[tuple[str, ...], list] = {}
    for n in spec.nodes:
        inside.setdefault(n.cluster, []).append(n)
    clusters = sorted({n.cluster[:j] for n in spec.nodes for j in range(1, len(n.cluster) + 1)},
                      key=lambda p: int(key_of[p][1:]))

    def children(path: tuple[str, ...]) -> list[tuple[str, ...]]:
        return [c for c in clusters if len(c) == len(path) + 1 and c[:len(path)] == path]

    def emit(path: tuple[str, ...], indent: str):
        for n in inside.get(path, []):
            lines.append(f'{indent}{n.key} [id="{n.key}", label="{dot_quote(n.label)}", '
                         f'fillcolor="{n.fill}", color="{n.border}", penwidth={n.width}, '
                         f'tooltip="{dot_quote(n.tooltip)}"];')
        for sub in children(path):
            key, title, content = key_of[sub], spec.titles.get(sub, sub[-1]), sub
            while not inside.get(content) and len(children(content)) == 1:
                content = children(content)[0]      # a box around one box: one box, both titles
                title += f" {content[-1]}"
            lines.append(f'{indent}subgraph cluster_{key} {{ id="{key}"; '
                         f'label="{dot_quote(title)} · {spec.sizes.get(sub, 0)} ops"; style=dashed; '
                         f'color="{_group_colour(content)}"; tooltip="{dot_quote("/".join(sub))} '
                         f'(click the title to collapse)";')
            emit(content, indent + "  ")
            lines.append(f"{indent}}}")

    emit((), "  ")
    for s, d, label, dashed in spec.edges:
        style = ", style=dashed" if dashed else ""
        lines.append(f'  {s} -> {d} [label="{dot_quote(label)}"{style}];')
    lines.append("}")
    return "\n".join(lines)


def no_svg_reason(spec: GraphSpec) -> str:
    """Why a spec is drawn with plotly rather than graphviz's SVG (HTML), for the views' note
    and the exported page."""
    if len(spec.nodes) > DOT_LIMIT:
        return (f"{len(spec.nodes)} nodes are more than graphviz lays out quickly "
                f"({DOT_LIMIT}); collapse groups for the SVG picture")
    if dot_installed():
        return ("graphviz's <code>dot</code> program failed on this graph or took longer than "
                f"{DOT_SECONDS} s")
    return "graphviz's <code>dot</code> program is not installed (Debian: apt-get install graphviz)"


def svg_html(svg: str, max_height: int = 640) -> str:
    return (f'<div class="tempo-lab-graph" style="overflow:auto;max-height:{max_height}px;'
            f'border:1px solid #eee">{svg}</div>')


def legend_items(spec: GraphSpec) -> list[tuple[str, str, str]]:
    """What the colours mean, as ``(text, fill, border)``: a swatch per fill drawn, then the
    borders of search hits and of the selected op (the cost scale is ``spec.heat``). The
    legend above the canvas and the one in the SVG (``layout.svg``, what a download or an
    export saves) are both made from these."""
    items = [(t, c, "#888") for t, c in sorted(spec.legend.items())]
    if any(n.border == MATCH for n in spec.nodes):
        items.append(("search hit", "#ffffff", MATCH))
    if any(n.border == HIGHLIGHT for n in spec.nodes):
        items.append(("selected", "#ffffff", HIGHLIGHT))
    return items


def heat_legend(spec: GraphSpec) -> str:
    """The cost scale's words, when nodes are coloured by a cost."""
    return f"0 → {spec.heat} (square-root scale)" if spec.heat else ""


def legend_html(spec: GraphSpec) -> str:
    """What the colours mean: a swatch per fill drawn, or the cost scale."""
    def swatch(colour: str, text: str, border: str = "#888") -> str:
        return (f'<span style="display:inline-block;width:11px;height:11px;background:{colour};'
                f'border:1px solid {border};margin:0 3px 0 9px;vertical-align:-1px"></span>'
                f"{html.escape(text)}")
    items = [swatch(c, t, b) for t, c, b in legend_items(spec)]
    if spec.heat:
        items.insert(0, '<span style="display:inline-block;width:80px;height:11px;'
                        f'background:linear-gradient(90deg,#ffffff,{heat(1.0)});border:1px '
                        'solid #888;margin:0 3px 0 9px;vertical-align:-1px"></span>'
                        + html.escape(heat_legend(spec)))
    return ('<div class="tempo-lab-legend" style="font-size:90%;'
            'color:var(--jp-ui-font-color1,#444)">colour:'
            + "".join(items) + "</div>") if items else ""


def hidden_html(spec: GraphSpec) -> str:
    if not spec.hidden:
        return ""
    text = "; ".join(spec.hidden)
    groups = sum(1 for h in spec.hidden if h.endswith(" collapsed"))
    if groups > 3:
        ops = sum(int(h.split()[0]) for h in spec.hidden if h.endswith(" collapsed"))
        text = "; ".join([f"{ops} ops in {groups} collapsed groups"]
                         + [h for h in spec.hidden if not h.endswith(" collapsed")])
    return ('<div class="tempo-lab-hidden" style="color:var(--jp-ui-font-color2,#555);'
            'font-size:90%">Not drawn: '
            + html.escape(text)
            + " (click a grey group to expand it, or search for ops to show them)</div>")


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


def group_of(custom: int) -> str | None:
    """The group key a plotly node's ``customdata`` stands for (None: an op)."""
    return f"g{-2 - custom}" if custom <= -2 else None


def graph_figure(spec: GraphSpec, title: str = ""):
    """The spec as a plotly figure (a ``go.Figure``): nodes coloured like the SVG, edges as
    lines with their dependence expressions at the midpoints; ``customdata`` holds op ids, and
    ``-2 - k`` for group ``g<k>`` (see ``group_of``)."""
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
        hoverinfo="text", customdata=[n.op if n.op is not None else -2 - int(n.key[1:])
                                      for n in spec.nodes],
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
