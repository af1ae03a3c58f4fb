"""Reverse mode on the traced graph: ``tl.grad(loss, [x, ...])``.

The gradient is more recurrent-tensor code in the same context, so it is compiled, scheduled and
checked like any other program. Every op ``n`` between the targets and the loss gets an adjoint
(an RT over ``n``'s domain with ``n``'s shape): the sum of what its consumers send back. A
consumer's contribution is its op's VJP (``vjp.py``) followed by the *reversal of its read*:

* a point read shifted by ``c`` (``x[t - 1]``) becomes a read of the cotangent at ``t + c``,
  guarded at the domain edge, so nothing leaks across it;
* a range read (``0:t+1``, a window, ``t:T``, ``0:T``) puts the cotangent back at absolute
  positions (``embed`` into a frame as long as the producer's bound), sums it over the consumer
  dims (a running sum when the range runs along the reader's own dim, so only one frame per
  point is live), and each producer point ``take``s its own position;
* consumer dims the read does not keep (broadcasts, ranges) are summed over; a constant point
  (``x[0]``) only reaches that point.

Recursive definitions need no special case: a placeholder's adjoint is itself a placeholder,
defined after everything that reads it has contributed, so back-propagation through time is a
recursive definition running the other way (``t + 1`` instead of ``t - 1``). A consumer's VJP is
computed only where the forward program reads that consumer (its *demand*, from isl), so no
backward op reads outside a domain even where the forward op is only valid on part of it.

``tl.grad`` differentiates the program *as written so far*: a branch added to a placeholder
after the call is not differentiated through. That is what an optimiser needs
(``p[i] = p[i - 1] - lr * g[i - 1]`` with ``g = tl.grad(loss, p)`` is the per-step gradient).
"""
from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import numpy as np

from ..errors import GradientError, user_location
from ..ir.demand import demand, param_context
from ..ir.ops import CATALOG, NONE, TensorType, flag, is_floating, norm_dim
from ..symbolic import TRUE, Cond, Const, Slice, and_, eq, not_, or_
from ..symbolic import isl as I
from . import vjp  # noqa: F401  (registers every op's VJP in the catalog)
from .build import build_sdg
from .context import Node, current_context
from .tensor import RecurrentTensor, apply, as_tensor, constant

RT = RecurrentTensor


def grad(loss: RT, wrt):
    """The gradient of ``loss`` summed over all its domain points (and elements), with respect
    to each tensor in ``wrt`` (one tensor or a list): RTs with their domains and shapes."""
    loc = user_location()
    single = isinstance(wrt, RT)
    if not single and not isinstance(wrt, (list, tuple)):
        raise GradientError(f"tl.grad(loss, wrt): wrt is a tensor or a list of tensors, got "
                            f"{type(wrt).__name__}", loc)
    targets = [wrt] if single else list(wrt)
    if not isinstance(loss, RT):
        raise GradientError("tl.grad needs a recurrent tensor as the loss", loc)
    if not is_floating(loss.dtype):
        raise GradientError(f"the loss is {loss.dtype.name}; tl.grad needs a floating loss", loc)
    if loss.shape != ():
        raise GradientError(f"the loss {loss.name} has shape {tuple(loss.shape)}; tl.grad needs "
                            "a scalar at each point (as jax.grad does): sum it first, e.g. "
                            "tl.grad(loss.sum(), ...)", loc)
    for x in targets:
        if not isinstance(x, RT) or x.ctx is not loss.ctx:
            raise GradientError("tl.grad differentiates with respect to tensors of the loss's "
                                "context; pass a list of recurrent tensors", loc)
        if x.index is not None:
            raise GradientError(f"{x._ref()} is a read of {x.name}, not a tensor; differentiate "
                                f"with respect to {x.name} itself", loc)
        if not is_floating(x.dtype):
            raise GradientError(f"{x.name} is {x.dtype.name}; only floating tensors have "
                                "gradients", loc)
    ctx = loss.ctx
    with ctx:
        loss = loss.materialize()
        ctx.record("grad", f"grad({loss._ref()}, [{', '.join(x.name for x in targets)}])",
                   None, loc)
        grads = _Backward(ctx, loss, targets, loc).run()
    return grads[0] if single else grads


class _Backward:
    def __init__(self, ctx, loss: RT, targets: list[RT], loc):
        self.ctx, self.loss, self.targets, self.loc = ctx, loss, targets, loc
        self.graph = _reachable(loss.node)
        self.consumers: dict[int, list[tuple[Node, int]]] = defaultdict(list)
        for n in self.graph.values():
            for k, inp in enumerate(n.inputs):
                self.consumers[inp.node.id].append((n, k))
        self.relevant = self._relevant()
        for i in self.relevant:
            n = self.graph[i]
            if flag(n.kind, "bwd_only"):
                raise GradientError("the loss depends on the gradient of a range read (0:t+1, a "
                                    "window, ...): second-order gradients through range reads "
                                    "are not supported", self.loc)
        self.demand = _demand_conds(ctx, loss, self.graph) if self.relevant else {}

    def _relevant(self) -> set[int]:
        """Ops on a path from a target to the loss that carry a floating value."""
        seen, stack = set(), [x.node.id for x in self.targets if x.node.id in self.graph]
        while stack:
            i = stack.pop()
            if i in seen or not is_floating(self.graph[i].type.dtype):
                continue
            if flag(self.graph[i].kind, "no_grad") \
                    and i not in {x.node.id for x in self.targets}:
                continue
            seen.add(i)
            stack.extend(c.id for c, _ in self.consumers[i])
        return seen

    def run(self) -> list[RT]:
        adj: dict[int, RT] = {}
        contribs: dict[int, list[RT]] = defaultdict(list)
        merges = sorted(i for i in self.relevant if self.graph[i].kind == "merge")
        for i in merges:  # placeholders first: every recurrence goes through one
            n = self.graph[i]
            adj[i] = _placeholder(self.ctx, n.domain, TensorType(n.type.shape, n.type.dtype),
                                  f"grad_{n.name or i}")
        if self.loss.node.id in self.relevant:
            contribs[self.loss.node.id].append(_full(1, self.loss.type))
        for i in merges:
            self._send_from_merge(self.graph[i], adj[i], contribs)
        early: dict[int, RT] = {}  # totals of a call's other outputs, summed at its last one
        sent: set[int] = set()     # their cotangents went back with it
        for i in sorted(self.relevant, reverse=True):
            n = self.graph[i]
            total = early.pop(i) if i in early else _sum(contribs.pop(i, []), n.type)
            if n.kind == "merge":
                ph = adj[i]
                ph[tuple(ph.domain)] = total
            else:
                adj[i] = total
                if i in sent:
                    continue
                others = self._same_call(n)
                for s in others:
                    early[s.id] = _sum(contribs.pop(s.id, []), s.type)
                    sent.add(s.id)
                self._send(n, total, contribs, [(s, early[s.id]) for s in others])
        out = []
        for x in self.targets:
            g = adj.get(x.node.id)
            g = _full(0, x.type) if g is None else g
            out.append(_over(self.ctx, g.astype(x.dtype) if g.dtype != x.dtype else g,
                             x.domain))
        return out

    # -- contributions ------------------------------------------------------------------------
    def _send_from_merge(self, m: Node, g: RT, contribs):
        others = [inp.cond for inp in m.inputs if not inp.default]
        for inp in m.inputs:
            if inp.node.id not in self.relevant:
                continue
            cond = not_(or_(*others)) if inp.default else inp.cond
            ct = g if cond == TRUE else _guard(self.ctx, g, cond, m.domain)
            contribs[inp.node.id].append(self._reverse(ct, inp, m, None))

    def _same_call(self, n: Node) -> list[Node]:
        """The other relevant outputs of the ``tl.lift`` call ``n`` is the last relevant output
        of (made one after the other, so their readers all come after ``n``): one ``jax.vjp``
        takes all their cotangents, not one ``vjp`` each."""
        k = n.attrs.get("out") if n.kind == "lift" else None
        if k is None:
            return []
        out = []
        for j in range(1, k + 1):
            s = self.graph.get(n.id - j)
            if s is None or s.kind != "lift" or s.attrs["jax_fn"] is not n.attrs["jax_fn"] \
                    or s.attrs["out"] != k - j or _reads(s) != _reads(n):
                break
            if s.id in self.relevant:
                out.append(s)
        return out

    def _send(self, n: Node, g: RT, contribs, others: list[tuple[Node, RT]] = ()):
        """``n``'s cotangent ``g`` sent back to its inputs; ``others``: outputs of the same
        lifted call and their cotangents, sent back with it in one VJP."""
        wanted = [k for k, inp in enumerate(n.inputs) if inp.node.id in self.relevant]
        if not wanted:
            return
        reads = [self.demand.get(m.id) for m in (n, *(s for s, _ in others))]
        reads = [r for r in reads if r is not False]
        if not reads:  # never read by the loss: nothing flows back
            return
        rule = CATALOG[n.kind].vjp
        if rule is None or rule == NONE:
            raise GradientError(f"no gradient rule for {n.kind} (at {n.loc}); differentiate "
                                "through other ops, or stop the gradient before it", self.loc)
        gs = {m.attrs.get("out"): x if tuple(x.domain) == tuple(n.domain)
              else _over(self.ctx, x, n.domain)  # shapes in the VJP may name n's dims
              for m, x in sorted(((n, g), *others), key=lambda mx: mx[0].id)}
        g = gs if others else gs[n.attrs.get("out")]
        xs = [_view_of(self.ctx, inp) for inp in n.inputs]
        guard = None if flag(n.kind, "ct_only") or None in reads else or_(*reads)
        summed = {k: self._summed(n, k, g, xs) for k in wanted} if guard is None else {}
        if any(summed.get(k) is None for k in wanted):
            cts = rule(n, g, xs, RT(self.ctx, n))
        for k in wanted:
            if summed.get(k) is not None:
                ct, done = summed[k]
            elif cts[k] is not None:
                ct, done = cts[k], ()
            else:
                continue
            ct = _cast(ct, xs[k].dtype)
            contribs[n.inputs[k].node.id].append(self._reverse(ct, n.inputs[k], n, guard, done))

    def _summed(self, n: Node, k: int, g: RT, xs: list[RT]):
        """Input ``k``'s cotangent summed over the innermost consumer dim its read does not
        vary along (a parameter read at every token), as the op's contraction of the points
        (``OpDef.vjp_sum``), and that dim; None where the op has no such rule, the read is
        not a plain point read, or another input does not read the dim at its own point (or
        reads a point given by a bound).
        Summing one dim here leaves the outer ones to ``_reverse``, as it sums any."""
        rule = CATALOG[n.kind].vjp_sum
        index = n.inputs[k].index
        # a whole range, x[0:T], is read alike at every point: a weight (for matmul: the
        # take of a whole range lost a clamped position's cotangent unvectorised)
        if rule is None or any(isinstance(e, Slice) and (e.dims() or n.kind != "matmul")
                               for e in index):
            return None
        varies = set().union(*(e.dims() for e in index))
        free = [u for u in n.domain if u not in varies]
        if not free:
            return None
        u = free[-1]
        stacked = []
        for j, (inp, x) in enumerate(zip(n.inputs, xs)):
            if j == k:
                stacked.append(x)
                continue
            at = [p for p, e in enumerate(inp.index) if u in e.dims()]
            if len(at) != 1 or inp.index[at[0]] != u \
                    or any(isinstance(e, Slice) or e.symbols() - e.dims() for e in inp.index):
                return None  # (a bound in the read, x[b, T - 1], may be an instance's own)
            entries = tuple(Slice(Const(0), u.bound) if p == at[0] else e
                            for p, e in enumerate(inp.index))
            stacked.append(RT(self.ctx, inp.node)._view(entries, inp.loc, record=False))
        entries = tuple(Slice(Const(0), u.bound) if v == u else v for v in g.domain)
        ct = rule(n, g._view(entries, self.loc, record=False), stacked, k)
        return None if ct is None else (ct, (u,))

    def _reverse(self, ct: RT, inp, consumer: Node, guard: Cond | None, done=()) -> RT:
        """``ct`` (a cotangent of the read ``inp`` at every consumer point, already summed
        over the consumer dims ``done``) as a contribution to the producer's adjoint: the
        transpose of the read."""
        ctx, prod = self.ctx, inp.node
        mapped, conds, frames = {}, [], []
        for d, e in zip(prod.domain, inp.index):
            if isinstance(e, Slice):
                frames.append((len(frames), d, e))
            elif not e.dims():
                conds.append(eq(d, e))
            else:
                (u,) = e.dims() if len(e.dims()) == 1 else (None,)
                shift = None if u is None else e - u
                if not isinstance(shift, Const) or u in mapped:
                    raise GradientError(
                        f"cannot differentiate the read {prod.name or '%' + str(prod.id)}"
                        f"[{', '.join(map(str, inp.index))}]: a point index must be a dim plus a "
                        "constant (t, t - 1, t + 2) or a constant; rewrite the read with a slice "
                        "or a branch", inp.loc or consumer.loc)
                mapped[u] = (d, shift.value)
        f = ct
        for j, d, s in frames:
            if not (s.start == Const(0) and s.stop == d.bound):
                f = apply("embed", [f, as_tensor(s.start, ctx)], {"axis": j, "size": d.bound})
        if guard is not None:
            f = _guard(ctx, f, guard, consumer.domain)
        for _, d, sl in frames:  # a range along the reader's own dim: accumulate, not stack
            run = _direction(sl, d)
            if run and d in f.domain and d not in mapped:
                f = _accumulate(ctx, f, d, run[0])
                mapped[d] = (d, run[1])
        summed = [u for u in consumer.domain if u not in mapped and u not in done]
        present = [u for u in summed if u in f.domain]
        for u in reversed(present):  # one dim at a time, innermost first: each read has one
            entries = tuple(Slice(Const(0), u.bound) if v == u else v for v in f.domain)
            f = f._view(entries, self.loc, record=False).sum(axis=0)  # slice (vectorisable)
        for u in summed:
            if u not in present:  # constant along u: summing is scaling by u's bound
                f = f * as_tensor(u.bound, ctx)
        entries = []
        for u in f.domain:
            d, c = mapped[u]
            entries.append(d - c)
            if c != 0 or d.bound != u.bound:
                conds += [d - c >= 0, d - c < u.bound]
        if tuple(entries) != tuple(f.domain):
            f = f.materialize()._view(tuple(entries), self.loc, record=False)
        for j, d, _ in reversed(frames):
            f = apply("take", [f, as_tensor(d, ctx)], {"axis": j})
        cond = and_(*conds)
        return f if cond == TRUE else _guard(ctx, f, cond, prod.domain)


# -- helpers --------------------------------------------------------------------------------------
def _direction(sl: Slice, d) -> tuple[str, int] | None:
    """How the readers of point ``p`` of a range read along ``d`` itself lie, and where the
    running sum of their cotangents is read for ``p`` (as ``p - shift``): every reader of a
    range ending at ``d + c`` lies after ``p - c`` ("suffix": ``0:t+1`` and windows read the
    sum from ``p``, ``0:t`` from ``p + 1``), every reader of one starting at ``d + c`` up to
    ``p - c`` ("prefix": ``t:T`` reads it at ``p``); None for neither. Readers whose range
    does not reach ``p`` add the zeros their frame holds there."""
    if sl.dims() != {d}:
        return None
    c = sl.stop - d
    if isinstance(c, Const):
        return "suffix", c.value - 1
    c = sl.start - d
    if isinstance(c, Const):
        return "prefix", c.value
    return None


def _accumulate(ctx, f: RT, d, direction: str) -> RT:
    """Running sums of ``f`` along ``d``: from the end (suffix) or the start (prefix). Point
    ``p`` then holds everything its readers sent, in one frame rather than ``d``'s bound of
    them: back-propagation through a causal read keeps O(T) values live, not O(T^2)."""
    acc = _placeholder(ctx, f.domain, TensorType(f.type.shape, f.type.dtype))
    here = tuple(f.domain)
    step = 1 if direction == "suffix" else -1
    edge = tuple(d.bound - 1 if u == d and step == 1 else (0 if u == d else u) for u in here)
    acc[edge] = f
    acc[here] = acc[tuple(u + step if u == d else u for u in here)] + f
    return acc


def _reachable(root: Node) -> dict[int, Node]:
    seen, stack = {}, [root]
    while stack:
        n = stack.pop()
        if n.id not in seen:
            seen[n.id] = n
            stack.extend(i.node for i in n.inputs)
    return seen


def _demand_conds(ctx, loss: RT, graph: dict[int, Node]) -> dict[int, Cond | bool | None]:
    """Per op, where the loss reads it: None (everywhere), False (nowhere) or a condition."""
    sdg = build_sdg(SimpleNamespace(dims=ctx.dims, _sinks=[]), {"loss": loss}, partial=True)
    ids = sorted(graph)
    boxes = {k: sdg.isl_domain(k) for k in sdg.ops}
    dem = demand(sdg, boxes, {e: sdg.isl_map(e) for e in sdg.edges})
    bounds = param_context(sdg)  # bounds are positive: "T >= 1" is no condition
    out: dict[int, Cond | bool | None] = {}
    for k, nid in enumerate(ids):
        d = dem[k].coalesce()
        if boxes[k].intersect_params(bounds).is_subset(d):
            out[nid] = None
        elif d.is_empty():
            out[nid] = False
        else:
            named = I.named(d.gist(boxes[k].intersect_params(bounds)),
                            graph[nid].domain).reset_tuple_id()
            out[nid] = I.cond_from_set(named)
    return out


def _reads(n: Node) -> list[tuple]:
    return [(inp.node.id, tuple(inp.index), inp.cond) for inp in n.inputs]


def _view_of(ctx, inp) -> RT:
    """The value an op input reads, as the op saw it (no trace entry)."""
    base = RT(ctx, inp.node)
    if tuple(inp.index) == tuple(inp.node.domain):
        return base
    return base._view(tuple(inp.index), inp.loc, record=False)


def _placeholder(ctx, domain, type_: TensorType, name: str | None = None) -> RT:
    """A placeholder of any type (symbolic shapes included), for adjoints and guards."""
    return RT(ctx, ctx.add_node("merge", [], {"type": type_}, domain, type_, name=name))


def _full(value, type_: TensorType) -> RT:
    """``value`` everywhere, of ``type_``'s shape and dtype. A shape that depends on dims
    (``(t + 1, 3)``) makes an op over those dims."""
    ctx = current_context()
    if type_.is_static:
        return constant(np.full(type_.shape, value, type_.dtype), ctx)
    scalar = constant(np.asarray(value, type_.dtype), ctx)
    dims = set().union(*(s.dims() for s in type_.shape if not isinstance(s, int)))
    node = ctx.add_node("broadcast_to", [scalar._input()], {"shape": tuple(type_.shape)}, dims,
                        TensorType(tuple(type_.shape), type_.dtype))
    return RT(ctx, node)


def _guard(ctx, x: RT, cond: Cond, domain) -> RT:
    """``x`` where ``cond`` holds and zeros elsewhere on ``domain``; ``x`` is only demanded
    where ``cond`` holds."""
    ph = _placeholder(ctx, domain, TensorType(x.type.shape, x.type.dtype))
    ph[cond] = x
    ph[tuple(domain)] = _full(0, ph.type)
    return ph


def _over(ctx, x: RT, domain) -> RT:
    """``x`` with exactly ``domain`` (broadcast over the dims it lacks)."""
    if tuple(x.domain) == tuple(domain):
        return x
    ph = _placeholder(ctx, domain, TensorType(x.type.shape, x.type.dtype))
    ph[tuple(domain)] = x
    return ph


def _cast(x: RT, dtype) -> RT:
    return x if x.dtype == dtype else x.astype(dtype)


def _sum(xs: list[RT], type_: TensorType) -> RT:
    if not xs:
        return _full(0, type_)
    total = _cast(xs[0], type_.dtype)
    for x in xs[1:]:
        total = total + _cast(x, type_.dtype)
    if tuple(map(norm_dim, total.shape)) != tuple(map(norm_dim, type_.shape)):
        total = apply("broadcast_to", [total], {"shape": tuple(type_.shape)})
    return total
