"""The XLA-loop executor: the whole loop AST as one jitted JAX program.

What it decides before tracing (store shapes and layouts, unrolled, split and peeled loops,
values kept in registers, zero-padded reads) is an ``XlaPlan`` (``xla_plan.py``, no JAX code);
this module traces ``lax`` code from the plan it is given and runs the compiled program.

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
import re
import time
from collections.abc import Mapping
from contextlib import contextmanager

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback

from ..cache import LRU
from ..ir.ops import accumulator, flag
from ..schedule import Exec, For, Free, If, Seq, While, statement_counts
from ..symbolic import as_expr
from ..symbolic.cond import decide, lt
from . import index_code as ic
from .compile_cache import use_persistent_cache
from .host import Host
from .kernels import COMPILER_OPTIONS, attrs_key, kernel_body
from .lowered import Lowered
from .sharding import to_host
from .xla_plan import Run, XlaPlan, has_exec, items, ranged, traced_statements, writes

_OP_SCOPE = re.compile(r"(?:^|/)op(\d+)(?=/|$)")
_LOOP_SCOPE = re.compile(r"(?:^|/)loop(\d+)/while$")


def _loop_of(path: str) -> int | None:
    """The loop a ``while`` instruction's ``op_name`` path was traced for (``_Trace.loop``)."""
    m = _LOOP_SCOPE.search(path)
    return int(m.group(1)) if m else None


def _op_of(path: str) -> int | None:
    """The op an HLO instruction's ``op_name`` path was traced for (its innermost op scope)."""
    m = _OP_SCOPE.findall(path)
    return int(m[-1]) if m else None
MAX_PROGRAMS = 64  # compiled programs kept process-wide (XLA code only: no SDG, no weights)
PROGRAM_BYTES = 32 * 2**20  # ... and at most this many resident bytes of them, as estimated
RESIDENT_PER_HLO_BYTE = 32  # a compiled program's resident bytes per byte of its HLO text on
# the CPU, which reports no code size (measured: 1.44 MB for 46 KB of text, 101 MB for PPO's
# 4.4 MB); a notebook session compiling PPO after PPO grew by a program each time


def program_bytes(compiled) -> int:
    """A compiled program's resident bytes: its generated code where the backend reports it,
    else estimated from its HLO text."""
    stats = compiled.memory_analysis()
    code = getattr(stats, "generated_code_size_in_bytes", 0) if stats is not None else 0
    return code or RESIDENT_PER_HLO_BYTE * len(compiled.as_text())


_PROGRAMS = LRU(MAX_PROGRAMS, PROGRAM_BYTES, lambda entry: program_bytes(entry[0]))  # each
# entry: (the compiled program, what tracing found: see _Xla._program)
_MEASURED = ("store bytes: the static stores the XLA program allocates for the whole run (one "
             "timeline entry); calls: statement instances, counted inside the XLA program "
             "where a tl.until loop decides them, otherwise from the bounds")
_RUNS: dict[int, Host] = {}  # the runs in progress by id: a callback gets its run's id as
_RUN_IDS = itertools.count(1)  # an argument of the program, so concurrent runs never mix


class XlaBackend:
    name = "xla"

    def prepare(self, lowered: Lowered, sync: bool, split: int):
        return _Xla(XlaPlan(lowered, split))


class _Xla:
    """The loop AST as one jitted program of ``lax`` loops, traced from its ``XlaPlan``."""

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
        self._found: dict = {}  # what tracing it found (see _program)
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
        self._zero_args = self._zero_stores()
        self._zero_arrays: tuple | None = None
        self._outs = tuple(i for i in dict.fromkeys(self.sdg.outputs.values())
                           if i in plan.shapes)  # the output stores the program returns
        # statement counters in the program: a kernel per loop (an eighth of PPO's kernels,
        # each adding to XLA's compile time and peak memory) for what the bounds decide
        # without a tl.until loop (statement_counts)
        self._counts_on_device = any(isinstance(n, While) for n in self.schedule.ast.walk())

    @property
    def predicted_peak_bytes(self) -> int:
        return self.plan.predicted_peak_bytes

    def store_bytes(self, bounds: Mapping[str, int]) -> dict[int, int]:
        """Each store's bytes as the program allocates it: at the compiled bounds' shapes,
        whatever ``bounds`` a run has."""
        return {i: int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
                for i, (shape, dt) in self.plan.shapes.items() if i not in self.plan.in_place}

    def sections(self):
        return self.plan.sections()

    def to_dict(self) -> dict:
        return self.plan.to_dict()

    def _literal(self, op: int):
        """A baked constant. One that an op of 16-bit floats reads passes an optimisation
        barrier: XLA's algebraic simplifier folds constant factors (``(x * 1000) / 1000`` to
        ``x``), which in float16 skipped the overflow that NumPy, the reference and the other
        executors meet (an opaque value is computed with as written)."""
        o = self.sdg.ops[op]
        value = jnp.asarray(np.asarray(o.attrs["value"], o.type.dtype))
        sixteen = any(accumulator(d.type.dtype) != d.type.dtype
                      for d in (self.sdg.ops[e.dst] for e in self.sdg.out_edges(op)))
        return lax.optimization_barrier(value) if sixteen else value

    def _prefill(self, op: int, host):
        """The store of a prefilled ``from_array`` op: its array cut or padded with zeros to
        the store's shape; for an op in ``by_point``, its buffers, one argument per point
        (and zeros past the array's end)."""
        shape, dtype = self.plan.shapes[op]
        if op in self.plan.by_point:
            a = self.plan.held_axis(op)
            rest = shape[:a] + shape[a + 1:]
            return tuple(host) + tuple(jnp.zeros(rest, dtype)
                                       for _ in range(shape[a] - len(host)))
        x = host.astype(self.sdg.ops[op].type.dtype).astype(dtype)
        if op in self.plan.perms:
            x = jnp.transpose(x, self.plan.perms[op])
        x = x[tuple(slice(0, n) for n in shape)]
        if x.shape != shape:
            x = jnp.pad(x, [(0, n - m) for n, m in zip(shape, x.shape)])
        x = self._placed(op, x)
        return self._views(op, x)

    def _views(self, op: int, x):
        """An unstacked store's buffers, one per point of its axis, without that axis (carried
        with an axis of size 1, each in-place update of keys in a loop was copied: 3.2 ms a
        decode step against 0.6)."""
        if op not in self.plan.unstacked:
            return x
        a = self.plan.held_axis(op)
        return tuple(lax.index_in_dim(x, j, a, keepdims=False) for j in range(x.shape[a]))

    def _program(self, found: dict | None = None):
        """The program to trace. Tracing fills ``found``: "calls", "device" where the program
        counts the statements (a ``tl.until`` loop's trips are known only there) or "host"
        where ``statement_counts`` finds them from the bounds, and
        "err", whether it can meet a max/min over an empty range. A program returns its
        outputs, then what it counted, its bounds as reached and that error in one array, or
        nothing more where there is none of these (an output costs a buffer and a transfer:
        a third of a one-op program's run). Outputs are a flat tuple, in ``_outs``' order
        (a dict of them cost a tenth of a one-op program's call)."""
        names = list(self.sdg.params)
        found = {} if found is None else found

        def program(bvec, hosts):  # bvec: the bound values, then the run's id
            env = {ic.bound(p): bvec[k] for k, p in enumerate(names)}
            run_id = bvec[len(names)]
            zeros = dict(zip(self._zero_args, hosts[len(self._host_ops):]))
            hosts = dict(zip(self._host_ops, hosts))
            calls = (jnp.zeros(len(self.plan.ops), jnp.int32) if self._counts_on_device
                     else None)
            err = jnp.zeros(2 + self.plan.ndom, jnp.int32)
            state = {"s": {i: self._prefill(i, hosts[i]) if i in self.plan.prefilled else
                           zeros[i] if i in zeros else self._zeros(i, sh, dt)
                           for i, (sh, dt) in self.plan.shapes.items()},
                     "calls": calls,
                     "w": {i: jnp.int32(-1) for i in self.sdg.untils.values()},
                     "b": {p: env[ic.bound(p)] for p in self.sdg.untils},
                     "err": err}
            ctx = _Trace(self.plan, hosts, run_id)
            state = ctx.node(self.schedule.ast, env, state,
                             {i: self._literal(i) for i in self.plan.baked})
            outs = tuple(_logical(state["s"][i], self.plan.perms.get(i)) for i in self._outs)
            found["calls"] = "device" if self._counts_on_device else "host"
            found["err"] = state["err"] is not err
            ints = ([_calls(state)] if self._counts_on_device else []) + [
                jnp.asarray(state["b"][p], jnp.int32)[None] for p in self.sdg.untils] + (
                [state["err"]] if found["err"] else [])
            return (*outs, jnp.concatenate(ints)) if ints else outs

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

            def make():
                use_persistent_cache()
                found: dict = {}
                return jax.jit(self._program(found)).lower(*args).compile(
                    compiler_options=COMPILER_OPTIONS), found

            self._fn, self._found = _PROGRAMS.get((self._key(), str(avals), precision), make)
        return self._fn

    def _hosts(self, host: Host | None = None) -> tuple:
        """The host arrays on the device (those of the last run, or new ones), then the
        zero stores (``_zero_args``)."""
        host = host or Host(self.lowered, cached=self._cached)
        if host.cached is not self._cached or self._host_args is None:
            self._cached = host.cached
            if self._zero_arrays is None:
                self._zero_arrays = tuple(  # put, not jnp.zeros: that compiles a program
                    jax.device_put(np.zeros(*self.plan.shapes[i])) for i in self._zero_args)
            self._host_args = tuple(
                host.host_points(i) if i in self.plan.by_point else host.host_array(i)
                for i in self._host_ops) + self._zero_arrays
        return self._host_args

    def _zero_stores(self) -> tuple[int, ...]:
        """The stores that start as zeros passed in, made once: XLA copies each into place
        (a memcpy), where zeros made in the program were a broadcast kernel each, and every
        kernel costs XLA's compile about 12 ms and 1.2 MiB of peak memory (a quarter of a
        PPO program's kernels were these). Small stores only, as the arrays stay held; not
        on a mesh, where a store's zeros are made sharded; not in a program without a loop,
        whose few stores cost less compile than the arguments cost each call (0.3 µs). Nor
        where the copies would cost a run more than ``_ZERO_COPY_SHARE`` of its least time
        (``_zero_copies_pay``)."""
        if self.lowered.layout is not None or not any(
                isinstance(n, For) for n in self.schedule.ast.walk()):
            return ()
        out, total = [], 0
        for i, (shape, dtype) in sorted(self.plan.shapes.items()):
            n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            if (i in self.plan.prefilled or i in self.plan.unstacked or n > _ZERO_ARG_BYTES
                    or total + n > _ZERO_ARGS_BYTES):
                continue
            out.append(i)
            total += n
        return tuple(out) if self._zero_copies_pay(len(out), total) else ()

    def _zero_copies_pay(self, stores: int, nbytes: int) -> bool:
        """Whether copying ``stores`` zero stores of ``nbytes`` in at every call costs at most
        ``_ZERO_COPY_SHARE`` of the least a run takes: a microsecond per statement it
        executes (a thunk each). A BiRNN of 64 instances in 4 length groups copied 33 stores,
        4.4 MB, at every call: 4.6 ms a batch against 4.2 without; PPO's 75 stores, 2.6 MB,
        are under 2 % of its 21 570 statements' microseconds. A ``tl.until`` program's
        statements are known only by running: it makes its zeros."""
        if not stores or self.sdg.untils:
            return False
        # counted where every bound that shares this program counts the same (cost_bounds)
        executed = sum(self._host_counts(self.plan.cost_bounds()).values())
        copies = stores * _ZERO_COPY_SECONDS + nbytes / _COPY_BYTES_PER_SECOND
        return copies <= _ZERO_COPY_SHARE * executed * _STATEMENT_SECONDS

    def _args(self) -> tuple:
        """The program's arguments for the compiled bounds: bound values (and run 0: no host
        to call back) and host inputs."""
        bvec = np.asarray([self.bounds.get(p, 1) for p in self.sdg.params] + [0], np.int32)
        return bvec, self._hosts()

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
        from .xla_profile import seconds_by

        return seconds_by(self._profiled(runs, "op_seconds"), self.hlo(), _op_of, runs)

    def loop_seconds(self, runs: int = 3) -> dict:
        """Measured seconds per run inside each loop of the compiled program, keyed by its
        number (``XlaPlan.loops``, as the source lists them): ``{"loop": its variable and
        range, "seconds": ..., "control": the part no op's thunk covers}`` (see
        ``xla_profile.loop_seconds``). Where ``op_seconds`` says the rest of a run is
        ``unattributed``, this says which loop's control it is."""
        from .xla_profile import loop_seconds

        call = self._profiled(runs, "loop_seconds")
        found = loop_seconds(call, self.hlo(), _loop_of, runs)
        return {k: {"loop": self.plan.loop_label(k), **found[k]} for k in sorted(found)}

    def program_seconds(self, runs: int = 3) -> float:
        """Measured seconds of the compiled program alone, warm: the median of ``runs`` calls
        of it on the last run's arguments, without the profiler (which slows every thunk) and
        without a run's Python or fetching its results. A run's time less this is its host's
        share; ``op_seconds`` splits this into ops."""
        call = self._profiled(runs, "program_seconds")
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    def _profiled(self, runs, what: str):
        """The warm call that ``op_seconds`` and ``loop_seconds`` profile and
        ``program_seconds`` times."""
        from ..errors import ArgumentError, user_location

        if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
            raise ArgumentError(f"{what}(runs={runs!r}): give a positive number of runs",
                                user_location())
        if self.lowered.sources or self.lowered.sinks:
            raise ArgumentError(f"{what} runs the program several times without a run's "
                                "host: it would call the program's tl.sink/tl.source "
                                "callbacks again; profile a copy of the program without them",
                                user_location())
        fn, args = self._compiled(), (self._bvec(self.bounds), self._hosts())  # as a run's
        jax.block_until_ready(fn(*args))  # compiled and warm before anything is measured
        return lambda: jax.block_until_ready(fn(*args))

    def fused_ops(self, timed) -> dict[int, tuple[str, int]]:
        """Ops without time of their own (not in ``timed``, the ops ``op_seconds`` measured)
        because XLA fused them into a kernel whose time is counted under another op (the op of
        its root): op id -> (the kernel's HLO name, the op its time is counted under)."""
        from .xla_profile import instruction_scopes, kernel_members

        hlo = self.hlo()
        roots = {name: _op_of(path) for name, path in
                 instruction_scopes(hlo, lambda p: _op_of(p) is not None).items()}
        out: dict[int, tuple[str, int]] = {}
        for kernel, paths in sorted(kernel_members(hlo).items()):
            root = roots.get(kernel)
            if root in timed:
                for op in {_op_of(p) for p in paths} - {None, root} - set(timed):
                    out.setdefault(op, (kernel, root))
        return out

    def jaxpr(self) -> str:
        """The traced program as a jaxpr (text)."""
        return str(jax.make_jaxpr(self._program())(*self._args()))

    def run(self, host: Host, bounds: Mapping[str, int]):
        host.t0 = time.perf_counter()  # the first run compiles: its time says so
        hosts, fn = self._hosts(host), self._fn or self._compiled()
        if self._calls_host:  # the callbacks find this run's host by the id passed in
            run_id = next(_RUN_IDS) % 2**31
            _RUNS[run_id] = host
            try:  # waits for the program; one transfer of everything it returns
                got = to_host(_ready(fn(self._bvec(bounds, run_id), hosts)))
            finally:
                del _RUNS[run_id]
            host.raise_error()
        else:
            got = _ready(fn(self._bvec(bounds), hosts))
            # on one CPU each array is whole here, and a copy costs less than a start
            got = tuple(map(np.asarray, got)) if self._local_cpu else to_host(got)
        n = len(self._outs)
        outs, calls, reached = dict(zip(self._outs, got)), self._found["calls"], {}
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
            return functools.partial(self._host_counts, dict(bounds))
        return lambda: dict(zip(self.plan.ops, calls))

    def _host_counts(self, bounds: Mapping[str, int]) -> dict[int, int]:
        """The statement counts at ``bounds`` of the ops that have a statement, from the
        bounds (a program without a ``tl.until`` loop)."""
        ops = set(self.plan.ops)
        return {i: n for i, n in statement_counts(self.schedule, bounds).items() if i in ops}

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
        sdg = self.sdg
        ops = tuple((o.id, o.kind, attrs_key(o), str(o.type), tuple(d.name for d in o.domain),
                     str(o.attrs.get("expr")), np.shape(o.attrs.get("array", ())))
                    for o in sdg.ops.values())
        edges = tuple((e.dst, e.src, e.slot, tuple(map(str, e.index)), str(e.cond))
                      for e in sdg.edges)
        return (ops, edges, tuple(sorted(sdg.outputs.items())), self.schedule.code(),
                tuple(sorted((i, s.slots) for i, s in self.plan.memory.storages.items())),
                tuple(sorted((i, sh, str(dt)) for i, (sh, dt) in self.plan.shapes.items())),
                tuple(sorted(self.plan.perms.items())), tuple(sorted(self.plan.unstacked.items())),
                tuple(sorted(self.plan.by_point)),
                tuple(sorted(self.plan.local)), tuple(sorted(self.sdg.untils.items())),
                tuple((i, np.asarray(self.sdg.ops[i].attrs["value"]).tobytes())
                      for i in sorted(self.plan.baked)),
                tuple(self.plan.pads), tuple(sorted(self.plan.checked)),
                tuple(sorted((str(b), str(f)) for b, (f, _) in self.plan.floors.items())),
                tuple((tuple(self.plan.segments(n)), self.plan.unrolled.get(id(n)))
                      for n in self.schedule.ast.walk() if isinstance(n, For)),
                None if self.lowered.layout is None else self.lowered.layout.key())


def _ready(got: tuple) -> tuple:
    """``got`` once the program has ended: an error it met (XLA's ``RESOURCE_EXHAUSTED``)
    raised here, where reading a result that holds one aborts the process. One output
    suffices: a program's outputs are ready, or failed, together."""
    if got:
        got[0].block_until_ready()
    return got


def _pinned(xp: XlaPlan, v, state: dict) -> dict:
    """``state`` with its prefilled stores (the weights) passed through one optimisation
    barrier together with the loop variable ``v``: what the loop computes from a weight alone
    is then not loop-invariant for XLA, which hoisted such values out of the loop and held
    them for the whole run (a float32 copy of a bfloat16 embedding table, 1 GB at Llama's
    widths)."""
    ids = sorted(i for i in xp.prefilled if i in state["s"])
    if not ids:
        return state
    _, bufs = lax.optimization_barrier((v, [state["s"][i] for i in ids]))
    return {**state, "s": {**state["s"], **dict(zip(ids, bufs))}}


def _host_call(method: str, s: int, default=None):
    """A callback into the host of run ``run_id`` (statement ``s``'s ``method``)."""
    def call(run_id, *args):
        return _RUNS[int(run_id)].guarded(method, default)(s, *args)
    return call


_ZERO_ARG_BYTES = 1 << 20   # a store passed in as zeros (_Xla._zero_stores): at most
_ZERO_ARGS_BYTES = 16 << 20  # this big, and all of them together at most this
# what copying the zero stores in costs a call, as measured on the CPU (_zero_copies_pay): a
# memcpy thunk per store, bytes at memory speed; and the least a statement executed costs
_ZERO_COPY_SECONDS, _COPY_BYTES_PER_SECOND, _STATEMENT_SECONDS = 1.5e-6, 10e9, 1e-6
_ZERO_COPY_SHARE = 0.05  # of a run's least time, at most


class _Trace:
    """Traces the loop AST into lax control flow; state = {"s": stores, "calls": counters,
    "w": until ops' last written point, "b": until bounds as reached, "err": the first
    max/min over an empty range (1 + statement, then its point)}."""

    def __init__(self, xp: XlaPlan, hosts: dict, run_id):
        self.xp, self.hosts, self.run_id = xp, hosts, run_id
        self.seg: tuple = ()  # (loop variable, largest value) of the split loops being traced
        # the split loop traced as one loop: (it, its plan (XlaPlan.switched), its variable)
        self.switch: tuple | None = None
        # the loops being traced: loop variable -> (its first value, whether it is exactly
        # that), so that branches the loop's range settles are traced without a lax.cond
        self.lower: dict = dict(xp.floors)  # and what the bounds are at least

    def node(self, node, env, state, vals):
        xp = self.xp
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
            if not has_exec(node):
                return state
            settled = decide(node.cond, self.lower)
            if settled is not None:
                sub = node.then if settled else node.orelse
                return state if sub is None else self.node(sub, env, state, vals)
            keys = writes(xp, node)
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
        """The loop ``node``, traced under the name scope ``loop<k>`` (``XlaPlan.loops``), so
        that ``loop_seconds`` can find its ``while`` instruction."""
        with jax.named_scope(f"loop{self.xp.loops.get(id(node), '')}"):
            return self._loop(node, env, state, vals)

    def _loop(self, node: For, env, state, vals):
        xp = self.xp
        keys = writes(xp, node)
        var = ic.var(node.var)
        stop = isinstance(node, While)
        dyn = {b for b in xp.sdg.untils if any(s.name == b for s in node.hi.bounds())}

        def env_of(st, v):
            e = dict(env)
            e.update({ic.bound(b): st["b"][b] for b in xp.sdg.untils})
            e[var] = v
            return e

        def body(v, st):
            st = self.node(node.body, env_of(st, v), _pinned(xp, v, st), dict(vals))
            return st

        if id(node) in xp.unrolled:  # each step traced with its variable a constant
            for v in range(*xp.unrolled[id(node)]):
                with self._from(node, as_expr(v), True):
                    state = self.node(node.body, env_of(state, v), state, dict(vals))
            return state
        lo = ic.jax_int(node.lo, env)
        if not stop and not dyn and node.step == 1:
            hi = ic.jax_int(node.hi, env)
            if xp.copies_only(node):  # nothing to run: count its statements only
                if state["calls"] is None:
                    return state
                n = jnp.maximum(jnp.int32(hi) - jnp.int32(lo), 0)
                calls = _calls(state)
                for x in items(node.body):
                    calls = calls.at[xp.slot[x.op]].add(n)
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
        if xp.peeled(node, self.lower):  # the first step alone, if the loop runs one
            with self._from(node, node.lo, True):  # (new functions: JAX caches traces by one)
                init = lax.cond(cond(init), lambda c: wbody(c), lambda c: c, init)
            with self._from(node, as_expr(node.lo) + 1, False):
                _, _, carry = lax.while_loop(lambda c: cond(c), lambda c: wbody(c), init)
            return _merge(state, keys, carry)
        with self._from(node, node.lo, False):
            _, _, carry = lax.while_loop(cond, wbody, init)
        return _merge(state, keys, carry)

    def switched(self, run: Run, env, state, vals):
        """A run of a split loop's body whose reads are padded per segment: traced once per
        segment, the one of this step chosen by ``lax.switch``."""
        xp = self.xp
        node, plan, v = self.switch
        segments = xp.segments(node)
        keys = sorted({i for n in run.nodes for i in writes(xp, n)})

        def branch(first, end):
            def f(carry):
                st, local = _merge(state, keys, carry), dict(vals)
                outer, self.seg, self.switch = self.seg, self.seg + ((node.var, end - 1),), None
                old = self.lower
                self.lower = ranged(xp, node, old, as_expr(first), False)
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
        self.lower = ranged(self.xp, node, old, first, exact)
        try:
            yield
        finally:
            self.lower = old

    def _fori(self, node: For, env, state, vals, body, keys, lo, hi):
        """A loop with fixed bounds as ``lax.fori_loop`` (one per segment of a split loop)."""
        def fbody(v, carry):
            return _carry(body(v, _merge(state, keys, carry)), keys)
        carry = _carry(state, keys)
        segments = self.xp.segments(node)
        lo, hi = jnp.int32(lo), jnp.int32(hi)
        if self.xp.peeled(node, self.lower):
            with self._from(node, node.lo, True):  # the first step, alone
                carry = (fbody(lo, carry) if decide(lt(node.lo, node.hi), self.lower) else
                         lax.fori_loop(lo, jnp.minimum(lo + 1, hi),
                                       lambda v, c: fbody(v, c), carry))
            with self._from(node, as_expr(node.lo) + 1, False):
                carry = lax.fori_loop(lo + 1, hi, lambda v, c: fbody(v, c), carry)
        elif not segments:
            with self._from(node, node.lo, False):
                carry = lax.fori_loop(lo, hi, fbody, carry)
        plan = self.xp.switched(node) if segments else None
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
        xp = self.xp
        idx = xp.lowered.of_exec[id(node)]
        stmts = [xp.lowered.stmts[k] for k in idx]
        op = xp.sdg.ops[node.op]
        if not stmts:
            return state
        taken = traced_statements(xp.lowered, idx, self.lower)
        # counted in Python, added to the counters in one step at the next carry (_carry):
        # a scatter per statement would multiply the XLA program's size
        state = {**state, "pending": state.get("pending", ()) + (xp.slot[op.id],)}
        if op.id in xp.prefilled or op.id in xp.baked:  # already there: counted only
            return state
        ys = []
        with jax.named_scope(f"op{op.id}"):  # names its instructions (xla_profile)
            for k in taken:
                y, state = self.stmt(k, env, state, vals)
                ys.append(y)
        y = ys[-1]
        for k, v in zip(taken[-2::-1], ys[-2::-1]):
            y = jnp.where(ic.jax_bool(xp.lowered.stmts[k].cond, env), v, y)
        if op.id in xp.local:
            vals[op.id] = y
            return state
        if op.id not in xp.shapes:
            return state
        st0 = stmts[0]
        slots = [ic.jax_int(x, env) for x in st0.slots]
        buf = views = state["s"][op.id]
        upd = y.reshape((1,) * len(slots) + y.shape).astype(y.dtype)
        at = tuple(_int32(s) for s in slots) + (0,) * y.ndim
        if op.id in xp.perms:
            upd, at = jnp.transpose(upd, xp.perms[op.id]), tuple(at[k] for k in xp.perms[op.id])
        if op.id in xp.unstacked:  # the buffer of the point written, a constant here
            a = xp.held_axis(op.id)
            j = _clamped(slots[xp.unstacked[op.id]], len(views))
            upd, at, buf = jnp.squeeze(upd, a), at[:a] + at[a + 1:], views[j]
        buf = lax.dynamic_update_slice(buf, upd.astype(buf.dtype), at,
                                       allow_negative_indices=False)  # slots: never negative
        if op.id in xp.unstacked:
            buf = views[:j] + (buf,) + views[j + 1:]
        state = {**state, "s": {**state["s"], op.id: buf}}
        if op.id in state["w"]:
            p = ic.jax_int(node.args[0], env) if node.args else 0
            state = {**state, "w": {**state["w"], op.id: jnp.maximum(state["w"][op.id], p)}}
        return state

    def stmt(self, k: int, env, state, vals):
        """Statement ``k``'s value at this point (not yet written anywhere), and the state
        (with the emptiness check of a max/min recorded)."""
        xp = self.xp
        st = xp.lowered.stmts[k]
        op = st.op
        pads = xp.pads_for(k, self.seg)
        reads, out = st.static(pads)
        in_types = tuple(xp.sdg.ops[r.src].type for r in st.reads)
        fn = kernel_body(op, in_types, tuple(p for _, p in reads), out, False, st.levels,
                         tuple(None if r.src in vals else xp.perms.get(r.src) for r in st.reads),
                         tuple((k, i) in xp.zeroed for i in range(len(st.reads))))
        bufs, ints, at = [], [ic.jax_int(x, env) for x in st.ints()], 0
        for r in st.reads:
            if r.src in vals:
                v = vals[r.src]
                bufs.append(v.reshape((1,) * len(r.entries) + v.shape))
            elif r.src in xp.unstacked:  # the buffer of the point read, a constant here
                a = at + xp.unstacked[r.src]
                views = state["s"][r.src]
                bufs.append(jnp.expand_dims(views[_clamped(ints[a], len(views))],
                                            xp.held_axis(r.src)))
                ints[a] = 0
            else:
                bufs.append(state["s"][r.src])
            at += len(r.ints())
        # a tuple of scalars: stacked into one array, every use would be a slice of it
        ints = tuple(_int32(x) for x in ints)
        point = [_int32(ic.jax_int(x, env)) for x in st.point]
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
        if op.kind == "sink" or k in xp.checked:
            r = st.reads[0]
            lens = r.lens([ic.jax_int(p.length, env) for p in r.padded()])
        if op.kind == "sink":
            have = [n for n in lens if n is not None]
            io_callback(_sink_call(k, [n is None for n in lens]), None, self.run_id,
                        tuple(point), y, tuple(have), ordered=True)
        if k in xp.checked:
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


def _int32(x):
    """An index as an int32 scalar: a NumPy one where it is known while tracing (a constant of
    the program; ``jnp.int32`` made a device array each time, 800 of them in PPO's trace)."""
    return np.int32(x) if isinstance(x, ic.KNOWN_INT) else jnp.asarray(x, jnp.int32)


def _clamped(j, n: int) -> int:
    """A constant index into ``n`` buffers, clamped as a dynamic index is (a point outside
    is read only in a branch that is not taken there)."""
    return min(max(int(j), 0), n - 1)


def _logical(x, perm):
    """A store held in the order ``perm`` back in the logical order."""
    return x if perm is None else jnp.transpose(x, np.argsort(perm))


def _carry(state, keys):
    return ({i: state["s"][i] for i in keys}, _calls(state), dict(state["w"]),
            dict(state["b"]), state["err"])


def _calls(state):
    """The statement counters with the calls counted since the last carry added."""
    pending = state.get("pending", ())
    if not pending or state["calls"] is None:  # None: counted on the host
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
