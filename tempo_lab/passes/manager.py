"""The pass manager: passes are registered functions ``SDG -> SDG`` that edit a copy of the graph
through an ``Editor``, which records every created, erased and replaced op with the pass and the
op it came from. The manager checks the SDG's invariants after each pass (always in tests, on
request otherwise) and keeps a ``PassTrace`` of before/after graphs, edits and times.
"""
from __future__ import annotations

import dataclasses
import functools
import heapq
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from ..errors import ArgumentError, InternalError, TempoLabError, user_api, user_location
from ..executors import resolve
from ..ir.callbacks import calls_python
from ..ir.ops import TensorType, flag, infer, norm_dim
from ..ir.sdg import SDG, Edge, Op, read_type
from ..ir.vmap import base_op, in_axes, vdims
from ..stage import Stage
from ..symbolic import Bound, Dim

SCHEMA = "tempo_lab.passtrace/1"


@dataclass(frozen=True)
class Pass:
    name: str
    fn: Callable[[Editor], None]
    switch: str          # the CompileConfig field that turns it on
    doc: str


REGISTRY: dict[str, Pass] = {}


def register(name: str, switch: str):
    """Register ``fn(editor)`` as pass ``name``, enabled by ``CompileConfig.<switch>``."""
    def deco(fn):
        summary = " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())
        REGISTRY[name] = Pass(name, fn, switch, summary)
        return fn
    return deco


@dataclass(frozen=True)
class Event:
    """One recorded edit: ``kind`` is created / erased / replaced / rewritten (an op, in place)
    / reindexed (a read of op ``op``) / dim (a dim the pass made; ``op`` is -1) / note (no
    edit: why the pass left op ``op`` as it is, ``source`` the op it was compared with)."""

    kind: str
    op: int
    source: int | None = None   # created: the op it was made from; replaced: the replacement
    note: str = ""


class Editor:
    """A mutable copy of an SDG that a pass edits through its methods (``ops``, ``edges`` and
    ``dims`` are read-only views), so that every edit is recorded; ``result()`` freezes it."""

    def __init__(self, sdg: SDG, pass_name: str, config=None, bounds=None, dynamic=(),
                 executor=None):
        self.sdg0, self.pass_name = sdg, pass_name
        self.config, self.dynamic = config, set(dynamic)
        self.executor = executor  # the executors.Choice the compilation resolved (or None)
        self._bounds = dict(bounds or {})
        self._dims = sdg.dims
        self._ops: dict[int, Op] = dict(sdg.ops)
        self._in: dict[int, dict[int, Edge]] = {i: {} for i in self._ops}  # dst -> slot -> edge
        self._out: dict[int, set[Edge]] = {i: set() for i in self._ops}
        for e in sdg.edges:
            self._link(e)
        self.outputs = dict(sdg.outputs)
        self.sinks = list(sdg.sinks)
        self.untils = dict(sdg.untils)
        self.ragged = dict(sdg.ragged)  # the ragged pass turns them into guarded boxes
        self.made = dict(sdg.made)
        self.events: list[Event] = []
        # each op -> the op of the SDG before the pass it is (or was made from): ids change
        # when a pass renumbers, so events alone do not say it (PassTrace.origin)
        self.came_from: dict[int, int] = {i: i for i in self._ops}
        self.new_bounds: dict[str, int] = {}  # bounds of dims a pass added (with their values)
        # dim name -> the instances in the order the compiled program holds them (see ragged)
        self.orders: dict[str, np.ndarray] = {}
        self._next = max(self._ops, default=-1) + 1

    # -- queries ------------------------------------------------------------------------------
    @property
    def ops(self):
        return MappingProxyType(self._ops)

    @property
    def edges(self) -> tuple[Edge, ...]:
        return tuple(e for i in sorted(self._in) for _, e in sorted(self._in[i].items()))

    @property
    def dims(self) -> tuple[Dim, ...]:
        return self._dims

    @property
    def bounds(self):
        return MappingProxyType(self._bounds)

    def in_edges(self, i: int) -> list[Edge]:
        return [e for _, e in sorted(self._in[i].items())]

    def out_edges(self, i: int) -> list[Edge]:
        return sorted(self._out[i], key=lambda e: (e.dst, e.slot))

    def roots(self) -> set[int]:
        return set(self.outputs.values()) | set(self.sinks) | set(self.untils.values())

    def role(self, d: Dim) -> str | None:
        return self.made.get(d.name, (None,))[0]

    # -- edits --------------------------------------------------------------------------------
    def _link(self, e: Edge):
        self._in[e.dst][e.slot] = e
        self._out[e.src].add(e)

    def _unlink_inputs(self, i: int):
        for e in self._in[i].values():
            self._out.get(e.src, set()).discard(e)
        self._in[i] = {}

    def add(self, op: Op, inputs: list[Edge], source: int | None, note: str = "") -> int:
        """Add ``op`` (its id is assigned here) reading ``inputs`` (their dst is filled in)."""
        i = self._next
        self._next += 1
        scope = op.scope or (self._ops[source].scope if source in self._ops else ())
        self._ops[i] = Op(i, op.kind, op.domain, op.type, dict(op.attrs), op.loc, op.name, scope)
        self._in[i], self._out[i] = {}, set()
        for slot, e in enumerate(inputs):
            self._link(Edge(i, e.src, slot, e.index, e.cond, e.loc))
        self.events.append(Event("created", i, source, note))
        if source in self.came_from:
            self.came_from[i] = self.came_from[source]
        return i

    def erase(self, i: int, note: str = ""):
        self._unlink_inputs(i)
        self._ops.pop(i)
        self._in.pop(i)
        self._out.pop(i)  # a read of it left behind is a bug check_invariants reports
        self.events.append(Event("erased", i, None, note))

    def rewrite(self, i: int, op: Op, inputs: list[Edge], note: str = ""):
        """Put ``op`` (with id ``i``) in place of op ``i``, reading ``inputs``."""
        self._unlink_inputs(i)
        self._ops[i] = self._scoped(i, op)
        for e in inputs:
            self._link(Edge(i, e.src, e.slot, e.index, e.cond, e.loc))
        self.events.append(Event("rewritten", i, None, note))

    def update(self, i: int, op: Op, note: str = ""):
        """Put ``op`` (with id ``i``: new attributes, type, domain or name) in place of op
        ``i``; its reads stay."""
        self._ops[i] = self._scoped(i, op)
        self.events.append(Event("rewritten", i, None, note))

    def _scoped(self, i: int, op: Op) -> Op:
        """``op`` in place of op ``i`` keeps ``i``'s ``tl.scope`` unless it has its own."""
        return op if op.scope or not self._ops[i].scope else dataclasses.replace(
            op, scope=self._ops[i].scope)

    def reindex(self, e: Edge, index: tuple, note: str = "", src: int | None = None):
        """The read ``e`` at another index (a pass that changes the producer's domain), of
        another producer ``src`` if given."""
        self._out[e.src].discard(e)
        src = e.src if src is None else src
        self._link(Edge(e.dst, src, e.slot, tuple(index), e.cond, e.loc))
        self.events.append(Event("reindexed", e.dst, src, note))

    def replace(self, old: int, new: int, note: str = ""):
        """Make every reader of ``old`` read ``new`` instead (same domain and type), then erase
        ``old``. Reads keep their index: ``new`` must have ``old``'s domain."""
        if self._ops[old].domain != self._ops[new].domain:
            raise TempoLabError(f"internal: pass {self.pass_name} replaced op {old} by op {new} "
                                "with another domain")
        for e in list(self._out[old]):
            self._out[old].discard(e)
            self._link(Edge(e.dst, new, e.slot, e.index, e.cond, e.loc))
        self.outputs = {k: new if v == old else v for k, v in self.outputs.items()}
        self.sinks = [new if s == old else s for s in self.sinks]
        self.untils = {k: new if v == old else v for k, v in self.untils.items()}
        self.events.append(Event("replaced", old, new, note))
        self.erase(old, note)

    def note(self, i: int, text: str, other: int | None = None):
        """Record why the pass left op ``i`` alone (shown with the pass's edits); the text
        starts with the op's label, as ids may change when the pass renumbers."""
        op = self._ops[i]
        self.events.append(Event("note", i, other, f"{op.label} ({op.kind}): {text}"))

    def add_dim(self, role: str, of: Dim, value: int, in_place: bool = False) -> Dim:
        """A new dim of ``role`` (see ``ir.sdg.ROLES``) made from ``of``, with bound ``value``:
        right after ``of`` in universe order, or ``in_place`` of it. Its name is ``of``'s with
        a suffix, numbered if a dim or bound of that name exists already."""
        suffix = {"blocks": "_tile", "parts": "_blk"}[role]
        d = self.new_dim(of.name + suffix, of, value, in_place, f"{role} of {of}")
        self.made[d.name] = (role, of.name)
        return d

    def new_dim(self, name: str, after: Dim, value: int, in_place: bool = False,
                why: str = "") -> Dim:
        """A dim named ``name`` (numbered if a dim or bound of that name exists) with bound
        ``value``, right after ``after`` in universe order (or in its place); without a role it
        is scheduled and vectorised like the user's dims."""
        taken = {d.name for d in self._dims} | {b.lower() for b in self._bounds}
        base, k = name, 1
        while name in taken:
            k += 1
            name = f"{base}{k}"
        d = Dim(name)
        at = self._dims.index(after)
        self._dims = self._dims[:at + (not in_place)] + (d,) + self._dims[at + 1:]
        self.new_bounds[d.bound.name] = self._bounds[d.bound.name] = value
        self.events.append(Event("dim", -1, None, f"{why}: {name} < {value}"))
        return d

    def set_bound(self, d: Dim, value: int):
        """A larger bound for a dim this pass made (a second range tiled along it)."""
        self.new_bounds[d.bound.name] = self._bounds[d.bound.name] = value

    def renumber(self):
        """Number the ops in a topological order again (producers before readers, except the
        branches of placeholders), keeping the old order where it allows: later passes,
        demand and fusion rely on it. For a pass whose new ops are read by an old one."""
        deps = {i: set() if self._ops[i].closes_cycles else {e.src for e in self._in[i].values()}
                for i in self._ops}
        readers: dict[int, list[int]] = {i: [] for i in self._ops}
        for i, ds in deps.items():
            for d in ds:
                readers[d].append(i)
        ready = [i for i, ds in deps.items() if not ds]
        heapq.heapify(ready)
        new: dict[int, int] = {}
        while ready:
            i = heapq.heappop(ready)
            new[i] = len(new)
            for r in readers[i]:
                deps[r].discard(i)
                if not deps[r]:
                    heapq.heappush(ready, r)
        if len(new) != len(self._ops):
            raise TempoLabError(f"internal: pass {self.pass_name} made a cycle without a "
                                "placeholder")
        edges = self.edges
        self._ops = {new[i]: dataclasses.replace(op, id=new[i])
                     for i, op in sorted(self._ops.items(), key=lambda kv: new[kv[0]])}
        self._in = {i: {} for i in self._ops}
        self._out = {i: set() for i in self._ops}
        for e in edges:
            self._link(Edge(new[e.dst], new[e.src], e.slot, e.index, e.cond, e.loc))
        self.outputs = {k: new[v] for k, v in self.outputs.items()}
        self.sinks = [new[s] for s in self.sinks]
        self.untils = {k: new[v] for k, v in self.untils.items()}
        self.events = [Event(ev.kind, ev.op if ev.kind in ("erased", "dim")
                             else new.get(ev.op, ev.op),
                             new.get(ev.source, ev.source) if ev.kind in ("replaced", "reindexed",
                                                                          "note")
                             else ev.source, ev.note) for ev in self.events]
        self._next = len(new)
        self.came_from = {new[i]: v for i, v in self.came_from.items() if i in new}

    def result(self) -> SDG:
        return SDG(self._dims, self._ops.values(), self.edges, self.outputs, self.sinks,
                   self.untils, self.made, self.ragged)


# -- invariants -------------------------------------------------------------------------------
def check_invariants(sdg: SDG, after: str, fixed: Mapping[str, int] | None = None) -> None:
    """Structural facts every SDG must satisfy; a violation is a compiler bug, named after the
    pass that caused it. ``fixed``: the values of the bounds that cannot change in a run (not
    a ``tl.until`` or ragged one); types are compared with them written in, since a pass may
    write a shape with a bound's value (a batched axis) that a reader has as the bound."""
    subs = {Bound(k): v for k, v in (fixed or {}).items()}

    def fix(t: TensorType) -> TensorType:
        if not subs:
            return t
        return TensorType(tuple(x if isinstance(x, int) else norm_dim(x.substitute(subs))
                                for x in t.shape), t.dtype, t.weak)

    def bad(msg):
        raise TempoLabError(f"internal error after pass {after!r}: {msg}")

    for e in sdg.edges:
        if e.src not in sdg.ops or e.dst not in sdg.ops:
            bad(f"edge {e} points at a missing op")
        if e.src >= e.dst and sdg.ops[e.dst].kind != "merge":
            bad(f"ids are not topological: {sdg.ops[e.dst].label} (id {e.dst}) reads "
                f"{sdg.ops[e.src].label} (id {e.src}); only a placeholder may read a later op")
        p = sdg.ops[e.src]
        if len(e.index) != len(p.domain):
            bad(f"edge into {sdg.ops[e.dst].label} indexes {p.label} with {len(e.index)} entries "
                f"for {len(p.domain)} dims")
        used = set().union(*(x.dims() for x in e.index)) if e.index else set()
        if not used <= set(sdg.ops[e.dst].domain):
            bad(f"edge into {sdg.ops[e.dst].label} uses dims outside its domain")
    for name, i in sdg.outputs.items():
        if i not in sdg.ops:
            bad(f"output {name!r} points at a missing op")
    for op in sdg.ops.values():
        ins = sdg.in_edges(op.id)
        if [e.slot for e in ins] != list(range(len(ins))):
            bad(f"{op.label} has input slots {[e.slot for e in ins]}")
        if op.kind == "merge" or flag(op.kind, "value"):  # typed by attributes
            continue
        types = [fix(read_type(sdg.ops[e.src], e)) for e in ins]
        have = op
        if vdims(op):  # check the op for one element of its vectorised axes
            for level in in_axes(sdg, op, ins):
                types = [t if a is None else TensorType(t.shape[:a] + t.shape[a + 1:], t.dtype,
                                                        t.weak) for t, a in zip(types, level)]
            have = base_op(op)
        want = fix(infer(op.kind, types, have.attrs))
        if tuple(map(norm_dim, want.shape)) != tuple(map(norm_dim, fix(have.type).shape)) \
                or want.dtype != op.type.dtype:
            bad(f"{op.label} ({op.kind}) has type {op.type} but its inputs give {want}")
    _check_acyclic(sdg, bad)


def _check_acyclic(sdg: SDG, bad):
    """Every cycle must pass through a placeholder (merge): the rest is a DAG."""
    state: dict[int, int] = {}
    for start in sdg.ops:
        if state.get(start):
            continue
        stack = [(start, iter(sdg.in_edges(start)))]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            e = next(it, None)
            if e is None:
                state[node] = 2
                stack.pop()
                continue
            if sdg.ops[e.src].kind == "merge":
                continue
            s = state.get(e.src, 0)
            if s == 1:
                bad(f"a cycle through {sdg.ops[e.src].label} avoids every placeholder")
            if s == 0:
                state[e.src] = 1
                stack.append((e.src, iter(sdg.in_edges(e.src))))


# -- the trace ----------------------------------------------------------------------------------
@dataclass
class PassRecord:
    name: str
    before: SDG
    after: SDG
    events: list[Event] = field(default_factory=list)
    seconds: float = 0.0
    new_bounds: dict[str, int] = field(default_factory=dict)
    orders: dict = field(default_factory=dict)
    came_from: dict[int, int] = field(default_factory=dict)  # after's op -> before's op

    def count(self, kind: str) -> int:
        return sum(1 for e in self.events if e.kind == kind)


class PassTrace(Stage):
    """Every pass that ran: its before and after SDG, what it created, erased and replaced (with
    the op each new op came from), and how long it took."""

    def __init__(self, initial: SDG, records: list[PassRecord]):
        self.initial, self.records = initial, list(records)

    @property
    def new_bounds(self) -> dict[str, int]:
        """Bounds of the dims the passes added, with their values for this compilation."""
        return {k: v for r in self.records for k, v in r.new_bounds.items()}

    @functools.cached_property
    def orders(self) -> dict:
        """Dim name -> the order a pass put its instances in (outputs come back in it)."""
        return {k: v for r in self.records for k, v in r.orders.items()}

    @property
    def final(self) -> SDG:
        return self.records[-1].after if self.records else self.initial

    @user_api
    def origin(self, i: int) -> int | None:
        """The op of the initial SDG that op ``i`` of the final one is, or was made from
        (through every pass's new ops and renumbering); None for an op made from nothing."""
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or i not in self.final.ops:
            raise ArgumentError(f"origin({i!r}): give the id of an op of the final SDG "
                                f"(prog.sdg.ops has {len(self.final.ops)}, e.g. "
                                f"{min(self.final.ops)})", user_location())
        for r in reversed(self.records):
            if r.came_from:  # (a trace saved before passes recorded it: ids as they are)
                i = r.came_from.get(i)
            if i is None:
                return None
        return i

    def __repr__(self) -> str:
        return (f"PassTrace(passes={len(self.records)}, ops={len(self.initial.ops)}->"
                f"{len(self.final.ops)})")

    def __len__(self):
        return len(self.records)

    def __getitem__(self, k) -> PassRecord:
        return self.records[k]

    def _sections(self):
        rows = [f"{r.name}: ops {len(r.before.ops)}->{len(r.after.ops)}, created "
                f"{r.count('created')}, erased {r.count('erased')}, replaced "
                f"{r.count('replaced')}" for r in self.records]
        edits = []
        for r in self.records:
            for ev in r.events:
                src = f" from {ev.source}" if ev.kind == "created" and ev.source is not None \
                    else f" by {ev.source}" if ev.kind == "replaced" else ""
                edits.append(f"{r.name}: {ev.kind} %{ev.op}{src}"
                             + (f" ({ev.note})" if ev.note else ""))
        return [("passes", rows), ("edits", edits)]

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "initial": self.initial.to_dict(),
                "passes": [{"name": r.name, "seconds": r.seconds,
                            "ops_before": len(r.before.ops), "ops_after": len(r.after.ops),
                            "events": [{"kind": e.kind, "op": None if e.kind == "dim" else e.op,
                                        "source": e.source, "note": e.note}
                                       for e in r.events],  # a dim event has no op: null
                            "came_from": {str(k): v for k, v in r.came_from.items()},
                            "after": r.after.to_dict()} for r in self.records]}


def run_passes(sdg: SDG, config, check: bool = False, bounds=None,
               dynamic=(), executor=None) -> tuple[SDG, PassTrace]:
    """Run the passes ``config.enabled_passes`` names, in order (``ragged`` first whenever a
    bound is ragged), recording a PassTrace. ``bounds`` are
    the compiled bound values; ``dynamic`` names the data-dependent ones; ``executor`` is the
    ``executors.Choice`` the compilation resolved ``config.executor`` to (``ed.executor``;
    None: resolved here, the same way)."""
    if executor is None:
        executor = resolve(config.executor, calls_python(sdg.ops),
                           config.device_memory_budget is not None)
    records, bounds = [], dict(bounds or {})
    first = ["ragged"] if sdg.ragged else []  # not optional: executors run boxes only
    for name in first + list(config.enabled_passes):
        p = REGISTRY[name]
        ed = Editor(sdg, name, config, bounds, dynamic, executor)
        t0 = time.perf_counter()
        try:
            p.fn(ed)
            after = ed.result()
        except TempoLabError:
            raise
        except Exception as e:
            before = ", ".join(r.name for r in records) or "none"
            raise InternalError(f"internal error in pass {name!r} (the passes before it: "
                                f"{before}): {type(e).__name__}: {e}; "
                                + (f"turn the pass off with CompileConfig({p.switch}=False) "
                                   "and " if p.switch else "") + "please report it") from e
        dt = time.perf_counter() - t0
        if check:
            check_invariants(after, name, {
                k: v for k, v in {**bounds, **ed.new_bounds}.items()
                if k not in dynamic and k not in after.untils and k not in after.ragged})
        records.append(PassRecord(name, sdg, after, ed.events, dt, ed.new_bounds, ed.orders,
                                  {i: v for i, v in ed.came_from.items() if i in after.ops}))
        bounds.update(ed.new_bounds)
        sdg = after
    return sdg, PassTrace(records[0].before if records else sdg, records)
