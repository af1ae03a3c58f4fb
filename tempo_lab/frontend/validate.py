"""Compile-time checks with isl, for the bound values being compiled.

* every placeholder's branches are pairwise disjoint and cover its domain (DefinitionError);
* every read stays inside its producer's domain at every point where it happens
  (BoundsError) -- a read inside a branch only happens where that branch applies;
* outputs have static spatial shapes and ``from_array`` arrays match the bounds (ShapeError).

Where a read happens is the *demand* of its consumer (``ir.demand``).
"""
from __future__ import annotations

from collections.abc import Mapping

import islpy as isl

from ..errors import BoundsError, DefinitionError, ShapeError
from ..ir.demand import demand
from ..ir.sdg import SDG, Edge
from ..symbolic import Slice
from ..symbolic import isl as I


def _point_str(p: dict) -> str:
    return "(" + ", ".join(f"{k} = {v}" for k, v in p.items()) + ")"


class _Checker:
    """A ragged bound (``tl.lengths``) stays a parameter, between its shortest and longest
    length: every instance is the program at its own length, so a check that holds for every
    value in that range holds for every instance."""

    def __init__(self, sdg: SDG, bounds: Mapping[str, int]):
        self.sdg, self.bounds = sdg, dict(bounds)
        self.boxes = {i: self._fix(sdg.isl_domain(i)) for i in sdg.ops}
        self.maps = {e: self._fix(sdg.isl_map(e)) for e in sdg.edges}

    def _fix(self, obj):
        fixed = I.fix(obj, {k: v for k, v in self.bounds.items() if k not in self.sdg.ragged})
        names = fixed.get_space().get_var_names(isl.dim_type.param)
        for name, r in self.sdg.ragged.items():
            if name in names:
                fixed = fixed.intersect_params(isl.Set(
                    f"[{', '.join(names)}] -> {{ : {r.shortest} <= {name} <= {r.longest} }}"))
        return fixed

    def describe(self, s: isl.Set, within: isl.Set) -> str:
        """A readable condition for a subset of ``within`` (bounds and the constraints of
        ``within`` left implicit)."""
        params = self._fix(isl.Set.universe(s.get_space().params()))
        cond = I.cond_from_set(s.gist(within).gist_params(params).reset_tuple_id())
        return str(cond)

    # -- branches -----------------------------------------------------------------------------
    def branches(self):
        for op in self.sdg.ops.values():
            if op.kind != "merge":
                continue
            box = self.boxes[op.id]
            covered = []
            for e in self.sdg.in_edges(op.id):
                s = self.maps[e].domain() & box
                for prev, ps in covered:
                    both = s & ps
                    if not both.is_empty():
                        raise DefinitionError(
                            f"branches of {op.label} overlap: this branch (where {e.cond}) and "
                            f"the one at {prev.loc} (where {prev.cond}) both define it at "
                            f"{_point_str(I.sample(both))}; make their conditions disjoint",
                            e.loc)
                covered.append((e, s))
            missing = box
            for _, s in covered:
                missing = missing - s
            if not missing.is_empty():
                dims = ", ".join(map(str, op.domain))
                raise DefinitionError(
                    f"{op.label} is not defined at {_point_str(I.sample(missing))} (nor wherever "
                    f"{self.describe(missing, box)}); add a branch for those points or a default "
                    f"branch {op.label}[{dims}] = ...", op.loc)

    # -- reads --------------------------------------------------------------------------------
    def reads(self):
        demand(self.sdg, self.boxes, self.maps, self._read)

    def _read(self, e: Edge, m: isl.Map, demanded: isl.Set):
        self._lengths(e, demanded)
        outside = m.range() - self.boxes[e.src]
        if outside.is_empty():
            return
        bad = m.intersect_range(outside)
        at = I.sample(bad.domain())
        reads = I.sample(I.reads_at(bad, at) & outside)
        p, c = self.sdg.ops[e.src], self.sdg.ops[e.dst]
        extent = ", ".join(f"0 <= {d} < {d.bound} = {self.bounds[d.bound.name]}"
                           for d in p.domain)
        reader = "this read" if c.kind != "merge" else "this branch"
        raise BoundsError(
            f"{reader} of {p.label}[{e.index_str()}] leaves its domain ({extent}): at "
            f"{_point_str(at)} it reads {_point_str({k.rstrip(chr(39)): v for k, v in reads.items()})}"
            f". Guard it with a branch for those points (e.g. {p.label}[0] = ...), clip the index "
            "with tl.max/tl.min, or shorten the slice", e.loc)

    def _lengths(self, e: Edge, demanded: isl.Set):
        """A slice must not end before it starts wherever the read happens (its length would
        be negative: no such range of points exists)."""
        slices = [x for x in e.index if isinstance(x, Slice)]
        if not slices:
            return
        demanded = I.named(demanded, self.sdg.ops[e.dst].domain)
        where = demanded & I.cond_set(e.cond, demanded.get_space())
        for x in slices:
            bad = where & I.cond_set(x.stop < x.start, where.get_space())
            if bad.is_empty():
                continue
            at = I.sample(bad)
            p = self.sdg.ops[e.src]
            raise BoundsError(
                f"the range {x} of {p.label}[{e.index_str()}] ends before it starts at "
                f"{_point_str(at)}, where {x.start} = {x.start.evaluate({**self.bounds, **at})} "
                f"and {x.stop} = {x.stop.evaluate({**self.bounds, **at})}; a range start:stop "
                "needs start <= stop (clip it with tl.max/tl.min, or guard those points with a "
                "branch)", e.loc)

    # -- shapes -------------------------------------------------------------------------------
    def shapes(self):
        sdg = self.sdg
        for name, i in sdg.outputs.items():
            op = sdg.ops[i]
            dyn = [s for s in op.type.shape if not isinstance(s, int) and s.dims()]
            if dyn:
                dims = ", ".join(sorted({str(d) for s in dyn for d in s.dims()}))
                raise ShapeError(
                    f"output {name!r} has spatial shape ({', '.join(map(str, op.type.shape))}), "
                    f"which changes with {dims}; outputs need a static shape: reduce over that "
                    "axis, or read a range whose length has no dims in it (e.g. x[0:T])", op.loc)
        for op in sdg.ops.values():
            if op.kind != "from_array":
                continue
            lead = op.attrs["array"].shape[:len(op.domain)]
            want = tuple(self.bounds[d.bound.name] for d in op.domain)
            if lead != want:
                raise ShapeError(
                    f"from_array: the array's leading axes {lead} do not match the bounds "
                    f"{', '.join(f'{d.bound} = {v}' for d, v in zip(op.domain, want))} of its "
                    "domain; pass an array whose leading axes are the bounds", op.loc)


def validate(sdg: SDG, bounds: Mapping[str, int]) -> None:
    c = _Checker(sdg, bounds)
    c.shapes()
    c.branches()
    c.reads()

