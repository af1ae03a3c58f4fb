"""Rematerialisation of index functions: a value computed from dim values alone is recomputed
where it is read instead of stored for every point.

A RoPE angle table ``cos(t * inv_freq)``, a discount ``gamma ** (T - t)`` or the step index a
random stream is keyed by depend on ``t`` alone, so they have domain ``(t,)``; their readers
have more dims (``(i, b, t)``, ``(b, n, t)``). Such an op runs outside the readers' loops
(before the loop over ``i``, or once over all of ``t`` when vectorised) and its store holds
every ``t``: memory that grows with ``T`` in programs that otherwise need a few steps (a
windowed decode, a TD(n) learner), 40 MB at ``T = 10**6`` for a small Llama's tables.
Recomputed at its readers' points it costs a few elementwise ops per step, and the fusion
scheduler places it in its readers' loop (``schedule/fusion.py``), so one point is live. The
clone is made once per reader domain; the original goes when nothing reads it.

A reader outside such an op's loop that reads it at points (``y[T - 1] + y[T - 2]`` after the
loop over ``t``) gets a clone with the points substituted into its dim values, so however many
points are read, none of them is stored for every ``t``.
"""
from __future__ import annotations

from ..ir.sdg import Edge, Op, index_functions
from ..symbolic import TRUE, Slice
from .manager import Editor, register


@register("remat", "remat")
def remat(ed: Editor):
    """Rematerialisation: an op computed from dim values alone is recomputed at the points of
    each reader that has more dims, instead of stored over all of its own."""
    cheap = index_functions(ed)
    clones: dict[tuple, int] = {}

    def clone(i: int, domain: tuple, at: tuple = ()) -> int:
        """Op ``i`` recomputed over ``domain``, its dims taken at ``at`` (dim, expr) pairs."""
        if (i, domain, at) not in clones:
            op = ed.ops[i]
            attrs = dict(op.attrs)
            if op.kind == "dimval" and at:
                attrs["expr"] = attrs["expr"].substitute(dict(at))
            edges = [Edge(-1, e.src, e.slot, e.index, e.cond, e.loc)
                     if ed.ops[e.src].kind == "const" else
                     Edge(-1, clone(e.src, domain, at), e.slot, domain, e.cond, e.loc)
                     for e in ed.in_edges(i)]
            where = f" at {', '.join(f'{d} = {x}' for d, x in at)}" if at else ""
            clones[(i, domain, at)] = ed.add(
                Op(-1, op.kind, domain, op.type, attrs, op.loc, op.name), edges, i,
                f"%{i} recomputed over ({', '.join(d.name for d in domain)}){where}")
        return clones[(i, domain, at)]

    changed = False
    for i in sorted(ed.ops):
        reader = ed.ops[i]
        if reader.kind == "merge" or i in cheap:
            continue
        edges, moved = [], []
        for e in ed.in_edges(i):
            src = ed.ops[e.src]
            at = None  # the dims of src fixed by the read: none, or points outside the loop
            if e.src in cheap and e.cond == TRUE:
                if set(src.domain) < set(reader.domain) and e.index == tuple(src.domain):
                    at = ()
                elif _point_outside(src, reader, e):
                    at = tuple(zip(src.domain, e.index))
            if at is not None:
                moved.append(e.src)
                e = Edge(i, clone(e.src, reader.domain, at), e.slot, reader.domain, e.cond,
                         e.loc)
            edges.append(e)
        if moved:
            ed.rewrite(i, reader, edges, "reads " + ", ".join(f"%{k}" for k in moved)
                       + " recomputed at its own points")
            changed = True
    if changed:
        ed.renumber()


def _point_outside(src: Op, reader: Op, e: Edge) -> bool:
    """``reader`` reads ``src`` at one point of a dim it does not have (outside its loop)."""
    return (not set(src.domain) <= set(reader.domain)
            and all(not isinstance(x, Slice) for x in e.index))
