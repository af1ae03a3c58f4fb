"""Vectorisation: a dim that no read crosses becomes a spatial axis (whole, or in blocks).

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

import math

import numpy as np

from ..ir.ops import TensorType, flag, norm_dim
from ..ir.sdg import Op
from ..symbolic import Bound, Dim, Expr, Slice
from .manager import Editor, register


def _mentions(x, d: Dim) -> bool:
    return d in x.dims()


def _whole(x, d: Dim) -> bool:
    return isinstance(x, Slice) and x.start == 0 and x.stop == d.bound


def eligible(ed: Editor, d: Dim, size: int, budget: int | None) -> bool:
    """Whether ``d`` can become a spatial axis of ``size`` (``budget`` None: whatever the
    values' size)."""
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
        if flag(op.kind, "effect") or (op.kind == "dimval" and op.attrs["expr"] != d
                                             and _mentions(op.attrs["expr"], d)):
            return False
        if any(not isinstance(s, int) and _mentions(s, d) for s in op.type.shape):
            return False
        if budget is not None and largest_point(op) * size > budget:
            return False
    return True


def largest_point(op: Op) -> int:
    """Bytes of one point's value, over its static axes."""
    static = int(np.prod([s for s in op.type.shape if isinstance(s, int)], dtype=np.int64))
    return static * op.type.dtype.itemsize


def vectorise_dim(ed: Editor, d: Dim, size: int, block: int | None = None):
    """Rewrite every op over ``d`` in place (same ids: readers keep reading the same op).
    ``block``: ``block`` points of ``d`` at a time, the blocks along a new dim ``d_blk`` that
    takes ``d``'s place (incrementalisation)."""
    n = block or size
    db = ed.add_dim("parts", d, size // block, in_place=True) if block else None
    for i, op in list(ed.ops.items()):  # d's own value (domain (d,)): the array 0..D-1
        if op.kind == "dimval" and op.attrs["expr"] == d:
            arr = np.arange(size, dtype=op.type.dtype)
            ed.update(i, Op(i, "from_array", op.domain, op.type, {"array": arr, "ndomain": 1},
                            op.loc, op.name), f"value of {d} -> array 0..{size - 1}")
    old = {i: op.domain for i, op in ed.ops.items()}
    touched = [i for i, dom in old.items() if d in dom]
    reads = [e for e in ed.edges if e.src in touched]
    for i in touched:
        op = ed.ops[i]
        k = op.domain.index(d)
        attrs = dict(op.attrs)
        attrs["vdims"] = (d.name,) + tuple(attrs.get("vdims", ()))
        if op.kind == "from_array":
            arr, nd = attrs["array"], attrs["ndomain"]
            if block:
                arr = arr.reshape(arr.shape[:k] + (size // block, block) + arr.shape[k + 1:])
                attrs["array"] = np.moveaxis(arr, k + 1, nd)
            else:
                attrs["array"], attrs["ndomain"] = np.moveaxis(arr, k, nd - 1), nd - 1
        if op.kind == "merge":
            t = attrs["type"]
            attrs["type"] = TensorType((n,) + t.shape, t.dtype, t.weak)
        domain = tuple(db if x == d else x for x in op.domain if x != d or block)
        ed.update(i, Op(i, op.kind, domain, TensorType((n,) + tuple(op.type.shape),
                                                       op.type.dtype, op.type.weak),
                        attrs, op.loc, op.name),
                  f"{d} -> leading axis" + (f" of {block}-point blocks over {db}" if block else ""))
    for e in reads:
        k = old[e.src].index(d)
        rest = (db,) if block else ()
        ed.reindex(e, e.index[:k] + rest + e.index[k + 1:], f"{d} read whole as an axis")
        if isinstance(e.index[k], Slice) and d in old[e.dst]:  # a reduction over d
            c = ed.ops[e.dst]
            attrs = {**c.attrs, "whole": tuple(sorted({*c.attrs.get("whole", ()),
                                                       (d.name, e.slot)}))}
            ed.update(c.id, Op(c.id, c.kind, c.domain, c.type, attrs, c.loc, c.name),
                      f"reads all of {d} as an axis")
    _pin_bound(ed, d.bound, size)


def _pin_bound(ed: Editor, bound: Bound, value: int):
    """Write ``bound``'s value into every shape that mentions it. A vectorised dim's axis has
    the bound's exact size, so a value shaped by the bound (``x[0:T]``, a gradient's
    ``broadcast_to((T,))``) must have it too, not a padded size class."""
    def pin(v):
        if isinstance(v, Expr) and bound in v.symbols():
            return norm_dim(v.substitute({bound: value}))
        if isinstance(v, TensorType):
            return TensorType(tuple(map(pin, v.shape)), v.dtype, v.weak)
        if isinstance(v, tuple) and not (v and isinstance(v[0], tuple) and v[0]
                                         and isinstance(v[0][0], Op)):  # not a fused body
            return tuple(map(pin, v))
        return v

    for i, op in list(ed.ops.items()):
        keys = [k for k in ("shape", "size", "type") if k in op.attrs]
        new_type = pin(op.type)
        if new_type == op.type and all(pin(op.attrs[k]) == op.attrs[k] for k in keys):
            continue
        attrs = {**op.attrs, **{k: pin(op.attrs[k]) for k in keys}}
        ed.update(i, Op(i, op.kind, op.domain, new_type, attrs, op.loc, op.name),
                  f"{bound} = {value} in its shape")


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


@register("incrementalise", "incrementalise")
def incrementalise(ed: Editor):
    """Incrementalisation: a dim too large to vectorise whole runs in blocks of its points.

    A dim that vectorisation declined only for the memory budget becomes a new dim ``d_blk``
    over blocks (a loop, so only a block's values need be live at once) whose points inside a
    block form a leading spatial axis, as vectorisation would make it for the whole dim. The
    block is the largest divisor of the bound whose values fit the budget, so no block is
    padded. Not for a dim some op reduces over whole (``x[0:B]``) or with a block under 2.
    """
    budget = ed.config.vectorise_budget_bytes
    for d in reversed(ed.dims):
        size = ed.bounds.get(d.bound.name)
        ops = [op for op in ed.ops.values() if d in op.domain]
        if size is None or d.bound.name in ed.dynamic or not ops or ed.role(d) \
                or _reduced_whole(ed, d) or not eligible(ed, d, size, None):
            continue
        big = max(largest_point(op) for op in ops)
        if big * size <= budget:  # fits whole: not vectorised for another reason (or off)
            continue
        block = max((b for b in _divisors(size) if b < size and b * big <= budget), default=1)
        if block >= 2:
            vectorise_dim(ed, d, size, block)


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` (in O(sqrt n): a bound may be 10**9)."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in small]


def _reduced_whole(ed: Editor, d: Dim) -> bool:
    return any(isinstance(x, Slice) for e in ed.edges for pd, x in
               zip(ed.ops[e.src].domain, e.index) if pd == d)
