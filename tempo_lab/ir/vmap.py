"""Ops applied per element of vectorised leading axes (see passes/vectorise.py).

An op with ``attrs["vdims"]`` computes, for every element of its leading axes, what the op
without those axes (``base_op``) computes from the matching elements of its inputs. An input
carries a vectorised dim if its producer was vectorised over it too; its batch axis then sits
right after the axes its read's slices prepend. An input in ``attrs["stacked"]`` carries it
as the axis of its read's whole range over that dim instead (a producer that stays in a loop
over the dim, read by an op vectorised over it: see ``passes/vectorise.vectorise_group``).
"""
from __future__ import annotations

from ..symbolic import Slice
from .ops import TensorType
from .sdg import SDG, Edge, Op


def vdims(op: Op) -> tuple[str, ...]:
    return tuple(op.attrs.get("vdims", ()))


def base_op(op: Op) -> Op:
    """``op`` for one element of its vectorised axes."""
    n = len(vdims(op))
    attrs = {k: v for k, v in op.attrs.items() if k not in ("vdims", "whole", "stacked")}
    if op.kind == "merge":
        t = attrs["type"]
        attrs["type"] = TensorType(t.shape[n:], t.dtype, t.weak)
    return Op(op.id, op.kind, op.domain, TensorType(op.type.shape[n:], op.type.dtype,
                                                    op.type.weak), attrs, op.loc, op.name,
              op.scope)


def in_axes(sdg: SDG, op: Op, edges: list[Edge]) -> list[list[int | None]]:
    """Per vectorised dim of ``op`` (outermost first), per input: the axis to map over, or
    None if that input does not vary along the dim (after peeling the outer dims). An input's
    value has the axes of its read's slices over unvectorised dims, then the producer's
    vectorised axes in its ``vdims`` order (a whole read's among them)."""
    levels = [[] for _ in vdims(op)]
    whole = set(op.attrs.get("whole", ()))  # inputs read over all of d (see passes/vectorise)
    stacked = set(op.attrs.get("stacked", ()))
    for e in edges:
        p = sdg.ops[e.src]
        left = list(vdims(p))
        slices = [d.name for d, x in zip(p.domain, e.index) if isinstance(x, Slice)]
        for row, d in zip(levels, vdims(op)):
            if (d, e.slot) in stacked:
                row.append(slices.index(d))
                slices.remove(d)
                continue
            carried = d in left and (d, e.slot) not in whole
            row.append(len(slices) + left.index(d) if carried else None)
            if carried:
                left.remove(d)
    return levels


def mapped_axes(levels, slot: int) -> list[int]:
    """The axes of input ``slot``'s value (numbered before any is mapped) that ``levels`` map,
    outermost level first: each level numbers the axes left after the outer ones are peeled."""
    left = list(range(len(levels) + 64))
    return [left.pop(level[slot]) for level in levels if level[slot] is not None]
