"""Vectorisation: a dim that no read crosses becomes a spatial axis.

If every read of every op over ``d`` happens at the reader's own ``d`` (no ``b - 1``, no partial
slice or constant point along ``d``, no condition or index that mentions ``d``), the points along
``d`` are independent: the whole range can run at once. A read of the *whole* range ``0:D`` (a
reduction over the batch) is allowed when it is the read's only slice: it then reads the
producer's leading axis as it is, and a reader over ``d`` gets it whole rather than one element
(``attrs["whole"]`` lists those input slots). Each op over ``d`` then drops ``d`` from its
domain and gains a leading axis of size ``D``; it keeps its own attributes and is applied per
element of that axis (``vdims`` lists the vectorised dims, outermost leading axis first), so op
semantics need no batching rules: the JAX executor uses ``jax.vmap``, the reference a loop.

Rejected when ``d`` is data-dependent (``tl.until``), read by a sink or a ``tl.source``, or when
the largest value would exceed the memory budget (``CompileConfig.vectorise_budget_bytes``).
"""
from __future__ import annotations

import numpy as np

from ..ir.ops import TensorType
from ..ir.sdg import Edge, Op
from ..symbolic import Dim, Slice
from .manager import Editor, Event, register


def _mentions(x, d: Dim) -> bool:
    return d in x.dims()


def _whole(x, d: Dim) -> bool:
    return isinstance(x, Slice) and x.start == 0 and x.stop == d.bound


def eligible(ed: Editor, d: Dim, size: int, budget: int) -> bool:
    for e in ed.edges:
        p, c = ed.ops[e.src], ed.ops[e.dst]
        if _mentions(e.cond, d):
            return False
        for pd, x in zip(p.domain, e.index):
            if pd == d:
                if _whole(x, d) and sum(isinstance(y, Slice) for y in e.index) == 1:
                    continue
                if isinstance(x, Slice) or x != d:
                    return False
            elif _mentions(x, d):
                return False
        if d in c.domain and c.kind == "sink" and d in p.domain:
            return False
    for op in ed.ops.values():
        if d not in op.domain:
            continue
        if op.kind in ("sink", "source") or (op.kind == "dimval" and op.attrs["expr"] != d
                                             and _mentions(op.attrs["expr"], d)):
            return False
        if any(not isinstance(s, int) and _mentions(s, d) for s in op.type.shape):
            return False
        static = int(np.prod([s for s in op.type.shape if isinstance(s, int)], dtype=np.int64))
        if static * size * op.type.dtype.itemsize > budget:
            return False
    return True


def vectorise_dim(ed: Editor, d: Dim, size: int):
    """Rewrite every op over ``d`` in place (same ids: readers keep reading the same op)."""
    for i, op in list(ed.ops.items()):  # d's own value (domain (d,)): the array 0..D-1
        if op.kind == "dimval" and op.attrs["expr"] == d:
            arr = np.arange(size, dtype=op.type.dtype)
            ed.ops[i] = Op(i, "from_array", op.domain, op.type, {"array": arr, "ndomain": 1},
                           op.loc, op.name)
            ed.events.append(Event("rewritten", i, None, f"value of {d} -> array 0..{size - 1}"))
    old = {i: op.domain for i, op in ed.ops.items()}
    touched = [i for i, dom in old.items() if d in dom]
    for i in touched:
        op = ed.ops[i]
        k = op.domain.index(d)
        attrs = dict(op.attrs)
        attrs["vdims"] = (d.name,) + tuple(attrs.get("vdims", ()))
        if op.kind == "from_array":
            attrs["array"] = np.moveaxis(attrs["array"], k, attrs["ndomain"] - 1)
            attrs["ndomain"] -= 1
        if op.kind == "merge":
            t = attrs["type"]
            attrs["type"] = TensorType((size,) + t.shape, t.dtype, t.weak)
        ed.ops[i] = Op(i, op.kind, tuple(x for x in op.domain if x != d),
                       TensorType((size,) + tuple(op.type.shape), op.type.dtype, op.type.weak),
                       attrs, op.loc, op.name)
        ed.events.append(Event("rewritten", i, None, f"{d} -> leading axis"))
    for n, e in enumerate(ed.edges):
        if e.src in touched:
            k = old[e.src].index(d)
            ed.edges[n] = Edge(e.dst, e.src, e.slot, e.index[:k] + e.index[k + 1:], e.cond,
                               e.loc)
            if isinstance(e.index[k], Slice) and d in old[e.dst]:  # a reduction over d
                c = ed.ops[e.dst]
                attrs = {**c.attrs, "whole": tuple(sorted({*c.attrs.get("whole", ()),
                                                           (d.name, e.slot)}))}
                ed.ops[e.dst] = Op(c.id, c.kind, c.domain, c.type, attrs, c.loc, c.name)


@register("vectorise", "vectorise")
def vectorise(ed: Editor):
    """Vectorisation: dims with no read across them become leading spatial axes."""
    budget = ed.config.vectorise_budget_bytes
    for d in reversed(ed.dims):  # innermost first, so leading axes end up in universe order
        size = ed.bounds.get(d.bound.name)
        if size is None or d.bound.name in ed.dynamic:
            continue
        if any(d in op.domain for op in ed.ops.values()) and eligible(ed, d, size, budget):
            vectorise_dim(ed, d, size)
