"""Loops cut in two at a point their body branches on, and the ranges a loop's body runs in.

A decode whose prompt's steps the prefix pass split off (``passes/prefix.py``) keeps one loop
over ``t`` whose every statement sits under a branch on the prompt's end ``P``: before it, the
joins copy the prompt's results; from it, the whole model runs. Run as one loop, those
branches are tested at every step (on XLA, a ``lax.cond`` each, carrying the stores they
write), and a value written under one and read under another is held in a store. Cut into
``lo..min(hi, P)`` and ``max(lo, P)..hi``, each body is the original less the branches its
range settles, so every executor sees straight code. The two loops run the same points in the
same order as the one, so meaning is kept whatever ``P`` turns out to be at run time.

``loop_ranges`` says what a loop's body may assume of its variable; ``decide`` (in
``symbolic/cond.py``) settles a condition from such ranges; the XLA executor reads them too
(``xla_loops.ranged``).
"""
from __future__ import annotations

from dataclasses import replace

from ..ir.sdg import SDG
from ..symbolic import Const, Dim, as_expr
from ..symbolic.cond import AtMost, Cmp, Junction, Not, decide
from ..symbolic.expr import Lin, MinMax, max_, min_
from .loops import Exec, For, If, Node, Seq, While, execs_under

SHARE = 2  # a loop is cut where the branches the cut settles hold a 1/SHARE of its statements;
# at a point that moves with a bound, not a fixed number of steps from either end


def loop_ranges(node: For, untils, lower: dict, first, exact: bool) -> dict:
    """``lower`` (each dim or bound: (least value, exactly it), and ``AtMost`` keys: the most)
    with ``node``'s variable from ``first`` (exactly ``first`` if ``exact``) and, by steps of
    one, at most its end less one, where that end does not move with a ``tl.until`` bound
    (of a ``min``, the arguments that do not); unchanged for a loop whose start moves with a
    ``tl.until`` bound."""
    if node.step <= 0 or _moves(node.lo, untils):
        return lower
    v = Dim(node.var)
    out = {k: r for k, r in lower.items() if k != AtMost(v)}
    out[v] = (first, exact)
    hi = as_expr(node.hi)
    fixed = [a for a in (hi.args if isinstance(hi, MinMax) and hi.op == "min" else (hi,))
             if not _moves(a, untils)]
    if node.step == 1 and fixed:
        out[AtMost(v)] = ((min_(*fixed) if len(fixed) > 1 else fixed[0]) - 1, False)
    return out


def _moves(e, untils) -> bool:
    return any(b.name in untils for b in as_expr(e).bounds())


def cut_loops(ast: Node, sdg: SDG) -> tuple[Node, dict[int, For], list[str]]:
    """``ast`` with each loop that mostly branches on one point of its variable cut in two
    there (``SHARE``), the loop after each cut by the ``id`` of the loop before it (an
    executor may treat the two as one loop writing in order), and a line per loop whose body
    branches on such a point: where it was cut, or why not. The nodes of loops left whole
    are the same objects."""
    pairs: dict[int, For] = {}
    notes: list[str] = []
    return _visit(ast, sdg, {}, pairs, notes), pairs, notes


def _visit(node, sdg: SDG, ranges: dict, pairs: dict, notes: list):
    if isinstance(node, Seq):
        body = tuple(_visit(n, sdg, ranges, pairs, notes) for n in node.body)
        return node if all(a is b for a, b in zip(body, node.body)) else Seq(body)
    if isinstance(node, If):
        then = _visit(node.then, sdg, ranges, pairs, notes)
        orelse = None if node.orelse is None else _visit(node.orelse, sdg, ranges, pairs,
                                                         notes)
        return node if then is node.then and orelse is node.orelse else If(
            node.cond, then, orelse)
    if not isinstance(node, For):
        return node
    whole = loop_ranges(node, sdg.untils, ranges, node.lo, False)
    # by steps of one only: a part from max(lo, P) by steps of k would leave the stride; a
    # tl.until loop only where its end is its bound, which ends the second part as well once
    # the first has reached it (each part checks the end anew)
    ends = isinstance(node, While) and node.bound not in {
        b.name for b in as_expr(node.hi).bounds()}
    p, why = _point(node, sdg, whole) if whole is not ranges else (None, None)
    loop = f"{node.var} in {node.lo}..{node.hi}"
    if p is not None and (node.step != 1 or ends):
        why = (f"not cut at {p}: " + ("its steps are of " + str(node.step) if node.step != 1
               else "a tl.until loop whose end is not its bound"))
        p = None
    if why and f"{loop}: {why}" not in notes:  # (a loop inside a cut one: once, not per part)
        notes.append(f"{loop}: {why}")
    if p is None:
        body = _visit(node.body, sdg, whole, pairs, notes)
        return node if body is node.body else replace(node, body=body)
    parts = []
    for lo, hi in ((node.lo, min_(node.hi, p)), (max_(node.lo, p), node.hi)):
        part = replace(node, lo=lo, hi=hi)
        inner = dict(loop_ranges(part, sdg.untils, ranges, lo, False))
        if hi is not node.hi:  # before the cut: at most P - 1, even where the end moves
            inner[AtMost(Dim(node.var))] = (as_expr(p) - 1, False)
        body = _settled(node.body, sdg, inner)
        if body is not None or isinstance(node, While):  # (a tl.until loop checks its end)
            parts.append(replace(part, body=_visit(body or Seq(()), sdg, inner, pairs,
                                                   notes)))
    if len(parts) == 2:
        pairs[id(parts[0])] = parts[1]
    return Seq(tuple(parts))


def _settled(node, sdg: SDG, ranges: dict):
    """A copy of ``node`` (new objects: each part's statements are its own) without the
    branches ``ranges`` settle; None where nothing is left."""
    if isinstance(node, Seq):
        body = tuple(x for x in (_settled(n, sdg, ranges) for n in node.body) if x is not None)
        return Seq(body) if body else None
    if isinstance(node, If):
        known = decide(node.cond, ranges)
        if known is not None:
            sub = node.then if known else node.orelse
            return None if sub is None else _settled(sub, sdg, ranges)
        then = _settled(node.then, sdg, ranges)
        orelse = None if node.orelse is None else _settled(node.orelse, sdg, ranges)
        return None if then is None and orelse is None else If(
            node.cond, then if then is not None else Seq(()), orelse)
    if isinstance(node, For):
        inner = loop_ranges(node, sdg.untils, ranges, node.lo, False)
        body = _settled(node.body, sdg, inner)
        return None if body is None else replace(node, body=body)
    if isinstance(node, Exec):
        return Exec(node.op, node.args)
    return replace(node)


def _point(node: For, sdg: SDG, whole: dict):
    """The point where ``node`` is cut (an expression of bounds) or None, and a line saying
    where or why not (None: its body branches on no point of its variable)."""
    v = Dim(node.var)
    stmts, found = [], []
    for conds in _conds(node.body, sdg):
        open_ = [c for c in conds if decide(c, whole) is None]
        stmts.append(open_)
        found += [p for c in open_ for p in _points(c, v, sdg.untils) if p not in found]
    best, most, ends = None, 0, []
    for p in found:
        if any(isinstance(p - as_expr(end), Const) for end in (node.lo, node.hi)):
            ends.append(p)  # a few steps at an end: the XLA executor traces a first step apart
            continue
        before = {**whole, AtMost(v): (as_expr(p) - 1, False)}
        after = {**whole, v: (p, False)}
        gained = sum(1 for cs in stmts if any(
            decide(c, before) is not None and decide(c, after) is not None for c in cs))
        if gained > most:
            best, most = p, gained
    if most and most * SHARE >= len(stmts):
        return best, f"cut at {best} (settles the branches of {most} of {len(stmts)} statements)"
    if most:
        return None, (f"not cut at {best}: it settles the branches of {most} of {len(stmts)} "
                      f"statements, under 1/{SHARE}")
    if ends:
        return None, (f"not cut at {', '.join(map(str, ends))}: a fixed number of steps from "
                      f"an end (the XLA executor traces a first step apart)")
    return None, None


def _conds(node, sdg: SDG):
    """For each statement under ``node``: the branch conditions around it (within ``node``)
    and, for a merge, those of its branches."""
    for x, _, around in execs_under(node):
        op = sdg.ops[x.op]
        at = {Dim(d.name): a for d, a in zip(op.domain, x.args)}
        yield around + (tuple(e.cond.substitute(at) for e in sdg.in_edges(op.id))
                        if op.kind == "merge" else ())


def _points(c, v: Dim, untils):
    """The points ``p`` of the comparisons ``v >= p`` and ``v <= p - 1`` in a condition, ``p``
    an expression of bounds that do not move with a ``tl.until``."""
    if isinstance(c, Junction):
        for a in c.args:
            yield from _points(a, v, untils)
    elif isinstance(c, Not):
        yield from _points(c.arg, v, untils)
    elif isinstance(c, Cmp) and c.op == ">=":
        e = as_expr(c.expr)
        k = dict(e.terms).get(v, 0) if isinstance(e, Lin) else 1 if e == v else 0
        p = as_expr(v) - e if k == 1 else e + v + 1 if k == -1 else None
        if p is not None and not p.dims() and not _moves(p, untils):
            yield p
