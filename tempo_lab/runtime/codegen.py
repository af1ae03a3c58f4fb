"""``executor="codegen"``: the loop AST becomes one Python function (``executable.source``).

Loops are Python ``for`` loops (``while`` for a ``tl.until`` loop), store buffers are local
variables, and every statement is a direct call of its jitted kernel with its integers (slots,
range starts, valid lengths) written as index arithmetic over the loop variables: no AST walk,
no per-op dispatch, no ``evaluate``. A statement whose read lengths are symbolic looks its
kernel up by padded size class (a new class compiles one more kernel). Store bytes are counted
when a store is first written or grows and when it is freed, so ``run.profile`` measures what
the interpreter measures. User names reach the source only inside ``repr`` strings and
comments with their line breaks removed, so any name is safe.
"""
from __future__ import annotations

import time
from collections.abc import Mapping

from ..ir.ops import flag
from ..schedule import Exec, Fetch, For, Free, If, Offload, Seq, While
from . import index_code as ic
from .host import Host
from .lowered import Lowered, Padded, Stmt
from .out_of_memory import ready


class CodegenBackend:
    name = "codegen"

    def prepare(self, lowered: Lowered, sync: bool, split: int):
        return _Codegen(lowered, sync)


class _Writer:
    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, depth: int, text: str):
        self.lines.append("    " * depth + text)


# what a store's Free, Offload (to the host, the device bytes released) and Fetch emit
# (a store not written yet, freed or on the host holds no device bytes and has nothing to move;
# one not on the host has nothing to fetch)
_STORE_LINES = {Free: ("if b{o} is not None:", "    total -= L{o}", "b{o} = None",
                       "R.on_host.pop({o}, None)", "L{o} = 0"),
                Offload: ("if b{o} is not None:", "    R.offload({o}, b{o})", "    b{o} = None",
                          "    total -= L{o}"),
                Fetch: ("if {o} in R.on_host:", "    b{o} = R.fetch({o})", "    total += L{o}")}


def _comment(text: str) -> str:
    return " ".join(str(text).split())  # no line break can end the comment early


class _Codegen:
    how = ["a Python function generated from the loop AST (executable.source): loops are "
           "Python loops, each statement a direct call of its jitted kernel with its index "
           "arithmetic inlined"]
    host_per_run = True  # stores, offloads and the progress bar live on the host

    def __init__(self, lowered: Lowered, sync: bool):
        self.lowered, self.sdg, self.sync = lowered, lowered.sdg, sync
        self._static: set[tuple] = set()  # (statement, pads) made before the first run
        self.source = self._generate(record=False)
        self._fns: dict[bool, object] = {}

    @property
    def predicted_peak_bytes(self) -> int:
        return self.lowered.memory.peak_bytes

    def store_bytes(self, bounds: Mapping[str, int]) -> dict[int, int]:
        return self.lowered.memory.store_bytes(bounds)

    def sections(self):
        return [("source", self.source.splitlines())]

    def to_dict(self) -> dict:
        return {"source": self.source.splitlines()}

    # -- generation ---------------------------------------------------------------------------
    def _generate(self, record: bool) -> str:
        self.record, self._depth = record, 0
        low = self.lowered
        w = _Writer()
        params = ", ".join(ic.bound(p) for p in self.sdg.params)
        w(0, f"def program(R, {params}):" if params else "def program(R):")
        w(1, "K, a32, sc, timeline = R.kernels, R.a32, R.sc, []")
        w(1, "tl = timeline.append")
        w(1, "total = 0")
        for i in low.stores:
            grow = [k for k, s in enumerate(low.stores[i].slots) if s is None]
            caps = "".join(f", cap{i}_{k}" for k in grow)
            w(1, f"b{i}{caps}, z{i} = R.alloc({i})")
            w(1, f"L{i} = 0")
        ops = sorted({st.op.id for st in low.stmts})
        timed = self.sync or self.record  # seconds per op: synced, or dispatch times as recorded
        for i in ops:
            w(1, f"c{i} = 0")
            if timed:
                w(1, f"S{i} = 0.0")
        for i in set(self.sdg.untils.values()):
            w(1, f"W{i} = -1")
        self._node(w, low.ast, 1)
        bufs = ", ".join(f"{i}: b{i}" for i in self.sdg.outputs.values() if i in low.stores)
        calls = ", ".join(f"{i}: c{i}" for i in ops)
        secs = ", ".join(f"{i}: S{i}" for i in ops) if timed else ""
        bounds = ", ".join(f"{p!r}: {ic.bound(p)}" for p in self.sdg.untils)
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
        elif isinstance(node, (Free, Offload, Fetch)):
            lines = _STORE_LINES[type(node)]
            for o in node.ops:
                if o in self.lowered.stores:
                    for line in lines:
                        w(d, line.format(o=o))
            w(d, "tl(total)")
        elif isinstance(node, Exec):
            self._exec(w, node, d)
        else:
            raise TypeError(node)

    def _loop(self, w: _Writer, node: For, d: int):
        v = ic.var(node.var)
        lo, hi = ic.expr_src(node.lo), ic.expr_src(node.hi)
        dynamic = any(s.name in self.sdg.untils for s in node.hi.bounds())
        self._depth += 1
        if not isinstance(node, While) and not dynamic:
            step = f", {node.step}" if node.step != 1 else ""
            w(d, f"for {v} in range({lo}, {hi}{step}):")
            self._node(w, node.body, d + 1)
        else:
            w(d, f"{v} = {lo}")
            if isinstance(node, While):
                w(d, f"E{node.done} = False")
            w(d, f"while {v} < {hi}:")
            if isinstance(node, While):  # the bound is set once, when the condition holds
                head, tail = node.split()  # (schedule.walk); the loop runs on to its end
                self._node(w, head, d + 1)
                at, i = ic.expr_src(node.at), node.done
                w(d + 1, f"if not E{i} and W{i} >= {at} >= 0 and bool(b{i}[{at}]):")
                w(d + 2, f"{ic.bound(node.bound)}, E{i} = {at} + 1, True")
                self._node(w, tail, d + 1)
            else:
                self._node(w, node.body, d + 1)
            w(d + 1, f"{v} += {node.step}")
            if isinstance(node, While) and node.has_free():
                # ended early: the frees of its last iteration under the reached bound
                # (schedule.last_frees)
                w(d, f"if E{node.done} and {v} > {lo}:")
                w(d + 1, f"{v} -= {node.step}")
                self._frees(w, node.body, d + 1)
        if self._depth == 1:  # progress: an iteration of an outermost loop ended
            w(d + 1, "R.tick()")
        self._depth -= 1

    def _frees(self, w: _Writer, node, d: int):
        """Only the ``Free`` nodes of ``node``, under their conditions and inner loops."""
        if not node.has_free():
            return
        if isinstance(node, Seq):
            for n in node.body:
                self._frees(w, n, d)
        elif isinstance(node, For):
            w(d, f"for {ic.var(node.var)} in range({ic.expr_src(node.lo)}, "
                 f"{ic.expr_src(node.hi)}, {node.step}):")
            self._frees(w, node.body, d + 1)
        elif isinstance(node, If):
            w(d, f"if {ic.cond_src(node.cond)}:")
            self._frees(w, node.then, d + 1)
            w(d + 1, "pass")
            if node.orelse is not None and node.orelse.has_free():
                w(d, "else:")
                self._frees(w, node.orelse, d + 1)
        else:
            self._node(w, node, d)

    def _exec(self, w: _Writer, node: Exec, d: int):
        low = self.lowered
        op = self.sdg.ops[node.op]
        stmts = low.of_exec[id(node)]
        w(d, f"# {_comment(low.schedule._stmt(node))}")
        if self.sync or self.record:
            w(d, "_t0 = R.clock()")
        if not stmts:
            w(d, f"raise RuntimeError({op.label + ' reads a value that has no store'!r})")
        elif op.kind == "merge":
            for k, s in enumerate(stmts):
                w(d, f"{'if' if k == 0 else 'elif'} {ic.cond_src(low.stmts[s].cond)}:")
                self._call(w, s, d + 1)
            w(d, "else:")
            w(d + 1, f"raise RuntimeError({'no branch of ' + op.label + ' holds here'!r})")
        else:
            self._call(w, stmts[0], d)
        i = op.id
        if i in low.stores:
            w(d, f"if L{i} != z{i}:")
            w(d + 1, f"total += z{i} - L{i}")
            w(d + 1, f"L{i} = z{i}")
        if i in self.sdg.untils.values():
            w(d, f"W{i} = max(W{i}, {ic.expr_src(node.args[0]) if node.args else 0})")
        if self.sync and i in low.stores:
            w(d, f"b{i}.block_until_ready()")
        if self.sync or self.record:
            w(d, f"S{i} += R.clock() - _t0")
        w(d, f"c{i} += 1")
        w(d, "tl(total)")
        if self.record:
            point = "(" + "".join(f"{ic.expr_src(a)}, " for a in node.args) + ")"
            w(d, f"R.event({i}, {point}, _t0, total)")

    def _call(self, w: _Writer, s: int, d: int):
        st: Stmt = self.lowered.stmts[s]
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

        def lens(r):
            return ", ".join(val(p.length) if p is not None else "None"
                             for p in r.lens(list(r.padded())))

        if flag(op.kind, "nonempty") and st.reads:
            w(d, f"R.check({s}, [{lens(st.reads[0])}], {point})")
        store = i in self.lowered.stores
        if store:
            grow = [k for k, x in enumerate(self.lowered.stores[i].slots) if x is None]
            caps = "".join(f", cap{i}_{k}" for k in grow)
            if self.lowered.memory.budget is not None:  # a store freed every iteration (only
                # under a budget, memory/offload.py) gets a fresh buffer in the next
                w(d, f"if b{i} is None:")
                w(d + 1, f"b{i}{caps}, z{i} = R.alloc({i})")
            if grow:
                test = " or ".join(f"{ic.expr_src(st.point[k])} >= cap{i}_{k}" for k in grow)
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
            self._static.add((s, key))
            kname = f"K[{s}][{key}]"
        if flag(op.kind, "array"):
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
            w(d, f"R.sink({s}, {point}, {call}, [{lens(st.reads[0])}])")
        else:
            w(d, call)

    # -- running ------------------------------------------------------------------------------
    def _compiled(self, record: bool):
        fn = self._fns.get(record)
        if fn is None:
            source = self.source if not record else self._generate(record=True)
            ns: dict = {}
            exec(compile(source, f"<tempo_lab codegen {len(self.lowered.stmts)} statements>",
                         "exec"), ns)
            fn = self._fns[record] = ns["program"]
        return fn

    def run(self, host: Host, bounds: Mapping[str, int]):
        fn = self._compiled(host.record)
        for s, key in self._static:
            if key not in host.kernels[s]:
                host.kernel(s, key)
        host.t0 = time.perf_counter()
        args = [int(bounds.get(p, 1)) for p in self.sdg.params]
        bufs, calls, secs, timeline, reached = fn(host, *args)
        ready(bufs)
        profile = host.profile("codegen", calls, secs, timeline,
                               "store bytes: the store buffers on the device after every "
                               "statement (counted when a store is first written, grows, is "
                               "freed or moves to or from the host); calls: statement "
                               "instances run")
        return bufs, reached, profile
