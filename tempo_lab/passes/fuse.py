"""Fusion: a chain of static ops computed at the same point runs as one kernel.

An op whose every reader is one op at the same point (same domain and vectorised dims, read
unconditionally at the identity index) is folded into that reader; repeated, this gathers trees
of ops under a root. Such a tree is always legal to fuse: nothing outside reads its inner ops,
so no dependence cycle can appear. Members must be computations (no sources, placeholders or
sinks) with static shapes, so the fused kernel has no padded axes of its own; its external
inputs keep their reads (slices, offsets) and masks. The root keeps its id, so readers and the
order of ops (producers before consumers) are unchanged.
"""
from __future__ import annotations

from ..ir.ops import CATALOG
from ..ir.sdg import Edge, Op
from ..ir.vmap import base_op, vdims
from ..symbolic import TRUE
from .manager import Editor, register

COMPUTE = ("elementwise", "reduce", "layout", "linalg", "lift")


def _fusible(op: Op) -> bool:
    return (op.kind in CATALOG and CATALOG[op.kind].category in COMPUTE
            and op.type.is_static and "whole" not in op.attrs  # whole reads: own kernel
            and "stacked" not in op.attrs)


@register("fuse", "fuse")
def fuse(ed: Editor):
    """Fusion: fold ops read by exactly one op at the same point into that op's kernel."""
    roots = ed.roots()
    parent: dict[int, int] = {}
    for i, op in ed.ops.items():
        outs = ed.out_edges(i)
        if not outs or i in roots or not _fusible(op):
            continue
        c = ed.ops[outs[0].dst]
        if (all(e.dst == c.id and e.cond == TRUE and tuple(e.index) == tuple(op.domain)
                for e in outs)
                and _fusible(c) and c.domain == op.domain and vdims(c) == vdims(op)):
            parent[i] = c.id
    children: dict[int, list[int]] = {}
    for p, c in parent.items():
        children.setdefault(c, []).append(p)
    for root in sorted(set(children) - set(parent)):
        members, stack = [], [root]
        while stack:
            m = stack.pop()
            members.append(m)
            stack.extend(children.get(m, ()))
        _fuse_group(ed, root, sorted(members))


def _fuse_group(ed: Editor, root: int, members: list[int]):
    position = {m: k for k, m in enumerate(members)}
    body, external = [], []
    for m in members:
        refs = []
        for e in ed.in_edges(m):
            if e.src in position:
                refs.append(("int", position[e.src]))
                continue
            key = (e.src, e.index, e.cond)
            k = next((j for j, x in enumerate(external) if (x.src, x.index, x.cond) == key),
                     None)
            if k is None:
                k = len(external)
                external.append(e)
            refs.append(("ext", k))
        body.append((base_op(ed.ops[m]), tuple(refs)))
    r = ed.ops[root]
    attrs = {"body": tuple(body)}
    if vdims(r):
        attrs["vdims"] = vdims(r)
    fused = Op(root, "fused", r.domain, r.type, attrs, r.loc, r.name)
    ed.rewrite(root, fused, [Edge(root, e.src, k, e.index, e.cond, e.loc)
                             for k, e in enumerate(external)],
               "fused " + ", ".join(f"%{m} {ed.ops[m].kind}" for m in members))
    for m in members:
        if m != root:
            ed.erase(m, f"fused into %{root}")
