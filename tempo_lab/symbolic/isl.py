"""Bridge between index expressions / conditions and islpy sets and maps.

Bounds are isl parameters, so one set or map describes the program for every bound value;
``fix`` pins them when a question is about one compiled instance. Producer dims in edge maps
are named with a trailing prime (``t'``) so printed maps read naturally.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import islpy as isl

from ..cache import LRU
from ..errors import ExprError
from .cond import TRUE, BoolConst, Cmp, Cond, Junction, Not, and_, compare, or_
from .expr import Bound, Const, Dim, DivMod, Expr, Lin, MinMax, Slice, Sym

CTX = isl.DEFAULT_CONTEXT


def space(dims: Sequence[Dim], params: Sequence[str]) -> isl.Space:
    return isl.Space.create_from_names(CTX, set=[d.name for d in dims], params=list(params))


def pw_aff(e: Expr, affs: dict) -> isl.PwAff:
    """``e`` as an isl piecewise quasi-affine function on the space that ``affs`` came from."""
    if isinstance(e, Const):
        return affs[0] + e.value
    if isinstance(e, Sym):
        if e.name not in affs:
            raise ExprError(f"{e.name} is not a dim of this domain or a bound of the context")
        return affs[e.name]
    if isinstance(e, Lin):
        out = affs[0] + e.const
        for a, c in e.terms:
            out = out + pw_aff(a, affs) * c
        return out
    if isinstance(e, MinMax):
        parts = [pw_aff(a, affs) for a in e.args]
        out = parts[0]
        for p in parts[1:]:
            out = out.min(p) if e.op == "min" else out.max(p)
        return out
    if isinstance(e, DivMod):
        inner = pw_aff(e.arg, affs)
        if e.op == "//":
            return inner.div(affs[0] + e.divisor).floor()
        return inner.mod_val(e.divisor)
    raise TypeError(f"not an index expression: {e!r}")


def cond_set(c: Cond, sp: isl.Space) -> isl.Set:
    """The points of ``sp`` where ``c`` holds."""
    affs = isl.affs_from_space(sp)
    return _cond_set(c, affs, sp)


def _cond_set(c: Cond, affs, sp) -> isl.Set:
    if isinstance(c, BoolConst):
        return isl.Set.universe(sp) if c.value else isl.Set.empty(sp)
    if isinstance(c, Cmp):
        e = pw_aff(c.expr, affs)
        return e.ge_set(affs[0]) if c.op == ">=" else e.eq_set(affs[0])
    if isinstance(c, Junction):
        sets = [_cond_set(a, affs, sp) for a in c.args]
        out = sets[0]
        for s in sets[1:]:
            out = (out & s) if c.op == "and" else (out | s)
        return out
    if isinstance(c, Not):
        return isl.Set.universe(sp) - _cond_set(c.arg, affs, sp)
    raise TypeError(f"not a condition: {c!r}")


def box(dims: Sequence[Dim], params: Sequence[str]) -> isl.Set:
    """``{ [d...] : 0 <= d < D }``: the full domain of a tensor over ``dims`` (shared: isl
    objects are values, and most ops of a program have one of a few domains)."""
    key = (tuple((d.name, d.bound.name) for d in dims), tuple(params))
    return _BOXES.get(key, lambda: cond_set(and_(*[(d >= 0) & (d < d.bound) for d in dims]),
                                            space(dims, params)))


_BOXES = LRU(1024)


def fix(obj, values: dict[str, int]):
    """Pin the bound parameters of an isl set or map (or union) to concrete values."""
    if not hasattr(obj, "fix_val"):
        names = obj.get_space().get_var_names(isl.dim_type.param)
        cons = " and ".join(f"{n} = {values[n]}" for n in names if n in values) or "true"
        return obj.intersect_params(isl.Set(f"[{', '.join(names)}] -> {{ : {cons} }}"))
    for name, v in values.items():
        pos = obj.find_dim_by_name(isl.dim_type.param, name)
        if pos >= 0:
            obj = obj.fix_val(isl.dim_type.param, pos, v)
    return obj


def primed(d: Dim) -> str:
    return d.name + "'"


def edge_map(consumer: tuple[str, Sequence[Dim]], producer: tuple[str, Sequence[Dim]],
             index: Sequence[Expr | Slice], cond: Cond = TRUE,
             params: Sequence[str] = ()) -> isl.Map:
    """The dependence of an SDG edge: consumer point -> producer points it reads (under cond).
    Made once per shape of edge (dims, index, condition) and named for this one."""
    (cname, cdims), (pname, pdims) = consumer, producer
    if len(index) != len(pdims):
        raise ExprError(f"{len(index)} index entries for {len(pdims)} producer dims")
    key = (tuple((d.name, d.bound.name) for d in cdims),
           tuple((d.name, d.bound.name) for d in pdims), tuple(map(str, index)), str(cond),
           tuple(params))
    m = _EDGES.get(key, lambda: _edge_map(cdims, pdims, index, cond, params))
    return m.set_tuple_name(isl.dim_type.in_, cname).set_tuple_name(isl.dim_type.out, pname)


_EDGES = LRU(8192)


def _edge_map(cdims, pdims, index, cond, params) -> isl.Map:
    names = [d.name for d in cdims] + [primed(d) for d in pdims]
    sp = isl.Space.create_from_names(CTX, set=names, params=list(params))
    affs = isl.affs_from_space(sp)
    rel = _cond_set(cond, affs, sp)
    for d, entry in zip(pdims, index):
        p = affs[primed(d)]
        if isinstance(entry, Slice):
            rel &= p.ge_set(pw_aff(entry.start, affs)) & p.lt_set(pw_aff(entry.stop, affs))
        else:
            rel &= p.eq_set(pw_aff(entry, affs))
    return isl.Map.from_range(rel).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0,
                                             len(cdims))


def reads_at(m: isl.Map, point: dict[str, int]) -> isl.Set:
    """The producer points that one consumer point reads through edge map ``m``."""
    dom = m.domain()
    for i in range(dom.dim(isl.dim_type.set)):
        dom = dom.fix_val(isl.dim_type.set, i, point[dom.get_dim_name(isl.dim_type.set, i)])
    return m.intersect_domain(dom).range()


# -- union sets and maps ---------------------------------------------------------------------
def union_of(items):
    """The union of isl sets (a UnionSet) or maps (a UnionMap), built by adding each (a chain
    of ``union`` calls copies the growing union every time: quadratic in a 1 000-op program)."""
    out = None
    for x in items:
        if isinstance(x, isl.Set):
            out = isl.UnionSet.from_set(x) if out is None else out.add_set(x)
        else:
            out = isl.UnionMap.from_map(x) if out is None else out.add_map(x)
    return out


def maps_of(umap: isl.UnionMap) -> list[isl.Map]:
    """The maps of a union map (as owned copies: islpy's foreach callbacks are not safe to keep
    objects from)."""
    lst = umap.get_map_list()
    return [lst.get_at(i) for i in range(lst.n_map())]


def sets_of(uset: isl.UnionSet) -> list[isl.Set]:
    lst = uset.get_set_list()
    return [lst.get_at(i) for i in range(lst.n_set())]


# -- back from isl -----------------------------------------------------------------------------
def _sym(name: str, dim_names: set[str]) -> Sym:
    return Dim(name) if name in dim_names else Bound(name)


def cond_from_set(s: isl.Set) -> Cond:
    """An isl set (over named dims, with bounds as parameters) as a ``Cond`` on those dims.
    Memoised by the set's text: a program's repeated layers ask for the same conditions."""
    return _CONDS.get(str(s), lambda: _cond_from_set(s))


_CONDS = LRU(8192)


def _cond_from_set(s: isl.Set) -> Cond:
    dim_names = {s.get_dim_name(isl.dim_type.set, i) for i in range(s.dim(isl.dim_type.set))}
    pieces = []
    for bs in s.get_basic_sets():
        syms = {}
        for t in (isl.dim_type.set, isl.dim_type.param):
            for i in range(bs.dim(t)):
                n = bs.get_dim_name(t, i)
                syms[n] = _sym(n, dim_names)
        divs = [_div_expr(bs.get_div(i), syms) for i in range(bs.dim(isl.dim_type.div))]
        atoms = []
        for con in bs.get_constraints():
            e = _constraint_expr(con, syms, divs)
            atoms.append(Cmp("==", e) if con.is_equality() else Cmp(">=", e))
        pieces.append(and_(*[_recanon(a) for a in atoms]))
    return or_(*pieces)


def _recanon(c: Cmp) -> Cond:
    return compare(c.op, c.expr)


def _constraint_expr(con, syms, divs) -> Expr:
    out: Expr = Const(con.get_constant_val().to_python())
    for t in (isl.dim_type.set, isl.dim_type.param):
        for i in range(con.space.dim(t)):
            c = con.get_coefficient_val(t, i).to_python()
            if c:
                out = out + syms[con.space.get_dim_name(t, i)] * c
    for i, d in enumerate(divs):
        c = con.get_coefficient_val(isl.dim_type.div, i).to_python()
        if c:
            out = out + d * c
    return out


def _div_expr(aff: isl.Aff, syms) -> Expr:
    denom = aff.get_denominator_val().to_python()
    num: Expr = Const((aff.get_constant_val() * denom).to_python())
    for t in (isl.dim_type.in_, isl.dim_type.param):
        for i in range(aff.dim(t)):
            c = (aff.get_coefficient_val(t, i) * denom).to_python()
            if c:
                num = num + syms[aff.get_dim_name(t, i)] * c
    if any(not aff.get_coefficient_val(isl.dim_type.div, i).is_zero()
           for i in range(aff.dim(isl.dim_type.div))):
        raise ExprError("nested integer divisions cannot be converted back from isl")
    return num // denom


def sample(s: isl.Set) -> dict[str, int] | None:
    """One point of a (parameter-fixed) set as ``{dim name: value}``, or None if it is empty."""
    if s.is_empty():
        return None
    pt = s.sample_point()
    return {s.get_dim_name(isl.dim_type.set, i):
            pt.get_coordinate_val(isl.dim_type.set, i).to_python()
            for i in range(s.dim(isl.dim_type.set))}


def named(s, dims: Sequence[Dim]):
    """``s`` (a set over ``len(dims)`` dims) with its dims named after ``dims``; isl keeps
    whichever names it met first (e.g. primed producer names from an edge map)."""
    for k, d in enumerate(dims):
        s = s.set_dim_name(isl.dim_type.set, k, d.name)
    return s


def least_gap(s: isl.Set, hi: str, lo: str) -> int | float:
    """The least value of ``hi - lo`` (two of ``s``'s set dims, by name) over the non-empty
    set ``s``: an int, or ``-inf`` where it falls without bound as a parameter grows."""
    sp = s.get_space()
    ls = isl.LocalSpace.from_space(sp)

    def var(name):
        return isl.Aff.var_on_domain(ls, isl.dim_type.set,
                                     sp.find_dim_by_name(isl.dim_type.set, name))

    v = s.min_val(var(hi).sub(var(lo)))
    return v.to_python() if v.is_int() else -math.inf


def max_over(e: Expr, s: isl.Set, dims: Sequence[Dim], values: dict[str, int]) -> int:
    """The largest value of ``e`` over the (non-empty) set ``s`` of points over ``dims``, with
    the bounds pinned to ``values``."""
    s = fix(named(s, dims).reset_tuple_id(), values)
    pa = pw_aff(e, isl.affs_from_space(s.get_space()))
    return fix(pa, values).intersect_domain(s).max_val().to_python()
