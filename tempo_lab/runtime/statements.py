"""Each statement of the loop AST, resolved once before a run: what its kernel reads, which
integers (store slots, range starts, valid lengths) it passes, and which sizes are padded.

The interpreter works these out at every statement instance from the SDG; the generated and the
XLA-loop executors resolve them here once, as index expressions over the loop variables and the
bounds (``Stmt``), and only evaluate those expressions per instance.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.sdg import SDG, Edge, Op
from ..ir.vmap import in_axes, vdims
from ..memory.plan import MemoryPlan, const_cap, size_class
from ..schedule import Exec
from ..symbolic import TRUE, Const, Dim, Expr, Slice, mod
from ..symbolic.cond import Cond


@dataclass(frozen=True)
class Padded:
    """A symbolic length: its value per instance, and the static size it is padded to (its
    constant cap when it has one, else the size class of its value)."""

    length: Expr
    cap: int | None
    orig: Expr | None = None  # the length over the op's own dims (for its maximum, with isl)

    def pad(self, n: int) -> int:
        return self.cap if self.cap is not None else size_class(n)


@dataclass(frozen=True)
class Read:
    src: int
    entries: tuple  # per source dim: ("p", slot expr) or ("s", start expr, Padded, ring slots)
    cut: tuple      # per spatial axis of the source: None (static) or Padded

    def ints(self) -> list:
        """The expressions passed to the kernel for this read, in the kernel's order."""
        out = [e[1] for e in self.entries]
        out += [e[2].length for e in self.entries if e[0] == "s"]
        out += [c.length for c in self.cut if c is not None]
        return out

    def padded(self) -> list[Padded]:
        return [e[2] for e in self.entries if e[0] == "s"] + [c for c in self.cut if c]

    def pattern(self, pads) -> tuple:
        """The kernel's static read pattern, given the padded sizes (in ``padded()`` order)."""
        it = iter(pads)
        entries = tuple(("s", next(it), e[3], e[1] == 0) if e[0] == "s" else ("p",)
                        for e in self.entries)
        cut = tuple(None if c is None else next(it) for c in self.cut)
        return entries, cut

    def lens(self, values) -> list:
        """Valid length per axis of the read value (None: static), like the interpreter's."""
        it = iter(values)
        return [next(it) for e in self.entries if e[0] == "s"] + [
            None if c is None else next(it) for c in self.cut]


@dataclass(frozen=True)
class Stmt:
    """One (Exec, edge selection): a merge has one Stmt per branch, guarded by ``cond``."""

    op: Op
    edges: tuple[Edge, ...]
    cond: Cond
    reads: tuple[Read, ...]
    point: tuple[Expr, ...]         # the op's point, over loop variables and bounds
    slots: tuple[Expr, ...] | None  # where it is written in its store (None: no store)
    out: tuple                      # per output axis: int or Padded
    levels: tuple                   # vmap axes for vectorised dims
    donate: bool
    host: Expr | None = None        # a dimval's value

    def ints(self) -> list:
        out = [x for r in self.reads for x in r.ints()] + list(self.point)
        return out + list(self.slots or ())

    def padded(self) -> list[Padded]:
        return [p for r in self.reads for p in r.padded()] + [
            x for x in self.out if isinstance(x, Padded)]

    def static(self, pads) -> tuple[tuple, tuple]:
        """(read patterns, out shape) for the given padded sizes (``padded()`` order)."""
        pads = list(pads)
        reads, k = [], 0
        for r in self.reads:
            n = len(r.padded())
            reads.append((r.src, r.pattern(pads[k:k + n])))
            k += n
        out = tuple(x if isinstance(x, int) else pads.pop(k) for x in self.out)
        return tuple(reads), out


def _slot(v: Expr, w: int | None) -> Expr:
    if w is None:
        return v
    return Const(0) if w == 1 else mod(v, w)


def resolve(sdg: SDG, plan: MemoryPlan, node: Exec) -> list[Stmt]:
    """The statements of one Exec node: one, or one per branch of a merge (branches reading
    values that have no store, because no demanded point takes them, are left out; an Exec
    left with none raises if it ever runs)."""
    op = sdg.ops[node.op]
    at = {Dim(d.name): a for d, a in zip(op.domain, node.args)}
    edges = sdg.in_edges(op.id)
    groups = [((e,), e.cond.substitute(at)) for e in edges] if op.kind == "merge" else [
        (tuple(edges), TRUE)]
    st = plan.storages.get(op.id)
    out = []
    for group, cond in groups:
        if any(e.src not in plan.storages for e in group):
            continue  # reads a value nobody stores: a branch no demanded point takes
        reads = tuple(_read(sdg, plan, e, at) for e in group)
        slots = None if st is None else tuple(_slot(a, w) for a, w in zip(node.args, st.slots))
        shape = tuple(x if isinstance(x, int) else Padded(x.substitute(at), const_cap(x), x)
                      for x in op.type.shape)
        levels = tuple(map(tuple, in_axes(sdg, op, list(group)))) if vdims(op) else ()
        donate = st is not None and all(e.src != op.id for e in group)
        host = op.attrs["expr"].substitute(at) if op.kind == "dimval" else None
        out.append(Stmt(op, group, cond, reads, tuple(node.args), slots, shape, levels, donate,
                        host))
    return out


def _read(sdg: SDG, plan: MemoryPlan, e: Edge, at: dict) -> Read:
    src = sdg.ops[e.src]
    slots = plan.storages[e.src].slots
    entries, pmap, omap = [], {}, {}
    for k, (d, x) in enumerate(zip(src.domain, e.index)):
        if isinstance(x, Slice):
            start = x.start.substitute(at)
            n = x.stop.substitute(at) - start
            entries.append(("s", start, Padded(n, const_cap(x.length), x.stop - x.start),
                            slots[k]))
        else:
            v = x.substitute(at)
            pmap[Dim(d.name)] = v
            omap[Dim(d.name)] = x
            entries.append(("p", _slot(v, slots[k])))
    cut = tuple(None if isinstance(x, int) else Padded(x.substitute(pmap), const_cap(x),
                                                       x.substitute(omap))
                for x in src.type.shape)
    return Read(e.src, tuple(entries), cut)
