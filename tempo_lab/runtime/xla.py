"""The XLA-loop executor: the whole loop AST as one jitted JAX program.

What it decides before tracing (store shapes and layouts, unrolled, split and peeled loops,
values kept in registers, zero-padded reads, the stores passed in as zeros, where statements are
counted) is an ``XlaPlan`` (``xla_plan.py`` and ``xla_loops.py``, no JAX code), built from the
backend's ``XlaOptions``; ``xla_trace.py`` traces ``lax`` code from the plan; this module compiles
that program, passes it its arguments and runs it. What the compiled program says about itself
(its HLO, XLA's memory analysis, measured seconds per op and per loop) is ``xla_profile.py``'s.

Every store gets a static shape for the run's bounds (point and ring stores already have one; a
growing store is allocated at its padded size class at once), so the loop nest can be traced
into ``lax`` loops (``xla_trace``).

What recompiles: the program is compiled once per *static layout* (store shapes and padded read
sizes), keyed process-wide by the program's structure, so another bound value within the same
size classes (powers of two, or a growing store's 64-point blocks) reuses the compiled
program; bounds are run-time arguments. A ``tl.sink`` or ``tl.source`` is an ordered host callback
into the run's ``Host``; ``executor="auto"`` prefers generated code for such programs, since a
callback at every point serialises the XLA program. A ``max``/``min`` over a range that can be
empty records the first empty point in the loop state, and the run raises the same error as the
other executors when the program returns.
"""
from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Mapping

import jax
import numpy as np

from ..cache import LRU
from ..gc_pause import full_collections_paused
from ..ir.sdg import Op
from ..schedule import For
from .compile_cache import load_or_compile
from .host import Host
from .kernels import COMPILER_OPTIONS, attrs_key
from .lowered import Lowered
from .sharding import to_host
from .xla_options import XlaOptions
from .xla_plan import XlaPlan
from .xla_profile import XlaInspection
from .xla_trace import _RUNS, make_program

MAX_PROGRAMS = 64  # compiled programs kept process-wide (XLA code only: no SDG, no weights)
PROGRAM_BYTES = 128 * 2**20  # ... and at most this many resident bytes of them, as estimated
# (a decode split at its prompt, passes/prefix.py, is 10-13 MB: 32 MB held two, and calls that
# alternated prompt shapes compiled again)
RESIDENT_PER_HLO_BYTE = 32  # a compiled program's resident bytes per byte of its HLO text on
# the CPU, which reports no code size (measured: 1.44 MB for 46 KB of text, 101 MB for PPO's
# 4.4 MB); a notebook session compiling PPO after PPO grew by a program each time


def program_bytes(compiled) -> int:
    """A compiled program's resident bytes: its generated code where the backend reports it,
    else estimated from its HLO text."""
    stats = compiled.memory_analysis()
    code = getattr(stats, "generated_code_size_in_bytes", 0) if stats is not None else 0
    return code or RESIDENT_PER_HLO_BYTE * len(compiled.as_text())


_PROGRAMS = LRU(MAX_PROGRAMS, PROGRAM_BYTES, program_bytes)  # the compiled programs
_MEASURED = ("store bytes: the static stores the XLA program allocates for the whole run (one "
             "timeline entry); calls: statement instances, counted inside the XLA program "
             "where a tl.until loop decides them, otherwise from the bounds")
_RUN_IDS = itertools.count(1)  # each run's id (``xla_trace._RUNS``)


class XlaBackend:
    """The XLA executor; ``options``: its ``XlaOptions`` (every field, ``split`` too: the
    ``split`` a compile passes is then not read). None: the defaults, with the ``split`` that
    ``prepare`` is given (``CompileConfig.xla_split``)."""

    name = "xla"

    def __init__(self, options: XlaOptions | None = None):
        self.options = options

    def prepare(self, lowered: Lowered, sync: bool, split: int):
        options = self.options if self.options is not None else XlaOptions(split=split)
        return _Xla(XlaPlan(lowered, options))


class _Xla(XlaInspection):
    """The loop AST as one jitted program of ``lax`` loops, traced from its ``XlaPlan``
    (its inspection and profiling methods: ``XlaInspection``)."""

    how = ["one jitted XLA program: For -> lax.fori_loop (lax.while_loop for a tl.until "
           "bound), If -> lax.cond, each statement's kernel traced inline",
           "bounds are run-time arguments: the program compiles once per layout of store "
           "shapes and padded read sizes"]

    def __init__(self, plan: XlaPlan):
        self.plan = plan
        self.lowered, self.sdg, self.schedule = plan.lowered, plan.sdg, plan.schedule
        self.bounds = plan.bounds
        self.source = plan.source  # the program as traced, in words (``executable.source``)
        self._fn = None  # the compiled program (jax.stages.Compiled), cached process-wide
        self._cached = None  # the device arrays of the last run, reused by op_seconds
        # a run registers its host only for a program that calls back into it
        self._calls_host = bool(plan.lowered.sources or plan.lowered.sinks)
        self.host_per_run = self._calls_host  # only a program that calls back keeps anything
        self._timeline = (plan.static_bytes,)  # every store is held for the whole run
        self._bvec_last: tuple = (None, None)  # the last bounds and their argument
        self._params = self.sdg.params
        self._local_cpu = plan.lowered.layout is None and jax.default_backend() == "cpu"
        self._host_args: tuple | None = None  # the host arrays of ``_cached``, as arguments
        # those the program reads: a baked constant is a literal of it (an argument it ignored
        # still cost the call: 6 of the BiRNN's 9)
        self._host_ops = tuple(i for i in plan.lowered.hosts if i not in plan.baked)
        self._zero_arrays: tuple | None = None
        self._kept: tuple | None = None  # the carried stores as the last run left them
        self._keep_lock = threading.Lock()  # runs in threads take them in turn
        self._outs = tuple(i for i in dict.fromkeys(self.sdg.outputs.values())
                           if i in plan.shapes)  # the output stores the program returns

    @property
    def predicted_peak_bytes(self) -> int:
        return self.plan.predicted_peak_bytes

    @property
    def held_bytes(self) -> int:
        """Bytes of the stores kept from the last run for the next (none while a run has
        them)."""
        kept = self._kept
        return 0 if kept is None else sum(a.nbytes for a in jax.tree.leaves(kept))

    def store_bytes(self, bounds: Mapping[str, int]) -> dict[int, int]:
        """Each store's bytes as the program allocates it: at the compiled bounds' shapes,
        whatever ``bounds`` a run has."""
        return {i: int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
                for i, (shape, dt) in self.plan.shapes.items() if i not in self.plan.in_place}

    def sections(self):
        return self.plan.sections()

    def to_dict(self) -> dict:
        return self.plan.to_dict()

    def _program(self):
        """The program to trace (``xla_trace.make_program``)."""
        return make_program(self.plan, self._host_ops, self._outs)

    def _compiled(self):
        if self._fn is None:
            args = self._args()
            avals = jax.tree.map(lambda a: (a.shape, str(a.dtype), str(getattr(a, "sharding", ""))),
                                 args)
            precision = jax.config.jax_default_matmul_precision  # part of what compiles

            key = (self._key(), str(avals), precision)

            def make():
                donate = (2,) if self.plan.carried else ()
                with full_collections_paused():  # tracing makes and drops many objects
                    return load_or_compile((key, COMPILER_OPTIONS), lambda: jax.jit(
                        self._program(), donate_argnums=donate).lower(*args).compile(
                        compiler_options=COMPILER_OPTIONS), _functions(self.sdg),
                        keep=not self._calls_host)

            self._fn = _PROGRAMS.get(key, make)
        return self._fn

    def _hosts(self, host: Host | None = None) -> tuple:
        """The host arrays on the device (those of the last run, or new ones), then the
        zero stores (``plan.zero_args``)."""
        host = host or Host(self.lowered, cached=self._cached)
        if host.cached is not self._cached or self._host_args is None:
            self._cached = host.cached
            if self._zero_arrays is None:
                self._zero_arrays = tuple(  # put, not jnp.zeros: that compiles a program
                    jax.device_put(np.zeros(*self.plan.shapes[i])) for i in self.plan.zero_args)
            self._host_args = tuple(
                host.host_points(i) if i in self.plan.by_point else host.host_array(i)
                for i in self._host_ops) + self._zero_arrays
        return self._host_args

    def _args(self) -> tuple:
        """The program's arguments for the compiled bounds: bound values (and run 0: no host
        to call back), host inputs and the carried stores' shapes."""
        bvec = np.asarray([self.bounds.get(p, 1) for p in self.sdg.params] + [0], np.int32)
        kept = tuple(self.plan.fresh_store(i, jax.ShapeDtypeStruct) for i in self.plan.carried)
        return bvec, self._hosts(), kept

    def _call(self, fn, bvec, hosts) -> tuple:
        """One call of the compiled program: it is given the carried stores as the last run
        left them (fresh ones where there are none: the first run, or another thread's run
        holds them) and keeps what it leaves for the next."""
        with self._keep_lock:
            kept, self._kept = self._kept, None
        if kept is None:
            kept = tuple(jax.device_put(self.plan.fresh_store(i)) for i in self.plan.carried)
        got, kept = fn(bvec, hosts, kept)
        _ready(got)
        self._kept = kept
        return got

    def run(self, host: Host, bounds: Mapping[str, int]):
        host.t0 = time.perf_counter()  # the first run compiles: its time says so
        hosts, fn = self._hosts(host), self._fn or self._compiled()
        if self._calls_host:  # the callbacks find this run's host by the id passed in
            run_id = next(_RUN_IDS) % 2**31
            _RUNS[run_id] = host
            try:  # waits for the program; one transfer of everything it returns
                got = to_host(self._call(fn, self._bvec(bounds, run_id), hosts))
            finally:
                del _RUNS[run_id]
            host.raise_error()
        else:
            got = self._call(fn, self._bvec(bounds), hosts)
            # on one CPU each array is whole here, and a copy costs less than a start
            got = tuple(map(np.asarray, got)) if self._local_cpu else to_host(got)
        n = len(self._outs)
        outs, reached = dict(zip(self._outs, got)), {}
        calls = "device" if self.plan.counts_on_device else "host"
        if len(got) > n:  # what the program counted, its bounds as reached, its error
            ints = got[n].tolist()
            if calls == "device":
                n = len(self.plan.ops)
                calls, ints = ints[:n], ints[n:]
            if self.sdg.untils:
                reached = dict(zip(self.sdg.untils, ints))
            err = ints[len(self.sdg.untils):]
            if err and err[0]:  # the first max/min over an empty range, as the others raise it
                s = int(err[1])
                st = self.lowered.stmts[s]
                n = len(st.reads[0].lens([None] * len(st.reads[0].padded())))
                host.check(s, [0] * n, tuple(err[2:2 + len(st.op.domain)]))
        return outs, reached, host.profile("xla", self._counts(calls, bounds), {},
                                           self._timeline, _MEASURED, synced=True)

    def _counts(self, calls, bounds: dict[str, int]):
        """The statement counts by op as ``host.profile`` takes them: made from the bounds
        only if the profile is asked for."""
        if calls == "host":
            return functools.partial(self.plan.host_counts, dict(bounds))
        return lambda: dict(zip(self.plan.ops, calls))

    def _bvec(self, bounds: Mapping[str, int], run_id: int = 0):
        """The bound values and the run's id as the program's argument: for run 0 (no host
        to call back) on one process, kept on the device by value (a NumPy argument is
        copied to the device at every call)."""
        if run_id == 0 and bounds == self._bvec_last[0]:
            return self._bvec_last[1]
        values = np.asarray([int(bounds.get(p, 1)) for p in self._params] + [run_id], np.int32)
        if run_id or self.lowered.layout is not None:  # a mesh's processes pass the same values
            return values
        arg = jax.device_put(values)
        self._bvec_last = (dict(bounds), arg)  # one assignment: threads may run at once
        return arg

    def _key(self) -> tuple:
        """What the compiled program depends on, besides its arguments' shapes."""
        sdg, o = self.sdg, self.plan.options
        ops = tuple((o.id, o.kind, attrs_key(o), str(o.type), tuple(d.name for d in o.domain),
                     str(o.attrs.get("expr")), np.shape(o.attrs.get("array", ())))
                    for o in sdg.ops.values())
        edges = tuple((e.dst, e.src, e.slot, tuple(map(str, e.index)), str(e.cond))
                      for e in sdg.edges)
        return (ops, edges, tuple(sorted(sdg.outputs.items())), self.schedule.code(),
                tuple(sorted((i, s.slots) for i, s in self.plan.memory.storages.items())),
                tuple(sorted((i, sh, str(dt)) for i, (sh, dt) in self.plan.shapes.items())),
                tuple(sorted(self.plan.perms.items())), tuple(sorted(self.plan.unstacked.items())),
                tuple(sorted(self.plan.by_point)), self.plan.carried,
                tuple(sorted(self.plan.local)), tuple(sorted(self.sdg.untils.items())),
                tuple((i, np.asarray(self.sdg.ops[i].attrs.get("value", ())).tobytes())
                      for i in sorted(self.plan.baked)),
                tuple(self.plan.pads), tuple(sorted(self.plan.checked)),
                tuple(sorted((str(b), str(f)) for b, (f, _) in self.plan.floors.items())),
                tuple((tuple(self.plan.segments(n)), self.plan.unrolled.get(id(n)))
                      for n in self.lowered.ast.walk() if isinstance(n, For)),
                (o.peel_small, o.peel_steps, o.peel_statements, o.peel_share),  # peeled loops
                None if self.lowered.layout is None else self.lowered.layout.key())


def _functions(sdg) -> list:
    """The Python functions the ops of ``sdg`` call (a lifted function, a fused body's)."""
    out: list = []

    def visit(v):
        if callable(v) and not isinstance(v, type):
            out.append(v)
        elif isinstance(v, Op):
            for x in v.attrs.values():
                visit(x)
        elif isinstance(v, tuple):
            for x in v:
                visit(x)

    for op in sdg.ops.values():
        visit(op)
    return out


def _ready(got: tuple) -> tuple:
    """``got`` once the program has ended: an error it met (XLA's ``RESOURCE_EXHAUSTED``)
    raised here, where reading a result that holds one aborts the process. One output
    suffices: a program's outputs are ready, or failed, together."""
    if got:
        got[0].block_until_ready()
    return got


