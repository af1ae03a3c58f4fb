"""Streaming: a sum over the whole of a loop dim becomes a running sum inside that loop.

``sum(x[i, 0:T])`` reads every step of ``x``, so every step is stored until the loop over ``t``
ends, even when step ``t``'s value is ready a few steps after ``t`` (a TD(n) learner's
gradient contribution needs the rewards up to ``t + n`` only). When the dependences say so,
this pass rewrites the sum as the recurrence

    acc[i, 0] = x[i, 0];   acc[i, t] = acc[i, t - 1] + x[i, t];   s[i] = acc[i, T - 1]

which the fusion scheduler runs in the loop that makes ``x`` (shifted by how far ahead ``x``
reads), so ``x`` and what it reads need only a few steps' storage. A sum is streamed when

* ``x`` runs in a loop over ``t`` anyway: it depends, at the same outer point, on a recurrence
  along ``t`` (else vectorisation computes all steps at once and a sum of them is cheaper);
* step ``t`` of ``x`` depends on a bounded number of steps ahead (``lookahead``): not on a
  recurrence that runs backwards (a Monte-Carlo return), nor on a whole range, nor on a value
  that needs the whole range (a mean over the episode).

A sum of such a sum (``sum(sum(c[i, b, 0:T])[i, 0:B])``, how ``tl.grad`` adds a parameter's
cotangents) is reordered first, ``t`` outermost, so the sum over ``b`` stays a whole-axis sum
that contraction turns into one batched vjp per step.
"""
from __future__ import annotations

import math

from ..ir.demand import demand, param_context
from ..ir.graph import sccs
from ..ir.ops import TensorType, accumulator
from ..ir.sdg import Edge, Op
from ..symbolic import TRUE, Const, Dim, Slice, eq, ne
from ..symbolic import isl as I
from .manager import Editor, register

INF = math.inf


def _whole_sum(ed: Editor, s: Op) -> tuple[Edge, Dim] | None:
    """``(read, d)`` if ``s`` sums its one input over the whole of a static dim ``d``."""
    ins = ed.in_edges(s.id)
    if s.kind != "sum" or s.attrs.get("keepdims") or len(ins) != 1 or ins[0].cond != TRUE:
        return None
    (read,) = ins
    src = ed.ops[read.src]
    if s.attrs.get("axis") not in (0, (0,)) and not (s.attrs.get("axis") is None
                                                     and src.type.shape == ()):
        return None
    slices = [(d, x) for d, x in zip(src.domain, read.index) if isinstance(x, Slice)]
    if len(slices) != 1:
        return None
    d, x = slices[0]
    if x.start != Const(0) or x.stop != d.bound or d.bound.name in ed.dynamic \
            or ed.bounds.get(d.bound.name) is None:
        return None
    return read, d


class Lookahead:
    """Per op, at the same point of the dims outside ``d``: how many steps along ``d`` ahead
    of its own point it depends on (``inf``: unbounded), and whether it runs in a loop over
    ``d`` (depends on a recurrence along it)."""

    def __init__(self, ed: Editor, d: Dim):
        self.ed, self.d = ed, d
        self.outer = set(ed.dims[:ed.dims.index(d)])
        self.params = list(ed.sdg0.params)
        self._demand = None
        ops = sorted(ed.ops)
        succ: dict[int, list[int]] = {i: [] for i in ops}
        for e in ed.edges:
            if self._counts(e):
                succ[e.src].append(e.dst)
        self.ahead: dict[int, float] = {}
        self.looped: dict[int, bool] = {}
        for comp in reversed(sccs(ops, succ)):  # Tarjan finds sinks first
            self._visit(comp)

    def _counts(self, e: Edge) -> bool:
        """Whether ``e`` is a dependence at the same outer point (not one carried by an earlier
        iteration of a loop outside ``d``, such as the parameters of iteration ``i - 1``)."""
        src = self.ed.ops[e.src]
        for u, x in zip(src.domain, e.index):
            if u in self.outer and not isinstance(x, Slice):
                c = x - u
                if isinstance(c, Const) and c.value < 0:
                    return False
        return True

    def _visit(self, comp: list[int]):
        ed, d = self.ed, self.d
        members = set(comp)
        ahead, looped = 0, False
        for i in comp:
            for e in ed.in_edges(i):
                if not self._counts(e):
                    continue
                reach = self._reach(e)
                if e.src in members:
                    if d in ed.ops[i].domain and reach != 0:
                        looped = True
                        if reach > 0:  # a recurrence that runs backwards along d
                            ahead = INF
                    continue
                ahead = max(ahead, self.ahead[e.src] + reach)
                looped = looped or (self.looped[e.src] and d in ed.ops[e.src].domain)
        for i in comp:
            self.ahead[i], self.looped[i] = ahead, looped

    def _reach(self, e: Edge) -> float:
        """How far along ``d`` ahead of the reader's point the read ``e`` reaches (for a reader
        without ``d``: the last point it reads, from 0)."""
        ed, d = self.ed, self.d
        src, dst = ed.ops[e.src], ed.ops[e.dst]
        if d not in src.domain:
            return 0
        x = e.index[src.domain.index(d)]
        last = x.stop - 1 if isinstance(x, Slice) else x
        base = d if d in dst.domain else Const(0)
        c = last - base
        if isinstance(c, Const) and e.cond == TRUE:
            return c.value
        if d not in dst.domain:
            return INF if (last.dims() or not isinstance(last, Const)) else last.value
        m = I.edge_map(("c", dst.domain), ("p", src.domain), e.index, e.cond, self.params)
        m = m.intersect_domain(self._demanded(dst).set_tuple_name("c")) \
            .intersect_range(I.box(src.domain, self.params).set_tuple_name("p"))
        rel = m.wrap()
        if rel.is_empty():
            return 0
        names = [x.name for x in dst.domain] + [I.primed(x) for x in src.domain]
        for k, n in enumerate(names):
            rel = rel.set_dim_name(I.isl.dim_type.set, k, n)
        return -I.least_gap(rel, d.name, I.primed(d))

    def _demanded(self, op: Op):
        """The points of ``op`` someone reads (an op made by this pass: all of them): a
        branch's op is computed only where its branch holds."""
        sdg = self.ed.sdg0
        if self._demand is None:
            pctx = param_context(sdg)
            self._demand = demand(sdg, {i: sdg.isl_domain(i).intersect_params(pctx)
                                        for i in sdg.ops},
                                  {e: sdg.isl_map(e) for e in sdg.edges})
        if op.id in sdg.ops and sdg.ops[op.id].domain == op.domain:
            return self._demand[op.id]
        return I.box(op.domain, self.params)

    def streams(self, x: int) -> bool:
        return self.looped.get(x, False) and self.ahead.get(x, INF) < INF


@register("stream", "stream")
def stream(ed: Editor):
    """Streaming: a sum over the whole of a loop dim whose summands are ready a bounded number
    of steps after their point becomes a running sum in that loop."""
    analyses: dict[Dim, Lookahead] = {}
    changed = False

    def analysis(d):
        if d not in analyses:
            analyses[d] = Lookahead(ed, d)
        return analyses[d]

    for i in sorted(ed.ops, reverse=True):  # an outer sum before the sum it reads
        s = ed.ops.get(i)
        found = s and _whole_sum(ed, s)
        if not found:
            continue
        read, d = found
        inner = _inner_sum(ed, read.src, d)
        if inner is not None and analysis(inner[1]).streams(inner[0].src):
            _reorder(ed, s, read, d, inner)
            read, d = ed.in_edges(i)[0], inner[1]
        elif not analysis(d).streams(read.src):
            why = ("no loop over" if analysis(d).ahead.get(read.src, INF) < INF else
                   "a backward recurrence or the whole range along")
            ed.note(i, f"not streamed: each step of %{read.src} needs {why} {d}")
            continue
        _running_sum(ed, ed.ops[i], read, d)
        analyses.clear()
        changed = True
    if changed:
        ed.renumber()  # a sum kept its id but now reads the ops made for it


def _inner_sum(ed: Editor, x: int, d: Dim):
    """``(read, e)``: ``x`` is a whole sum over a static dim ``e`` of a value that also has
    ``d``, read only by the sum over ``d`` being looked at."""
    if len(ed.out_edges(x)) != 1:
        return None
    found = _whole_sum(ed, ed.ops[x])
    if not found or d not in ed.ops[found[0].src].domain or found[1] == d:
        return None
    return found


def _reorder(ed: Editor, s: Op, read: Edge, d: Dim, inner):
    """``s = sum_d(sum_e(c))`` becomes ``sum_e(sum_d(c) at each e)``: the sum over ``d`` at
    every point of ``e``, then the sum over ``e`` (which the caller streams)."""
    inner_read, e = inner
    old, c = ed.ops[read.src], ed.ops[inner_read.src]
    domain = tuple(u for u in ed.dims if u in s.domain or u == e)
    index = tuple(Slice(Const(0), u.bound) if u == d else u for u in c.domain)
    new = ed.add(Op(-1, "sum", domain, old.type, dict(old.attrs), old.loc, old.name),
                 [Edge(-1, c.id, 0, index, TRUE, inner_read.loc)], s.id,
                 f"the sum over {d} of %{c.id} at each {e}")
    ed.rewrite(s.id, Op(s.id, "sum", s.domain, s.type, dict(s.attrs), s.loc, s.name),
               [Edge(s.id, new, 0, tuple(Slice(Const(0), u.bound) if u == e else u
                                         for u in domain), TRUE, read.loc)],
               f"the sum over {e} outermost")
    ed.erase(old.id, f"reordered into %{new} and %{s.id}")


def _running_sum(ed: Editor, s: Op, read: Edge, d: Dim):
    """``s`` as ``acc[T - 1]``, ``acc`` a recurrence along ``d``. Of 16-bit floats, ``acc``
    holds float32 (``accumulator``) and the last step is rounded once, as the sum it replaces
    is: a float16 running sum of 60 000, 60 000, -60 000, -60 000 was inf from its second step
    on, where the sum is 0."""
    x = ed.ops[read.src]
    here = tuple(u for u in ed.dims if u in s.domain or u == d)
    at = tuple(d if isinstance(v, Slice) else v for v in read.index)
    prev = tuple(u - 1 if u == d else u for u in here)
    loc = s.loc
    wide = accumulator(s.type.dtype)
    typ = TensorType(s.type.shape, wide)
    src = x.id
    if wide != s.type.dtype:  # read each step widened
        src = ed.add(Op(-1, "cast", here, typ, {"dtype": wide}, loc),
                     [Edge(-1, x.id, 0, at, TRUE, loc)], s.id, f"%{x.id} in {wide}")
        at = here
    acc = ed.add(Op(-1, "merge", here, typ, {"type": typ, "running": d.name}, loc,
                    s.name and f"{s.name}_running"), [],
                 s.id, f"running sum of %{x.id} along {d}")
    step = ed.add(Op(-1, "add", here, typ, {}, loc), [Edge(-1, acc, 0, prev, TRUE, loc),
                                                      Edge(-1, src, 1, at, TRUE, loc)],
                  s.id, "one more step")
    first = tuple(Const(0) if u == d else u for u in at)
    ed.rewrite(acc, ed.ops[acc], [Edge(acc, src, 0, first, eq(d, 0), loc),
                                  Edge(acc, step, 1, here, ne(d, 0), loc)],
               f"running sum of %{x.id} along {d}")
    last = tuple(d.bound - 1 if u == d else u for u in here)
    kind, attrs = ("identity", {}) if wide == s.type.dtype else ("cast", {"dtype": s.type.dtype})
    ed.rewrite(s.id, Op(s.id, kind, s.domain, s.type, attrs, s.loc, s.name),
               [Edge(s.id, acc, 0, last, TRUE, loc)], f"the running sum at the last {d}")
