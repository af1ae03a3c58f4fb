"""How the XLA executor traces the schedule's loops, decided before tracing (JAX-free, as
``xla_plan.py``): inner loops unrolled (``unrolled_loops``), a loop's first step traced apart
(``peels``), a split loop's per-span work under one ``lax.switch`` (``switch_plan``), and the
program as traced, in words (``describe``). Each function reads ``xp``, the ``XlaPlan`` being built
(its stores, segments and options: this module does not import it, which imports this one), and
returns a value that the plan keeps; the tracer (``xla_trace.py``) reads the plan.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..ir.ops import flag
from ..schedule import Exec, For, If, Seq, While
from ..schedule.cut import loop_ranges
from ..schedule.loops import execs_under
from ..symbolic import Dim, as_expr
from ..symbolic.cond import decide
from . import index_code as ic
from .lowered import Lowered, Padded


def unrolled_loops(xp, spans: bool) -> dict[int, tuple[int, int]]:
    """Inner loops traced once per step, by ``id``: (first, end). An inner loop whose
    variable picks a point (of ``unroll_bytes`` or more, ``XlaOptions``) of a store that the loops around
    it do not write (a layer's weights, read at ``n`` in the loop over layers inside the
    loop over steps; not PPO's minibatch, made in the iteration that reads it, whose
    four minibatches unrolled took 3 s more to compile for no faster a step) reads it
    by a dynamic index, which XLA copies out at every step; with the variable a constant,
    each layer's weights can be a buffer of their own (``XlaPlan._unstacked``), read in place.
    Only loops whose bounds are fixed numbers for these bounds, with few steps, outside
    a ``tl.until`` loop's bound, and only while the program stays small: XLA's compile
    time grows with the copies traced, ``spans`` counting the spans of the loops around
    (twelve layers in eight spans of the decode loop: compiled in 10.3 s against 2.6 s,
    for a step 18 % faster; with their keys and values held apart too, the loop is not
    split, and unrolled they ran 1.34 ms a token against 1.97, first run 3.1 s against
    4.3)."""
    return {id(node): (node.lo.evaluate(xp.bounds), node.hi.evaluate(xp.bounds))
            for node, loops in nodes_in_loops(xp.lowered.ast)
            if isinstance(node, For) and loops and _unrolls(xp, node, loops, spans)}


def _unrolls(xp, node: For, loops: tuple, spans: bool) -> bool:
    lo, hi = as_expr(node.lo), as_expr(node.hi)
    if (isinstance(node, While) or node.step != 1 or lo.dims() or hi.dims()
            or any(b.name in xp.sdg.untils for b in lo.bounds() | hi.bounds())):
        return False
    steps = hi.evaluate(xp.bounds) - lo.evaluate(xp.bounds)
    execs = [n for n in node.body.walk() if isinstance(n, Exec)]
    copies = steps * len(execs) * (math.prod(max(1, len(xp.segments(f))) for f in loops)
                                   if spans else 1)
    if not 0 < steps <= xp.options.unroll_steps or copies > xp.options.unroll_statements:
        return False
    v, written = Dim(node.var), set(writes(xp, loops[0]))
    return any(e[0] == "p" and v in as_expr(e[1]).dims()
               for n in execs for st in xp.lowered.stmts_of(n) for r in st.reads
               if r.src not in written and r.src in xp.shapes
               and _point_bytes(xp, r.src) >= xp.options.unroll_bytes for e in r.entries)


def _point_bytes(xp, op: int) -> int:
    """Bytes of one point of a store (its axes padded as stored)."""
    return math.prod(xp.memory.storages[op].spatial) * xp.sdg.ops[op].type.dtype.itemsize


def traced_statements(lowered: Lowered, idx, lower: dict) -> list[int]:
    """Of an Exec's statements ``idx`` (a merge has one per branch), those traced under the
    loops' ranges ``lower``: up to the first whose condition holds there, the last when none
    does, without those the ranges rule out."""
    out = []
    for j, k in enumerate(idx):
        settled = True if j == len(idx) - 1 else decide(lowered.stmts[k].cond, lower)
        if settled is not False:
            out.append(k)
        if settled:
            break
    return out


def ranged(xp, node: For, lower: dict, first, exact: bool) -> dict:
    """``lower`` with ``node``'s range (``schedule.cut.loop_ranges``)."""
    return loop_ranges(node, xp.sdg.untils, lower, first, exact)


def peels(xp, node: For, lower: dict) -> bool:
    """Whether tracing a loop's first step apart settles branches the whole loop cannot
    (``t == 0`` or ``t >= 1`` in a recurrence), so that neither copy has their lax.conds or
    selects: where the body is small (``peel_small``, ``XlaOptions``), or in a loop of many
    steps (``peel_steps``) where the body is not large (``peel_statements``) or those branches
    are at least a ``1 / peel_share`` of its statements (a chain of recurrences: 46 -> 4.4 ms a run).
    A large body with few of them is not doubled: a 16-layer decode, whose only such branches
    pick the prompt's token, compiled twice as long peeled for no faster a step. Nor is a body
    that holds a loop (it would be traced twice for branches run once a step), nor one of a
    few steps: PPO's loops over iterations and over epochs peeled compiled in 25 s against 11
    and ran 53 ms an iteration against 43."""
    whole = ranged(xp, node, lower, node.lo, False)
    rest = ranged(xp, node, lower, as_expr(node.lo) + 1, False)

    def settled(c) -> bool:
        return decide(c, whole) is None and decide(c, rest) is not None

    unrolls = {id(f): xp.unrolled[id(f)][1] - xp.unrolled[id(f)][0] for f in
               node.body.walk() if isinstance(f, For) and id(f) in xp.unrolled}
    if any(isinstance(f, For) and id(f) not in unrolls for f in node.body.walk()):
        return False
    lo, hi = as_expr(node.lo), as_expr(node.hi)
    steps = math.inf if lo.dims() or hi.dims() else hi.evaluate(xp.bounds) - lo.evaluate(
        xp.bounds)  # steps that vary with an outer loop's point: counted as many
    total = gained = 0
    for n, loops, conds in execs_under(node.body):
        copies = math.prod(unrolls.get(id(f), 1) for f in loops)
        total += copies
        idx = xp.lowered.of_exec.get(id(n), ())
        if any(settled(c) for c in conds) or any(
                settled(xp.lowered.stmts[k].cond) for k in idx[:-1]):  # a merge's branches
            gained += copies
    o = xp.options
    return gained > 0 and (total <= o.peel_small or steps >= o.peel_steps and (
        total <= o.peel_statements or gained * o.peel_share >= total))


def items(node) -> list:
    return list(node.body) if isinstance(node, Seq) else [node]


def switch_plan(xp, node: For) -> dict | None:
    """How a split loop runs as one loop: for each ``Seq`` in its body (by ``id``), its
    children in order, a ``Run`` for those whose reads are padded per segment (traced
    once per segment under one ``lax.switch`` on the segment of the step) with what
    reads what they compute, a node for the rest (traced once). None keeps one loop per
    segment: a split loop inside, a value computed per segment read outside its run, or
    stores written by a run too big to carry through the switch at every step.
    XLA compiles each copy traced, so only the work that differs per segment is copied
    (one loop per segment compiled all of Llama's decode step eight times)."""
    segs = [((node.var, end - 1),) for _, end in xp.segments(node)]
    if any(isinstance(n, For) and xp.segments(n) for n in node.body.walk()):
        return None
    varies = {k: len({xp.pads_for(k, s) for s in segs}) > 1
              for k in range(len(xp.lowered.stmts))}

    def execs(n):
        return [x for x in n.walk() if isinstance(x, Exec)]

    def stmts(n):
        return [k for x in execs(n) for k in xp.lowered.of_exec.get(id(x), ())]

    def shaped(n):  # values local to the loop whose shape differs per segment
        out = set()
        for k in stmts(n):
            st = xp.lowered.stmts[k]
            m = sum(isinstance(x, Padded) for x in st.out)
            if st.op.id in xp.local and m and len(
                    {xp.pads_for(k, s)[-m:] for s in segs}) > 1:
                out.add(st.op.id)
        return out

    def ops(n):
        return [x.op for x in execs(n)]

    def reads(n):
        return {r.src for k in stmts(n) for r in xp.lowered.stmts[k].reads}

    plan, runs, inside = {}, [], set()
    for seq in [n for n in node.body.walk() if isinstance(n, Seq)]:
        if id(seq) in inside:  # traced inside a run: not switched again
            continue
        parts, kids, i = [], _flat(seq), 0
        inside |= {id(n) for n in _spliced(seq)}
        while i < len(kids):  # a run starts at a statement padded per segment
            if not (isinstance(kids[i], Exec) and any(varies[k] for k in stmts(kids[i]))):
                parts.append(kids[i])  # a loop or branch: its own Seqs are planned
                i += 1
                continue
            j, made = i + 1, shaped(kids[i])
            while True:  # ... and ends after the last node reading what it made
                last = max((m for m in range(j, len(kids)) if reads(kids[m]) & made),
                           default=j - 1)
                if last < j:
                    break
                made |= set().union(*(shaped(n) for n in kids[j:last + 1]))
                j = last + 1
            run, wrote, read = [kids[i]], set(ops(kids[i])), reads(kids[i])
            for n in kids[i + 1:j]:  # what the run does not depend on runs before it
                if (any(varies[k] or k in xp.checked for k in stmts(n))
                        or any(flag(xp.sdg.ops[o].kind, "effect") for o in ops(n))
                        or reads(n) & wrote or set(ops(n)) & (read | wrote)):
                    run.append(n)
                    wrote, read = wrote | set(ops(n)), read | reads(n)
                else:
                    parts.append(n)
            runs.append((run, made, {id(x) for n in run for x in n.walk()}))
            inside |= runs[-1][2]
            parts.append(len(runs) - 1)
            i = j
        plan[id(seq)] = parts
    found = []
    for run, made, members in runs:
        after = set().union(*(reads(x) for x in execs(node.body) if id(x) not in members))
        if after & made or _carried_bytes(xp, {o for n in run for o in ops(n)}) \
                > xp.options.switch_carry_bytes:
            return None
        mine = {o for n in run for o in ops(n)} & xp.local
        found.append(Run(tuple(run), tuple(sorted(mine & after))))
    return {k: [found[p] if isinstance(p, int) else p for p in parts]
            for k, parts in plan.items()}


def nbytes(shape, dtype) -> int:
    """Bytes of a store held as ``shape`` of ``dtype`` (``XlaPlan.shapes``' entries)."""
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _carried_bytes(xp, ops) -> int:
    """Bytes of the stores ``ops`` write, which a ``lax.switch`` over them carries whole."""
    return sum(nbytes(*xp.shapes[o]) for o in ops if o in xp.shapes)


def nodes_in_loops(node, loops: tuple = ()):
    """Every loop and statement of the AST with the loops around it, outermost first."""
    if isinstance(node, Seq):
        for n in node.body:
            yield from nodes_in_loops(n, loops)
    elif isinstance(node, If):
        yield from nodes_in_loops(node.then, loops)
        if node.orelse is not None:
            yield from nodes_in_loops(node.orelse, loops)
    elif isinstance(node, For):
        yield node, loops
        yield from nodes_in_loops(node.body, loops + (node,))
    elif isinstance(node, Exec):
        yield node, loops


class Run(NamedTuple):
    """Consecutive nodes of a split loop's body traced once per segment (XlaPlan.switched),
    and the values local to the loop that they compute and later nodes read."""
    nodes: tuple
    values: tuple


def _flat(seq: Seq) -> list:
    """A ``Seq``'s children with the ``Seq``s among them spliced in."""
    return [m for n in seq.body for m in (_flat(n) if isinstance(n, Seq) else [n])]


def _spliced(seq: Seq) -> list:
    """The ``Seq``s that ``_flat`` splices into ``seq``."""
    return [m for n in seq.body if isinstance(n, Seq) for m in [n, *_spliced(n)]]


def has_exec(node) -> bool:
    return any(isinstance(n, Exec) for n in node.walk())


def writes(xp, node) -> list[int]:
    return sorted({n.op for n in node.walk() if isinstance(n, Exec) and n.op in xp.shapes})


def describe(xp, node, d: int, lower: dict) -> list[str]:
    """The program as traced, in words, from ``node`` at depth ``d`` (``lower``: the loops'
    ranges, as in ``xla_trace._Trace``): ``XlaPlan.source``."""
    pad = "  " * d
    if isinstance(node, Seq):
        out = []
        for n in xp.seq_parts.get(id(node), node.body):
            if isinstance(n, Run):
                out.append(f"{pad}lax.switch(the span of the step):  # traced once per "
                           "span, its reads padded for it")
                out += [x for m in n.nodes for x in describe(xp, m, d + 1, lower)]
            else:
                out += describe(xp, n, d, lower)
        return out
    if isinstance(node, For) and xp.copies_only(node):
        return [f"{pad}{' '.join(xp.schedule._stmt(n).split())}  [store, filled with the "
                "whole array at the start: no loop]" for n in node.body.walk()
                if isinstance(n, Exec)]
    if isinstance(node, For) and id(node) in xp.unrolled:
        first, end = xp.unrolled[id(node)]
        return [f"{pad}for {ic.var(node.var)} in {first}..{end}:  # unrolled: each step "
                "traced with its own constant"] + describe(xp, node.body, d + 1, lower)
    if isinstance(node, For):
        kind = "lax.while_loop" if isinstance(node, While) else "lax.fori_loop"
        segs = xp.segments(node)
        plan = xp.switched(node) if segs else None
        peeled = not segs and xp.peeled(node, lower)
        note = (f"  # one loop in {len(segs)} spans of {segs[0][1]} steps" if plan else
                f"  # {len(segs)} loops of {segs[0][1]} steps, ranges padded per loop"
                if segs else "  # the first step is traced apart; below, the others"
                if peeled else "  # not split: its growing reads are whole buffers, read "
                "in place" if xp.segments(node, False) else "")
        first = as_expr(node.lo) + 1 if peeled else node.lo
        return [f"{pad}{kind}({ic.var(node.var)} in {ic.expr_src(node.lo)}.."
                f"{ic.expr_src(node.hi)}):{note}"] + describe(
                    xp, node.body, d + 1, ranged(xp, node, lower, first, False))
    if isinstance(node, If):
        if not has_exec(node):
            return []
        settled = decide(node.cond, lower)
        if settled is not None:  # the loop's range decides it: traced without lax.cond
            sub = node.then if settled else node.orelse
            return [] if sub is None else describe(xp, sub, d, lower)
        out = [f"{pad}lax.cond({ic.cond_src(node.cond)}):"] + describe(
            xp, node.then, d + 1, lower)
        if node.orelse is not None and has_exec(node.orelse):
            out += [f"{pad}else:"] + describe(xp, node.orelse, d + 1, lower)
        return out
    if isinstance(node, Exec):
        kind = xp.sdg.ops[node.op].kind
        what = ("host callback" if flag(kind, "effect") else
                "value" if node.op in xp.local else
                "constant in the program" if node.op in xp.baked else
                "store, filled with the whole array at the start" if node.op in
                xp.prefilled else "store")
        return [f"{pad}{' '.join(xp.schedule._stmt(node).split())}  [{what}]"]
    return []
