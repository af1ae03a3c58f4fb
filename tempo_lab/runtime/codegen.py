"""The generated executor: the loop AST becomes one Python function (``executable.source``).

Loops are Python ``for`` loops, store buffers are local variables, and every statement is a
direct call of its jitted kernel with its integers (slots, range starts, valid lengths) written
as index arithmetic over the loop variables: no AST walk, no per-op dispatch, no ``evaluate``.
A statement whose read lengths are symbolic looks its kernel up by padded size class (a new
class compiles one more kernel, as on the interpreter). Store bytes are counted when a store
is first written or grows and when it is freed, so ``run.profile`` measures what the
interpreter measures.
"""
from __future__ import annotations

import time
from collections.abc import Mapping

import jax.numpy as jnp
import numpy as np

from ..errors import run_callback
from ..ir.sdg import SDG
from ..memory.plan import MemoryPlan, size_class
from ..schedule import Exec, For, Free, If, Schedule, Seq, While
from ..stage import Stage
from . import index_code as ic
from .executor import HOST_OPS, Profile, _check_nonempty, collect_outputs, shared_kernel
from .reference import call_source
from .statements import Padded, Stmt, resolve


class Generated:
    """What generated code calls back into: kernel misses, allocation, sinks, sources."""

    def __init__(self, sdg: SDG, plan: MemoryPlan, stmts: list[Stmt]):
        self.sdg, self.plan, self.stmts = sdg, plan, stmts
        self.kernels: list = [{} for _ in stmts]
        self.host: dict[int, object] = {}
        self.a32 = lambda xs: np.asarray(xs, np.int32)
        self.sc = size_class

    def kernel(self, s: int, pads: tuple):
        st = self.stmts[s]
        reads, out = st.static(pads)
        fn = shared_kernel(self.sdg, st.op, reads, out, st.slots is not None, st.donate,
                           st.levels)
        self.kernels[s][pads] = fn
        return fn

    def alloc(self, op: int):
        """A fresh store buffer (growing axes start at one block), its growing extents and
        bytes."""
        s = self.plan.storages[op]
        shape = tuple(w if w is not None else b for w, b in zip(s.slots, s.blocks)) + s.spatial
        buf = jnp.zeros(shape, s.dtype)
        return (buf, *[shape[k] for k, w in enumerate(s.slots) if w is None],
                int(buf.size) * buf.dtype.itemsize)

    def grow(self, op: int, buf, point: tuple):
        s = self.plan.storages[op]
        want = [buf.shape[k] if w is None and v < buf.shape[k] else
                (-(-(v + 1) // b) * b if w is None else buf.shape[k])
                for k, (w, v, b) in enumerate(zip(s.slots, point, s.blocks))]
        pads = [(0, x - y) for x, y in zip(want, buf.shape)]
        buf = jnp.pad(buf, pads + [(0, 0)] * len(s.spatial))
        return (buf, *[want[k] for k, w in enumerate(s.slots) if w is None],
                int(buf.size) * buf.dtype.itemsize)

    def host_array(self, op: int):
        arr = self.host.get(op)
        if arr is None:
            o = self.sdg.ops[op]
            arr = self.host[op] = jnp.asarray(o.attrs["value" if o.kind == "const" else "array"])
        return arr

    def source(self, s: int, point: tuple):
        op = self.stmts[s].op
        return call_source(op, {d.name: v for d, v in zip(op.domain, point)})

    def dimval(self, s: int, value: int):
        return np.asarray(value, self.stmts[s].op.type.dtype)

    def sink(self, s: int, point: tuple, y, lens: list):
        op = self.stmts[s].op
        value = np.asarray(y)[tuple(slice(0, n) for n in lens if n is not None)]
        at = {d.name: v for d, v in zip(op.domain, point)}
        run_callback(op.attrs["fn"], (at, value), "tl.sink", op.loc, at)

    def check(self, s: int, lens: list, point: tuple):
        _check_nonempty(self.stmts[s].op, lens, point)


class _Writer:
    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, depth: int, text: str):
        self.lines.append("    " * depth + text)


class CodegenExecutor(Stage):
    """``executor="codegen"``: runs a Python function generated from the loop AST."""

    name = "codegen"

    def __init__(self, sdg: SDG, schedule: Schedule, plan: MemoryPlan, sync: bool = False):
        self.sdg, self.schedule, self.plan, self.sync = sdg, schedule, plan, sync
        self.stmts: list[Stmt] = []
        self._static: list[int] = []  # statements with one kernel, made before the first run
        self.source = self._generate()
        self._fn = None
        self._rt = Generated(sdg, plan, self.stmts)
        self.choice = ["CompileConfig(executor='codegen')"]  # auto replaces it with its reasons

    @property
    def predicted_peak_bytes(self) -> int:
        return self.plan.peak_bytes

    def __repr__(self) -> str:
        return (f"Executable(executor=codegen, statements={len(self.stmts)}, "
                f"stores={len(self.plan.storages)}, source_lines={len(self.source.splitlines())})")

    def _sections(self):
        return [("executor choice", list(self.choice)), ("how it runs", [
            "a Python function generated from the loop AST (executable.source): loops are "
            "Python loops, each statement a direct call of its jitted kernel with its index "
            "arithmetic inlined"]),
            ("source", self.source.splitlines())]

    def to_dict(self) -> dict:
        return {"schema": "tempo_lab.executable/1", "executor": "codegen",
                "choice": list(self.choice),
                "stores": len(self.plan.storages), "statements": len(self.stmts),
                "source": self.source.splitlines()}

    # -- generation -------------------------------------------------------------------------
    def _generate(self) -> str:
        w = _Writer()
        params = ", ".join(ic.bound(p) for p in self.sdg.params)
        w(0, f"def program(R, {params}):" if params else "def program(R):")
        w(1, "K, a32, sc, timeline = R.kernels, R.a32, R.sc, []")
        w(1, "tl = timeline.append")
        w(1, "total = 0")
        for i in self.plan.storages:
            grow = [k for k, s in enumerate(self.plan.storages[i].slots) if s is None]
            caps = "".join(f", cap{i}_{k}" for k in grow)
            w(1, f"b{i}{caps}, z{i} = R.alloc({i})")
            w(1, f"L{i} = 0")
        ops = sorted({n.op for n in self.schedule.ast.walk() if isinstance(n, Exec)})
        for i in ops:
            w(1, f"c{i} = 0")
            if self.sync:
                w(1, f"S{i} = 0.0")
        for i in set(self.sdg.untils.values()):
            w(1, f"W{i} = -1")
        self._node(w, self.schedule.ast, 1)
        bufs = ", ".join(f"{i}: b{i}" for i in self.sdg.outputs.values()
                         if i in self.plan.storages)
        calls = ", ".join(f"{i}: c{i}" for i in ops)
        secs = ", ".join(f"{i}: S{i}" for i in ops) if self.sync else ""
        bounds = ", ".join(f"{p!r}: {ic.bound(p)}" for p in self.sdg.params)
        w(1, f"return {{{bufs}}}, {{{calls}}}, {{{secs}}}, timeline, {{{bounds}}}")
        return "\n".join(w.lines) + "\n"

    def _node(self, w: _Writer, node, d: int):
        if isinstance(node, Seq):
            if not node.body:
                w(d, "pass")
            for n in node.body:
                self._node(w, n, d)
        elif isinstance(node, For):
            self._loop(w, node, d)
        elif isinstance(node, If):
            w(d, f"if {ic.cond_src(node.cond)}:")
            self._node(w, node.then, d + 1)
            if node.orelse is not None:
                w(d, "else:")
                self._node(w, node.orelse, d + 1)
        elif isinstance(node, Free):
            for o in node.ops:
                if o in self.plan.storages:
                    w(d, f"b{o} = None")
                    w(d, f"total -= L{o}")
                    w(d, f"L{o} = 0")
            w(d, "tl(total)")
        elif isinstance(node, Exec):
            self._exec(w, node, d)
        else:
            raise TypeError(node)

    def _loop(self, w: _Writer, node: For, d: int):
        v = ic.var(node.var)
        lo, hi = ic.expr_src(node.lo), ic.expr_src(node.hi)
        dynamic = any(s.name in self.sdg.untils for s in node.hi.bounds())
        if not isinstance(node, While) and not dynamic:
            step = f", {node.step}" if node.step != 1 else ""
            w(d, f"for {v} in range({lo}, {hi}{step}):")
            self._node(w, node.body, d + 1)
            return
        w(d, f"{v} = {lo}")
        w(d, f"while {v} < {hi}:")
        self._node(w, node.body, d + 1)
        if isinstance(node, While):
            at, i = ic.expr_src(node.at), node.done
            w(d + 1, f"if W{i} >= {at} and bool(b{i}[{at}]):")
            w(d + 2, f"{ic.bound(node.bound)} = {at} + 1")
            w(d + 2, "break")
        w(d + 1, f"{v} += {node.step}")

    def _exec(self, w: _Writer, node: Exec, d: int):
        op = self.sdg.ops[node.op]
        stmts = resolve(self.sdg, self.plan, node)
        w(d, f"# {self.schedule._stmt(node)}")
        if self.sync:
            w(d, "_t0 = R.clock()")
        if not stmts:
            w(d, f"raise RuntimeError('{op.label} reads a value that has no store')")
        elif op.kind == "merge":
            for k, st in enumerate(stmts):
                w(d, f"{'if' if k == 0 else 'elif'} {ic.cond_src(st.cond)}:")
                self._call(w, st, d + 1)
            w(d, "else:")
            w(d + 1, f"raise RuntimeError('no branch of {op.label} holds here')")
        else:
            self._call(w, stmts[0], d)
        i = op.id
        if i in self.plan.storages:
            w(d, f"if L{i} != z{i}:")
            w(d + 1, f"total += z{i} - L{i}")
            w(d + 1, f"L{i} = z{i}")
        if i in self.sdg.untils.values():
            w(d, f"W{i} = max(W{i}, {ic.expr_src(node.args[0]) if node.args else 0})")
        if self.sync:
            if i in self.plan.storages:
                w(d, f"b{i}.block_until_ready()")
            w(d, f"S{i} += R.clock() - _t0")
        w(d, f"c{i} += 1")
        w(d, "tl(total)")

    def _call(self, w: _Writer, st: Stmt, d: int):
        s = len(self.stmts)
        self.stmts.append(st)
        op, i = st.op, st.op.id
        names: dict[Padded, str] = {}
        for p in st.padded():
            if p.cap is None and p not in names:
                names[p] = f"_n{len(names)}"
                w(d, f"{names[p]} = {ic.expr_src(p.length)}")

        def val(e):
            for p, nm in names.items():
                if p.length == e:
                    return nm
            return ic.expr_src(e)

        point = "(" + "".join(f"{ic.expr_src(a)}, " for a in st.point) + ")"
        if op.kind in ("max", "min") and st.reads:
            r = st.reads[0]
            lens = [val(p.length) if p is not None else "None"
                    for p in r.lens([p for p in r.padded()])]
            w(d, f"R.check({s}, [{', '.join(lens)}], {point})")
        store = i in self.plan.storages
        if store:
            grow = [k for k, x in enumerate(self.plan.storages[i].slots) if x is None]
            if grow:
                test = " or ".join(f"{ic.expr_src(st.point[k])} >= cap{i}_{k}" for k in grow)
                caps = "".join(f", cap{i}_{k}" for k in grow)
                w(d, f"if {test}:")
                w(d + 1, f"b{i}{caps}, z{i} = R.grow({i}, b{i}, {point})")
        pads = [str(p.cap) if p.cap is not None else f"sc({names[p]})" for p in st.padded()]
        if any(p.cap is None for p in st.padded()):
            key = f"({', '.join(pads)},)"
            w(d, f"_k = K[{s}].get({key})")
            w(d, "if _k is None:")
            w(d + 1, f"_k = R.kernel({s}, {key})")
            kname = "_k"
        else:
            key = tuple(p.cap for p in st.padded())
            self._static.append((s, key))
            kname = f"K[{s}][{key}]"
        if op.kind in ("const", "from_array"):
            host = f"R.host_array({i})"
        elif op.kind == "dimval":
            host = f"R.dimval({s}, {ic.value_src(st.host)})"
        elif op.kind == "source":
            host = f"R.source({s}, {point})"
        else:
            host = "None"
        bufs = "(" + "".join(f"b{r.src}, " for r in st.reads) + ")"
        ints = ", ".join(val(x) for x in st.ints())
        call = f"{kname}({bufs}, a32([{ints}]), {host}, {f'b{i}' if store else 'None'})"
        if store:
            w(d, f"b{i} = {call}")
        elif op.kind == "sink":
            r = st.reads[0]
            lens = [val(p.length) if p is not None else "None"
                    for p in r.lens([p for p in r.padded()])]
            w(d, f"R.sink({s}, {point}, {call}, [{', '.join(lens)}])")
        else:
            w(d, call)

    # -- running ------------------------------------------------------------------------------
    def _compiled(self):
        if self._fn is None:
            ns: dict = {}
            exec(compile(self.source, f"<tempo_lab codegen {len(self.stmts)} statements>",
                         "exec"), ns)
            self._fn = ns["program"]
            for s, key in self._static:
                self._rt.kernel(s, key)
            self._rt.clock = time.perf_counter
        return self._fn

    def run(self, bounds: Mapping[str, int]):
        fn = self._compiled()
        t0 = time.perf_counter()
        args = [int(bounds.get(p, 1)) for p in self.sdg.params]
        bufs, calls, secs, timeline, reached = fn(self._rt, *args)
        env = {**bounds, **reached}
        outs = collect_outputs(self.sdg, env, bufs)
        prof = Profile(self.sdg, calls={i: n for i, n in calls.items() if n},
                       seconds=dict(secs), timeline=timeline, synced=self.sync,
                       measured="store bytes: the store buffers after every statement (counted "
                                "when a store is first written, grows or is freed); calls: "
                                "statement instances run")
        prof.wall_s = time.perf_counter() - t0
        return outs, prof, {name: env[name] for name in self.sdg.untils}


__all__ = ["CodegenExecutor", "HOST_OPS"]
