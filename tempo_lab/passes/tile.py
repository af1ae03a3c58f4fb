"""Tiling of dynamic ranges: a reduction over ``x[0:t+c]`` becomes a loop over static blocks.

A read whose length grows with ``t`` gives its kernels a shape that changes every step, so the
executors pad it to a size class: its cost follows the class, not ``t``, and a loop over ``t``
has to be split for the padding to stay small. This pass cuts the range into blocks of ``B``
points along a new dim (``t_tile``, bound ``T_TILE``, the largest number of blocks): the ops
between the read and the reduction that consumes it run once per block on
``x[k*B : min(k*B+B, t+c)]`` (static size ``B``; the last block is masked by its valid length),
and their partial results are combined by a recurrence over ``k`` read at the last block,
``(t+c-1) // B``. Demand does the rest: only blocks up to the last are computed, so the loop
over blocks has a trip count that follows ``t``.

Reductions it splits: ``sum``, ``max`` and ``min`` over the range axis and a ``matmul``
contracting it (partials added or compared), and a ``softmax`` along it whose result, after
layout ops, is contracted with another range value: attention, combined with a running maximum
as in online softmax. Ops in between must act pointwise along the range axis (elementwise ops,
transposes and squeezes that keep it, matmuls and reductions over other axes), have the
reader's domain, and be read only by each other at the same point; anything else leaves the
read as it is. A range that never exceeds one block is left alone.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ..executors import CAPS
from ..ir.ops import CATALOG, TensorType, accumulator, flag, infer
from ..ir.sdg import Edge, Op, read_type
from ..ir.vmap import vdims
from ..symbolic import TRUE, Const, Dim, Slice, floordiv, min_
from ..symbolic.sizes import const_cap
from .manager import Editor, register


def auto_block(longest: int) -> int:
    """About 32 blocks at the longest range, 32 to 256 points each (a power of two): on the
    causal decoder at T = 1024 (CPU), with a kernel dispatched per statement, time per token
    grew with the block (32: 1.03 ms, 128: 1.53, 512: 2.02) while compile time grows with the
    number of blocks. (The XLA executor gets no automatic block: ``_padded_per_span``.)"""
    return min(256, max(32, 1 << (-(-longest // 32) - 1).bit_length()))


def _padded_per_span(ed: Editor) -> bool:
    """Whether the automatic block is left out: the program runs on an executor (chosen, or
    what "auto" picks: ``ed.executor``, resolved once before the passes) that pads a growing read to the end of its span of
    the loop (``xla_split``; ``Caps.pads_per_span``: the XLA executor), so every kernel is
    static already, and a loop over blocks adds a loop iteration per block. Measured on the decode benchmark (T = 1024, causal, CPU, ms/token,
    blocks of 32 / untiled): GPT-2-style 1.60 / 1.36, Llama-style 1.82 / 1.72."""
    c = ed.config
    if c.tile_block is not None or c.xla_split < 2:
        return False
    # a device memory budget may or may not make offloads: tiled is the safe side there
    # (``Choice.planned``: auto's fallback under a budget)
    return CAPS[ed.executor.planned].pads_per_span


class Region:
    """Ops carrying one range axis of length ``length`` between entry reads and a terminal."""

    def __init__(self, t: Dim, c: int, length, domain):
        self.t, self.c, self.length, self.domain = t, c, length, domain
        self.ops: set[int] = set()
        self.terminal: int | None = None
        self.softmax: int | None = None
        self.chain: list[int] = []  # layout ops from the softmax to the terminal
        self.block = self.blocks = 0


def _entry(e: Edge, op_domain) -> tuple[Dim, int] | None:
    """(t, c) when ``e`` reads ``0:t+c`` along one dim (``t`` the reader's) and points on the
    others, with a length that has no constant cap."""
    sl = [x for x in e.index if isinstance(x, Slice)]
    if len(sl) != 1 or sl[0].start != 0 or const_cap(sl[0].length) is not None:
        return None
    for t in op_domain:
        c = sl[0].stop - t
        if isinstance(c, Const) and c.value >= 1:
            return t, c.value
    return None


def _axis(shape, length) -> int | None:
    """The range axis of a value: the one entry equal to ``length`` (None: no symbolic axis;
    -1: another symbolic size or two range axes)."""
    sym = [k for k, s in enumerate(shape) if not isinstance(s, int)]
    if not sym:
        return None
    return sym[0] if len(sym) == 1 and shape[sym[0]] == length else -1


def _grow(ed: Editor, start: Edge, t: Dim, c: int) -> Region | None:
    """The region a range read feeds, or None when it cannot be tiled."""
    first = ed.ops[start.dst]
    length = next(x for x in start.index if isinstance(x, Slice)).length
    reg = Region(t, c, length, first.domain)
    roots, todo = ed.roots(), [start.dst]
    while todo:
        i = todo.pop()
        if i in reg.ops or i == reg.terminal:
            continue
        op = ed.ops[i]
        if op.domain != reg.domain or vdims(op) or op.kind not in CATALOG:
            return None
        for e in ed.in_edges(i):
            a = _axis(read_type(ed.ops[e.src], e).shape, length)
            if a == -1:
                return None
            if a is None:
                continue
            if _entry(e, op.domain) == (t, c):
                continue
            src = ed.ops[e.src]
            if tuple(e.index) != tuple(src.domain) or e.cond != TRUE:
                return None
            todo.append(e.src)
        a = _axis(op.type.shape, length)
        if a == -1:
            return None
        if a is not None:
            if i in roots or not flag(op.kind, "along"):
                return None
            reg.ops.add(i)
            todo.extend(e.dst for e in ed.out_edges(i))
        elif reg.terminal is None and CATALOG[op.kind].combine:
            reg.terminal = i
        else:
            return None
    return reg if reg.terminal is not None and _shape_ok(ed, reg) else None


def _shape_ok(ed: Editor, reg: Region) -> bool:
    """A softmax along the range axis must reach the terminal matmul through layout ops only,
    as its one operand; a sum, max or min terminal takes no softmax along the axis."""
    soft = [i for i in reg.ops if ed.ops[i].kind == "softmax"
            and ed.ops[i].attrs["axis"] % ed.ops[i].type.ndim
            == _axis(ed.ops[i].type.shape, reg.length)]
    if not soft:
        return True
    if len(soft) > 1 or ed.ops[reg.terminal].kind != "matmul":
        return False
    reg.softmax, i = soft[0], soft[0]
    while True:
        outs = ed.out_edges(i)
        if len(outs) != 1:
            return False
        i = outs[0].dst
        if i == reg.terminal:  # one operand (single readers all along): the other is free
            return True
        if not flag(ed.ops[i].kind, "relayout"):
            return False
        reg.chain.append(i)


def _topo(ed: Editor, ops: set[int]) -> list[int]:
    order, seen = [], set()

    def visit(i):
        if i in seen:
            return
        seen.add(i)
        for e in ed.in_edges(i):
            if e.src in ops:
                visit(e.src)
        order.append(i)

    for i in sorted(ops):
        visit(i)
    return order


class _Builder:
    """Adds the per-block ops (over the reader's domain and ``k``) and the ops that combine
    their partial results (over the reader's domain), reading the blocks ``0:n`` up to the last
    one; ``n`` is capped by the number of blocks, so those reads have a static size too."""

    def __init__(self, ed: Editor, reg: Region, k: Dim):
        self.ed, self.reg = ed, reg
        self.block = tuple(d for d in ed.dims if d in reg.domain or d == k)
        kb = k * reg.block
        self.slice = Slice(kb, min_(kb + reg.block, reg.t + reg.c))
        n = min_(reg.blocks, floordiv(reg.t + (reg.c - 1), reg.block) + 1)
        self.blocks = tuple(Slice(Const(0), n) if d == k else d for d in self.block)
        self.loc = ed.ops[reg.terminal].loc

    def edge(self, e: Edge, new: dict[int, int]) -> Edge:
        """``e`` as read by a block op: a region op's block value, an entry's block, or as is."""
        if e.src in new:
            return Edge(-1, new[e.src], e.slot, self.block, TRUE, e.loc)
        if _entry(e, self.reg.domain) == (self.reg.t, self.reg.c):
            index = tuple(self.slice if isinstance(x, Slice) else x for x in e.index)
            return Edge(-1, e.src, e.slot, index, e.cond, e.loc)
        return Edge(-1, e.src, e.slot, e.index, e.cond, e.loc)

    def clone(self, i: int, new: dict[int, int], note: str) -> int:
        op = self.ed.ops[i]
        return self.add(op.kind, [self.edge(e, new) for e in self.ed.in_edges(i)],
                        dict(op.attrs), self.block, note)

    def widened(self, i: int, new: dict[int, int], note: str) -> int:
        """Op ``i`` (a sum or matmul of 16-bit floats) on a block, its inputs cast to the dtype
        they accumulate in (``accumulator``): a block's partial result rounded to 16 bits
        overflowed where the whole sum does not (float16 60 000, 60 000, -60 000, -60 000 in
        blocks of 2 summed to inf, then NaN, where NumPy and the untiled sum give 0)."""
        op = self.ed.ops[i]
        edges = [Edge(-1, self.add("cast", [self.edge(e, new)],
                                   {"dtype": accumulator(op.type.dtype)}, self.block, note),
                      e.slot, self.block, TRUE, e.loc) for e in self.ed.in_edges(i)]
        return self.add(op.kind, edges, dict(op.attrs), self.block, note)

    def add(self, kind, edges, attrs, domain, note) -> int:
        typ = infer(kind, [read_type(self.ed.ops[e.src], e) for e in edges], attrs)
        op = Op(-1, kind, domain, typ, attrs, self.loc)
        return self.ed.add(op, edges, self.reg.terminal, note)

    def op(self, kind: str, args: list, attrs: dict | None = None, note: str = "",
           per_block: bool = True) -> int:
        """``kind`` of values given as op ids (read at the same point) or (id, index) pairs;
        ``per_block=False``: an op over the reader's domain, combining blocks."""
        pairs = [a if isinstance(a, tuple) else (a, self.block if per_block else
                                                 self.reg.domain) for a in args]
        edges = [Edge(-1, src, n, index, TRUE, self.loc) for n, (src, index) in enumerate(pairs)]
        return self.add(kind, edges, attrs or {}, self.block if per_block else self.reg.domain,
                        note)

    def combine(self, kind: str, args: list, attrs: dict | None = None, note: str = "") -> int:
        return self.op(kind, args, attrs, note, per_block=False)

    def over_blocks(self, i: int) -> tuple:
        return (i, self.blocks)


def _rewrite(ed: Editor, reg: Region, k: Dim):
    b = _Builder(ed, reg, k)
    z = ed.ops[reg.terminal]
    new: dict[int, int] = {}
    skip = {reg.softmax, *reg.chain} if reg.softmax is not None else set()
    for i in _topo(ed, reg.ops - skip):
        new[i] = b.clone(i, new, f"block of a {reg.length} range")
    if reg.softmax is None and z.kind in ("sum", "matmul") and \
            accumulator(z.type.dtype) != z.type.dtype:   # of 16-bit floats: added in float32
        part = b.widened(reg.terminal, new, "partial result of a block, in float32")
        total = b.combine("sum", [b.over_blocks(part)], {"axis": 0, "keepdims": False},
                          "partial results of the blocks added in float32")
        ed.rewrite(z.id, Op(z.id, "cast", z.domain, z.type, {"dtype": z.type.dtype}, z.loc,
                            z.name), [Edge(z.id, total, 0, reg.domain, TRUE, z.loc)],
                   "the blocks' sum rounded once")
    elif reg.softmax is None:
        part = b.clone(reg.terminal, new, "partial result of a block")
        kind = "sum" if z.kind == "matmul" else z.kind
        edges = [Edge(z.id, part, 0, b.blocks, TRUE, z.loc)]
        ed.rewrite(z.id, Op(z.id, kind, z.domain, z.type, {"axis": 0, "keepdims": False}, z.loc,
                            z.name), edges, "partial results of the blocks combined")
    else:
        _online_softmax(ed, reg, b, new)
    for i in reg.ops:
        ed.erase(i, "tiled")


def _online_softmax(ed: Editor, reg: Region, b: _Builder, new: dict[int, int]):
    """Attention per block: ``o_k = exp(s_k - m_k) @ v_k`` and ``l_k = sum(exp(s_k - m_k))``
    with the block's maximum ``m_k``; combined as ``sum_k w_k o_k / sum_k w_k l_k`` with
    ``w_k = exp(m_k - max_k m_k)`` (row factors laid out like the result, by the same layout
    ops that led from the softmax to the contraction)."""
    z, soft = ed.ops[reg.terminal], ed.ops[reg.softmax]
    (e_s,) = ed.in_edges(reg.softmax)
    ax = soft.attrs["axis"] % soft.type.ndim
    scores = new[e_s.src] if e_s.src in new else b.add("identity", [b.edge(e_s, new)], {},
                                                        b.block, "block scores")
    dt = soft.type.dtype
    lowest = ed.add(Op(-1, "const", (), TensorType((), dt), {"value": np.array(
        ml_dtypes.finfo(dt).min, dt)}, soft.loc), [], reg.softmax, "lowest finite score")
    m = b.op("maximum", [b.op("max", [scores], {"axis": (ax,), "keepdims": True}),
                         (lowest, ())], note="block maximum (finite: an all -inf block adds 0)")
    p = b.op("exp", [b.op("sub", [scores, m])])
    l_ = b.op("sum", [p], {"axis": (ax,), "keepdims": True}, "block normaliser")
    last = reg.chain[-1] if reg.chain else reg.softmax
    wslot = next(e.slot for e in ed.in_edges(reg.terminal) if e.src == last)
    other = ed.in_edges(reg.terminal)[1 - wslot]
    squeeze = read_type(ed.ops[other.src], other).ndim == 1 and ed.ops[last].type.ndim >= 2

    def lay(x: int, note: str) -> int:
        """A row factor (the range axis reduced to 1) laid out like the result."""
        cur = {**new, reg.softmax: x}
        for i in reg.chain:
            cur[i] = b.clone(i, cur, note)
        y = cur[last]
        return b.op("squeeze", [y], {"axis": (-1 if wslot == 0 else -2,)}) if squeeze else y

    cur = {**new, reg.softmax: p}
    for i in reg.chain:
        cur[i] = b.clone(i, cur, "block weights layout")
    o = b.clone(reg.terminal, cur, "block output (unnormalised)")
    lm, ll = lay(m, "block maximum laid out"), lay(l_, "block normaliser laid out")
    big = b.combine("max", [b.over_blocks(lm)], {"axis": 0, "keepdims": False}, "maximum")
    w = b.combine("exp", [b.combine("sub", [b.over_blocks(lm), big])], note="block weights")
    out = b.combine("sum", [b.combine("mul", [w, b.over_blocks(o)])], {"axis": 0,
                                                                       "keepdims": False})
    norm = b.combine("sum", [b.combine("mul", [w, b.over_blocks(ll)])], {"axis": 0,
                                                                         "keepdims": False})
    ed.rewrite(z.id, Op(z.id, "div", z.domain, z.type, {}, z.loc, z.name),
               [Edge(z.id, out, 0, reg.domain, TRUE, z.loc),
                Edge(z.id, norm, 1, reg.domain, TRUE, z.loc)], "normalised")


@register("tile", "tile")
def tile(ed: Editor):
    """Tiling: a reduction over a range that grows with ``t`` runs over static blocks."""
    if _padded_per_span(ed):
        for i in sorted(ed.ops):
            if any(_entry(e, ed.ops[i].domain) for e in ed.in_edges(i)):
                ed.note(i, "not tiled: the XLA executor pads a range that grows with its loop "
                           "to a static size per span of the loop (xla_split) or reads the "
                           "whole buffer in place, which ran faster than a loop over blocks; "
                           "give CompileConfig(tile_block=...) to tile")
        return
    regions: list[Region] = []
    taken: set[int] = set()
    for e in sorted(ed.edges, key=lambda e: (e.dst, e.slot)):
        if e.dst in taken or e.src not in ed.ops:
            continue
        tc = _entry(e, ed.ops[e.dst].domain)
        if tc is None or tc[0].bound.name not in ed.bounds:
            continue
        read = f"{ed.ops[e.src].label}[{e.index_str()}]"
        if tc[0].bound.name in ed.dynamic:
            ed.note(e.dst, f"not tiled: {read} ends at a data-dependent bound (tl.until)")
            continue
        if vdims(ed.ops[e.src]):
            ed.note(e.dst, f"not tiled: {read} reads a vectorised value")
            continue
        reg = _grow(ed, e, *tc)
        if reg is None:
            ed.note(e.dst, f"not tiled: {read} does not reach a sum, max, min or matmul over "
                           "the range through ops that act pointwise along it")
            continue
        if reg.ops & taken or reg.terminal in taken:
            continue
        longest = ed.bounds[tc[0].bound.name] - 1 + tc[1]
        block = ed.config.tile_block or auto_block(longest)
        if longest <= block:
            ed.note(e.dst, f"not tiled: {read} is never longer than one block ({longest} <= "
                           f"{block} points)")
            continue
        reg.block, reg.blocks = block, (longest - 1) // block + 1
        regions.append(reg)
        taken |= reg.ops | {reg.terminal}
    made: dict[str, Dim] = {}  # one blocks dim per step dim, as long as its longest range
    for reg in regions:
        k = made.get(reg.t.name)
        if k is None:
            k = made[reg.t.name] = ed.add_dim("blocks", reg.t, reg.blocks)
        elif reg.blocks > ed.bounds[k.bound.name]:
            ed.set_bound(k, reg.blocks)
        _rewrite(ed, reg, k)
    if regions:
        ed.renumber()  # each terminal kept its id but now reads new ops
