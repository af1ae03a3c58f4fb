"""The ``Lowered`` stage: the loop AST resolved once into what every executor runs.

Each ``Exec`` of the loop AST becomes statements (``Stmt``: one per branch of a placeholder)
with their reads, the integers they pass (store slots, range starts, valid lengths) as index
expressions over loop variables and bounds, and the sizes their symbolic axes are padded to.
The stores get their layouts from the memory plan, with the rules for allocating and growing
them; constants and arrays, sources and sinks, and the ``While`` loops of data-dependent bounds
are listed. The back ends (``executors.REGISTRY``) only evaluate what is
resolved here: ``lowered.compile(backend)`` gives the ``Executable``.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..ir.ops import flag
from ..ir.sdg import SDG, Edge, Op
from ..ir.vmap import in_axes, vdims
from ..memory.plan import MemoryPlan, Storage
from ..schedule import Exec, For, Schedule, While
from ..schedule.cut import cut_loops
from ..stage import Stage
from ..symbolic import TRUE, Const, Dim, Expr, Slice, mod
from ..symbolic.cond import Cond
from ..symbolic.sizes import const_cap, size_class
from .sharding import to_host

SCHEMA = "tempo_lab.lowered/1"


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


def resolve(sdg: SDG, memory: MemoryPlan, node: Exec) -> list[Stmt]:
    """The statements of one Exec node: one, or one per branch of a merge (branches reading
    values that have no store, because no demanded point takes them, are left out; an Exec
    left with none raises if it ever runs)."""
    op = sdg.ops[node.op]
    at = {Dim(d.name): a for d, a in zip(op.domain, node.args)}
    edges = sdg.in_edges(op.id)
    groups = [((e,), e.cond.substitute(at)) for e in edges] if op.kind == "merge" else [
        (tuple(edges), TRUE)]
    st = memory.storages.get(op.id)
    out = []
    for group, cond in groups:
        if any(e.src not in memory.storages for e in group):
            continue  # reads a value nobody stores: a branch no demanded point takes
        reads = tuple(_read(sdg, memory, e, at) for e in group)
        slots = None if st is None else tuple(_slot(a, w) for a, w in zip(node.args, st.slots))
        shape = tuple(x if isinstance(x, int) else Padded(x.substitute(at), const_cap(x), x)
                      for x in op.type.shape)
        levels = tuple(map(tuple, in_axes(sdg, op, list(group)))) if vdims(op) else ()
        donate = st is not None and all(e.src != op.id for e in group)
        host = op.attrs["expr"].substitute(at) if op.kind == "dimval" else None
        out.append(Stmt(op, group, cond, reads, tuple(node.args), slots, shape, levels, donate,
                        host))
    return out


def _read(sdg: SDG, memory: MemoryPlan, e: Edge, at: dict) -> Read:
    src = sdg.ops[e.src]
    slots = memory.storages[e.src].slots
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


# -- stores -------------------------------------------------------------------------------------
def initial_shape(s: Storage) -> tuple[int, ...]:
    """A store's buffer when first allocated: ring axes at their size, growing axes at one
    block (reads of points nobody wrote, outside every demand, then see zeros)."""
    return tuple(w if w is not None else b for w, b in zip(s.slots, s.blocks)) + s.spatial


def grown_shape(s: Storage, shape: tuple, point: tuple) -> tuple[int, ...]:
    """The buffer shape once ``point`` fits: growing axes extended by whole blocks."""
    return tuple(x if w is not None else max(x, -(-(v + 1) // b) * b)
                 for x, w, v, b in zip(shape, s.slots, point, s.blocks)) + s.spatial


# -- the stage ----------------------------------------------------------------------------------
class Lowered(Stage):
    """The loop AST resolved into statements, store layouts, host inputs, sinks, sources and
    data-dependent loops (``prog.lowered``); ``compile(backend)`` makes an ``Executable``.

    ``bounds``: the compiled bound values (a dict of ints), held here and not copied: the
    ``Program``, the backends and ``Executable.run`` read this one dict."""

    def __init__(self, sdg: SDG, schedule: Schedule, memory: MemoryPlan,
                 bounds: dict[str, int], layout=None):
        self.sdg, self.schedule, self.memory = sdg, schedule, memory
        self.layout = layout  # sharding.Layout over a device mesh, or None: one device
        self.bounds = bounds
        self._last_shapes: tuple = (None, [])  # (a run's bounds, its outputs' shapes)
        # loops that branch on one point, in two; the loop after each cut, by the one before;
        # where each loop that branches on a point was cut, or why not
        self.ast, self.cut_after, self.cut_notes = cut_loops(schedule.ast, sdg)
        self.stmts: list[Stmt] = []
        self.of_exec: dict[int, tuple[int, ...]] = {}  # id(Exec node) -> its statements
        for node in self.ast.walk():
            if isinstance(node, Exec):
                first = len(self.stmts)
                self.stmts.extend(resolve(sdg, memory, node))
                self.of_exec[id(node)] = tuple(range(first, len(self.stmts)))
        self.stores: dict[int, Storage] = dict(memory.storages)
        ran = {st.op.id for st in self.stmts}
        self.hosts = tuple(i for i in sorted(ran) if flag(sdg.ops[i].kind, "array"))
        self.sources = tuple(k for k, st in enumerate(self.stmts) if st.op.kind == "source")
        self.sinks = tuple(k for k, st in enumerate(self.stmts) if st.op.kind == "sink")
        self.loops = tuple(n for n in self.ast.walk() if isinstance(n, For))

    def stmts_of(self, node: Exec) -> list[Stmt]:
        return [self.stmts[k] for k in self.of_exec[id(node)]]

    def host_array(self, op: int) -> np.ndarray:
        """A constant's value or a ``from_array`` array (its leading axes over the domain)."""
        o = self.sdg.ops[op]
        return o.attrs["value" if o.kind == "const" else "array"]

    def compile(self, backend="auto", sync: bool = False, split: int = 8):
        """The ``Executable`` of this program on ``backend`` ("auto", "xla", "codegen",
        "interpreter", an ``executors.Choice``, or a ``Backend`` object)."""
        from .executable import compile_lowered

        return compile_lowered(self, backend, sync, split)

    # -- outputs ------------------------------------------------------------------------------
    def outputs(self, bufs: Mapping[int, object], env: Mapping[str, int]) -> dict:
        """Each output's valid region (bounds as reached) from its store buffer, as NumPy, with
        the axes of vectorised dims back among the domain axes (universe order)."""
        last = self._last_shapes  # a run's outputs have the shapes the last run's had
        if last[0] != env:
            last = self._last_shapes = (dict(env), [
                (name, i, tuple([env[b] for b in bounds]) + (
                    sizes if type(sizes) is tuple else
                    tuple(x if isinstance(x, int) else x.evaluate(env) for x in sizes)), order)
                for name, i, bounds, sizes, order in self._output_recipes])
        out = {}
        for name, i, want, order in last[1]:
            arr = bufs[i]
            if type(arr) is not np.ndarray:  # one transfer of every output still on a device
                bufs = to_host({r[1]: bufs[r[1]] for r in last[1]})
                arr = bufs[i]
            if arr.shape != want:
                arr = arr[tuple(slice(0, n) for n in want)]
            if arr.shape != want:  # points outside every demanded set were never computed
                full = np.zeros(want, arr.dtype)
                full[tuple(slice(0, n) for n in arr.shape)] = arr
                arr = full
            out[name] = arr if order is None else self._universe_order(arr, *order)
        return out

    @functools.cached_property
    def _output_recipes(self) -> list[tuple]:
        """Per output, what ``outputs`` needs at every run, worked out once: (name, op, its
        domain's bound names, its spatial sizes (a tuple where they are all constants), the
        axis order back to the universe's or None)."""
        recipes = []
        for name, i in self.sdg.outputs.items():
            op = self.sdg.ops[i]
            sizes = op.type.shape
            recipes.append((name, i, tuple(d.bound.name for d in op.domain),
                            tuple(sizes) if all(isinstance(x, int) for x in sizes) else list(sizes),
                            self._order_of(op)))
        return recipes

    def _order_of(self, op: Op) -> tuple[list[int], list[bool]] | None:
        """How ``op``'s store axes go back to universe order: a permutation of its domain axes
        and, per axis after it, whether it merges with the next (a dim's blocks and the points
        in a block); None where they are in that order already."""
        moved = vdims(op)
        if not moved:
            return None
        blocks = self.sdg.parted(op)  # d_blk, then d's points in a block
        have = [d.name for d in op.domain] + list(moved)
        want = [n for d in self.sdg.dims if d.name in have
                for n in (d.name, *([blocks[d.name]] if d.name in blocks else ()))]
        perm, merge = [have.index(n) for n in want], [n in blocks for n in want]
        return None if perm == sorted(perm) and not any(merge) else (perm, merge)

    @staticmethod
    def _universe_order(value: np.ndarray, perm: list[int], merge: list[bool]) -> np.ndarray:
        value = np.transpose(value, perm + list(range(len(perm), value.ndim)))
        shape, k = [], 0
        while k < value.ndim:  # merge each (blocks, points in a block) pair into one axis
            both = k < len(merge) and merge[k]
            shape.append(value.shape[k] * value.shape[k + 1] if both else value.shape[k])
            k += 2 if both else 1
        return value.reshape(shape)

    # -- stage vocabulary ---------------------------------------------------------------------
    def __repr__(self) -> str:
        whiles = sum(isinstance(n, While) for n in self.loops)
        return (f"Lowered(statements={len(self.stmts)}, stores={len(self.stores)}, "
                f"loops={len(self.loops)}, while_loops={whiles})")

    def _stmt_line(self, k: int, st: Stmt) -> str:
        reads = ", ".join(f"{self.sdg.ops[r.src].label}[{', '.join(_entry(e) for e in r.entries)}]"
                          for r in st.reads)
        guard = "" if st.cond == TRUE else f" if {st.cond}"
        at = ", ".join(map(str, st.point))
        where = f" -> slot [{', '.join(map(str, st.slots))}]" if st.slots is not None else ""
        return f"s{k}: {st.op.label}[{at}] = {st.op.kind}({reads}){guard}{where}"

    def _sections(self):
        stores = [f"{self.sdg.ops[i].label}: {s.describe()}, allocated "
                  f"{list(initial_shape(s))}, grows by blocks of "
                  f"{[b for w, b in zip(s.slots, s.blocks) if w is None] or 'none'}"
                  for i, s in self.stores.items()]
        loops = [f"{n.var} in {n.lo}..{n.hi}" + (f" until {self.sdg.ops[n.done].label}[{n.at}]"
                                                 f" sets {n.bound}"
                                                 if isinstance(n, While) else "")
                 for n in self.loops]
        hosts = [f"{self.sdg.ops[i].label}: {self.sdg.ops[i].kind} "
                 f"{self.host_array(i).dtype.name}{list(self.host_array(i).shape)}"
                 for i in self.hosts]
        calls = [f"s{k}: {self.stmts[k].op.kind} {self.stmts[k].op.label} at "
                 f"{self.stmts[k].op.loc}" for k in self.sources + self.sinks]
        return [("statements", [self._stmt_line(k, st) for k, st in enumerate(self.stmts)]),
                ("stores", stores), ("loops", loops),
                ("loops cut at a point their branches name, or not", self.cut_notes),
                ("host inputs", hosts),
                ("callbacks (tl.source, tl.sink)", calls), *self.devices_section()]

    def devices_section(self) -> list[tuple[str, list[str]]]:
        """The mesh and the shardings, with the predicted peak per device (none: one device)."""
        if self.layout is None:
            return []
        peak = self.device_peak_bytes
        return [("devices", self.layout.lines(self.stores) + [
            f"predicted store peak per device: {peak} B (of {self.memory.peak_bytes} B in all)"])]

    @functools.cached_property
    def device_peak_bytes(self) -> int:
        """The memory plan's peak of store bytes on one device (all of it on one device)."""
        if self.layout is None:
            return self.memory.peak_bytes
        return self.layout.device_peak_bytes(self.ast, self.stores, self.bounds)

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "bounds": dict(self.bounds),
                "statements": [{"id": k, "op": st.op.id, "kind": st.op.kind,
                                "point": [str(x) for x in st.point],
                                "cond": str(st.cond),
                                "reads": [{"src": r.src, "entries": [_entry(e) for e in r.entries]}
                                          for r in st.reads],
                                "slots": None if st.slots is None else [str(x) for x in st.slots],
                                "ints": [str(x) for x in st.ints()]}
                               for k, st in enumerate(self.stmts)],
                "stores": [{"op": i, "kind": s.kind, "slots": list(s.slots),
                            "blocks": list(s.blocks), "spatial": list(s.spatial),
                            "dtype": s.dtype.name, "initial": list(initial_shape(s))}
                           for i, s in self.stores.items()],
                "loops": [{"var": n.var, "lo": str(n.lo), "hi": str(n.hi),
                           "until": {"bound": n.bound, "done": n.done, "at": str(n.at)}
                           if isinstance(n, While) else None} for n in self.loops],
                "hosts": list(self.hosts), "sources": list(self.sources),
                "sinks": list(self.sinks), "untils": dict(self.sdg.untils),
                "devices": None if self.layout is None else {
                    "mesh": {str(a): int(n) for a, n in self.layout.mesh.shape.items()},
                    "shard": dict(self.layout.shard),
                    "device_peak_bytes": self.device_peak_bytes}}


def _entry(e) -> str:
    return str(e[1]) if e[0] == "p" else f"{e[1]}:+{e[2].length}"
