"""The reference interpreter: the ground truth every pass and executor is tested against.

It evaluates an SDG point by point with NumPy, demand-driven and memoised: no scheduler, no
passes, no JAX. Evaluation uses an explicit stack, so long recurrences (T = 10 000) do not hit
Python's recursion limit, and a value that needs itself at the same point is reported as a
``ScheduleError`` naming the cycle. Dtype semantics follow ``jax.numpy``: operands are cast to the
promoted dtype before a NumPy op and results to the op's inferred dtype.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping

import jax.numpy as jnp
import numpy as np

from ..errors import DTypeError, ScheduleError, ShapeError, run_callback
from ..ir.ops import promote
from ..ir.sdg import SDG, Edge, Op
from ..ir.vmap import base_op, in_axes, vdims
from ..symbolic import Slice
from . import counter_rng
from .jax_ops import lift_output, run_body


def _softmax(x, axis):
    z = x - np.max(x, axis=axis, keepdims=True)
    ez = np.exp(z)
    return ez / np.sum(ez, axis=axis, keepdims=True)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _int_floordiv(x, y):
    """Integer ``//`` as JAX (XLA) defines it: a quotient truncated towards zero (``x / 0`` is
    all ones: -1 signed, the maximum unsigned), then floored; so ``x // 0`` is -2 for a
    signed ``x != 0``, -1 for ``0 // 0``. NumPy gives 0 (with a warning) instead."""
    zero = y == 0
    safe = np.where(zero, 1, y)
    if x.dtype.kind == "u":
        return np.where(zero, np.iinfo(x.dtype).max, x // safe).astype(x.dtype)
    trunc = _trunc_div(x, safe)
    q = np.where(zero, -1, trunc)
    r = np.where(zero, x, x - trunc * safe)
    return np.where((np.sign(x) != np.sign(y)) & (r != 0), q - 1, q).astype(x.dtype)


def _trunc_div(x, y):
    """Integer division truncated towards zero (C and XLA), exact for every integer width."""
    q = np.floor_divide(x, y)
    return q + ((q * y != x) & ((x < 0) != (y < 0)))


def _int_mod(x, y):
    """Integer ``%`` as ``jax.numpy`` defines it: the sign of the divisor, and ``x % 0`` is
    0 (the divisor is taken as 1)."""
    return np.mod(x, np.where(y == 0, 1, y)).astype(x.dtype)


def _int_power(x, y):
    """Integer ``**`` as ``jax.numpy`` computes it: binary exponentiation over the low 6 bits
    of the exponent, wrapping on overflow (a negative exponent gives what those bits give,
    not an error)."""
    bits = y.astype(np.dtype(f"u{y.dtype.itemsize}"))
    acc = np.where((x == 0) & (y != 0), 0, 1).astype(x.dtype)
    for _ in range(6):
        acc = np.where(bits & 1, acc * x, acc).astype(x.dtype)
        x = (x * x).astype(x.dtype)
        bits = bits >> 1
    return acc


def _integer_aware(float_fn, int_fn):
    def f(x, y):
        return int_fn(x, y) if x.dtype.kind in "iu" else float_fn(x, y)
    return f


UNARY = {"neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
         "tanh": np.tanh, "sigmoid": _sigmoid, "relu": lambda x: np.maximum(x, 0),
         "sin": np.sin, "cos": np.cos, "not": np.logical_not}
BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
          "pow": _integer_aware(np.power, _int_power), "maximum": np.maximum,
          "minimum": np.minimum, "floordiv": _integer_aware(np.floor_divide, _int_floordiv),
          "mod": _integer_aware(np.mod, _int_mod), "lt": np.less, "le": np.less_equal,
          "gt": np.greater, "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal,
          "and": np.logical_and, "or": np.logical_or}
REDUCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


def _compute(op: Op, ins: list[np.ndarray], in_types, env: dict[str, int]) -> np.ndarray:
    k, a = op.kind, op.attrs
    if k in UNARY:
        x = ins[0].astype(op.type.dtype) if k not in ("not",) else ins[0]
        with np.errstate(all="ignore"):
            return UNARY[k](x)
    if k in BINARY:
        dt, _ = promote(in_types)
        with np.errstate(all="ignore"):
            return BINARY[k](ins[0].astype(dt), ins[1].astype(dt))
    if k in REDUCE:
        axis = a.get("axis")
        axis = tuple(axis) if isinstance(axis, (list, tuple)) else axis
        x = ins[0].astype(op.type.dtype) if k in ("sum", "mean") else ins[0]
        try:
            return REDUCE[k](x, axis=axis, keepdims=a.get("keepdims", False))
        except ValueError:  # max/min over an empty range (e.g. x[0:t] at t = 0)
            point = {d.name: env[d.name] for d in op.domain}
            raise ShapeError(f"{k} over an empty axis (shape {x.shape}) at {point}: {k} has no "
                             "identity; make the range non-empty at every point (e.g. 0:t + 1) "
                             "or guard this point with a branch", op.loc) from None
    if k in ("identity", "merge"):
        return ins[0]
    if k == "fused":
        return run_body(op, ins, [None] * len(ins), in_types,
                        lambda o, a, _ln, ts: np.asarray(_compute(o, a, ts, env)))
    if k == "const":
        return a["value"]
    if k == "dimval":
        return np.asarray(a["expr"].evaluate(env), op.type.dtype)
    if k == "from_array":
        return a["array"][tuple(env[d.name] for d in op.domain)]
    if k == "source":
        return call_source(op, env)
    if k == "cast":
        return ins[0].astype(a["dtype"])
    if k == "where":
        dt, _ = promote(in_types[1:])
        return np.where(ins[0], ins[1].astype(dt), ins[2].astype(dt))
    if k == "softmax":
        return _softmax(ins[0].astype(op.type.dtype), a["axis"])
    if k == "matmul":
        dt, _ = promote(in_types)
        return np.matmul(ins[0].astype(dt), ins[1].astype(dt))
    if k == "reshape":
        return ins[0].reshape(op.type.shape)
    if k == "transpose":
        return np.transpose(ins[0], a["perm"])
    if k == "squeeze":
        return np.squeeze(ins[0], axis=tuple(a["axis"]))
    if k == "expand_dims":
        return np.expand_dims(ins[0], axis=tuple(a["axis"]))
    if k == "broadcast_to":
        return np.broadcast_to(ins[0], [int(s) if isinstance(s, int) else s.evaluate(env)
                                        for s in op.type.shape])
    if k == "getitem":
        return ins[0][a["index"]]
    if k == "concatenate":
        dt, _ = promote(in_types)
        return np.concatenate([x.astype(dt) for x in ins], axis=a["axis"])
    if k == "lift":
        return np.asarray(lift_output(a, [jnp.asarray(x) for x in ins]))
    if k == "random":
        return counter_rng.sample(np, a, ins)
    if k == "take":
        return np.take(ins[0], int(ins[1]), axis=a["axis"])
    if k == "unindex":
        shape = [s if isinstance(s, int) else s.evaluate(env) for s in op.type.shape]
        out = np.zeros(shape, op.type.dtype)
        out[a["index"]] = ins[0]
        return out
    if k == "embed":
        x, off, ax = ins[0], int(ins[1]), a["axis"] % ins[0].ndim
        shape = list(x.shape)
        shape[ax] = int(a["size"]) if isinstance(a["size"], int) else a["size"].evaluate(env)
        out = np.zeros(shape, x.dtype)
        out[(slice(None),) * ax + (slice(off, off + x.shape[ax]),)] = x
        return out
    if k == "sink":
        return np.asarray(True)
    raise NotImplementedError(f"the reference interpreter has no rule for op kind {k!r}")


def call_source(op: Op, env) -> np.ndarray:
    """``tl.source``'s fn at one point (env has the dims), checked against its shape/dtype."""
    point = {d.name: env[d.name] for d in op.domain}
    got = run_callback(op.attrs["fn"], (dict(point),), "tl.source", op.loc, point)
    try:
        v = np.asarray(got)
    except ValueError:  # a ragged nested list
        v = np.asarray(None)
    if v.shape != tuple(op.type.shape):
        raise ShapeError(f"tl.source: fn returned shape {v.shape} at {point}, expected "
                         f"{tuple(op.type.shape)}", op.loc)
    if not np.can_cast(v.dtype, op.type.dtype, casting="same_kind"):
        raise DTypeError(f"tl.source: fn returned {v.dtype} at {point}, expected "
                         f"{op.type.dtype}", op.loc)
    return v.astype(op.type.dtype)


def _vectorised(sdg: SDG, op: Op, edges, ins, types, env) -> np.ndarray:
    """``_compute``, looping over the leading axes of vectorised dims (see ``ir.vmap``)."""
    if not vdims(op) or op.kind in ("from_array", "const", "dimval", "source"):
        return _compute(op, ins, types, env)
    base, levels = base_op(op), in_axes(sdg, op, edges)

    def at(level, xs):
        if level == len(levels):
            return np.asarray(_compute(base, xs, types, env))
        return np.stack([at(level + 1, [x if a is None else np.take(x, k, axis=a)
                                        for x, a in zip(xs, levels[level])])
                         for k in range(op.type.shape[level])])
    return at(0, ins)


class Reference:
    """Demand-driven, memoised evaluation of one SDG for fixed bound values."""

    def __init__(self, sdg: SDG, bounds: Mapping[str, int]):
        self.sdg = sdg
        self.bounds = dict(bounds)
        self.memo: dict[int, dict[tuple, np.ndarray]] = {i: {} for i in sdg.ops}

    def _env(self, op: Op, point: tuple) -> dict[str, int]:
        env = dict(self.bounds)
        env.update((d.name, v) for d, v in zip(op.domain, point))
        return env

    def _reads(self, e: Edge, env) -> tuple[list[tuple], tuple[int, ...]]:
        """The producer points one consumer point reads through ``e``, and the slice shape."""
        axes = []
        for entry in e.index:
            if isinstance(entry, Slice):
                axes.append(range(entry.start.evaluate(env), entry.stop.evaluate(env)))
            else:
                axes.append((entry.evaluate(env),))
        shape = tuple(len(a) for a, x in zip(axes, e.index) if isinstance(x, Slice))
        return list(itertools.product(*axes)), shape

    def _active(self, op: Op, env) -> list[Edge]:
        edges = self.sdg.in_edges(op.id)
        if op.kind == "merge":
            taken = [e for e in edges if e.cond.evaluate(env)]
            if len(taken) != 1:
                raise ScheduleError(f"{op.label} has {len(taken)} applicable branches at "
                                    f"{env}; compile-time validation should have caught this",
                                    op.loc)
            return taken
        return [e for e in edges if e.cond.evaluate(env)]

    def value(self, op_id: int, point: tuple) -> np.ndarray:
        """The value of op ``op_id`` at ``point`` (its domain's dims, in order)."""
        memo = self.memo
        if point in memo[op_id]:
            return memo[op_id][point]
        stack = [(op_id, point)]
        expanded: set[tuple[int, tuple]] = set()
        parent: dict[tuple[int, tuple], tuple[int, tuple]] = {}  # who needs it (for cycles)
        while stack:
            oid, pt = stack[-1]
            if pt in memo[oid]:
                stack.pop()
                continue
            op = self.sdg.ops[oid]
            env = self._env(op, pt)
            edges = self._active(op, env)
            reads = [self._reads(e, env) for e in edges]
            missing = [(e.src, q) for e, (qs, _) in zip(edges, reads) for q in qs
                       if q not in memo[e.src]]
            if missing:
                if (oid, pt) in expanded:  # inputs still missing after expansion: not possible
                    raise AssertionError("reference interpreter lost an input")
                expanded.add((oid, pt))
                for item in reversed(missing):
                    if item in expanded:
                        self._cycle(parent, (oid, pt), item)
                    parent[item] = (oid, pt)
                    stack.append(item)
                continue
            ins = [self._gather(e, qs, shape) for e, (qs, shape) in zip(edges, reads)]
            types = [self.sdg.ops[e.src].type for e in edges]
            out = np.asarray(_vectorised(self.sdg, op, edges, ins, types, env))
            if op.kind != "sink" and out.dtype != op.type.dtype:
                out = out.astype(op.type.dtype)
            memo[oid][pt] = out
            expanded.discard((oid, pt))
            stack.pop()
        return memo[op_id][point]

    def _gather(self, e: Edge, points: list[tuple], shape: tuple[int, ...]) -> np.ndarray:
        src = self.memo[e.src]
        if not shape:
            return src[points[0]]
        if not points:
            p = self.sdg.ops[e.src]
            spatial = tuple(s if isinstance(s, int) else s.evaluate(self.bounds)
                            for s in p.type.shape)
            return np.zeros(shape + spatial, p.type.dtype)
        vals = np.stack([src[q] for q in points])
        return vals.reshape(shape + vals.shape[1:])

    def _cycle(self, parent, last, item):
        """Raise for the dependence cycle ``item -> ... -> last -> item``: expanded values form
        the path from the requested value down to ``last``, linked by ``parent``."""
        path = [last]
        while path[-1] != item:
            path.append(parent[path[-1]])
        chain = path[::-1] + [item]
        ops = [self.sdg.ops[o] for o, _ in chain]
        steps = [f"{op.label} ({op.kind} at {op.loc}) at {pt}" for op, (_, pt) in
                 zip(ops, chain)]
        if len(steps) > 12:
            steps = steps[:6] + [f"... {len(steps) - 11} more ..."] + steps[-5:]
        head = ops[0]
        raise ScheduleError(f"{head.label} at {chain[0][1]} depends on its own value: "
                            f"{' -> '.join(steps)}. Read an earlier point (e.g. x[t - 1]) or "
                            "add a branch for the base case", head.loc)

    # -- whole-domain helpers -----------------------------------------------------------------
    def points(self, op_id: int):
        op = self.sdg.ops[op_id]
        return itertools.product(*(range(self.bounds[d.bound.name]) for d in op.domain))

    def evaluate(self, op_id: int) -> np.ndarray:
        """An op's value over its whole domain: domain axes (universe order), then spatial."""
        op = self.sdg.ops[op_id]
        dom = tuple(self.bounds[d.bound.name] for d in op.domain)
        vals = [self.value(op_id, pt) for pt in self.points(op_id)]
        if not vals:
            return np.zeros(dom + tuple(int(s.evaluate(self.bounds)) if not isinstance(s, int)
                                        else s for s in op.type.shape), op.type.dtype)
        return np.stack(vals).reshape(dom + vals[0].shape)

    def run_sinks(self):
        """Call every sink once per point, in sink order then lexicographic point order."""
        for sid in self.sdg.sinks:
            op = self.sdg.ops[sid]
            (e,) = self.sdg.in_edges(sid)
            for pt in self.points(sid):
                env = self._env(op, pt)
                qs, shape = self._reads(e, env)  # a point, or a range (tl.sink(x[0:t + 1], fn))
                for q in qs:
                    self.value(e.src, q)
                val = self._gather(e, qs, shape)
                point = {d.name: v for d, v in zip(op.domain, pt)}
                run_callback(op.attrs["fn"], (point, val), "tl.sink", op.loc, point)


def reference_bounds(sdg: SDG, bounds: Mapping[str, int]) -> dict[str, int]:
    """The bound values with each data-dependent bound (``tl.until``) cut after the first
    point of its dim where ``done`` holds (``max`` if none does)."""
    bounds = dict(bounds)
    for name, done in sdg.untils.items():
        ref = Reference(sdg, bounds)
        bounds[name] = next((v + 1 for v in range(bounds[name])
                             if bool(ref.value(done, (v,)))), bounds[name])
    return bounds


def run_reference(sdg: SDG, bounds: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Evaluate every output of ``sdg`` (and call its sinks) with the reference interpreter."""
    ref = Reference(sdg, bounds)
    out = {name: ref.evaluate(i) for name, i in sdg.outputs.items()}
    ref.run_sinks()
    return out
