"""The XLA executor's tracer: the loop AST as ``lax`` code, from the ``XlaPlan`` it is given
(``make_program``), a function of the bound values and the host arrays that ``jax.jit`` compiles.

A ``For`` becomes ``lax.fori_loop`` (``lax.while_loop`` when a ``tl.until`` bound can end it
early), an ``If`` becomes ``lax.cond`` (none where the loops' ranges settle it), an ``Exec`` the
same kernel body the other executors jit per statement, traced inline with its index arithmetic
as traced integers. A read of a dynamic range (``0:t+1``) reads the range's size class (the
largest it gets in this run) and masks the rest, as the other executors do. ``Free`` is a no-op:
XLA holds every store for the whole run (its own buffer assignment reuses what it can inside).
Point stores written and read within one loop iteration are not stores at all here: the value
stays a traced value, so XLA fuses producer and consumer. A ``tl.sink`` or ``tl.source`` is an
ordered host callback (``jax.experimental.io_callback``) into the run's ``Host``, found by the
run's id (``_RUNS``). A ``max``/``min`` over a range that can be empty records the first empty
point in the loop state, which the program returns.
"""
from __future__ import annotations

from contextlib import contextmanager

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback

from ..ir.ops import accumulator, flag
from ..schedule import Exec, For, Free, If, Seq, While
from ..symbolic import as_expr
from ..symbolic.cond import decide, lt
from . import index_code as ic
from .host import Host
from .kernels import kernel_body
from .xla_loops import Run, has_exec, items, ranged, traced_statements, writes
from .xla_plan import XlaPlan

_RUNS: dict[int, Host] = {}  # the runs in progress by id: a callback gets its run's id as
# an argument of the program, so concurrent runs never mix (``xla._Xla.run`` registers them)


def make_program(plan: XlaPlan, host_ops: tuple[int, ...], outs: tuple[int, ...]):
    """The program to trace: ``(bvec, hosts, carried)`` (the bound values, then the run's id;
    the host arrays of ``host_ops``, then the zero stores ``plan.zero_args``; the stores
    ``plan.carried`` as the last run left them, donated) -> ``(found, carried)``: what the
    trace found, as values: the stores ``outs`` (a flat tuple: a dict of them cost a tenth of
    a one-op program's call), then in one array what it counted (where
    ``plan.counts_on_device``), its bounds as reached and, where it met a max/min over a range
    that can be empty, that error; or the outputs alone where there is none of these (an output
    costs a buffer and a transfer: a third of a one-op program's run); and the carried stores
    as this run leaves them, for the next."""
    names = list(plan.sdg.params)

    def program(bvec, hosts, carried):  # jax names the compiled module after it (jit_program)
        env = {ic.bound(p): bvec[k] for k, p in enumerate(names)}
        zeros = dict(zip(plan.zero_args, hosts[len(host_ops):]))
        zeros.update(zip(plan.carried, carried))
        trace = _Trace(plan, dict(zip(host_ops, hosts)), bvec[len(names)])
        calls = jnp.zeros(len(plan.ops), jnp.int32) if plan.counts_on_device else None
        err = jnp.zeros(2 + plan.ndom, jnp.int32)
        state = {"s": {i: trace.prefill(i, trace.hosts[i]) if i in plan.prefilled else
                       zeros[i] if i in zeros else trace.zeros(i, sh, dt)
                       for i, (sh, dt) in plan.shapes.items()},
                 "calls": calls,
                 "w": {i: jnp.int32(-1) for i in plan.sdg.untils.values()},
                 "b": {p: env[ic.bound(p)] for p in plan.sdg.untils},
                 "err": err}
        state = trace.node(plan.lowered.ast, env, state,
                           {i: trace.literal(i) for i in plan.baked})
        values = tuple(_logical(state["s"][i], plan.perms.get(i)) for i in outs)
        met = state["err"] is not err  # a checked max/min was traced
        ints = ([_calls(state)] if plan.counts_on_device else []) + [
            jnp.asarray(state["b"][p], jnp.int32)[None] for p in plan.sdg.untils] + (
            [state["err"]] if met else [])
        kept = tuple(state["s"][i] for i in plan.carried)
        return ((*values, jnp.concatenate(ints)) if ints else values), kept

    return program


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

    def literal(self, op: int):
        """A baked constant, or a broadcast of one (``XlaPlan._baked``). A constant that an op
        of 16-bit floats reads passes an optimisation barrier: XLA's algebraic simplifier folds
        constant factors (``(x * 1000) / 1000`` to ``x``), which in float16 skipped the overflow
        that NumPy, the reference and the other executors meet (an opaque value is computed
        with as written)."""
        o = self.xp.sdg.ops[op]
        if o.kind == "broadcast_to":  # of a baked constant (XlaPlan._baked)
            return jnp.broadcast_to(self.literal(self.xp.sdg.in_edges(op)[0].src),
                                    o.type.shape)
        value = jnp.asarray(np.asarray(o.attrs["value"], o.type.dtype))
        sixteen = any(accumulator(d.type.dtype) != d.type.dtype
                      for d in (self.xp.sdg.ops[e.dst] for e in self.xp.sdg.out_edges(op)))
        return lax.optimization_barrier(value) if sixteen else value

    def prefill(self, op: int, host):
        """The store of a prefilled ``from_array`` op: its array cut or padded with zeros to
        the store's shape; for an op in ``by_point``, its buffers, one argument per point
        (and zeros past the array's end)."""
        shape, dtype = self.xp.shapes[op]
        if op in self.xp.by_point:
            a = self.xp.held_axis(op)
            rest = shape[:a] + shape[a + 1:]
            return tuple(host) + tuple(jnp.zeros(rest, dtype)
                                       for _ in range(shape[a] - len(host)))
        x = host.astype(self.xp.sdg.ops[op].type.dtype).astype(dtype)
        if op in self.xp.perms:
            x = jnp.transpose(x, self.xp.perms[op])
        x = x[tuple(slice(0, n) for n in shape)]
        if x.shape != shape:
            x = jnp.pad(x, [(0, n - m) for n, m in zip(shape, x.shape)])
        x = self._placed(op, x)
        return self._views(op, x)

    def _views(self, op: int, x):
        """An unstacked store's buffers, one per point of its axis, without that axis (carried
        with an axis of size 1, each in-place update of keys in a loop was copied: 3.2 ms a
        decode step against 0.6)."""
        if op not in self.xp.unstacked:
            return x
        a = self.xp.held_axis(op)
        return tuple(lax.index_in_dim(x, j, a, keepdims=False) for j in range(x.shape[a]))

    def zeros(self, op: int, shape, dtype):
        """A store of the program, constrained to its sharding when the program has a mesh
        (XLA's partitioner then splits what computes it)."""
        return self._views(op, self._placed(op, jnp.zeros(shape, dtype)))

    def _placed(self, op: int, x):
        """``x`` as ``op``'s store: constrained to the store's sharding under a mesh."""
        layout = self.xp.lowered.layout
        sharding = None if layout is None else layout.store(op, x.ndim)
        return x if sharding is None else lax.with_sharding_constraint(x, sharding)

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
            # values written inside and read after it (XlaPlan.from_conds): returned, with
            # zeros from the branch that does not write them
            out = sorted({n.op for n in node.walk() if isinstance(n, Exec)} & xp.from_conds)

            def branch(sub):
                def f(carry):
                    st, inner = _merge(state, keys, carry), dict(vals)
                    if sub is not None:
                        st = self.node(sub, env, st, inner)
                    return _carry(st, keys), tuple(
                        inner[i].astype(xp.sdg.ops[i].type.dtype) if i in inner else
                        jnp.zeros(xp.sdg.ops[i].type.shape, xp.sdg.ops[i].type.dtype)
                        for i in out)
                return f
            carry, got = lax.cond(pred, branch(node.then), branch(node.orelse),
                                  _carry(state, keys))
            vals.update(zip(out, got))
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
        exprs = st.ints()
        bufs, ints, at = [], [ic.jax_int(x, env) for x in exprs], 0
        picks: dict = {}  # (index, points) -> [(position in bufs, views, axis)]
        for r in st.reads:
            if r.src in vals:
                v = vals[r.src]
                bufs.append(v.reshape((1,) * len(r.entries) + v.shape))
            elif r.src in xp.unstacked:  # the buffer of the point read, a constant here
                a = at + xp.unstacked[r.src]
                views, axis = state["s"][r.src], xp.held_axis(r.src)
                if _is_int(ints[a]):
                    bufs.append(jnp.expand_dims(views[_clamped(ints[a], len(views))], axis))
                else:  # picked by a loop's variable: the statement runs under a lax.switch
                    picks.setdefault((exprs[a], len(views)), []).append(
                        (len(bufs), views, axis))
                    bufs.append(None)
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
        y = _picked(lambda b: fn(tuple(b), ints, host, None), bufs,
                    [(jnp.clip(_int32(ic.jax_int(e, env)), 0, n - 1), n, reads)
                     for (e, n), reads in picks.items()])
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


def _picked(call, bufs: list, picks: list):
    """``call(bufs)`` where reads of unstacked stores at a traced point (``picks``: (index,
    number of points, [(position in bufs, views, axis)]), one per index) are filled in: under
    a ``lax.switch`` on the index whose branches read their point's buffers in place.
    Returning the buffer from a switch instead copied a layer's weights out at every step of
    the loop (a prompt's layers split off by ``passes/prefix.py``)."""
    if not picks:
        return call(bufs)
    (j, n, reads), rest = picks[0], picks[1:]

    def branch(v):
        def f():
            b = list(bufs)
            for pos, views, axis in reads:
                b[pos] = jnp.expand_dims(views[v], axis)
            return _picked(call, b, rest)
        return f
    return lax.switch(j, [branch(v) for v in range(n)])


def _is_int(j) -> bool:
    return isinstance(j, (int, np.integer))


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
