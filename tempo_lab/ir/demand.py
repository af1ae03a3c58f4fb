"""Which points of each op are ever read: the basis of validation and of domain reduction.

Placeholders, outputs and sinks are demanded on their whole domain (a placeholder whose
``needed`` condition a pass set, where it holds); any other op on the union of what its readers
read. Every cycle in an SDG goes through a placeholder (a merge op), and an op
is numbered after the ops it reads except for placeholders, so one sweep over the ops in reverse
order settles every demand.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import islpy as isl

from ..symbolic import Bound, Cond, and_
from ..symbolic import isl as I
from .sdg import SDG, Edge


def demand(sdg: SDG, boxes: Mapping[int, isl.Set], maps: Mapping[Edge, isl.Map],
           on_read: Callable[[Edge, isl.Map, isl.Set], None] | None = None
           ) -> dict[int, isl.Set]:
    """The demanded points of every op. ``on_read(edge, map restricted to the demanded
    consumer points, those consumer points)`` is called once per edge, e.g. to check reads
    against domains."""
    roots = set(sdg.roots)
    merges = [i for i, op in sdg.ops.items() if op.closes_cycles]
    out = {i: boxes[i] if i in roots else _needed(sdg.ops[i], boxes[i]) if i in merges
           else boxes[i].subtract(boxes[i]) for i in sdg.ops}
    for i in merges + sorted((i for i in sdg.ops if i not in merges), reverse=True):
        for e in sdg.in_edges(i):
            m = maps[e].intersect_domain(out[i])
            if on_read is not None:
                on_read(e, m, out[i])
            if e.src not in merges and e.src not in roots:
                out[e.src] = out[e.src] | (m.range() & boxes[e.src])
    return out


def _needed(op, box: isl.Set) -> isl.Set:
    """A placeholder's points: its whole domain, or where its ``attrs["needed"]`` holds (a
    pass that gave the other points to a copy says so, ``passes/prefix.py``)."""
    c = op.attrs.get("needed")  # text in an SDG loaded from JSON (tl.load), which never runs
    return box & I.cond_set(c, box.get_space()) if isinstance(c, Cond) else box


def param_context(sdg: SDG) -> isl.Set:
    """Bounds are positive: ``{ [B, T] : B >= 1 and T >= 1 }``."""
    sp = isl.Space.create_from_names(I.CTX, set=[], params=list(sdg.params))
    return I.cond_set(and_(*(Bound(p) >= 1 for p in sdg.params)), sp).params()
