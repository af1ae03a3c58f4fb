"""What the XLA executor decides about a run before it traces anything: ``XlaPlan``.

Every decision the XLA-loop executor (``runtime/xla.py``) makes from the lowered program, the
run's bounds and its ``XlaOptions`` lives here, JAX-free, so that it can be printed
(``plan.pretty()``), tested and changed without reading the tracer: each store's static shape and
the order its axes are held in; stores held one buffer per point (a layer's weights, read in
place); values that stay traced values (written and read in one iteration); small constants baked
into the program; inner loops unrolled; loops split into spans padded per span and the switch plan
that traces only what differs per span; loops whose first step is traced apart (peeled); reads
whose padding is known to hold zeros; statements whose range can be empty; the stores that start
as zeros passed in; where the statements are counted. The loop decisions are made in
``xla_loops.py``. Everything is computed when the plan is built; the tracer (``xla_trace.py``)
reads these facts from the plan it is given; nothing is passed through module state.
"""
from __future__ import annotations

import functools

import numpy as np

from ..ir.ops import flag
from ..ir.sdg import SDG
from ..ir.vmap import base_op
from ..schedule import Exec, For, While, statement_counts
from ..stage import Stage
from ..symbolic import TRUE, Bound, Const, Dim, as_expr
from ..symbolic import isl as I
from ..symbolic.expr import Lin
from ..symbolic.sizes import MIN_PAD, size_class, store_extent
from . import index_code as ic
from .lowered import Lowered, Padded, Stmt
from .xla_loops import (
    describe,
    items,
    nbytes,
    nodes_in_loops,
    peels,
    switch_plan,
    unrolled_loops,
)
from .xla_options import XlaOptions
from .xla_values import local_values, settled_locals

MIN_SPAN = 16  # a loop is split into spans of at least this many steps
BAKED_SIZE = 1024  # constants of at most this many elements become literals of the program
TO_DICT_VERSION = 1


class XlaPlan(Stage):
    """Every decision about how the loop AST runs as one XLA program for these bounds and
    ``options``. Built once per executable, every decision at once (nothing is filled in as
    the tracer asks); its attributes cannot be reassigned."""

    def __init__(self, lowered: Lowered, options: XlaOptions = XlaOptions()):
        s = super().__setattr__
        s("lowered", lowered)
        s("sdg", lowered.sdg)
        s("schedule", lowered.schedule)
        s("memory", lowered.memory)
        s("bounds", lowered.bounds)
        s("_building", True)
        self.options = options
        self._build()
        s("_building", False)

    def __setattr__(self, name, value):
        if not self._building:
            raise AttributeError(f"XlaPlan is frozen: {name} cannot be set")
        super().__setattr__(name, value)

    def _build(self):
        lowered = self.lowered
        self.floors = self._floors()
        self.local, apart = local_values(self.sdg, self.memory, self.lowered.ast,
                                          set(self.sdg.untils.values()))
        self.baked = self._baked()
        self.perms = self._store_perms()
        self.shapes = self._store_shapes()
        self.prefilled = self._prefilled()
        unrolled = unrolled_loops(self, spans=False)
        while True:  # unrolling may hold stores apart, so that a loop around is not split
            self.unrolled = unrolled
            self.unstacked = self._unstacked()
            kept = unrolled_loops(self, spans=True)
            if kept.keys() >= unrolled.keys():
                break
            unrolled = {k: v for k, v in unrolled.items() if k in kept}
        self.zeroed = self._zeroed()
        self.by_point = self._by_point()
        self.pads = [self._static_pads(st) for st in lowered.stmts]
        settled = settled_locals(self, apart) if apart else set()
        self.from_conds = settled  # those a lax.cond around their write returns
        if settled:  # traced values too, from the stores they were
            self.local = self.local | settled
            self.shapes = {i: v for i, v in self.shapes.items() if i not in settled}
        self.ops = sorted({n.op for n in self.lowered.ast.walk() if isinstance(n, Exec)})
        self.slot = {i: k for k, i in enumerate(self.ops)}  # statement counters, by op
        self.checked = {k for k, st in enumerate(lowered.stmts)
                        if flag(st.op.kind, "nonempty") and _may_be_empty(lowered, st)}
        self.ndom = max((len(st.op.domain) for st in lowered.stmts), default=0)
        self._loop_nodes = [f for f in self.lowered.ast.walk() if isinstance(f, For)]
        # each loop (id of its node) -> its number, in the order the source lists them: what
        # names its while instruction (xla_profile's loop_seconds)
        self.loops = {id(f): k for k, f in enumerate(self._loop_nodes)}
        # the split loops' switch plans (switched), and the Seqs in them as planned
        self.switch_plans = {id(f): self._switch_plan(f) for f in self._loop_nodes
                             if self.segments(f)}
        self.seq_parts = {k: v for plan in self.switch_plans.values() if plan
                          for k, v in plan.items()}
        self.source = "\n".join(describe(self, self.lowered.ast, 0, self.floors))
        self.in_place = self._held_in_place()
        self.static_bytes = sum(nbytes(*v) for i, v in self.shapes.items()
                                if i not in self.in_place)  # allocated by the program
        # statement counters in the program: a kernel per loop (an eighth of PPO's kernels,
        # each adding to XLA's compile time and peak memory) for what the bounds decide
        # without a tl.until loop (host_counts)
        self.counts_on_device = any(isinstance(n, While) for n in self.lowered.ast.walk())
        self.carried = self._carried_stores()
        self.zero_args = self._zero_stores()

    def _floors(self) -> dict:
        """What tracing may assume of the bounds, in every run of this program and of any
        program that shares its compilation (``_Xla._key`` holds it): each bound but a
        ``tl.until`` one is at least its value up to ``MIN_PAD``, so that bounds of 20 and of
        1 000 still share one. Branches such as ``T - 2 >= 0`` are then traced without a
        ``lax.cond``, and a peeled first step as straight code, not a loop of at most one step
        (the BiRNN's two loops: each cost a ``while`` and a ``conditional`` more than a scan)."""
        return {Bound(p): (Const(min(int(self.bounds[p]), MIN_PAD)), False)
                for p in self.sdg.params if p in self.bounds and p not in self.sdg.untils}

    def cost_bounds(self) -> dict[str, int]:
        """The bound values a decision about a run's cost may be made at (which stores start
        as zeros passed in, ``_zero_copies_pay``) without making more programs than the
        store shapes do: a bound that sizes a store (a growing axis along its dim, a shape
        that mentions it) at its store extent, as another size class compiles another program
        anyway; any other at its floor, so that every value from the floor on shares one
        program. Judged at its store extent, a window program's T made one program for T of
        8 to 16 and another from 17 on, where the zero stores started to be passed in."""
        sized = {d.bound.name for i, s in self.memory.storages.items()
                 for d, w in zip(self.sdg.ops[i].domain, s.slots) if w is None}
        for op in self.sdg.ops.values():
            for x in op.type.shape:
                if not isinstance(x, int):
                    sized |= {b.name for b in as_expr(x).bounds()}
                    sized |= {d.bound.name for d in as_expr(x).dims()}
        floors = {b.name: f.value for b, (f, _) in self.floors.items()}
        return {k: floors[k] if k in floors and k not in sized else store_extent(v)
                for k, v in self.bounds.items()}

    def __repr__(self) -> str:
        return (f"XlaPlan({len(self.shapes)} stores, {self.static_bytes} B static, "
                f"{len(self.local)} traced values, {len(self.unstacked)} unstacked, "
                f"{len(self.unrolled)} unrolled loops, {len(self.zeroed)} zero-padded reads)")

    def _sections(self):
        loops = [f"{line.strip()}" for line in self.source.splitlines()
                 if line.lstrip().startswith(("lax.fori_loop", "lax.while_loop", "for "))
                 and "#" in line]
        consts = [self.sdg.ops[i].label for i in sorted(self.baked)]
        zeroed = [f"{self.lowered.stmts[k].op.label} reads "
                  f"{self.sdg.ops[self.lowered.stmts[k].reads[r].src].label} in place"
                  for k, r in sorted(self.zeroed)]
        return [*self.sections(),
                ("what the trace assumes of the bounds (shared by programs that assume it)",
                 [f"{b} >= {f}" for b, (f, _) in sorted(self.floors.items(), key=str)]),
                ("constants baked into the program", consts),
                ("loops unrolled, split into spans or peeled", loops),
                ("reads whose padding holds zeros (not masked)", zeroed)]

    def sections(self):
        """The decisions a reader of the executable sees (``executable.pretty()``)."""
        stores = [f"{self.sdg.ops[i].label}: {dt.name if hasattr(dt, 'name') else dt}"
                  f"{list(sh)}" + (f" (axes held in the order {list(self.perms[i])})"
                                   if i in self.perms else "")
                  + (f" (one buffer per point of axis {self.unstacked[i]})"
                     if i in self.unstacked else "")
                  + (" (the host array in place: not allocated)" if i in self.in_place else "")
                  for i, (sh, dt) in sorted(self.shapes.items())]
        local = [self.sdg.ops[i].label for i in sorted(self.local)]
        kept = [self.sdg.ops[i].label for i in self.carried]
        return [("static stores (allocated for the whole run)", stores),
                ("stores kept from one run for the next (written in place, not zeroed)", kept),
                ("values kept in registers (written and read in one iteration)", local),
                ("source", self.source.splitlines())]

    def _baked(self) -> set[int]:
        """Small constants (not outputs) written into the program as literals, not held in
        stores: XLA then sees their values (``1 / (1 + exp(-z))`` stays a sigmoid with a
        constant one; passed in as a run-time value, the fused kernel was measured 7x slower).
        And broadcasts of them made once (an optimiser's zero moments): a broadcast where
        each is read, which XLA fuses into its reader, where a store of one was as large as
        the parameter (1 GB for Llama-3.2-1B's embedding table) and held for the whole run."""
        outputs = set(self.sdg.outputs.values())
        consts = {i for i, s in self.memory.storages.items()
                  if (op := self.sdg.ops[i]).kind == "const" and not op.domain
                  and i not in outputs and np.size(op.attrs["value"]) <= BAKED_SIZE
                  and np.shape(op.attrs["value"]) == tuple(s.spatial)}
        return consts | {i for i, s in self.memory.storages.items() if i not in outputs
                         and _broadcast_of(self.sdg, i, consts)
                         and tuple(self.sdg.ops[i].type.shape) == tuple(s.spatial)}

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
            order = _read_order(st, len(self.memory.storages[r.src].spatial))
            if order is not None and found.setdefault(r.src, order) != order:
                found[r.src] = None  # readers that disagree: the logical order
        return {i: p for i, p in found.items() if p is not None and list(p) != sorted(p)}

    def _store_shapes(self) -> dict[int, tuple]:
        """Every store's shape as held (in the order of ``perms``), and its dtype."""
        out = {}
        for i, s in self.memory.storages.items():
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
            op, s = self.sdg.ops[i], self.memory.storages[i]
            arr = op.attrs.get({"from_array": "array", "const": "value"}.get(op.kind, ""))
            nd = len(op.domain)
            whole = all(w is None or w >= self.bounds.get(d.bound.name, w + 1)  # a ring that
                        for d, w in zip(op.domain, s.slots))  # holds every point is whole
            if (arr is not None and (nd or op.kind == "const") and i not in outputs and whole
                    and np.ndim(arr) == nd + len(s.spatial)
                    and tuple(np.shape(arr)[nd:]) == tuple(s.spatial)):
                out.add(i)
        return out

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

    def _held_in_place(self) -> set[int]:
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

    @property
    def predicted_peak_bytes(self) -> int:
        """Every store is allocated for the whole run: the peak is their sum."""
        return self.static_bytes

    def _max(self, op, p: Padded) -> int:
        dom = self.schedule.domains[op.id]
        if dom.is_empty() or p.orig is None:
            return 1
        return max(1, _max_over(p.orig, dom, op.domain, self.bounds, 1))

    def _static_pads(self, st: Stmt, seg: tuple = (), whole: tuple | None = None) -> tuple:
        """Padded sizes for every symbolic length of a statement, fixed for the whole run (or
        for one segment of a split loop, ``seg``: (loop variable, its largest value) pairs): a
        range read at its largest size class; a value's symbolic axes at its store's size.
        ``whole``: the statement's sizes for the whole run, where a segment's are not its own."""
        pads = []

        def largest(p: Padded) -> int:  # for the whole run, at most its store's extent (a
            return (whole[len(pads)] if whole is not None else p.cap if p.cap is not None  # batch
                    else store_extent(self._max(st.op, p)))  # of 1: not 8 weight-sized copies)
        for r in st.reads:
            src = self.memory.storages[r.src]
            for e in r.entries:
                if e[0] == "s":
                    p = e[2]
                    pads.append(p.cap is None and _in_segment(p, seg) or largest(p))
            for j, c in enumerate(r.cut):
                if c is not None:
                    pads.append(r.src in self.local and _in_segment(c, seg) or src.spatial[j])
        own = self.memory.storages.get(st.op.id)
        for j, x in enumerate(st.out):
            if isinstance(x, Padded):
                seg_pad = st.op.id in self.local and _in_segment(x, seg)
                pads.append(seg_pad or (own.spatial[j] if own is not None else largest(x)))
        return tuple(pads)

    def pads_for(self, s: int, seg: tuple) -> tuple:
        """Statement ``s``'s padded sizes in the segments ``seg`` of the split loops around it
        (computed from its sizes for the whole run: no solver call)."""
        if not seg:
            return self.pads[s]
        return self._static_pads(self.lowered.stmts[s], seg, self.pads[s])

    def segments(self, node: For, whole: bool = True) -> list[tuple[int, int]]:
        """How a loop is split so that range reads growing with its variable are padded per
        segment, not to their largest size: [(first, end)] with equal static spans, or [] to
        keep it whole (no such read, a bound that depends on another loop, or, with
        ``whole``, every such read a whole buffer read in place: a slice per segment would
        be copied, at about twice the cost of reading the whole buffer). Loops inside are
        traced once per segment, their reads padded for it too."""
        split = self.options.split
        if split < 2 or node.step != 1 or node.hi.dims() or node.lo.dims():
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
        span = -(-hi // split)
        if span < MIN_SPAN:
            return []
        return [(k * span, (k + 1) * span) for k in range(split)]

    def _unstacked(self) -> dict[int, int]:
        """Stores held as one buffer per point of one axis (the logical axis, by store): those
        every statement reads, and writes, at a point of that axis that is a constant where
        it is traced (in unrolled loops: a layer's weights, or its keys and values, at
        ``n``). XLA copies a slice of a stacked buffer out at every step, even a constant
        slice of a buffer the loop never writes; a buffer of its own is read in place
        (measured: a two-layer MLP step 0.23 ms from a stacked buffer, 0.11 from one buffer
        per layer). A read may also pick the point by the variable of an outermost loop that
        is not unrolled, once a step of it (a split-off prompt's layers, ``passes/prefix.py``),
        where the axis has at most ``unroll_steps`` points: its statement runs under a
        ``lax.switch`` whose branches read their point's buffer in place (``xla_trace``), and
        the decode loop's reads stay in place too (at 1B widths, two layers, every decode step
        had copied its 464 MB of weights). Not for outputs, ``tl.until`` conditions or under
        a mesh."""
        if self.lowered.layout is not None:
            return {}
        skip = set(self.sdg.outputs.values()) | set(self.sdg.untils.values())
        found: dict[int, int | None] = {}
        pinned: set[int] = set()  # read at a constant point somewhere (not only by a loop's)
        picked: set[int] = set()  # read at a point an outermost loop's variable picks
        for node, loops in nodes_in_loops(self.lowered.ast):
            if not isinstance(node, Exec):
                continue
            consts = {Dim(f.var) for f in loops if id(f) in self.unrolled}
            rolled = [f for f in loops if id(f) not in self.unrolled]
            once = {Dim(f.var) for f in rolled[:1] if len(rolled) == 1 and f is loops[0]}
            for st in self.lowered.stmts_of(node):
                for r in st.reads:
                    if r.src in self.shapes:
                        at = [e[1] if e[0] == "p" else Const(0) for e in r.entries]
                        a = _constant_at(at, consts | once)
                        if found.setdefault(r.src, a) != a:
                            found[r.src] = None
                        if a is not None and _constant_at(at, consts) == a:
                            pinned.add(r.src)
                        elif a is not None:
                            picked.add(r.src)
                if node.op in self.shapes and node.op not in self.prefilled:
                    a = None if st.slots is None else _constant_at(st.slots, consts)
                    if found.setdefault(node.op, a) != a:
                        found[node.op] = None
                    pinned.add(node.op)
        return {i: a for i, a in found.items() if a is not None and i not in skip and i in pinned
                and (i not in picked or self.shapes[i][0][self.perms[i].index(a) if i in
                                                          self.perms else a]
                     <= self.options.unroll_steps)}

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
        for node, loops in nodes_in_loops(self.lowered.ast):
            if not isinstance(node, Exec):
                continue
            outer = [f for f in loops if id(f) not in self.unrolled]
            if outer and outer[0] is not loops[0]:  # traced again per step of an unrolled loop
                outer = []
            # the steps before a cut and those from it (schedule/cut.py) write in order as one
            outer = [self.lowered.cut_after.get(id(f), f) for f in outer]
            for k in self.lowered.of_exec.get(id(node), ()):
                made.setdefault(node.op, []).append(k)
                if len(outer) == 1:
                    where[k] = outer[0]
                st = self.lowered.stmts[k]
                if node.op not in self.shapes:
                    continue
                slots = self.memory.storages[node.op].slots
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
        """How a split loop runs as one loop (``xla_loops.switch_plan``), or None: one loop
        per segment."""
        return self.switch_plans.get(id(node))

    def _switch_plan(self, node: For) -> dict | None:
        return switch_plan(self, node)

    def loop_label(self, k: int) -> str:
        """Loop ``k``'s variable and range, as the source shows them."""
        f = self._loop_nodes[k]
        return f"{ic.var(f.var)} in {f.lo}..{f.hi}"

    def copies_only(self, node: For) -> bool:
        """Whether a loop only copies arrays into prefilled stores: it is not run (its
        statements are counted)."""
        body = items(node.body)
        return (not isinstance(node, While) and node.step == 1 and bool(body)
                and not any(s.name in self.sdg.untils for s in node.hi.bounds())
                and all(isinstance(n, Exec) and n.op in self.prefilled for n in body))

    def peeled(self, node: For, lower: dict) -> bool:
        """Whether the loop's first step is traced apart from the rest (``xla_loops.peels``,
        asked as the loop is traced: ``lower`` is what the loops around say); a loop
        not split into segments (a ``lax.while_loop`` too: its first step runs under one
        ``lax.cond``, where the branches it settles were a ``lax.cond`` at every step)."""
        return node.step == 1 and not self.segments(node) and peels(self, node, lower)

    def _carried_stores(self) -> tuple[int, ...]:
        """The stores kept from one run for the next (``XlaOptions.carry_stores``), passed in
        donated: XLA then writes them in place, where a store the program makes is filled with
        zeros first at every run (XLA:CPU has no uninitialised buffer). Only stores that no read
        relies on starting as zeros: not one read with its padding unmasked (``zeroed``), nor
        a prefilled one, nor an output (its points outside the demanded set must be zeros).
        Every other read is of a point this run wrote, or of padding that its op masks (with
        ``where``, which a stale NaN does not reach). Not on a mesh, whose stores are made
        sharded."""
        if not self.options.carry_stores or self.lowered.layout is not None:
            return ()
        unmasked = {self.lowered.stmts[k].reads[r].src for k, r in self.zeroed}
        outputs = set(self.sdg.outputs.values())
        return tuple(i for i in sorted(self.shapes) if i not in self.prefilled
                     and i not in unmasked and i not in outputs)

    def fresh_store(self, i: int, make=None):
        """A carried store as the first run gets it, on the host: zeros (NaN, the largest int
        or true where ``XlaOptions.carry_poison``; ml_dtypes' 16-bit floats are of kind V),
        as one array, or one per point of its axis where it is unstacked. ``make(shape,
        dtype=...)`` makes each array instead (its shape and dtype alone, to compile with)."""
        shape, dtype = self.shapes[i]
        dtype = np.dtype(dtype)
        if make is None:
            fill = 0
            if self.options.carry_poison:
                fill = (np.nan if dtype.kind in "fcV" else True if dtype.kind == "b"
                        else np.iinfo(dtype).max)
            make = np.zeros if fill == 0 else functools.partial(np.full, fill_value=fill)
        if i not in self.unstacked:  # zeros: pages the kernel maps as they are first written
            return make(shape, dtype=dtype)
        a = self.held_axis(i)
        return tuple(make(shape[:a] + shape[a + 1:], dtype=dtype) for _ in range(shape[a]))

    def _zero_stores(self) -> tuple[int, ...]:
        """The stores that start as zeros passed in, made once: XLA copies each into place
        (a memcpy), where zeros made in the program were a broadcast kernel each, and every
        kernel costs XLA's compile about 12 ms and 1.2 MiB of peak memory (a quarter of a
        PPO program's kernels were these). Small stores only (``XlaOptions.zero_arg_bytes``
        each, ``zero_args_bytes`` together), as the arrays stay held; not on a mesh, where a
        store's zeros are made sharded; not in a program without a loop, whose few stores
        cost less compile than the arguments cost each call (0.3 µs). Nor where the copies
        would cost a run more than ``zero_copy_share`` of its least time
        (``_zero_copies_pay``)."""
        if self.lowered.layout is not None or not self._loop_nodes:
            return ()
        out, total = [], 0
        for i, (shape, dtype) in sorted(self.shapes.items()):
            n = nbytes(shape, dtype)
            if (i in self.prefilled or i in self.unstacked or i in self.carried
                    or n > self.options.zero_arg_bytes
                    or total + n > self.options.zero_args_bytes):
                continue
            out.append(i)
            total += n
        return tuple(out) if self._zero_copies_pay(len(out), total) else ()

    def _zero_copies_pay(self, stores: int, nbytes: int) -> bool:
        """Whether copying ``stores`` zero stores of ``nbytes`` in at every call costs at most
        ``zero_copy_share`` of the least a run takes: a microsecond per statement it
        executes (a thunk each). A BiRNN of 64 instances in 4 length groups copied 33 stores,
        4.4 MB, at every call: 4.6 ms a batch against 4.2 without; PPO's 75 stores, 2.6 MB,
        are under 2 % of its 21 570 statements' microseconds. A ``tl.until`` program's
        statements are known only by running: it makes its zeros."""
        if not stores or self.sdg.untils:
            return False
        o = self.options
        # counted where every bound that shares this program counts the same (cost_bounds)
        executed = sum(self.host_counts(self.cost_bounds()).values())
        copies = stores * o.zero_copy_seconds + nbytes / o.copy_bytes_per_second
        return copies <= o.zero_copy_share * executed * o.statement_seconds

    def host_counts(self, bounds) -> dict[int, int]:
        """The statement counts at ``bounds`` of the ops that have a statement, from the
        bounds (a program without a ``tl.until`` loop; ``counts_on_device`` otherwise)."""
        ops = set(self.ops)
        return {i: n for i, n in statement_counts(self.schedule, bounds).items() if i in ops}

    def to_dict(self) -> dict:
        return {"version": TO_DICT_VERSION, "static_bytes": self.static_bytes, "in_place": sorted(self.in_place),
                "static_stores": {str(i): list(sh) for i, (sh, _) in sorted(self.shapes.items())},
                "store_axis_order": {str(i): list(p) for i, p in sorted(self.perms.items())},
                "unstacked": {str(i): a for i, a in sorted(self.unstacked.items())},
                "carried": list(self.carried),
                "local": sorted(self.local), "source": self.source.splitlines(),
                "bounds_at_least": {str(b): f.value for b, (f, _) in self.floors.items()}}

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


def _broadcast_of(sdg: SDG, i: int, consts: set[int]) -> bool:
    """Whether op ``i`` is a ``broadcast_to`` over no dims, to a static shape, of one of
    ``consts`` read whole."""
    op = sdg.ops[i]
    if op.kind != "broadcast_to" or op.domain or not op.type.is_static:
        return False
    (e,) = sdg.in_edges(i)
    return e.src in consts and not e.index and e.cond == TRUE
