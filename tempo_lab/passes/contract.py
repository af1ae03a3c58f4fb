"""Contraction: a parameter's per-point gradient, summed over a range, becomes one batched vjp.

``tl.grad`` sends a lifted function's cotangent for a parameter ``theta[i]`` from every point
``(i, b, t)`` that reads it, then sums the contributions over the points
(``sum(c[i, b, 0:T])``): one parameter-sized value per point, stored over the whole range
before the sum. That sum is linear in the points' cotangents, so it equals a single ``jax.vjp``
of the function vmapped over the stacked points, in which JAX contracts the points in the
backward matmuls (the usual batch gradient). This pass rewrites

    c   = lift(theta[i], x[i, b, t], g[i, b, t], jax_fn=Cotangent)        over (i, b, t)
    s   = sum(c[i, b, 0:T], axis=0)                                         over (i, b)
into
    s   = lift(theta[i], x[i, b, 0:T], g[i, b, 0:T], jax_fn=Cotangent.summed)   over (i, b)

when ``c`` is read only by that sum, the sum takes the whole range of a static dim, and every
input of ``c`` reads that dim at the point itself or not at all (``theta`` must not vary along
it). One level per sum: the next sum (over ``b``) is left for vectorisation, since a read
with two ranges would keep ``b`` from becoming a spatial axis.
"""
from __future__ import annotations

from ..ir.cotangent import Cotangent
from ..ir.sdg import Edge, Op
from ..symbolic import TRUE, Slice
from .manager import Editor, register


def _whole(x, d) -> bool:
    return isinstance(x, Slice) and x.start == 0 and x.stop == d.bound


def _stacked(ed: Editor, s: Op):
    """``(c, d, read)`` if ``s`` sums a lifted cotangent ``c`` over the whole of ``c``'s dim
    ``d``, read only there; else None."""
    if s.kind != "sum" or s.attrs.get("keepdims") or s.attrs.get("axis") not in (0, (0,)):
        return None
    ins = ed.in_edges(s.id)
    if len(ins) != 1 or ins[0].cond != TRUE:
        return None
    (read,) = ins
    c = ed.ops[read.src]
    if c.kind != "lift" or not isinstance(c.attrs["jax_fn"], Cotangent) \
            or c.type != s.type or len(ed.out_edges(c.id)) != 1:
        return None
    slices = [(d, x) for d, x in zip(c.domain, read.index) if isinstance(x, Slice)]
    if len(slices) != 1 or not _whole(slices[0][1], slices[0][0]) \
            or slices[0][0].bound.name in ed.dynamic:
        return None
    return c, slices[0][0], read


def _input(e: Edge, c: Op, read: Edge, d):
    """``c``'s input ``e`` read from the sum's points (``d`` stacked), and the axis ``d``
    takes in the value (0, or None: constant along ``d``); None if ``e`` reads ``d`` otherwise
    or already reads a range."""
    at = {u: x for u, x in zip(c.domain, read.index) if u != d}
    index, axis = [], None
    for x in e.index:
        if isinstance(x, Slice):  # one range per read (see above)
            return None
        if x == d:
            index.append(read.index[c.domain.index(d)])
            axis = 0
        elif d in x.dims():
            return None
        else:
            index.append(x.substitute(at))
    if d in e.cond.dims():
        return None
    return Edge(read.dst, e.src, e.slot, tuple(index), e.cond.substitute(at), e.loc), axis


@register("contract", "contract")
def contract(ed: Editor):
    """Contraction: a lifted parameter cotangent summed over the whole of a static range
    becomes one vjp of the function vmapped over the range (no per-point gradients)."""
    for i in sorted(ed.ops):
        s = ed.ops.get(i)
        found = s and _stacked(ed, s)
        if not found:
            continue
        c, d, read = found
        inputs = [_input(e, c, read, d) for e in ed.in_edges(c.id)]
        if any(x is None for x in inputs):
            continue
        fn = c.attrs["jax_fn"].summed([axis for _, axis in inputs])
        if fn is None:
            continue
        ed.rewrite(i, Op(i, "lift", s.domain, s.type, {**c.attrs, "jax_fn": fn}, s.loc, s.name),
                   [e for e, _ in inputs], f"sum over {d} of %{c.id} as one vjp")
        ed.erase(c.id, f"contracted into %{i}")
