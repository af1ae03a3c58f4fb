"""Ragged bounds as guarded boxes: the first pass whenever a bound is ``tl.lengths(L, over=b)``.

The choice (DESIGN: "a bound per instance"): ``T`` stays one symbol, and every stage after this
pass sees it as the longest length, so the schedule, memory plan and executors work on the box
``{(b, t) : t < max L}`` and vectorise ``b`` as usual. Points past an instance's own end are
computed on whatever is there and never read as real values, because this pass rewrites every
place where the instance's own ``T_b = L[b]`` matters into data over a lengths op ``len[b]``:

* a branch condition with ``T`` (``h[b, T - 1] = ...``): the branch that holds by data is
  selected with ``where`` inside each branch of the box;
* a point read with ``T`` (``x[b, T - 1]``): the whole range is read and the point taken at
  ``len[b] - 1`` (``take``);
* a range ending at ``T`` (``x[b, 0:T]``): read as ``0:max L``, and the first op that reduces
  along it (sum, mean, max, min, softmax, matmul) masks the points past ``len[b]``; elementwise
  and layout ops in between carry the mask;
* a read of an instance's points from an op without ``b`` (``x[0:B, t]``, e.g. a gradient
  summed over the batch): the points outside an instance's range read as zeros, as in the
  reference;
* an index expression's value with ``T`` (``tl.zeros(()) + T``).

A read of another instance's points (``x[b - 1, t]``), a range that starts at ``T``, and sinks and
sources over a ragged domain are refused with an error that says so.
"""
from __future__ import annotations

import islpy as isl
import ml_dtypes
import numpy as np

from ..errors import BoundsError
from ..ir.ops import CATALOG, TensorType, accumulator, infer, is_floating, rule
from ..ir.sdg import Edge, Op, Ragged, read_type
from ..symbolic import TRUE, Bound, Const, Dim, Expr, Slice
from ..symbolic import isl as I
from ..symbolic.cond import BoolConst, Cmp, Cond, Junction, Not
from ..symbolic.cond import eq as eq_
from ..symbolic.cond import ne as ne_
from .manager import Editor, register

UNSUPPORTED = "unsupported"  # what a carry rule returns for a use it cannot mask


class RaggedError(BoundsError):
    """A construct over a ragged bound that the compiled executors do not support yet."""


class _Lower:
    """One ragged bound's guarded box: the lengths (or per-instance ends) as ops, and every
    use of the instance's own bound rewritten over them (see the module docstring)."""

    def __init__(self, ed: Editor, name: str, r: Ragged):
        self.ed, self.name, self.r = ed, name, r
        self.t, self.b = _dims(ed, name, r)
        self.T = Bound(name)
        self._len: int | None = None
        self._valid: int | None = None
        self._consts: dict[tuple, int] = {}
        self._masks: dict[tuple, int] = {}
        self._forwarded: set[int] = set()
        self._before = set(ed.ops)
        self._internal: set[int] = set()  # ops this pass made that read T as it means
        self._carried: set[tuple[int, int]] = set()

    # -- building ops ---------------------------------------------------------------------------
    def add(self, kind: str, reads: list[tuple[int, tuple]], domain: tuple, loc, source: int,
            attrs: dict | None = None, note: str = "") -> int:
        attrs = dict(attrs or {})
        edges = [Edge(-1, src, k, tuple(index), TRUE, loc) for k, (src, index) in
                 enumerate(reads)]
        typ = infer(kind, [read_type(self.ed.ops[e.src], e) for e in edges], attrs)
        return self.ed.add(Op(-1, kind, domain, typ, attrs, loc), edges, source,
                           note or f"ragged {self.name}")

    def const(self, value, dtype, loc, source) -> int:
        key = (np.dtype(dtype).name, repr(value))
        if key not in self._consts:
            v = np.array(value, dtype)
            self._consts[key] = self.ed.add(Op(-1, "const", (), TensorType((), v.dtype),
                                               {"value": v}, loc), [], source,
                                            f"ragged {self.name}: constant")
        return self._consts[key]

    def dom(self, *dims: Dim) -> tuple[Dim, ...]:
        return tuple(d for d in self.ed.dims if d in dims)

    def ends(self):
        """``tl.until(done, max=N)`` per instance: ``finished[b, t]`` (done at or before
        ``t``) makes the valid points (``t == 0`` or not finished before ``t``), the loop over
        ``t`` ends once every instance has finished (an until over ``t`` alone), and ``len[b]``
        counts each instance's valid points (an output of the run, for its masks)."""
        ed, b, t = self.ed, self.b, self.t
        dom = self.dom(b, t)
        done = ed.ops[self.r.done]
        loc, src = done.loc, done.id
        flag = TensorType((), np.dtype(np.bool_))

        def merge(first: int, first_index, rest) -> int:
            m = ed.add(Op(-1, "merge", dom, flag, {"type": flag}, loc), [], src,
                       f"ragged {self.name}: per-instance end")
            later = rest(m)
            ed.rewrite(m, ed.ops[m], [Edge(m, first, 0, first_index, eq_(t, 0), loc),
                                      Edge(m, later, 1, dom, ne_(t, 0), loc)])
            return m

        prev = tuple(t - 1 if d == t else d for d in dom)
        fin = merge(src, dom, lambda m: self.add("or", [(m, prev), (src, dom)], dom, loc, src))
        yes = self.const(True, np.bool_, loc, src)
        self._valid = merge(yes, (), lambda m: self.add("not", [(fin, prev)], dom, loc, src))
        every = tuple(Slice(Const(0), d.bound) if d == b else d for d in dom)
        ints = self.add("cast", [(fin, every)], (t,), loc, src, {"dtype": np.dtype(np.int32)})
        least = self.add("min", [(ints, (t,))], (t,), loc, src, {"axis": 0, "keepdims": False})
        ed.untils[self.name] = self.add("ge", [(least, (t,)), (self.const(
            1, np.int32, loc, src), ())], (t,), loc, src, note=f"ragged {self.name}: every "
            "instance has finished")
        counted = self.add("cast", [(self._valid, self.index_bt(Const(0)))], (b,), loc, src,
                           {"dtype": np.dtype(np.int32)})
        self._len = self.add("sum", [(counted, (b,))], (b,), loc, src,
                             {"axis": 0, "keepdims": False},
                             f"ragged {self.name}: each instance's length")
        ed.outputs[lengths_output(self.name)] = self._len
        self._internal = set(ed.ops) - self._before

    @property
    def lengths(self) -> int:
        """``len[b]``: each instance's length, an int32 over ``(b,)``."""
        if self._len is None:
            op = next(iter(self.ed.ops.values()))
            a = self.r.lengths.astype(np.int32)
            self._len = self.ed.add(Op(-1, "from_array", (self.b,), TensorType((), a.dtype),
                                       {"array": a, "ndomain": 1}, op.loc, f"len_{self.name}"),
                                    [], None, f"ragged {self.name}: the lengths")
        return self._len

    @property
    def valid(self) -> int:
        """``t < len[b]`` over ``(b, t)``: whether a point is an instance's own."""
        if self._valid is None:
            dom = self.dom(self.b, self.t)
            loc = self.ed.ops[self.lengths].loc
            at = self.add("dimval", [], dom, loc, self.lengths, {"expr": self.t})
            self._valid = self.add("lt", [(at, dom), (self.lengths, (self.b,))], dom, loc,
                                   self.lengths, note=f"ragged {self.name}: valid points")
        return self._valid

    def int_of(self, e: Expr, domain: tuple, loc, source) -> int:
        """An int32 op over ``domain`` with the value of ``e``, ``T`` being ``len[b]``."""
        a, rest = self.affine(e, loc)
        if not a:
            return self.add("dimval", [], domain, loc, source, {"expr": rest})
        n = (self.lengths, (self.b,))
        if a != 1:
            n = (self.add("mul", [n, (self.const(a, np.int32, loc, source), ())], domain, loc,
                          source), domain)
        if isinstance(rest, Const) and rest.value == 0:
            return n[0] if n[0] != self.lengths else self.add("identity", [n], domain, loc,
                                                                 source)
        r = self.add("dimval", [], domain, loc, source, {"expr": rest})
        return self.add("add", [n, (r, domain)], domain, loc, source)

    def affine(self, e: Expr, loc) -> tuple[int, Expr]:
        """``e`` as ``a * T + rest``, or an error where it is not affine in ``T``."""
        e0, e1, e2 = (e.substitute({self.T: v}) for v in (0, 1, 2))
        a, a2 = e1 - e0, e2 - e0
        if not (a.is_const and a2.is_const and a2.value == 2 * a.value):
            raise RaggedError(f"the index expression {e} uses the ragged bound {self.name} "
                              f"other than as {self.name} + c; write it as an affine "
                              f"expression of {self.name}", loc)
        return a.value, e0

    def cond_of(self, c: Cond, domain: tuple, loc, source) -> int:
        """A bool op over ``domain``: ``c`` at each point, ``T`` being ``len[b]``."""
        if self.T not in c.symbols():
            return self.add("dimval", [], domain, loc, source, {"expr": c})
        if isinstance(c, Cmp):
            v = self.int_of(c.expr, domain, loc, source)
            zero = self.const(0, np.int32, loc, source)
            return self.add("ge" if c.op == ">=" else "eq", [(v, domain), (zero, ())], domain,
                            loc, source)
        if isinstance(c, Not):
            return self.add("not", [(self.cond_of(c.arg, domain, loc, source), domain)],
                            domain, loc, source)
        if isinstance(c, Junction):
            args = [self.cond_of(a, domain, loc, source) for a in c.args]
            out = args[0]
            for a in args[1:]:
                out = self.add(c.op, [(out, domain), (a, domain)], domain, loc, source)
            return out
        assert isinstance(c, BoolConst)
        return self.add("dimval", [], domain, loc, source, {"expr": c})

    # -- the rewrite ----------------------------------------------------------------------------
    def run(self):
        ed = self.ed
        if self.r.lengths is None:
            self.ends()
        for op in list(ed.ops.values()):
            if self.b in op.domain and self.t in op.domain and op.kind in ("sink", "source"):
                what = "tl.sink" if op.kind == "sink" else "tl.source"
                raise RaggedError(f"{what} over the ragged domain ({self.b}, {self.t}) is not "
                                  f"supported yet; make the data a padded array "
                                  f"(tl.from_array) and read outputs with run.mask", op.loc)
        for op in list(ed.ops.values()):
            if op.kind == "merge" and self.b in op.domain and any(
                    self.T in e.cond.symbols() for e in ed.in_edges(op.id)):
                self.branches(op)
        for e in list(ed.edges):
            if e.dst in ed.ops and e.src in ed.ops and e.dst not in self._internal:
                self.read(e)
        for op in list(ed.ops.values()):
            if op.kind == "dimval" and self.b in op.domain and self.T in op.attrs[
                    "expr"].symbols():
                x = op.attrs["expr"]
                new = (self.cond_of(x, op.domain, op.loc, op.id) if isinstance(x, Cond) else
                       self.int_of(x, op.domain, op.loc, op.id))
                ed.replace(op.id, new, f"ragged {self.name}: {x} per instance")

    def branches(self, m: Op):
        """Each branch of the box (its condition with ``T`` the longest length) takes the value
        of the branch that holds by data (``T`` the instance's length), by ``where``."""
        ed = self.ed
        edges = ed.in_edges(m.id)
        inst = Bound(self.name + "_inst")
        plain = [d.bound.name for d in ed.dims]
        params = plain + [inst.name]

        def domain(i: int):
            return I.box(ed.ops[i].domain, plain).set_tuple_name(f"op{i}")

        def reads(e: Edge):
            c, p = ed.ops[e.dst], ed.ops[e.src]
            return I.edge_map((f"op{c.id}", c.domain), (f"op{p.id}", p.domain), e.index,
                              e.cond, plain)
        sp = I.space(m.domain, params)
        fixed = {**dict(ed.bounds), self.name: self.r.longest}
        alive = I.box(m.domain, params)
        if self.t in m.domain:
            alive = alive & I.cond_set(self.t < inst, sp)
        alive = I.fix(alive, fixed) \
            .intersect_params(isl.Set(f"[{', '.join(params)}] -> {{ : {self.r.shortest} "
                                      f"<= {inst.name} <= {self.r.longest} }}"))
        new_inputs = []
        for j, ej in enumerate(edges):
            box_j = alive & I.fix(I.cond_set(ej.cond, sp), fixed)
            value = (ej.src, ej.index)
            for k, ek in enumerate(edges):
                if k == j or (self.T not in ek.cond.symbols() and self.T not in
                              ej.cond.symbols()):
                    continue
                held = box_j & I.fix(I.cond_set(ek.cond.substitute({self.T: inst}), sp), fixed)
                if held.is_empty():
                    continue
                read = I.fix(reads(ek), fixed).intersect_domain(
                    I.fix(I.cond_set(ej.cond, sp), fixed).set_tuple_name(f"op{m.id}")
                    .project_out(isl.dim_type.param, len(params) - 1, 1)
                    & I.fix(domain(m.id), fixed))
                if not read.range().is_subset(I.fix(domain(ek.src), fixed)):
                    raise RaggedError(
                        f"{m.label}: the branch where {ek.cond} (at {ek.loc}) can hold, per "
                        f"instance, where the branch where {ej.cond} holds for the longest "
                        f"instance, and its value cannot be read there; write the branch so "
                        f"that its reads stay inside the longest instance", ek.loc)
                d = self.cond_of(ek.cond, m.domain, ek.loc, m.id)
                value = (self.add("where", [(d, m.domain), (ek.src, ek.index), value],
                                  m.domain, ek.loc, m.id, note=f"ragged {self.name}: branch "
                                  f"{ek.cond} by data"), m.domain)
            new_inputs.append(Edge(m.id, value[0], j, tuple(value[1]), ej.cond, ej.loc))
        ed.rewrite(m.id, m, new_inputs, f"ragged {self.name}: branches chosen per instance")

    def read(self, e: Edge):
        ed = self.ed
        c, p = ed.ops[e.dst], ed.ops[e.src]
        pos = {d: k for k, d in enumerate(p.domain)}
        ragged_src = self.b in pos and self.t in pos
        if self.b not in c.domain:
            if ragged_src:
                self.zero_outside(e)
            return
        uses_T = [k for k, x in enumerate(e.index) if self.T in x.symbols()]
        if ragged_src and e.index[pos[self.b]] != self.b:
            raise RaggedError(f"{c.label} reads {p.label}[{e.index_str()}]: another instance's "
                              f"points of a ragged domain; read {p.label} at {self.b} itself",
                              e.loc)
        if not uses_T:
            return
        for k in uses_T:
            x = e.index[k]
            if isinstance(x, Slice):
                self.ranged(e, k)
                return  # one range ending at T per read
        self.gather(e, uses_T)

    def gather(self, e: Edge, ks: list[int]):
        """Point reads at ``T``: the whole range along those dims, then ``take`` at the
        instance's point."""
        ed = self.ed
        c, p = ed.ops[e.dst], ed.ops[e.src]
        index = list(e.index)
        for k in ks:
            index[k] = Slice(Const(0), p.domain[k].bound)
        src = self.add("identity", [(e.src, index)], c.domain, e.loc, e.dst,
                       note=f"ragged {self.name}: the range to pick {p.label}"
                            f"[{e.index_str()}] from")
        slots = [sum(isinstance(x, Slice) for x in e.index[:k]) for k in ks]
        at = [(self.int_of(e.index[k], c.domain, e.loc, e.dst), c.domain) for k in ks]
        # consecutive picked axes in one take; the axes stay in order after each
        out = src
        for slot, pick in zip(reversed(slots), reversed(at)):
            out = self.add("take", [(out, c.domain), pick], c.domain, e.loc, e.dst,
                           {"axis": slot}, f"ragged {self.name}: {p.label}[{e.index_str()}] "
                           "per instance")
        self.reroute(e, out)

    def reroute(self, e: Edge, new: int):
        """Make ``e``'s reader read op ``new`` (over its own domain) in place of ``e``."""
        ed = self.ed
        c = ed.ops[e.dst]
        ins = [Edge(c.id, new, f.slot, c.domain, f.cond, f.loc) if f.slot == e.slot else f
               for f in ed.in_edges(c.id)]
        ed.rewrite(c.id, c, ins, f"ragged {self.name}: reads per instance")

    def zero_outside(self, e: Edge):
        """A read from an op without ``b``: points outside an instance's range read as
        zeros."""
        ed = self.ed
        c, p = ed.ops[e.dst], ed.ops[e.src]
        vdom = self.dom(self.b, self.t)
        vindex = tuple(e.index[p.domain.index(d)] for d in vdom)
        mask = self.add("identity", [(self.valid, vindex)], c.domain, e.loc, e.dst,
                        note=f"ragged {self.name}: which points of {p.label} are real")
        n_read = read_type(p, e).ndim
        axes = [k for k, x in enumerate(e.index) if isinstance(x, Slice)]
        kept = [j for j, k in enumerate(axes) if p.domain[k] in vdom]
        mask_axes = [j - len(axes) - p.type.ndim for j in kept]
        value = self.add("identity", [(e.src, e.index)], c.domain, e.loc, e.dst)
        bm = self.broadcastable(mask, mask_axes, n_read, c.domain, e.loc, e.dst)
        zero = self.const(0, p.type.dtype, e.loc, e.dst)
        out = self.add("where", [(bm, c.domain), (value, c.domain), (zero, ())], c.domain,
                       e.loc, e.dst, note=f"ragged {self.name}: zeros outside each instance")
        self.reroute(e, out)

    def broadcastable(self, mask: int, axes: list[int], rank: int, domain, loc, source) -> int:
        """The compact ``mask`` (one axis per entry of ``axes``, negative positions in a value
        of rank ``rank``) with size-1 axes between and after, so it broadcasts."""
        if not axes:
            return mask
        width = -min(axes)
        ones = tuple(k for k in range(width) if k - width not in axes)
        if not ones:
            return mask
        return self.add("expand_dims", [(mask, domain)], domain, loc, source, {"axis": ones})

    # -- ranges that end at T -------------------------------------------------------------------
    def ranged(self, e: Edge, k: int):
        """``x[.., s:T + c, ..]``: read up to the longest instance; the mask
        ``valid[b, s - c:T]`` marks the instance's own points, carried to the op that reduces
        along the range."""
        ed = self.ed
        c, p = ed.ops[e.dst], ed.ops[e.src]
        x = e.index[k]
        a, rest = self.affine(x.stop, e.loc)
        if self.T in x.start.symbols() or a != 1 or not rest.is_const or rest.value > 0:
            raise RaggedError(f"{c.label} reads {p.label}[{e.index_str()}]: a range over the "
                              f"ragged bound {self.name} must start without it and end at "
                              f"{self.name} - c (e.g. 0:{self.name} or t:{self.name})", e.loc)
        for j, y in enumerate(e.index):
            if j != k and self.T in y.symbols():
                raise RaggedError(f"{c.label} reads {p.label}[{e.index_str()}]: one use of "
                                  f"{self.name} per read; read the range, then index it",
                                  e.loc)
        key = (c.id, str(x))
        if key not in self._masks:
            self._masks[key] = self.add(
                "identity", [(self.valid, self.index_bt(x.start - rest.value))], c.domain,
                e.loc, e.dst, note=f"ragged {self.name}: the instance's own points of "
                f"{p.label}[{e.index_str()}]")
        slot = sum(isinstance(y, Slice) for y in e.index[:k])
        axis = slot - read_type(p, e).ndim  # the range's axis, counted from the end
        self.carry(e.dst, e.slot, self._masks[key], [axis], e)

    def index_bt(self, start: Expr) -> tuple:
        return tuple(Slice(start, self.T) if d == self.t else self.b
                     for d in self.dom(self.b, self.t))

    def carry(self, i: int, slot: int, mask: int, axes: list[int], origin: Edge):
        """The value at input ``slot`` of op ``i`` holds points past the instance's end along
        ``axes`` (negative positions), where ``mask`` (over op ``i``'s domain) is false."""
        ed = self.ed
        if (i, slot) in self._carried:
            return
        self._carried.add((i, slot))
        op = ed.ops[i]
        e = ed.in_edges(i)[slot]
        rank = read_type(ed.ops[e.src], e).ndim
        where = f"{ed.ops[origin.src].label}[{origin.index_str()}]"
        carry_rule = CATALOG[op.kind].ragged
        out = None if carry_rule is None else carry_rule(self, op, slot, mask, axes, rank)
        if out is UNSUPPORTED or out is None and carry_rule is None:
            self.unsupported(op, where, origin)
        elif out is not None:
            self.forward(i, mask, out, origin)

    def unsupported(self, op: Op, where: str, origin: Edge):
        raise RaggedError(f"{op.label} ({op.kind}) takes {where}, a range that ends at the "
                          f"ragged bound {self.name}, in a way the compiled executors do not "
                          f"support yet; reduce along the range first (sum, mean, max, min, "
                          f"softmax, matmul) with elementwise ops in between", origin.loc)

    def forward(self, i: int, mask: int, axes: list[int], origin: Edge):
        """Op ``i``'s value carries the mask: pass it to its readers (and zero an output)."""
        ed = self.ed
        op = ed.ops[i]
        if i in self._forwarded:
            return
        self._forwarded.add(i)
        readers = list(ed.out_edges(i))
        for name, o in list(ed.outputs.items()):
            if o == i:
                bm = self.broadcastable(mask, axes, op.type.ndim, op.domain, op.loc, i)
                zero = self.const(0, op.type.dtype, op.loc, i)
                z = self.add("where", [(bm, op.domain), (i, op.domain), (zero, ())], op.domain,
                             op.loc, i, note=f"ragged {self.name}: zeros past each instance")
                ed.outputs[name] = z
        for f in readers:
            r = ed.ops[f.dst]
            if tuple(f.index) == tuple(op.domain) and r.domain == op.domain:
                m, ax = mask, axes
            else:
                m = self.add("identity", [(mask, f.index)], r.domain, f.loc, f.dst)
                n = sum(isinstance(x, Slice) for x in f.index)
                ax = [j - n - op.type.ndim for j in range(n)] + axes
            self.carry(f.dst, f.slot, m, ax, origin)

    def mask_input(self, op: Op, slot: int, mask: int, axes, rank: int, fill) -> int:
        """Op ``op`` reads ``where(mask, its input, fill)`` at ``slot``."""
        ed = self.ed
        e = ed.in_edges(op.id)[slot]
        p = ed.ops[e.src]
        bm = self.broadcastable(mask, axes, rank, op.domain, e.loc, op.id)
        fill_op = self.const(fill, read_type(p, e).dtype, e.loc, op.id)
        w = self.add("where", [(bm, op.domain), (e.src, e.index), (fill_op, ())], op.domain,
                     e.loc, op.id, note=f"ragged {self.name}: past each instance's end as "
                     f"{fill}")
        self.reroute(e, w)
        return w

    def reduce_masked(self, op: Op, slot: int, mask: int, axes, rank: int):
        """A reduction along a masked axis: the points past the end are its identity; a mean
        divides by the number of real points. A mean of 16-bit floats adds its points and
        counts them in float32 (``accumulator``) and rounds the quotient once, as an unmasked
        mean does: a float16 mean of 60 000s was inf (their float16 sum)."""
        ed = self.ed
        if op.kind != "mean":
            dt = op.type.dtype
            fill = {"sum": 0, "max": _lowest(dt), "min": _highest(dt)}[op.kind]
            self.mask_input(op, slot, mask, axes, rank, fill)
            return
        e = ed.in_edges(op.id)[slot]
        x = self.mask_input(op, slot, mask, axes, rank, 0)
        dom, wide = op.domain, accumulator(op.type.dtype)
        if wide != op.type.dtype:
            x = self.add("cast", [(x, dom)], dom, e.loc, op.id, {"dtype": wide})
        bm = self.broadcastable(mask, axes, rank, dom, e.loc, op.id)
        shape = read_type(ed.ops[e.src], e).shape
        ones = self.add("broadcast_to", [(self.const(1, wide, e.loc, op.id), ())],
                        dom, e.loc, op.id, {"shape": shape})
        zero = self.const(0, wide, e.loc, op.id)
        counted = self.add("where", [(bm, dom), (ones, dom), (zero, ())], dom, e.loc, op.id)
        attrs = {"axis": op.attrs.get("axis"), "keepdims": op.attrs.get("keepdims", False)}
        total = self.add("sum", [(x, dom)], dom, e.loc, op.id, attrs)
        count = self.add("sum", [(counted, dom)], dom, e.loc, op.id, attrs)
        if wide != op.type.dtype:
            total = self.add("div", [(total, dom), (count, dom)], dom, e.loc, op.id)
            ed.rewrite(op.id, Op(op.id, "cast", dom, op.type, {"dtype": op.type.dtype}, op.loc,
                                 op.name, op.scope), [Edge(op.id, total, 0, dom, TRUE, op.loc)],
                       f"ragged {self.name}: the mean of each instance's own points")
            return
        ed.rewrite(op.id, Op(op.id, "div", dom, op.type, {}, op.loc, op.name, op.scope),
                   [Edge(op.id, total, 0, dom, TRUE, op.loc),
                    Edge(op.id, count, 1, dom, TRUE, op.loc)],
                   f"ragged {self.name}: the mean of each instance's own points")


def lengths_output(bound: str) -> str:
    """The output that brings each instance's length of a per-instance ``tl.until`` back."""
    return f"__lengths_{bound}"


def _axes(axis, rank: int) -> list[int]:
    if axis is None:
        return list(range(rank))
    return [a % rank for a in (axis if isinstance(axis, (list, tuple)) else (axis,))]


def _lowest(dt):
    return ml_dtypes.finfo(dt).min if is_floating(dt) else np.iinfo(dt).min


def _highest(dt):
    return ml_dtypes.finfo(dt).max if is_floating(dt) else np.iinfo(dt).max


# -- buckets ------------------------------------------------------------------------------------
def _separable(ed: Editor, b: Dim) -> bool:
    """Whether every instance of ``b`` is computed on its own: a value of ``b``'s instance is
    read only by the same instance, and nothing depends on which instance it is."""
    for e in ed.edges:
        p, c = ed.ops[e.src], ed.ops[e.dst]
        if b in e.cond.symbols():
            return False
        for d, x in zip(p.domain, e.index):
            if (d == b) != (x == b) or (d != b and b in x.symbols()):
                return False
        if b in p.domain and b not in c.domain:
            return False
    for op in ed.ops.values():
        if b in op.domain and op.kind in ("random", "sink", "source"):
            return False
        if op.kind == "dimval" and b in op.attrs["expr"].symbols():
            return False
    return True


def _subst(v, sub: dict):
    """An attribute with the dims and bounds of ``sub`` replaced."""
    if isinstance(v, (Expr, Cond)):
        return v.substitute(sub)
    if isinstance(v, Slice):
        return Slice(v.start.substitute(sub), v.stop.substitute(sub))
    if isinstance(v, TensorType):
        return TensorType(tuple(_subst(x, sub) for x in v.shape), v.dtype, v.weak)
    if isinstance(v, tuple):
        return tuple(_subst(x, sub) for x in v)
    return v


def _dims(ed: Editor, name: str, r: Ragged) -> tuple[Dim, Dim]:
    """The ragged dim of bound ``name`` and the dim it is ragged over."""
    return (next(d for d in ed.dims if d.bound.name == name),
            next(d for d in ed.dims if d.name == r.over))


def bucket(ed: Editor, name: str, r: Ragged) -> bool:
    """Group the instances of ragged bound ``name`` by length if ``groupable``; whether it
    did. A construct the box cannot compile is reported first, in the user's dims."""
    groups = groupable(ed, name, r)
    if not groups:
        return False
    _Lower(Editor(ed.result(), ed.pass_name, ed.config, ed.bounds, ed.dynamic, ed.executor),
           name, r).run()
    _groups(ed, name, r, groups)
    return True


def groupable(ed: Editor, name: str, r: Ragged) -> int:
    """The number of groups to make (0: none): given lengths, groups asked for (by default,
    ``AUTO_GROUPS`` where ``_grouping_pays``) and enough instances, one ragged bound, no
    other data-dependent one, every instance computed on its own (``_separable``), and no
    output over ``(b, t)`` or as long as ``T`` (those keep the program one box)."""
    groups = getattr(ed.config, "ragged_buckets", 1) if ed.config else 1
    t, b = _dims(ed, name, r)
    if groups is None and r.lengths is not None:  # automatic: group where it pays
        groups = AUTO_GROUPS if _grouping_pays(ed, b, t, r.lengths, AUTO_GROUPS) else 1
    if (r.lengths is None or groups < 2 or len(r.lengths) < 2 * groups
            or len(set(r.lengths.tolist())) < 2 or ed.untils or len(ed.ragged) > 1
            or not _separable(ed, b)):
        return 0
    outs = [ed.ops[o] for o in ed.outputs.values() if b in ed.ops[o].domain]
    if any(t in op.domain or any(t.bound in x.symbols() for x in op.type.shape
                                 if not isinstance(x, int)) for op in outs):
        return 0
    return groups


AUTO_GROUPS = 4  # CompileConfig.ragged_buckets=None: this many groups, where they pay
STEP_OPERATIONS = 12_500  # a step of an op in a loop costs as much as this many arithmetic
# operations (an estimate fitted on a 2-CPU machine: a BiRNN's step of its 16 ops took about
# 1.5 us, its arithmetic about 135 GFLOP/s, both directions' loops together)


def _grouping_pays(ed: Editor, b: Dim, t: Dim, lengths: np.ndarray, groups: int) -> bool:
    """Whether ``groups`` groups by length are estimated to run faster than one box: each
    group's loop runs as many steps as its longest instance, and a step costs its arithmetic
    for every instance of the group plus a fixed cost per op (``STEP_OPERATIONS``). At batch 16,
    hidden 32, a BiRNN's four groups took 1.33x one box's time (the steps cost more than the
    padding saved); at batch 64, hidden 128, 0.66x."""
    work, ops = 0.0, 0
    for i, op in ed.ops.items():
        if b not in op.domain or t not in op.domain:
            continue
        n = _elements(op.type.shape, ed.bounds)
        ins = ed.in_edges(i)
        if op.kind == "matmul" and ins:  # two operations per element per contracted entry
            n *= 2 * _elements(read_type(ed.ops[ins[0].src], ins[0]).shape[-1:], ed.bounds)
        work, ops = work + n, ops + 1

    def cost(k: int) -> float:
        parts = np.array_split(np.sort(lengths)[::-1], k)
        return sum(int(p[0]) * (len(p) * work + ops * STEP_OPERATIONS) for p in parts if len(p))
    return cost(groups) < cost(1)


def _elements(shape, bounds) -> int:
    """The elements of ``shape`` at these bound values (an axis they do not decide: 1)."""
    known = {k: v for k, v in bounds.items() if isinstance(v, (int, np.integer))}
    out = 1
    for x in shape:
        if isinstance(x, int):
            out *= x
        elif all(s.name in known for s in x.symbols()):
            out *= int(x.evaluate(known))
    return out


def _groups(ed: Editor, name: str, r: Ragged, groups: int):
    """Sorted by length and cut into ``groups`` groups, each group of instances becomes a
    copy of the program over its own dims, as long as its own longest instance: the padded
    work shrinks from ``B x max`` to the sum of each group's size times its longest. Outputs
    over ``b`` are put together from the groups in sorted order (``ed.orders``, undone by the
    run)."""
    t, b = _dims(ed, name, r)
    T = t.bound
    outs = {k: o for k, o in ed.outputs.items() if b in ed.ops[o].domain}
    order = np.argsort(-r.lengths, kind="stable")
    cloned = sorted(i for i, op in ed.ops.items() if b in op.domain)
    parts, off = [], 0
    for g in np.array_split(order, groups):
        longest = int(r.lengths[g].max())
        bg = ed.new_dim(f"{b.name}_g", b, len(g), why=f"instances {off}..{off + len(g) - 1} "
                        f"of {b} by length")
        tg = ed.new_dim(f"{t.name}_g", t, longest, why=f"{t} in that group")
        sub = {b: bg, t: tg, T: tg.bound}
        ids = {}
        for i in cloned:
            op = ed.ops[i]
            attrs = {k: _subst(v, sub) for k, v in op.attrs.items()}
            if op.kind == "from_array":
                a = np.take(op.attrs["array"], g, axis=op.domain.index(b))
                if t in op.domain:
                    a = np.take(a, np.arange(longest), axis=op.domain.index(t))
                attrs["array"] = a
            ids[i] = ed.add(Op(-1, op.kind, tuple(sub.get(d, d) for d in op.domain),
                               _subst(op.type, sub), attrs, op.loc, op.name, op.scope), [], i,
                            f"ragged {name}: {bg} < {len(g)}, {tg} < {longest}")
        for i in cloned:
            ins = [Edge(ids[i], ids.get(e.src, e.src), e.slot, _subst(tuple(e.index), sub),
                        e.cond.substitute(sub), e.loc) for e in ed.in_edges(i)]
            ed.rewrite(ids[i], ed.ops[ids[i]], ins)
        ed.ragged[tg.bound.name] = Ragged(bg.name, r.lengths[g])
        parts.append((off, len(g), longest, bg, tg, ids))
        off += len(g)
    for k, o in outs.items():  # the groups' values side by side, then instance b's row
        op = ed.ops[o]
        rest = tuple(d for d in op.domain if d != b)
        reads = [(ids[o], tuple(Slice(Const(0), bg.bound) if d == bg else d
                                for d in ed.ops[ids[o]].domain)) for *_, bg, _, ids in parts]
        edges = [Edge(-1, src, n, index, TRUE, op.loc) for n, (src, index) in enumerate(reads)]
        together = ed.add(Op(-1, "concatenate", rest, infer(
            "concatenate", [read_type(ed.ops[e.src], e) for e in edges], {"axis": 0}),
            {"axis": 0}, op.loc), edges, o, f"ragged {name}: {k} of every group, by length")
        at = ed.add(Op(-1, "dimval", (b,), infer("dimval", [], {"expr": b}), {"expr": b},
                       op.loc), [], o)
        ed.outputs[k] = ed.add(Op(-1, "take", op.domain, op.type, {"axis": 0}, op.loc, op.name,
                                  op.scope), [Edge(-1, together, 0, rest, TRUE, op.loc),
                                              Edge(-1, at, 1, (b,), TRUE, op.loc)], o,
                               f"ragged {name}: {k} of each instance")
    for i in reversed(cloned):
        ed.erase(i, f"ragged {name}: one copy per group of instances")
    ed.orders[b.name] = order
    del ed.ragged[name]


@register("ragged", None)
def ragged(ed: Editor):
    """Ragged bounds (``tl.lengths``, per-instance ``tl.until``): instances grouped by length
    where they are computed apart, then each a guarded box up to its longest instance, with
    each instance's own bound as data where it matters."""
    for name, r in list(ed.ragged.items()):
        bucket(ed, name, r)
    for name, r in list(ed.ragged.items()):
        _Lower(ed, name, r).run()
    ed.ragged = {}
    ed.renumber()


# -- how each op carries a mask (``OpDef.ragged``) ---------------------------------------------
# ``(lowering, op, slot, mask, axes, rank) -> axes``: the op reads, at input ``slot``, a value
# whose ``axes`` hold points past the instance's end (false in ``mask``). The rule either masks
# the input itself (and returns None: the mask ends here), returns the axes of its own value
# that carry the mask on (its readers are visited next), or returns UNSUPPORTED. An op without
# a rule is unsupported.
def _reduce(lw, op, slot, mask, axes, rank):
    reduced = [a - rank if a >= 0 else a for a in _axes(op.attrs.get("axis"), rank)]
    if set(reduced) & set(axes):
        lw.reduce_masked(op, slot, mask, axes, rank)
        return None
    keep = op.attrs.get("keepdims", False)
    return [a + (0 if keep else sum(1 for r in reduced if r > a)) for a in axes]


@rule("ragged", "softmax")
def _softmax(lw, op, slot, mask, axes, rank):
    if (op.attrs["axis"] % rank) - rank in axes:
        lw.mask_input(op, slot, mask, axes, rank, ml_dtypes.finfo(op.type.dtype).min)
    return axes


@rule("ragged", "matmul")
def _matmul(lw, op, slot, mask, axes, rank):
    other = lw.ed.in_edges(op.id)[1 - slot]
    rank_o = read_type(lw.ed.ops[other.src], other).ndim
    rank_y = rank if slot == 1 else rank_o
    tb = op.attrs.get("tb", False)  # y stored transposed: its axes -1 and -2 swap
    contract = -1 if slot == 0 or rank_y == 1 or tb else -2
    if contract in axes:
        lw.mask_input(op, slot, mask, axes, rank, 0)
        return None
    if axes == [-2] and slot == 0:
        return [-2 if rank_y >= 2 else -1]
    if axes == [-2 if tb else -1] and slot == 1 and rank_y >= 2:
        return [-1]
    return UNSUPPORTED


def _pointwise(lw, op, slot, mask, axes, rank):
    return axes


@rule("ragged", "merge")
def _merge(lw, op, slot, mask, axes, rank):
    """A branch read at its own point (autodiff's guards)."""
    e = lw.ed.in_edges(op.id)[slot]
    if tuple(e.index) != tuple(op.domain) or lw.ed.ops[e.src].domain != op.domain:
        return UNSUPPORTED
    return axes


@rule("ragged", "take")
def _take(lw, op, slot, mask, axes, rank):
    if slot != 0:
        return UNSUPPORTED
    n = len(lw.ed.in_edges(op.id)) - 1
    first = op.attrs["axis"] % (rank - n + 1) - rank
    if set(axes) & set(range(first, first + n)):  # a pick along the range ends the mask
        return None
    return [a + n if a < first else a for a in axes]


@rule("ragged", "scatter_add")
def _scatter_add(lw, op, slot, mask, axes, rank):
    """Points past the end add zeros: the cotangents are masked, their positions need not be."""
    if axes != [-rank]:
        return UNSUPPORTED
    if slot == 0:
        lw.mask_input(op, slot, mask, axes, rank, 0)
    return None


@rule("ragged", "transpose")
def _transpose(lw, op, slot, mask, axes, rank):
    if len(axes) != 1:
        return UNSUPPORTED
    perm = [p % rank for p in op.attrs["perm"]]
    return [perm.index(axes[0] + rank) - rank]


@rule("ragged", "expand_dims")
def _expand_dims(lw, op, slot, mask, axes, rank):
    out_rank = op.type.ndim
    new = sorted(a % out_rank for a in _axes(op.attrs["axis"], out_rank))
    rest = [q for q in range(out_rank) if q not in new]
    return [rest[a + rank] - out_rank for a in axes]


@rule("ragged", "squeeze")
def _squeeze(lw, op, slot, mask, axes, rank):
    gone = [a % rank for a in _axes(op.attrs["axis"], rank)]
    if any(a + rank in gone for a in axes):
        return UNSUPPORTED
    return [a + sum(1 for g in gone if g > a + rank) for a in axes]


for _k, _d in CATALOG.items():
    if _d.category == "elementwise" or _k in ("identity", "broadcast_to"):
        _d.ragged = _pointwise
    elif _d.category == "reduce" and _k != "softmax":
        _d.ragged = _reduce
