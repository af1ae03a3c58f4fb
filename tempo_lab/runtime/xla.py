"""The XLA-loop executor: the whole loop AST as one jitted JAX program.

Every store gets a static shape for the run's bounds (point and ring stores already have one; a
growing store is allocated at its padded size class at once), so the loop nest can be traced
into ``lax`` loops: a ``For`` becomes ``lax.fori_loop`` (``lax.while_loop`` when a ``tl.until``
bound can end it early), an ``If`` becomes ``lax.cond``, an ``Exec`` the same kernel body the
other executors jit per statement, traced inline with its index arithmetic as traced integers.
A read of a dynamic range (``0:t+1``) reads the range's size class (the largest it gets in this
run) and masks the rest, as the other executors do. ``Free`` is a no-op: XLA holds every store
for the whole run (its own buffer assignment reuses what it can inside).

Point stores written and read within one loop iteration are not stores at all here: the value
stays a traced value, so XLA fuses producer and consumer.

What recompiles: the program is compiled once per *static layout* (store shapes and padded read
sizes), keyed process-wide by the program's structure, so another bound value within the same
size classes (powers of two, or a growing store's 64-point blocks) reuses the compiled
program; bounds are run-time arguments. A ``tl.sink`` or ``tl.source`` is an ordered host callback
(``jax.experimental.io_callback``) into the run's ``Host``; ``executor="auto"`` prefers
generated code for such programs, since a callback at every point serialises the XLA program.
A ``max``/``min`` over a range that can be empty records the first empty point in the loop
state, and the run raises the same error as the other executors when the program returns.
"""
from __future__ import annotations

import functools
import itertools
import math
import re
import time
from collections.abc import Mapping
from contextlib import contextmanager
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback

from ..cache import LRU
from ..ir.ops import flag
from ..ir.sdg import SDG
from ..ir.vmap import base_op
from ..memory.plan import MemoryPlan
from ..schedule import Exec, For, Free, If, Seq, While
from ..symbolic import Const, Dim, as_expr
from ..symbolic import isl as I
from ..symbolic.cond import decide
from ..symbolic.expr import Lin
from ..symbolic.sizes import size_class
from . import index_code as ic
from .host import Host
from .kernels import attrs_key, kernel_body
from .lowered import Lowered, Padded, Stmt
from .sharding import to_host

_OP_SCOPE = re.compile(r"(?:^|/)op(\d+)(?=/|$)")
UNROLL_STEPS = 32  # an inner loop of at most this many steps may be traced once per step
UNROLL_STATEMENTS = 1024  # ... while the program then traces at most this many copies of
# its statements (counted as if a loop split into spans traced all of its body once per span)
PEEL_STATEMENTS = 128  # a loop body of at most this many statements may be traced twice, a
PEEL_SHARE = 20  # larger one when the branches peeling settles are a 20th of its statements
MIN_SPAN = 16  # a loop is split into spans of at least this many steps
BAKED_SIZE = 1024  # constants of at most this many elements become literals of the program
MAX_PROGRAMS = 64  # compiled programs kept process-wide (XLA code only: no SDG, no weights)
_PROGRAMS = LRU(MAX_PROGRAMS)
_RUNS: dict[int, Host] = {}  # the runs in progress by id: a callback gets its run's id as
_RUN_IDS = itertools.count(1)  # an argument of the program, so concurrent runs never mix


class XlaBackend:
    name = "xla"

    def prepare(self, lowered: Lowered, sync: bool, split: int):
        return _Xla(lowered, split)


def _may_be_empty(lowered: Lowered, st: Stmt) -> bool:
    """Whether a ``max``/``min`` statement's range read can be empty for these bounds."""
    op = st.op
    dom = lowered.schedule.domains[op.id]
    if dom.is_empty() or not st.edges:
        return False
    for x in st.edges[0].index:
        if hasattr(x, "stop"):
            most = _max_over(x.start - x.stop, dom, op.domain, lowered.bounds, None)
            if most is not None and most >= 0:
                return True
    return False


def _max_over(e, dom, dims, bounds, default):
    """isl's maximum of ``e`` over ``dom`` for these bounds; ``default`` when no point of
    ``dom`` exists for them."""
    try:
        return I.max_over(e, dom, dims, bounds)
    except ValueError:  # isl answers NaN for an empty set
        return default


class _Xla:
    """The loop AST as one jitted program of ``lax`` loops."""

    how = ["one jitted XLA program: For -> lax.fori_loop (lax.while_loop for a tl.until "
           "bound), If -> lax.cond, each statement's kernel traced inline",
           "bounds are run-time arguments: the program compiles once per layout of store "
           "shapes and padded read sizes"]

    def __init__(self, lowered: Lowered, split: int = 8):
        self.lowered, self.sdg, self.schedule, self.plan = (lowered, lowered.sdg,
                                                            lowered.schedule, lowered.plan)
        self.bounds = lowered.bounds
        self._nodes = [n for n in self.schedule.ast.walk() if isinstance(n, Exec)]
        self.local = _local_values(self.sdg, self.plan, self.schedule.ast,
                                   set(self.sdg.untils.values()))
        self.baked = self._baked()
        self.perms = self._store_perms()
        self.shapes = self._store_shapes()
        self.prefilled = self._prefilled()
        self.split = max(1, int(split))
        self.unrolled = self._unrolled(spans=False)
        while True:  # unrolling may hold stores apart, so that a loop around is not split
            self.unstacked = self._unstacked()
            kept = self._unrolled(spans=True)
            if kept.keys() >= self.unrolled.keys():
                break
            self.unrolled = {k: v for k, v in self.unrolled.items() if k in kept}
        self.zeroed = self._zeroed()
        self.by_point = self._by_point()
        self.pads = [self._static_pads(st) for st in lowered.stmts]
        self._seg_pads: dict[tuple, tuple] = {}
        self._switch: dict[int, dict | None] = {}
        self._described: dict[int, list] = {}  # the Seqs of switched loops (_describe)
        self._ops = sorted({n.op for n in self._nodes})
        self._slot = {i: k for k, i in enumerate(self._ops)}
        self.checked = {k for k, st in enumerate(lowered.stmts)
                        if flag(st.op.kind, "nonempty") and _may_be_empty(lowered, st)}
        self._ndom = max((len(st.op.domain) for st in lowered.stmts), default=0)
        self._fn = None  # the compiled program (jax.stages.Compiled), cached process-wide
        self._cached = None  # the device arrays of the last run, reused by op_seconds
        self.source = "\n".join(self._describe(self.schedule.ast, 0, {}))

    # -- static layout --------------------------------------------------------------------
    def _baked(self) -> set[int]:
        """Small constants (not outputs) written into the program as literals, not held in
        stores: XLA then sees their values (``1 / (1 + exp(-z))`` stays a sigmoid with a
        constant one; passed in as a run-time value, the fused kernel was measured 7x slower)."""
        outputs = set(self.sdg.outputs.values())
        return {i for i, s in self.plan.storages.items()
                if (op := self.sdg.ops[i]).kind == "const" and not op.domain
                and i not in outputs and np.size(op.attrs["value"]) <= BAKED_SIZE
                and np.shape(op.attrs["value"]) == tuple(s.spatial)}

    def _literal(self, op: int):
        o = self.sdg.ops[op]
        return jnp.asarray(np.asarray(o.attrs["value"], o.type.dtype))

    def _store_perms(self) -> dict[int, tuple]:
        """Stores held in another order of axes than the logical one (point axes, then value
        axes): a store that a ``transpose`` reads over a range is held in the order that
        transpose gives, after the axes the read indexes by point. A step's read of keys over
        ``0:t+1`` is then a slice in the order attention contracts it; held in the logical
        order, every step copied the slice into that order (the transpose XLA now folds away
        cost a fifth of a decode step at 1024 keys). Not under a mesh (the stores' shardings
        are in the logical order) and not for a ``tl.until`` condition."""
        if self.lowered.layout is not None:
            return {}
        skip = self.local | self.baked | set(self.sdg.untils.values())
        found: dict[int, tuple | None] = {}
        for st in self.lowered.stmts:
            if st.op.kind != "transpose" or len(st.reads) != 1 or st.reads[0].src in skip:
                continue
            r = st.reads[0]
            order = _read_order(st, len(self.plan.storages[r.src].spatial))
            if order is not None and found.setdefault(r.src, order) != order:
                found[r.src] = None  # readers that disagree: the logical order
        return {i: p for i, p in found.items() if p is not None and list(p) != sorted(p)}

    def _store_shapes(self) -> dict[int, tuple]:
        """Every store's shape as held (in the order of ``perms``), and its dtype."""
        out = {}
        for i, s in self.plan.storages.items():
            if i in self.local or i in self.baked:
                continue
            op = self.sdg.ops[i]
            axes = [w if w is not None else s.allocated(k, self.bounds.get(d.bound.name, 1))
                    for k, (d, w) in enumerate(zip(op.domain, s.slots))]
            shape = tuple(axes) + tuple(s.spatial)
            out[i] = (tuple(shape[k] for k in self.perms.get(i, range(len(shape)))), s.dtype)
        return out

    def _prefilled(self) -> set[int]:
        """``from_array`` ops whose store holds every point of the array, and constants held in
        a store: the store starts as the array itself (an argument of the program) instead of
        zeros that the array is copied into, point by point (a loop of as many steps). Not for
        outputs, whose points outside the demanded set must stay zeros."""
        out = set()
        outputs = set(self.sdg.outputs.values())
        for i in self.shapes:
            op, s = self.sdg.ops[i], self.plan.storages[i]
            arr = op.attrs.get({"from_array": "array", "const": "value"}.get(op.kind, ""))
            nd = len(op.domain)
            whole = all(w is None or w >= self.bounds.get(d.bound.name, w + 1)  # a ring that
                        for d, w in zip(op.domain, s.slots))  # holds every point is whole
            if (arr is not None and (nd or op.kind == "const") and i not in outputs and whole
                    and np.ndim(arr) == nd + len(s.spatial)
                    and tuple(np.shape(arr)[nd:]) == tuple(s.spatial)):
                out.add(i)
        return out

    def _prefill(self, op: int, host):
        """The store of a prefilled ``from_array`` op: its array cut or padded with zeros to
        the store's shape; for an op in ``by_point``, its buffers, one argument per point
        (and zeros past the array's end)."""
        shape, dtype = self.shapes[op]
        if op in self.by_point:
            a = self.held_axis(op)
            rest = shape[:a] + shape[a + 1:]
            return tuple(host) + tuple(jnp.zeros(rest, dtype)
                                       for _ in range(shape[a] - len(host)))
        x = host.astype(self.sdg.ops[op].type.dtype).astype(dtype)
        if op in self.perms:
            x = jnp.transpose(x, self.perms[op])
        x = x[tuple(slice(0, n) for n in shape)]
        if x.shape != shape:
            x = jnp.pad(x, [(0, n - m) for n, m in zip(shape, x.shape)])
        x = self._placed(op, x)
        return self._views(op, x)

    def _views(self, op: int, x):
        """An unstacked store's buffers, one per point of its axis, without that axis (carried
        with an axis of size 1, each in-place update of keys in a loop was copied: 3.2 ms a
        decode step against 0.6)."""
        if op not in self.unstacked:
            return x
        a = self.held_axis(op)
        return tuple(lax.index_in_dim(x, j, a, keepdims=False) for j in range(x.shape[a]))

    @functools.cached_property
    def in_place(self) -> set[int]:
        """Prefilled stores that are the host array itself, as it is (same shape and dtype,
        axes in order): the program's argument, the user's array in place on the CPU, not a
        buffer the program allocates."""
        out = set()
        for i in self.prefilled - set(self.perms):
            shape, dt = self.shapes[i]
            arr = self.lowered.host_array(i)
            if arr.dtype == np.dtype(dt) and (tuple(arr.shape) == tuple(shape) or (
                    i in self.by_point and tuple(arr.shape[1:]) == tuple(shape[1:])
                    and arr.shape[0] == shape[0])):
                out.add(i)
        return out

    @functools.cached_property
    def static_bytes(self) -> int:
        """Bytes of the stores the program allocates (not those held in place)."""
        return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
                   for i, (shape, dt) in self.shapes.items() if i not in self.in_place)

    @property
    def predicted_peak_bytes(self) -> int:
        """Every store is allocated for the whole run: the peak is their sum."""
        return self.static_bytes

    def _max(self, op, p: Padded) -> int:
        dom = self.schedule.domains[op.id]
        if dom.is_empty() or p.orig is None:
            return 1
        return max(1, _max_over(p.orig, dom, op.domain, self.bounds, 1))

    def _static_pads(self, st: Stmt, seg: tuple = ()) -> tuple:
        """Padded sizes for every symbolic length of a statement, fixed for the whole run (or
        for one segment of a split loop, ``seg``: (loop variable, its largest value) pairs): a
        range read at its largest size class; a value's symbolic axes at its store's size."""
        pads = []
        for r in st.reads:
            src = self.plan.storages[r.src]
            for e in r.entries:
                if e[0] == "s":
                    p = e[2]
                    pads.append(p.cap if p.cap is not None else _in_segment(p, seg) or
                                size_class(self._max(st.op, p)))
            for j, c in enumerate(r.cut):
                if c is not None:
                    pads.append(r.src in self.local and _in_segment(c, seg) or src.spatial[j])
        own = self.plan.storages.get(st.op.id)
        for j, x in enumerate(st.out):
            if isinstance(x, Padded):
                seg_pad = st.op.id in self.local and _in_segment(x, seg)
                pads.append(seg_pad or (own.spatial[j] if own is not None else
                                        x.cap if x.cap is not None else
                                        size_class(self._max(st.op, x))))
        return tuple(pads)

    def pads_for(self, s: int, seg: tuple) -> tuple:
        if not seg:
            return self.pads[s]
        key = (s, seg)
        if key not in self._seg_pads:
            self._seg_pads[key] = self._static_pads(self.lowered.stmts[s], seg)
        return self._seg_pads[key]

    def segments(self, node: For, whole: bool = True) -> list[tuple[int, int]]:
        """How a loop is split so that range reads growing with its variable are padded per
        segment, not to their largest size: [(first, end)] with equal static spans, or [] to
        keep it whole (no such read, a bound that depends on another loop, or, with
        ``whole``, every such read a whole buffer read in place: a slice per segment would
        be copied, at about twice the cost of reading the whole buffer). Loops inside are
        traced once per segment, their reads padded for it too."""
        if self.split < 2 or node.step != 1 or node.hi.dims() or node.lo.dims():
            return []
        v = Dim(node.var)
        grows = any(_offset(p, v) is not None
                    for n in node.body.walk() if isinstance(n, Exec)
                    for st in self.lowered.stmts_of(n) for r in st.reads
                    if r.src in self.shapes and not (whole and self._in_place(st, r))
                    for p in r.padded() if p.cap is None)
        if not grows:
            return []
        classes = {b: size_class(n) for b, n in self.bounds.items()}
        hi = node.hi.evaluate(classes)
        span = -(-hi // self.split)
        if span < MIN_SPAN:
            return []
        return [(k * span, (k + 1) * span) for k in range(self.split)]

    def _unrolled(self, spans: bool) -> dict[int, tuple[int, int]]:
        """Inner loops traced once per step, by ``id``: (first, end). An inner loop whose
        variable picks a point of a store that the enclosing loop does not write (a layer's
        weights, read at ``n`` in the loop over layers inside the loop over steps) reads it
        by a dynamic index, which XLA copies out at every step; with the variable a constant,
        each layer's weights can be a buffer of their own (``_unstacked``), read in place.
        Only loops whose bounds are fixed numbers for these bounds, with few steps, outside
        a ``tl.until`` loop's bound, and only while the program stays small: XLA's compile
        time grows with the copies traced, ``spans`` counting the spans of the loops around
        (twelve layers in eight spans of the decode loop: compiled in 10.3 s against 2.6 s,
        for a step 18 % faster; with their keys and values held apart too, the loop is not
        split, and unrolled they ran 1.34 ms a token against 1.97, first run 3.1 s against
        4.3)."""
        return {id(node): (node.lo.evaluate(self.bounds), node.hi.evaluate(self.bounds))
                for node, loops in _nodes_in_loops(self.schedule.ast)
                if isinstance(node, For) and loops and self._unrolls(node, loops, spans)}

    def _unrolls(self, node: For, loops: tuple, spans: bool) -> bool:
        lo, hi = as_expr(node.lo), as_expr(node.hi)
        if (isinstance(node, While) or node.step != 1 or lo.dims() or hi.dims()
                or any(b.name in self.sdg.untils for b in lo.bounds() | hi.bounds())):
            return False
        steps = hi.evaluate(self.bounds) - lo.evaluate(self.bounds)
        execs = [n for n in node.body.walk() if isinstance(n, Exec)]
        copies = steps * len(execs) * (math.prod(max(1, len(self.segments(f))) for f in loops)
                                       if spans else 1)
        if not 0 < steps <= UNROLL_STEPS or copies > UNROLL_STATEMENTS:
            return False
        v, written = Dim(node.var), set(_writes(self, loops[-1]))
        return any(e[0] == "p" and v in as_expr(e[1]).dims()
                   for n in execs for st in self.lowered.stmts_of(n) for r in st.reads
                   if r.src not in written and r.src in self.shapes for e in r.entries)

    def _unstacked(self) -> dict[int, int]:
        """Stores held as one buffer per point of one axis (the logical axis, by store): those
        every statement reads, and writes, at a point of that axis that is a constant where
        it is traced (in unrolled loops: a layer's weights, or its keys and values, at
        ``n``). XLA copies a slice of a stacked buffer out at every step, even a constant
        slice of a buffer the loop never writes; a buffer of its own is read in place
        (measured: a two-layer MLP step 0.23 ms from a stacked buffer, 0.11 from one buffer
        per layer). Not for outputs, ``tl.until`` conditions or under a mesh."""
        if self.lowered.layout is not None:
            return {}
        skip = set(self.sdg.outputs.values()) | set(self.sdg.untils.values())
        found: dict[int, int | None] = {}
        for node, loops in _nodes_in_loops(self.schedule.ast):
            if not isinstance(node, Exec):
                continue
            consts = {Dim(f.var) for f in loops if id(f) in self.unrolled}
            for st in self.lowered.stmts_of(node):
                for r in st.reads:
                    if r.src in self.shapes:
                        a = _constant_at([e[1] if e[0] == "p" else Const(0) for e in r.entries],
                                         consts)
                        if found.setdefault(r.src, a) != a:
                            found[r.src] = None
                if node.op in self.shapes and node.op not in self.prefilled:
                    a = None if st.slots is None else _constant_at(st.slots, consts)
                    if found.setdefault(node.op, a) != a:
                        found[node.op] = None
        return {i: a for i, a in found.items() if a is not None and i not in skip}

    def _zeroed(self) -> set[tuple[int, int]]:
        """(statement, read) pairs whose padding is known to hold zeros, so that no op masks
        it (``jax_ops.Zeroed``): a range read from the start of a store to past the
        point written at this step, in the loop that writes that store one point a step in
        order (a loop run once: outside any other loop, with only unrolled ones inside it),
        of a store that starts as zeros (not prefilled, no ring on that axis): what lies
        beyond is not written yet. And a value a transpose or a squeeze makes of such a read.
        Attention's values are then read in place at full length; masked, each step copied
        them."""
        written: dict[int, set] = {}  # store -> {(loop, axis)} along which every write is in order
        where: dict[int, For] = {}  # statement -> the one loop not unrolled around it
        made: dict[int, list[int]] = {}  # op -> its statements
        for node, loops in _nodes_in_loops(self.schedule.ast):
            if not isinstance(node, Exec):
                continue
            outer = [f for f in loops if id(f) not in self.unrolled]
            if outer and outer[0] is not loops[0]:  # traced again per step of an unrolled loop
                outer = []
            for k in self.lowered.of_exec.get(id(node), ()):
                made.setdefault(node.op, []).append(k)
                if len(outer) == 1:
                    where[k] = outer[0]
                st = self.lowered.stmts[k]
                if node.op not in self.shapes:
                    continue
                slots = self.plan.storages[node.op].slots
                axes = set() if len(outer) != 1 or st.slots is None or node.op in (
                    self.prefilled) else {(id(outer[0]), j) for j, e in enumerate(st.slots)
                                         if as_expr(e) == Dim(outer[0].var) and slots[j] is None}
                written[node.op] = written.get(node.op, axes) & axes
        found: set[tuple[int, int]] = set()
        for _ in range(2):  # a value made of a zeroed read, read later in the same step
            for k, st in enumerate(self.lowered.stmts):
                for i, r in enumerate(st.reads):
                    if r.src in self.local:
                        ok = r.src in made and all(
                            flag(self.lowered.stmts[j].op.kind, "keeps_zeros") and (j, 0) in found
                            for j in made[r.src])
                    else:
                        ok = k in where and r.src in written and self._past_written(
                            r, where[k], written[r.src])
                    if ok:
                        found.add((k, i))
        return found

    @staticmethod
    def _past_written(r, loop: For, written: set) -> bool:
        """Whether every range of a read runs from the start of an axis that ``loop`` writes
        in order to past the point written at this step (``0:t+1``)."""
        ranges = [(j, e) for j, e in enumerate(r.entries) if e[0] == "s"]
        return bool(ranges) and all(c is None for c in r.cut) and all(
            e[3] is None and as_expr(e[1]) == Const(0) and (id(loop), j) in written
            and (_offset(e[2], Dim(loop.var)) or 0) >= 1 for j, e in ranges)

    def held_axis(self, op: int) -> int:
        """The axis of an unstacked store, in the order it is held, whose point picks the
        buffer."""
        a = self.unstacked[op]
        return self.perms[op].index(a) if op in self.perms else a

    def _in_place(self, st: Stmt, r) -> bool:
        """Whether a read is a whole buffer, read without a copy: of an unstacked store, at a
        point of the unstacked axis only, every range from the start over the whole axis."""
        if r.src not in self.unstacked or any(c is not None for c in r.cut):
            return False
        shape = self.shapes[r.src][0]
        perm = self.perms.get(r.src, range(len(shape)))
        for j, e in enumerate(r.entries):
            if e[0] == "p" and j != self.unstacked[r.src]:
                return False
            if e[0] == "s" and (e[3] is not None or as_expr(e[1]) != Const(0)
                                or e[2].pad(self._max(st.op, e[2]))
                                != shape[list(perm).index(j)]):
                return False
        return True

    def switched(self, node: For) -> dict | None:
        """How a split loop runs as one loop: for each ``Seq`` in its body (by ``id``), its
        children in order, a ``Run`` for those whose reads are padded per segment (traced
        once per segment under one ``lax.switch`` on the segment of the step) with what
        reads what they compute, a node for the rest (traced once). None keeps one loop per
        segment: a split loop inside, or a value computed per segment read outside its run.
        XLA compiles each copy traced, so only the work that differs per segment is copied
        (one loop per segment compiled all of Llama's decode step eight times)."""
        if id(node) not in self._switch:
            self._switch[id(node)] = self._switch_plan(node)
        return self._switch[id(node)]

    def _switch_plan(self, node: For) -> dict | None:
        segs = [((node.var, end - 1),) for _, end in self.segments(node)]
        if any(isinstance(n, For) and self.segments(n) for n in node.body.walk()):
            return None
        varies = {k: len({self.pads_for(k, s) for s in segs}) > 1
                  for k in range(len(self.lowered.stmts))}

        def execs(n):
            return [x for x in n.walk() if isinstance(x, Exec)]

        def stmts(n):
            return [k for x in execs(n) for k in self.lowered.of_exec.get(id(x), ())]

        def shaped(n):  # values local to the loop whose shape differs per segment
            out = set()
            for k in stmts(n):
                st = self.lowered.stmts[k]
                m = sum(isinstance(x, Padded) for x in st.out)
                if st.op.id in self.local and m and len(
                        {self.pads_for(k, s)[-m:] for s in segs}) > 1:
                    out.add(st.op.id)
            return out

        def ops(n):
            return [x.op for x in execs(n)]

        def reads(n):
            return {r.src for k in stmts(n) for r in self.lowered.stmts[k].reads}

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
                    if (any(varies[k] or k in self.checked for k in stmts(n))
                            or any(flag(self.sdg.ops[o].kind, "effect") for o in ops(n))
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
            if after & made:
                return None
            mine = {o for n in run for o in ops(n)} & self.local
            found.append(Run(tuple(run), tuple(sorted(mine & after))))
        return {k: [found[p] if isinstance(p, int) else p for p in parts]
                for k, parts in plan.items()}

    def copies_only(self, node: For) -> bool:
        """Whether a loop only copies arrays into prefilled stores: it is not run (its
        statements are counted)."""
        body = _items(node.body)
        return (not isinstance(node, While) and node.step == 1 and bool(body)
                and not any(s.name in self.sdg.untils for s in node.hi.bounds())
                and all(isinstance(n, Exec) and n.op in self.prefilled for n in body))

    def peeled(self, node: For, lower: dict) -> bool:
        """Whether the loop's first step is traced apart from the rest (``_peels``); only a
        ``lax.fori_loop`` that is not split into segments."""
        return (not isinstance(node, While) and node.step == 1 and not self.segments(node)
                and not any(s.name in self.sdg.untils for s in node.hi.bounds())
                and _peels(self, node, lower))

    def _key(self) -> tuple:
        sdg = self.sdg
        ops = tuple((o.id, o.kind, attrs_key(o), str(o.type), tuple(d.name for d in o.domain),
                     str(o.attrs.get("expr")), np.shape(o.attrs.get("array", ())))
                    for o in sdg.ops.values())
        edges = tuple((e.dst, e.src, e.slot, tuple(map(str, e.index)), str(e.cond))
                      for e in sdg.edges)
        return (ops, edges, tuple(sorted(sdg.outputs.items())), self.schedule.code(),
                tuple(sorted((i, s.slots) for i, s in self.plan.storages.items())),
                tuple(sorted((i, sh, str(dt)) for i, (sh, dt) in self.shapes.items())),
                tuple(sorted(self.perms.items())), tuple(sorted(self.unstacked.items())),
                tuple(sorted(self.by_point)),
                tuple(sorted(self.local)), tuple(sorted(self.sdg.untils.items())),
                tuple((i, np.asarray(self.sdg.ops[i].attrs["value"]).tobytes())
                      for i in sorted(self.baked)),
                tuple(self.pads), tuple(sorted(self.checked)),
                tuple((tuple(self.segments(n)), self.unrolled.get(id(n)))
                      for n in self.schedule.ast.walk() if isinstance(n, For)),
                None if self.lowered.layout is None else self.lowered.layout.key())

    # -- stage --------------------------------------------------------------------------------
    def sections(self):
        stores = [f"{self.sdg.ops[i].label}: {dt.name if hasattr(dt, 'name') else dt}"
                  f"{list(sh)}" + (f" (axes held in the order {list(self.perms[i])})"
                                   if i in self.perms else "")
                  + (f" (one buffer per point of axis {self.unstacked[i]})"
                     if i in self.unstacked else "")
                  + (" (the host array in place: not allocated)" if i in self.in_place else "")
                  for i, (sh, dt) in sorted(self.shapes.items())]
        local = [self.sdg.ops[i].label for i in sorted(self.local)]
        return [("static stores (allocated for the whole run)", stores),
                ("values kept in registers (written and read in one iteration)", local),
                ("source", self.source.splitlines())]

    def to_dict(self) -> dict:
        return {"static_bytes": self.static_bytes, "in_place": sorted(self.in_place),
                "static_stores": {str(i): list(sh) for i, (sh, _) in sorted(self.shapes.items())},
                "store_axis_order": {str(i): list(p) for i, p in sorted(self.perms.items())},
                "unstacked": {str(i): a for i, a in sorted(self.unstacked.items())},
                "local": sorted(self.local), "source": self.source.splitlines()}

    def _describe(self, node, d, lower) -> list[str]:
        """The program as traced (``lower``: the loops' ranges, as in ``_Trace``)."""
        pad = "  " * d
        if isinstance(node, Seq):
            out = []
            for n in self._described.get(id(node), node.body):
                if isinstance(n, Run):
                    out.append(f"{pad}lax.switch(the span of the step):  # traced once per "
                               "span, its reads padded for it")
                    out += [x for m in n.nodes for x in self._describe(m, d + 1, lower)]
                else:
                    out += self._describe(n, d, lower)
            return out
        if isinstance(node, For) and self.copies_only(node):
            return [f"{pad}{' '.join(self.schedule._stmt(n).split())}  [store, filled with the "
                    "whole array at the start: no loop]" for n in node.body.walk()
                    if isinstance(n, Exec)]
        if isinstance(node, For) and id(node) in self.unrolled:
            first, end = self.unrolled[id(node)]
            return [f"{pad}for {ic.var(node.var)} in {first}..{end}:  # unrolled: each step "
                    "traced with its own constant"] + self._describe(node.body, d + 1, lower)
        if isinstance(node, For):
            kind = "lax.while_loop" if isinstance(node, While) else "lax.fori_loop"
            segs = self.segments(node)
            plan = self.switched(node) if segs else None
            self._described.update(plan or {})
            peeled = not segs and self.peeled(node, lower)
            note = (f"  # one loop in {len(segs)} spans of {segs[0][1]} steps" if plan else
                    f"  # {len(segs)} loops of {segs[0][1]} steps, ranges padded per loop"
                    if segs else "  # the first step is traced apart; below, the others"
                    if peeled else "  # not split: its growing reads are whole buffers, read "
                    "in place" if self.segments(node, False) else "")
            first = as_expr(node.lo) + 1 if peeled else node.lo
            return [f"{pad}{kind}({ic.var(node.var)} in {ic.expr_src(node.lo)}.."
                    f"{ic.expr_src(node.hi)}):{note}"] + self._describe(
                        node.body, d + 1, _ranged(self, node, lower, first, False))
        if isinstance(node, If):
            if not _has_exec(node):
                return []
            settled = decide(node.cond, lower)
            if settled is not None:  # the loop's range decides it: traced without lax.cond
                sub = node.then if settled else node.orelse
                return [] if sub is None else self._describe(sub, d, lower)
            out = [f"{pad}lax.cond({ic.cond_src(node.cond)}):"] + self._describe(
                node.then, d + 1, lower)
            if node.orelse is not None and _has_exec(node.orelse):
                out += [f"{pad}else:"] + self._describe(node.orelse, d + 1, lower)
            return out
        if isinstance(node, Exec):
            kind = self.sdg.ops[node.op].kind
            what = ("host callback" if flag(kind, "effect") else
                    "value" if node.op in self.local else
                    "constant in the program" if node.op in self.baked else
                    "store, filled with the whole array at the start" if node.op in
                    self.prefilled else "store")
            return [f"{pad}{' '.join(self.schedule._stmt(node).split())}  [{what}]"]
        return []

    # -- tracing ------------------------------------------------------------------------------
    def _program(self):
        names = list(self.sdg.params)

        def program(bvec, hosts, run_id):
            env = {ic.bound(p): bvec[k] for k, p in enumerate(names)}
            hosts = dict(zip(self.lowered.hosts, hosts))
            state = {"s": {i: self._prefill(i, hosts[i]) if i in self.prefilled else
                           self._zeros(i, sh, dt) for i, (sh, dt) in self.shapes.items()},
                     "calls": jnp.zeros(len(self._ops), jnp.int32),
                     "w": {i: jnp.int32(-1) for i in self.sdg.untils.values()},
                     "b": {p: env[ic.bound(p)] for p in self.sdg.untils},
                     "err": jnp.zeros(2 + self._ndom, jnp.int32)}
            ctx = _Trace(self, hosts, run_id)
            state = ctx.node(self.schedule.ast, env, state,
                             {i: self._literal(i) for i in self.baked})
            outs = {i: _logical(state["s"][i], self.perms.get(i))
                    for i in self.sdg.outputs.values() if i in state["s"]}
            # the counters, the bounds as reached and the error in one array: one transfer
            reached = [jnp.asarray(state["b"][p], jnp.int32)[None] for p in self.sdg.untils]
            return outs, jnp.concatenate([_calls(state), *reached, state["err"]])

        return program

    def _zeros(self, op: int, shape, dtype):
        """A store of the program, constrained to its sharding when the program has a mesh
        (XLA's partitioner then splits what computes it)."""
        return self._views(op, self._placed(op, jnp.zeros(shape, dtype)))

    def _placed(self, op: int, x):
        """``x`` as ``op``'s store: constrained to the store's sharding under a mesh."""
        layout = self.lowered.layout
        sharding = None if layout is None else layout.store(op, x.ndim)
        return x if sharding is None else lax.with_sharding_constraint(x, sharding)

    def _compiled(self):
        if self._fn is None:
            args = self._args()
            avals = jax.tree.map(lambda a: (a.shape, str(a.dtype), str(getattr(a, "sharding", ""))),
                                 args)
            precision = jax.config.jax_default_matmul_precision  # part of what compiles
            self._fn = _PROGRAMS.get((self._key(), str(avals), precision), lambda: jax.jit(
                self._program()).lower(*args).compile())
        return self._fn

    def _hosts(self, host: Host | None = None) -> tuple:
        """The host arrays on the device: those of the last run (or new ones)."""
        host = host or Host(self.lowered, cached=self._cached)
        self._cached = host.cached
        return tuple(host.host_points(i) if i in self.by_point else host.host_array(i)
                     for i in self.lowered.hosts)

    def _by_point(self) -> set[int]:
        """Prefilled stores held one buffer per point of their first axis whose array has the
        store's layout there: each point's array is an argument of its own (a view of the
        user's array, in place on the CPU), not a slice the program cuts out, which XLA
        copies (every layer's weights a second time)."""
        out = set()
        for i in self.prefilled & set(self.unstacked):
            shape, dtype = self.shapes[i]
            arr = self.lowered.host_array(i)
            if (self.held_axis(i) == 0 and i not in self.perms and np.dtype(dtype) == arr.dtype
                    and tuple(arr.shape[1:]) == tuple(shape[1:]) and arr.shape[0] <= shape[0]):
                out.add(i)
        return out

    def _args(self) -> tuple:
        """The program's arguments for the compiled bounds: bound values and host inputs."""
        bvec = np.asarray([self.bounds.get(p, 1) for p in self.sdg.params], np.int32)
        return bvec, self._hosts(), np.int32(0)  # run 0: no host to call back

    def hlo(self) -> str:
        """The compiled XLA program as HLO text (after SPMD partitioning on a mesh: the shapes
        are one device's)."""
        return self._compiled().as_text()

    def memory_analysis(self) -> dict[str, int]:
        """XLA's own account of the compiled program's buffers, in bytes by kind (arguments,
        outputs, temporaries, aliased, generated code); empty where the backend gives none.
        It compiles the program if no run has yet."""
        stats = self._compiled().memory_analysis()
        kinds = ("argument", "output", "temp", "alias", "generated_code")
        return {} if stats is None else {
            k: int(getattr(stats, f"{k}_size_in_bytes")) for k in kinds
            if hasattr(stats, f"{k}_size_in_bytes")}

    def op_seconds(self, runs: int = 3) -> dict:
        """Measured seconds per run of each op's statements inside the compiled program (JAX's
        profiler, see ``xla_profile``), keyed by op id; ``"unattributed"``: the rest of the
        run's wall time (loop control, dispatch)."""
        from ..errors import ArgumentError, user_location
        from .xla_profile import seconds_by

        if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
            raise ArgumentError(f"op_seconds(runs={runs!r}): give a positive number of runs",
                                user_location())
        if self.lowered.sources or self.lowered.sinks:
            raise ArgumentError("op_seconds runs the program several times without a run's "
                                "host: it would call the program's tl.sink/tl.source "
                                "callbacks again; profile a copy of the program without them",
                                user_location())
        fn, args = self._compiled(), self._args()
        jax.block_until_ready(fn(*args))  # compiled and warm before anything is measured

        def op_of(path: str):
            m = _OP_SCOPE.findall(path)
            return int(m[-1]) if m else None

        return seconds_by(lambda: jax.block_until_ready(fn(*args)), self.hlo(), op_of, runs)

    def jaxpr(self) -> str:
        """The traced program as a jaxpr (text)."""
        return str(jax.make_jaxpr(self._program())(*self._args()))

    def run(self, host: Host, bounds: Mapping[str, int]):
        host.t0 = time.perf_counter()  # the first run compiles: its time says so
        hosts = self._hosts(host)
        fn = self._compiled()
        bvec = np.asarray([int(bounds.get(p, 1)) for p in self.sdg.params], np.int32)
        run_id = next(_RUN_IDS) % 2**31
        _RUNS[run_id] = host
        try:
            # waits for the program; one transfer of everything it returns
            outs, ints = to_host(fn(bvec, hosts, np.int32(run_id)))
            n = len(self._ops)
            calls, ends, err = np.split(ints, [n, n + len(self.sdg.untils)])
            reached = dict(zip(self.sdg.untils, ends))
        finally:
            del _RUNS[run_id]
        host.raise_error()
        if err[0]:  # the first max/min over an empty range, as the other executors raise it
            s = int(err[1])
            st = self.lowered.stmts[s]
            n = len(st.reads[0].lens([None] * len(st.reads[0].padded())))
            host.check(s, [0] * n, tuple(int(v) for v in err[2:2 + len(st.op.domain)]))
        profile = host.profile(
            "xla", {i: int(calls[k]) for k, i in enumerate(self._ops)}, {},
            [self.static_bytes], "store bytes: the static stores the XLA program allocates for "
                                 "the whole run (one timeline entry); calls: statement "
                                 "instances counted inside the XLA program", synced=True)
        return outs, {k: int(v) for k, v in reached.items()}, profile


def _pinned(ex: _Xla, v, state: dict) -> dict:
    """``state`` with its prefilled stores (the weights) passed through one optimisation
    barrier together with the loop variable ``v``: what the loop computes from a weight alone
    is then not loop-invariant for XLA, which hoisted such values out of the loop and held
    them for the whole run (a float32 copy of a bfloat16 embedding table, 1 GB at Llama's
    widths)."""
    ids = sorted(i for i in ex.prefilled if i in state["s"])
    if not ids:
        return state
    _, bufs = lax.optimization_barrier((v, [state["s"][i] for i in ids]))
    return {**state, "s": {**state["s"], **dict(zip(ids, bufs))}}


def _host_call(method: str, s: int, default=None):
    """A callback into the host of run ``run_id`` (statement ``s``'s ``method``)."""
    def call(run_id, *args):
        return _RUNS[int(run_id)].guarded(method, default)(s, *args)
    return call


def _offset(p: Padded, v: Dim) -> int | None:
    """c when the length is ``v + c``."""
    d = p.length - v
    return d.value if isinstance(d, Const) else None


def _in_segment(p: Padded, seg: tuple) -> int | None:
    """The padded size of a length ``v + c`` in a segment where ``v`` is at most ``top``."""
    for var, top in seg:
        c = _offset(p, Dim(var))
        if c is not None:
            return max(1, top + c)
    return None


def _nodes_in_loops(node, loops: tuple = ()):
    """Every loop and statement of the AST with the loops around it, outermost first."""
    if isinstance(node, Seq):
        for n in node.body:
            yield from _nodes_in_loops(n, loops)
    elif isinstance(node, If):
        yield from _nodes_in_loops(node.then, loops)
        if node.orelse is not None:
            yield from _nodes_in_loops(node.orelse, loops)
    elif isinstance(node, For):
        yield node, loops
        yield from _nodes_in_loops(node.body, loops + (node,))
    elif isinstance(node, Exec):
        yield node, loops


class Run(NamedTuple):
    """Consecutive nodes of a split loop's body traced once per segment (_Xla.switched),
    and the values local to the loop that they compute and later nodes read."""
    nodes: tuple
    values: tuple


def _flat(seq: Seq) -> list:
    """A ``Seq``'s children with the ``Seq``s among them spliced in."""
    return [m for n in seq.body for m in (_flat(n) if isinstance(n, Seq) else [n])]


def _spliced(seq: Seq) -> list:
    """The ``Seq``s that ``_flat`` splices into ``seq``."""
    return [m for n in seq.body if isinstance(n, Seq) for m in [n, *_spliced(n)]]


def _has_exec(node) -> bool:
    return any(isinstance(n, Exec) for n in node.walk())


def _writes(ex: _Xla, node) -> list[int]:
    return sorted({n.op for n in node.walk() if isinstance(n, Exec) and n.op in ex.shapes})


class _Trace:
    """Traces the loop AST into lax control flow; state = {"s": stores, "calls": counters,
    "w": until ops' last written point, "b": until bounds as reached, "err": the first
    max/min over an empty range (1 + statement, then its point)}."""

    def __init__(self, ex: _Xla, hosts: dict, run_id):
        self.ex, self.hosts, self.run_id = ex, hosts, run_id
        self.seg: tuple = ()  # (loop variable, largest value) of the split loops being traced
        # the split loop traced as one loop: (it, its plan (_Xla.switched), its variable)
        self.switch: tuple | None = None
        # the loops being traced: loop variable -> (its first value, whether it is exactly
        # that), so that branches the loop's range settles are traced without a lax.cond
        self.lower: dict[Dim, tuple] = {}

    def node(self, node, env, state, vals):
        ex = self.ex
        if state["b"]:  # bounds as reached so far (a tl.until loop may have ended early)
            env = {**env, **{ic.bound(b): v for b, v in state["b"].items()}}
        if isinstance(node, Seq):
            parts = self.switch[1].get(id(node), node.body) if self.switch else node.body
            for n in parts:
                state = (self.switched(n, env, state, vals) if isinstance(n, Run)
                         else self.node(n, env, state, vals))
            return state
        if isinstance(node, Free):
            return state
        if isinstance(node, Exec):
            return self.exec(node, env, state, vals)
        if isinstance(node, If):
            if not _has_exec(node):
                return state
            settled = decide(node.cond, self.lower)
            if settled is not None:
                sub = node.then if settled else node.orelse
                return state if sub is None else self.node(sub, env, state, vals)
            keys = _writes(ex, node)
            pred = ic.jax_bool(node.cond, env)

            def branch(sub):
                def f(carry):
                    st = _merge(state, keys, carry)
                    if sub is not None:
                        st = self.node(sub, env, st, dict(vals))
                    return _carry(st, keys)
                return f
            carry = lax.cond(pred, branch(node.then), branch(node.orelse),
                             _carry(state, keys))
            return _merge(state, keys, carry)
        if isinstance(node, For):
            return self.loop(node, env, state, vals)
        raise TypeError(node)

    def loop(self, node: For, env, state, vals):
        ex = self.ex
        keys = _writes(ex, node)
        var = ic.var(node.var)
        stop = isinstance(node, While)
        dyn = {b for b in ex.sdg.untils if any(s.name == b for s in node.hi.bounds())}

        def env_of(st, v):
            e = dict(env)
            e.update({ic.bound(b): st["b"][b] for b in ex.sdg.untils})
            e[var] = v
            return e

        def body(v, st):
            st = self.node(node.body, env_of(st, v), _pinned(ex, v, st), dict(vals))
            return st

        if id(node) in ex.unrolled:  # each step traced with its variable a constant
            for v in range(*ex.unrolled[id(node)]):
                with self._from(node, as_expr(v), True):
                    state = self.node(node.body, env_of(state, v), state, dict(vals))
            return state
        lo = ic.jax_int(node.lo, env)
        if not stop and not dyn and node.step == 1:
            hi = ic.jax_int(node.hi, env)
            if ex.copies_only(node):  # nothing to run: count its statements only
                n = jnp.maximum(jnp.int32(hi) - jnp.int32(lo), 0)
                calls = _calls(state)
                for x in _items(node.body):
                    calls = calls.at[ex._slot[x.op]].add(n)
                return {**state, "pending": (), "calls": calls}
            return self._fori(node, env, state, vals, body, keys, lo, hi)

        def cond(c):
            v, _, carry = c
            st = _merge(state, keys, carry)
            return v < ic.jax_int(node.hi, env_of(st, v))

        def wbody(c):  # the bound is set once, when the condition holds (schedule.walk);
            v, ended, carry = c  # the loop runs on while its new end allows
            st = _merge(state, keys, carry)
            if not stop:
                return v + node.step, ended, _carry(body(v, st), keys)
            head, tail = node.split()
            local = dict(vals)
            st = self.node(head, env_of(st, v), st, local)
            b, i = node.bound, node.done
            at = ic.jax_int(node.at, env_of(st, v))
            buf = st["s"][i]
            hit = ~ended & (st["w"][i] >= at) & lax.dynamic_index_in_dim(
                buf, jnp.clip(at, 0, buf.shape[0] - 1), 0, keepdims=False)
            st = {**st, "b": {**st["b"], b: jnp.where(hit, at + 1, st["b"][b])}}
            st = self.node(tail, env_of(st, v), st, local)
            return v + node.step, ended | hit, _carry(st, keys)

        init = (jnp.int32(lo), jnp.bool_(False), _carry(state, keys))
        with self._from(node, node.lo, False):
            _, _, carry = lax.while_loop(cond, wbody, init)
        return _merge(state, keys, carry)

    def switched(self, run: Run, env, state, vals):
        """A run of a split loop's body whose reads are padded per segment: traced once per
        segment, the one of this step chosen by ``lax.switch``."""
        ex = self.ex
        node, plan, v = self.switch
        segments = ex.segments(node)
        keys = sorted({i for n in run.nodes for i in _writes(ex, n)})

        def branch(first, end):
            def f(carry):
                st, local = _merge(state, keys, carry), dict(vals)
                outer, self.seg, self.switch = self.seg, self.seg + ((node.var, end - 1),), None
                old = self.lower
                self.lower = _ranged(ex, node, old, as_expr(first), False)
                try:
                    for n in run.nodes:
                        st = self.node(n, env, st, local)
                finally:
                    self.seg, self.switch, self.lower = outer, (node, plan, v), old
                return _carry(st, keys), tuple(local[i] for i in run.values)
            return f
        span = segments[0][1] - segments[0][0]
        which = jnp.clip((v - segments[0][0]) // span, 0, len(segments) - 1)
        carry, ys = lax.switch(which, [branch(*s) for s in segments], _carry(state, keys))
        vals.update(zip(run.values, ys))
        return _merge(state, keys, carry)

    @contextmanager
    def _from(self, node: For, first, exact: bool):
        """While tracing ``node``'s body: its variable starts at ``first`` (or is exactly
        ``first``)."""
        old = self.lower
        self.lower = _ranged(self.ex, node, old, first, exact)
        try:
            yield
        finally:
            self.lower = old

    def _fori(self, node: For, env, state, vals, body, keys, lo, hi):
        """A loop with fixed bounds as ``lax.fori_loop`` (one per segment of a split loop)."""
        def fbody(v, carry):
            return _carry(body(v, _merge(state, keys, carry)), keys)
        carry = _carry(state, keys)
        segments = self.ex.segments(node)
        lo, hi = jnp.int32(lo), jnp.int32(hi)
        if self.ex.peeled(node, self.lower):
            with self._from(node, node.lo, True):  # the first step, alone
                carry = lax.fori_loop(lo, jnp.minimum(lo + 1, hi),
                                      lambda v, c: fbody(v, c), carry)
            with self._from(node, as_expr(node.lo) + 1, False):
                carry = lax.fori_loop(lo + 1, hi, lambda v, c: fbody(v, c), carry)
        elif not segments:
            with self._from(node, node.lo, False):
                carry = lax.fori_loop(lo, hi, fbody, carry)
        plan = self.ex.switched(node) if segments else None
        if plan is not None:
            def sw_body(v, c):
                old, self.switch = self.switch, (node, plan, v)
                try:
                    return fbody(v, c)
                finally:
                    self.switch = old
            with self._from(node, node.lo, False):
                carry = lax.fori_loop(lo, hi, sw_body, carry)
            segments = []
        outer = self.seg
        for first, end in segments:  # one loop per segment, its reads padded for it
            self.seg = outer + ((node.var, end - 1),)
            a = jnp.clip(lo, first, end)

            def seg_body(v, c):  # a new function each time: JAX caches traces by function
                return fbody(v, c)
            with self._from(node, node.lo, False):
                carry = lax.fori_loop(a, jnp.clip(hi, a, end), seg_body, carry)
        self.seg = outer
        return _merge(state, keys, carry)

    def exec(self, node: Exec, env, state, vals):
        ex = self.ex
        idx = ex.lowered.of_exec[id(node)]
        stmts = [ex.lowered.stmts[k] for k in idx]
        op = ex.sdg.ops[node.op]
        if not stmts:
            return state
        # a merge has one statement per branch: the first whose condition holds is taken,
        # the last when none does; the branches this loop's range rules out are not traced
        taken = []
        for j, k in enumerate(idx):
            settled = True if j == len(idx) - 1 else decide(ex.lowered.stmts[k].cond,
                                                            self.lower)
            if settled is not False:
                taken.append(k)
            if settled:
                break
        # counted in Python, added to the counters in one step at the next carry (_carry):
        # a scatter per statement would multiply the XLA program's size
        state = {**state, "pending": state.get("pending", ()) + (ex._slot[op.id],)}
        if op.id in ex.prefilled or op.id in ex.baked:  # already there: counted only
            return state
        ys = []
        with jax.named_scope(f"op{op.id}"):  # names its instructions (xla_profile)
            for k in taken:
                y, state = self.stmt(k, env, state, vals)
                ys.append(y)
        y = ys[-1]
        for k, v in zip(taken[-2::-1], ys[-2::-1]):
            y = jnp.where(ic.jax_bool(ex.lowered.stmts[k].cond, env), v, y)
        if op.id in ex.local:
            vals[op.id] = y
            return state
        if op.id not in ex.shapes:
            return state
        st0 = stmts[0]
        slots = [ic.jax_int(x, env) for x in st0.slots]
        buf = views = state["s"][op.id]
        upd = y.reshape((1,) * len(slots) + y.shape).astype(y.dtype)
        at = tuple(jnp.int32(s) for s in slots) + (0,) * y.ndim
        if op.id in ex.perms:
            upd, at = jnp.transpose(upd, ex.perms[op.id]), tuple(at[k] for k in ex.perms[op.id])
        if op.id in ex.unstacked:  # the buffer of the point written, a constant here
            a = ex.held_axis(op.id)
            j = _clamped(slots[ex.unstacked[op.id]], len(views))
            upd, at, buf = jnp.squeeze(upd, a), at[:a] + at[a + 1:], views[j]
        buf = lax.dynamic_update_slice(buf, upd.astype(buf.dtype), at)
        if op.id in ex.unstacked:
            buf = views[:j] + (buf,) + views[j + 1:]
        state = {**state, "s": {**state["s"], op.id: buf}}
        if op.id in state["w"]:
            p = ic.jax_int(node.args[0], env) if node.args else 0
            state = {**state, "w": {**state["w"], op.id: jnp.maximum(state["w"][op.id], p)}}
        return state

    def stmt(self, k: int, env, state, vals):
        """Statement ``k``'s value at this point (not yet written anywhere), and the state
        (with the emptiness check of a max/min recorded)."""
        ex = self.ex
        st = ex.lowered.stmts[k]
        op = st.op
        pads = ex.pads_for(k, self.seg)
        reads, out = st.static(pads)
        in_types = tuple(ex.sdg.ops[r.src].type for r in st.reads)
        fn = kernel_body(op, in_types, tuple(p for _, p in reads), out, False, st.levels,
                         tuple(None if r.src in vals else ex.perms.get(r.src) for r in st.reads),
                         tuple((k, i) in ex.zeroed for i in range(len(st.reads))))
        bufs, ints, at = [], [ic.jax_int(x, env) for x in st.ints()], 0
        for r in st.reads:
            if r.src in vals:
                v = vals[r.src]
                bufs.append(v.reshape((1,) * len(r.entries) + v.shape))
            elif r.src in ex.unstacked:  # the buffer of the point read, a constant here
                a = at + ex.unstacked[r.src]
                views = state["s"][r.src]
                bufs.append(jnp.expand_dims(views[_clamped(ints[a], len(views))],
                                            ex.held_axis(r.src)))
                ints[a] = 0
            else:
                bufs.append(state["s"][r.src])
            at += len(r.ints())
        # a tuple of scalars: stacked into one array, every use would be a slice of it
        ints = tuple(jnp.asarray(x, jnp.int32) for x in ints)
        point = [jnp.int32(ic.jax_int(x, env)) for x in st.point]
        host = None
        if flag(op.kind, "array"):
            host = self.hosts[op.id]
        elif op.kind == "dimval":
            host = jnp.asarray(ic.jax_value(st.host, env)).astype(op.type.dtype)
        elif op.kind == "source":
            shape = jax.ShapeDtypeStruct(tuple(op.type.shape), op.type.dtype)
            host = io_callback(_host_call("source_call", k,
                                          lambda: np.zeros(shape.shape, shape.dtype)),
                               shape, self.run_id, tuple(point), ordered=True)
        y = fn(tuple(bufs), ints, host, None)
        if op.kind == "sink" or k in ex.checked:
            r = st.reads[0]
            lens = r.lens([ic.jax_int(p.length, env) for p in r.padded()])
        if op.kind == "sink":
            have = [n for n in lens if n is not None]
            io_callback(_sink_call(k, [n is None for n in lens]), None, self.run_id,
                        tuple(point), y, tuple(have), ordered=True)
        if k in ex.checked:
            axes = _reduced(op, len(lens))
            empty = jnp.bool_(False)
            for a in axes:
                if lens[a] is not None:
                    empty = empty | (jnp.int32(lens[a]) == 0)
            err = state["err"]
            row = jnp.stack([jnp.int32(k + 1), jnp.int32(k)] + point
                            + [jnp.int32(0)] * (err.shape[0] - 2 - len(point)))
            state = {**state, "err": jnp.where((err[0] == 0) & empty, row, err)}
        return y, state


def _read_order(st: Stmt, nspatial: int) -> tuple | None:
    """The order of store axes in which a ``transpose`` statement's range read comes out
    already transposed: the axes it reads by point, then the read's axes (ranges, then
    values) in the order of the statement's output; None when the read has no range or a
    vectorised level does not map it."""
    r = st.reads[0]
    points = [j for j, e in enumerate(r.entries) if e[0] == "p"]
    axes = [j for j, e in enumerate(r.entries) if e[0] == "s"]
    if not axes:
        return None
    axes += [len(r.entries) + k for k in range(nspatial)]
    out = []
    for level in st.levels:  # each vectorised level leads the output with its mapped axis
        if level[0] is None or level[0] >= len(axes):
            return None
        out.append(axes.pop(level[0]))
    perm = tuple(base_op(st.op).attrs["perm"])
    if sorted(perm) != list(range(len(axes))):
        return None
    return tuple(points + out + [axes[p] for p in perm])


def _constant_in(e, consts: set) -> bool:
    """Whether ``e`` is a number once the variables ``consts`` are (and depends on one)."""
    return bool(e.dims()) and e.dims() <= consts and not e.bounds()


def _constant_at(exprs, consts: set) -> int | None:
    """The first position whose index is a number once the variables ``consts`` are, and an
    affine one, which tracing computes in Python (``max``, ``%``: as traced values)."""
    return next((a for a, e in enumerate(exprs) if isinstance(as_expr(e), (Dim, Lin))
                 and _constant_in(as_expr(e), consts)), None)


def _clamped(j, n: int) -> int:
    """A constant index into ``n`` buffers, clamped as a dynamic index is (a point outside
    is read only in a branch that is not taken there)."""
    return min(max(int(j), 0), n - 1)


def _logical(x, perm):
    """A store held in the order ``perm`` back in the logical order."""
    return x if perm is None else jnp.transpose(x, np.argsort(perm))


def _ranged(ex: _Xla, node: For, lower: dict, first, exact: bool) -> dict:
    """``lower`` with ``node``'s variable starting at ``first`` (exactly ``first`` if
    ``exact``); unchanged for a loop whose start moves with a ``tl.until`` bound."""
    if node.step <= 0 or any(b.name in ex.sdg.untils for b in as_expr(node.lo).bounds()):
        return lower
    return {**lower, Dim(node.var): (first, exact)}


def _peels(ex: _Xla, node: For, lower: dict) -> bool:
    """Whether tracing a loop's first step apart settles branches the whole loop cannot
    (``t == 0`` or ``t >= 1`` in a recurrence), so that neither copy has their lax.conds or
    selects: where the body is small (``PEEL_STATEMENTS``) or those branches are at least a
    ``1 / PEEL_SHARE`` of its statements (a chain of recurrences: 46 -> 4.4 ms a run). A large
    body with few of them is not doubled: a 16-layer decode, whose only such branches pick the
    prompt's token, compiled twice as long peeled for no faster a step."""
    whole = _ranged(ex, node, lower, node.lo, False)
    rest = _ranged(ex, node, lower, as_expr(node.lo) + 1, False)

    def settled(c) -> bool:
        return decide(c, whole) is None and decide(c, rest) is not None

    unrolls = {id(f): ex.unrolled[id(f)][1] - ex.unrolled[id(f)][0] for f in
               node.body.walk() if isinstance(f, For) and id(f) in ex.unrolled}
    total = gained = 0
    for n, loops, conds in _execs_under(node.body):
        copies = math.prod(unrolls.get(id(f), 1) for f in loops)
        total += copies
        idx = ex.lowered.of_exec.get(id(n), ())
        if any(settled(c) for c in conds) or any(
                settled(ex.lowered.stmts[k].cond) for k in idx[:-1]):  # a merge's branches
            gained += copies
    return gained > 0 and (total <= PEEL_STATEMENTS or gained * PEEL_SHARE >= total)


def _execs_under(node, loops: tuple = (), conds: tuple = ()):
    """Every statement with the loops and the conditions (of ``If`` nodes) around it."""
    if isinstance(node, Seq):
        for n in node.body:
            yield from _execs_under(n, loops, conds)
    elif isinstance(node, If):
        yield from _execs_under(node.then, loops, conds + (node.cond,))
        if node.orelse is not None:
            yield from _execs_under(node.orelse, loops, conds + (node.cond,))
    elif isinstance(node, For):
        yield from _execs_under(node.body, loops + (node,), conds)
    elif isinstance(node, Exec):
        yield node, loops, conds


def _items(node) -> list:
    return list(node.body) if isinstance(node, Seq) else [node]


def _carry(state, keys):
    return ({i: state["s"][i] for i in keys}, _calls(state), dict(state["w"]),
            dict(state["b"]), state["err"])


def _calls(state):
    """The statement counters with the calls counted since the last carry added."""
    pending = state.get("pending", ())
    if not pending:
        return state["calls"]
    n = state["calls"].shape[0]
    return state["calls"] + jnp.asarray(np.bincount(pending, minlength=n).astype(np.int32))


def _merge(state, keys, carry):
    s, calls, w, b, err = carry
    return {"s": {**state["s"], **s}, "calls": calls, "w": w, "b": b, "err": err}


def _sink_call(s: int, static: list[bool]):
    """The sink callback of statement ``s``: the valid lengths come for the symbolic axes
    only (``static`` marks the others)."""
    def call(run_id, point, y, have):
        it = iter(have)
        lens = [None if st else int(next(it)) for st in static]
        return _RUNS[int(run_id)].guarded("sink")(s, point, y, lens)
    return call


def _reduced(op, ndim: int) -> tuple[int, ...]:
    axis = op.attrs.get("axis")
    if axis is None:
        return tuple(range(ndim))
    return tuple(a % ndim for a in ((axis,) if isinstance(axis, int) else axis))


def _local_values(sdg: SDG, plan: MemoryPlan, ast, keep: set[int]) -> set[int]:
    """Point stores whose every read happens later in the same loop iteration that wrote them,
    inside the If branch that wrote them (if any): held as traced values, never stored."""
    where: dict[int, tuple] = {}   # exec op -> (enclosing For id, position, If branches)
    execs: dict[int, Exec] = {}
    count: dict[int, int] = {}
    pos = [0]

    def visit(node, loop, branches):
        if isinstance(node, Seq):
            for n in node.body:
                visit(n, loop, branches)
        elif isinstance(node, For):
            visit(node.body, id(node), ())
        elif isinstance(node, If):
            visit(node.then, loop, branches + (id(node.then),))
            if node.orelse is not None:
                visit(node.orelse, loop, branches + (id(node.orelse),))
        elif isinstance(node, Exec):
            pos[0] += 1
            count[node.op] = count.get(node.op, 0) + 1
            where.setdefault(node.op, (loop, pos[0], branches))
            execs.setdefault(node.op, node)

    visit(ast, None, ())
    out = set()
    outputs = set(sdg.outputs.values())
    for i, s in plan.storages.items():
        if i in outputs or i in keep or any(w != 1 for w in s.slots) or count.get(i) != 1:
            continue
        if i not in where:
            continue
        loop, p, branches = where[i]
        w_op = sdg.ops[i]
        w_at = tuple(execs[i].args)
        ok = True
        for e in sdg.out_edges(i):
            r = execs.get(e.dst)
            if r is None:
                continue
            if count.get(e.dst) != 1:
                ok = False
                break
            rloop, rp, rbranches = where[e.dst]
            at = {Dim(d.name): a for d, a in zip(sdg.ops[e.dst].domain, r.args)}
            idx = tuple(x.substitute(at) if not hasattr(x, "stop") else None for x in e.index)
            if rloop != loop or rp <= p or rbranches[:len(branches)] != branches \
                    or idx != w_at or len(idx) != len(w_op.domain):
                ok = False
                break
        if ok:
            out.add(i)
    return out
