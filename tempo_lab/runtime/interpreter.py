"""``executor="interpreter"``: walks the loop AST and runs each statement instance's kernel,
evaluating the statement's index expressions as it goes. The simplest back end: what the
generated program does, without generating it."""
from __future__ import annotations

import time
from collections.abc import Mapping

from ..ir.ops import flag
from ..schedule import Fetch, Free, Offload, walk
from .host import Host
from .lowered import Lowered
from .out_of_memory import ready


class InterpreterBackend:
    name = "interpreter"

    def prepare(self, lowered: Lowered, sync: bool, split: int):
        return _Interpreter(lowered, sync)


class _Interpreter:
    how = ["walks the schedule's loop AST; per statement instance one jitted JAX kernel reads "
           "the inputs from their stores, computes the op and writes its store in place"]
    host_per_run = True  # stores, offloads and the progress bar live on the host

    def __init__(self, lowered: Lowered, sync: bool):
        self.lowered, self.sync = lowered, sync

    @property
    def predicted_peak_bytes(self) -> int:
        return self.lowered.memory.peak_bytes

    def store_bytes(self, bounds: Mapping[str, int]) -> dict[int, int]:
        return self.lowered.memory.store_bytes(bounds)

    def sections(self):
        return []

    def to_dict(self) -> dict:
        return {}

    def run(self, host: Host, bounds: Mapping[str, int]):
        low = self.lowered
        env = dict(bounds)
        bufs: dict[int, object] = {}
        caps: dict[int, tuple] = {}
        held: dict[int, int] = {}
        written: dict[int, int] = {}
        calls: dict[int, int] = {}
        seconds: dict[int, float] = {}
        timeline: list[int] = []
        total = 0

        def done(loop, at):
            return written.get(loop.done, -1) >= at >= 0 and bool(bufs[loop.done][at])

        for node, point in walk(low.ast, env, done, host.tick):
            if isinstance(node, (Free, Offload, Fetch)):
                for o in node.ops:
                    if isinstance(node, Offload) and o in bufs:
                        host.offload(o, bufs.pop(o))
                        total -= held.get(o, 0)
                    elif isinstance(node, Fetch) and o in host.on_host:
                        bufs[o] = host.fetch(o)
                        total += held.get(o, 0)
                    elif isinstance(node, Free):
                        if bufs.pop(o, None) is not None:  # on the device, not the host
                            total -= held.get(o, 0)
                        held.pop(o, None)
                        host.on_host.pop(o, None)
                timeline.append(total)
                continue
            stmts = low.of_exec[id(node)]
            s = next((k for k in stmts if low.stmts[k].cond.evaluate(env)), None)
            if s is None:
                raise RuntimeError(f"no branch of {low.sdg.ops[node.op].label} holds at {point}")
            t0 = time.perf_counter()
            nbytes = self._exec(host, s, point, env, bufs, caps)
            i = node.op
            if nbytes is not None:
                total += nbytes - held.get(i, 0)
                held[i] = nbytes
                written[i] = max(written.get(i, -1), point[0] if point else 0)
                if self.sync:
                    bufs[i].block_until_ready()
            seconds[i] = seconds.get(i, 0.0) + time.perf_counter() - t0
            calls[i] = calls.get(i, 0) + 1
            timeline.append(total)
            if host.record:
                host.event(i, point, t0, total)
        reached = {name: env[name] for name in low.sdg.untils}
        profile = host.profile("interpreter", calls, seconds, timeline,
                               "store bytes: the store buffers on the device after every "
                               "statement; calls: statement instances dispatched")
        return ready({i: bufs[i] for i in low.sdg.outputs.values() if i in bufs}), reached, profile

    def _exec(self, host: Host, s: int, point: tuple, env: dict, bufs, caps) -> int | None:
        """Run statement ``s`` at ``point``; the bytes of its store afterwards (None: it has
        none)."""
        st = self.lowered.stmts[s]
        op = st.op
        lengths = {p: p.length.evaluate(env) for p in st.padded() if p.cap is None}
        ints = [x.evaluate(env) for x in st.ints()]
        if flag(op.kind, "nonempty") and st.reads:
            r = st.reads[0]
            host.check(s, r.lens([p.length.evaluate(env) for p in r.padded()]), point)
        pads = tuple(p.cap if p.cap is not None else host.sc(lengths[p]) for p in st.padded())
        fn = host.kernels[s].get(pads) or host.kernel(s, pads)
        nbytes = None
        if st.slots is not None:
            i = op.id
            if i not in bufs:
                bufs[i], *caps[i], nbytes = host.alloc(i)
            grow = [k for k, w in enumerate(self.lowered.stores[i].slots) if w is None]
            if any(point[k] >= c for k, c in zip(grow, caps[i])):
                bufs[i], *caps[i], nbytes = host.grow(i, bufs[i], point)
        host_value = None
        if flag(op.kind, "array"):
            host_value = host.host_array(op.id)
        elif op.kind == "dimval":
            host_value = host.dimval(s, st.host.evaluate(env))
        elif op.kind == "source":
            host_value = host.source(s, point)
        y = fn(tuple(bufs[r.src] for r in st.reads), host.a32(ints), host_value,
               bufs.get(op.id) if st.slots is not None else None)
        if st.slots is not None:
            bufs[op.id] = y
            return int(y.size) * y.dtype.itemsize
        if op.kind == "sink":
            r = st.reads[0]
            host.sink(s, point, y, r.lens([p.length.evaluate(env) for p in r.padded()]))
        return None
