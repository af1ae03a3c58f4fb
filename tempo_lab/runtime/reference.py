"""The reference interpreter: the ground truth every pass and executor is tested against.

It evaluates an SDG point by point with NumPy, demand-driven and memoised: no scheduler, no
passes, no JAX. Evaluation uses an explicit stack, so long recurrences (T = 10 000) do not hit
Python's recursion limit, and a value that needs itself at the same point is reported as a
``ScheduleError`` naming the cycle. Dtype semantics follow ``jax.numpy``: operands are cast to the
promoted dtype before a NumPy op and results to the op's inferred dtype.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping

import jax.numpy as jnp
import numpy as np

from ..errors import ScheduleError, ShapeError
from ..ir.callbacks import deliver, source_value
from ..ir.ops import BINARY, CATALOG, POW_NUMPY, UNARY, accumulator, flag, promote, rule
from ..ir.sdg import SDG, Edge, Op
from ..ir.vmap import base_op, in_axes, vdims
from ..symbolic import Slice
from . import counter_rng
from .out_of_memory import reference_error


def _np_softmax(x, axis):
    z = x - np.max(x, axis=axis, keepdims=True)
    ez = np.exp(z)
    return ez / np.sum(ez, axis=axis, keepdims=True)


def _compute(op: Op, ins: list[np.ndarray], in_types, env: dict[str, int]) -> np.ndarray:
    """The value of ``op`` at one point: its catalog NumPy rule (NumPy warnings off: an
    overflow or a 0/0 gives what it gives in NumPy, as in JAX)."""
    with np.errstate(all="ignore"):
        return CATALOG[op.kind].numpy(op, ins, in_types, env)


def _sizes(shape, env) -> list[int]:
    return [s if isinstance(s, int) else s.evaluate(env) for s in shape]


# -- the NumPy rule of every op ------------------------------------------------------------------
def _unary_rule(e):
    return lambda op, ins, types, env: e.numpy(ins[0].astype(op.type.dtype))


def _binary_rule(fn):
    def rule(op, ins, types, env):
        dt, _ = promote(types)
        return fn(ins[0].astype(dt), ins[1].astype(dt))
    return rule


for _k, _e in UNARY.items():
    rule("numpy", _k)(_unary_rule(_e))
for _k, _e in BINARY.items():
    rule("numpy", _k)(_binary_rule(_e.numpy))
rule("numpy", "pow")(_binary_rule(POW_NUMPY))
rule("numpy", "div")(_binary_rule(np.true_divide))
rule("numpy", "not")(lambda op, ins, types, env: np.logical_not(ins[0]))


def _reduce_rule(fn):
    def rule(op, ins, types, env):
        axis = op.attrs.get("axis")
        axis = tuple(axis) if isinstance(axis, (list, tuple)) else axis
        x = ins[0].astype(accumulator(op.type.dtype)) if op.kind in ("sum", "mean") else ins[0]
        try:
            return np.asarray(fn(x, axis=axis, keepdims=op.attrs.get("keepdims", False)),
                              op.type.dtype)
        except ValueError:  # max/min over an empty range (e.g. x[0:t] at t = 0)
            point = {d.name: env[d.name] for d in op.domain}
            raise ShapeError(f"{op.kind} over an empty axis (shape {x.shape}) at {point}: "
                             f"{op.kind} has no identity; make the range non-empty at every "
                             "point (e.g. 0:t + 1) or guard this point with a branch",
                             op.loc) from None
    return rule


for _k, _fn in {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}.items():
    rule("numpy", _k)(_reduce_rule(_fn))


@rule("numpy", "identity")
@rule("numpy", "merge")
def _np_first(op, ins, types, env):
    return ins[0]


@rule("numpy", "fused")
def _np_fused(op, ins, in_types, env):
    vals, types = [], []  # the body's ops in order, each on external inputs or members
    for member, refs in op.attrs["body"]:
        args = [ins[k] if where == "ext" else vals[k] for where, k in refs]
        ts = [in_types[k] if where == "ext" else types[k] for where, k in refs]
        vals.append(np.asarray(_compute(member, args, ts, env)).astype(member.type.dtype))
        types.append(member.type)
    return vals[-1]


rule("numpy", "const")(lambda op, ins, types, env: op.attrs["value"])
rule("numpy", "dimval")(
    lambda op, ins, types, env: np.asarray(op.attrs["expr"].evaluate(env), op.type.dtype))
rule("numpy", "from_array")(
    lambda op, ins, types, env: op.attrs["array"][tuple(env[d.name] for d in op.domain)])
rule("numpy", "source")(
    lambda op, ins, types, env: source_value(op, {d.name: env[d.name] for d in op.domain}))
rule("numpy", "sink")(lambda op, ins, types, env: np.asarray(True))  # delivered by run_sinks
rule("numpy", "cast")(lambda op, ins, types, env: ins[0].astype(op.attrs["dtype"]))
rule("numpy", "softmax")(
    lambda op, ins, types, env: _np_softmax(ins[0].astype(accumulator(op.type.dtype)),
                                            op.attrs["axis"]).astype(op.type.dtype))
rule("numpy", "reshape")(lambda op, ins, types, env: ins[0].reshape(op.type.shape))
rule("numpy", "transpose")(lambda op, ins, types, env: np.transpose(ins[0], op.attrs["perm"]))
rule("numpy", "squeeze")(
    lambda op, ins, types, env: np.squeeze(ins[0], axis=tuple(op.attrs["axis"])))
rule("numpy", "expand_dims")(
    lambda op, ins, types, env: np.expand_dims(ins[0], axis=tuple(op.attrs["axis"])))
rule("numpy", "broadcast_to")(
    lambda op, ins, types, env: np.broadcast_to(ins[0], _sizes(op.type.shape, env)))
rule("numpy", "getitem")(lambda op, ins, types, env: ins[0][op.attrs["index"]])
rule("numpy", "random")(lambda op, ins, types, env: counter_rng.sample(np, op.attrs, ins))


@rule("numpy", "take")
def _np_take(op, ins, types, env):
    x, index = ins[0], ins[1:]
    axis = op.attrs["axis"] % (x.ndim - len(index) + 1)
    at = tuple(min(max(int(i), 0), x.shape[axis + k] - 1) for k, i in enumerate(index))
    return x[(slice(None),) * axis + at]


@rule("numpy", "where")
def _np_where(op, ins, types, env):
    dt, _ = promote(types[1:])
    return np.where(ins[0], ins[1].astype(dt), ins[2].astype(dt))


@rule("numpy", "matmul")
def _np_matmul(op, ins, types, env):
    dt, _ = promote(types)
    b = np.swapaxes(ins[1], -1, -2) if op.attrs.get("tb") else ins[1]
    return np.matmul(ins[0].astype(dt), b.astype(dt))


@rule("numpy", "concatenate")
def _np_concatenate(op, ins, types, env):
    dt, _ = promote(types)
    return np.concatenate([x.astype(dt) for x in ins], axis=op.attrs["axis"])


@rule("numpy", "lift")
def _np_lift(op, ins, types, env):
    out = op.attrs["jax_fn"](*[jnp.asarray(x) for x in ins])  # a lifted op *is* a JAX function
    return np.asarray(out if op.attrs["out"] is None else out[op.attrs["out"]])


@rule("numpy", "unindex")
def _np_unindex(op, ins, types, env):
    out = np.zeros(_sizes(op.type.shape, env), op.type.dtype)
    out[op.attrs["index"]] = ins[0]
    return out


@rule("numpy", "scatter_add")
def _np_scatter_add(op, ins, types, env):
    g, index, axis = ins[0], ins[1:], op.attrs["axis"]
    shape = _sizes(op.attrs["shape"], env)
    out = np.zeros(shape, accumulator(g.dtype))
    for s in range(g.shape[0]):
        at = tuple(min(max(int(i[s]), 0), shape[axis + k] - 1) for k, i in enumerate(index))
        out[(slice(None),) * axis + at] += g[s]
    return out.astype(g.dtype)


@rule("numpy", "embed")
def _np_embed(op, ins, types, env):
    x, off, ax = ins[0], int(ins[1]), op.attrs["axis"] % ins[0].ndim
    shape = list(x.shape)
    shape[ax] = _sizes([op.attrs["size"]], env)[0]
    out = np.zeros(shape, x.dtype)
    out[(slice(None),) * ax + (slice(off, off + x.shape[ax]),)] = x
    return out


def _vectorised(sdg: SDG, op: Op, edges, ins, types, env) -> np.ndarray:
    """``_compute``, looping over the leading axes of vectorised dims (see ``ir.vmap``)."""
    if not vdims(op) or flag(op.kind, "value"):
        return _compute(op, ins, types, env)
    base, levels = base_op(op), in_axes(sdg, op, edges)

    def at(level, xs):
        if level == len(levels):
            return np.asarray(_compute(base, xs, types, env))
        return np.stack([at(level + 1, [x if a is None else np.take(x, k, axis=a)
                                        for x, a in zip(xs, levels[level])])
                         for k in range(op.type.shape[level])])
    return at(0, ins)


def _padded(x: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``x`` (an instance's value) with zeros up to the longest instance's shape."""
    if x.shape == like.shape:
        return x
    return np.pad(x, [(0, n - m) for n, m in zip(like.shape, x.shape)])


class Reference:
    """Demand-driven, memoised evaluation of one SDG for fixed bound values.

    A ragged bound ``T`` over ``b`` (``sdg.ragged``) is ``lengths[b]`` wherever ``b`` is in the
    evaluating op's domain, and the longest length elsewhere; an op over both dims has no
    points at ``t >= lengths[b]``, and a read of such a point gives zeros."""

    def __init__(self, sdg: SDG, bounds: Mapping[str, int]):
        self.sdg = sdg
        self.bounds = dict(bounds)
        self.memo: dict[int, dict[tuple, np.ndarray]] = {i: {} for i in sdg.ops}
        self._ragged: dict[int, list[tuple[int, int, np.ndarray]]] = {}  # (t, b) positions

    def _guards(self, op_id: int) -> list[tuple[int, int, np.ndarray]]:
        """For each ragged bound whose dim and outer dim are both in op ``op_id``'s domain:
        their positions in it and the lengths."""
        if op_id not in self._ragged:
            names = [d.name for d in self.sdg.ops[op_id].domain]
            self._ragged[op_id] = [
                (names.index(self.sdg.until_dim(T).name), names.index(r.over), r.lengths)
                for T, r in self.sdg.ragged.items()
                if self.sdg.until_dim(T).name in names and r.over in names
                and r.lengths is not None]
        return self._ragged[op_id]

    def valid(self, op_id: int, point: tuple) -> bool:
        """Whether ``point`` is in op ``op_id``'s (ragged) domain."""
        return all(point[t] < n[point[b]] for t, b, n in self._guards(op_id))

    def _env(self, op: Op, point: tuple) -> dict[str, int]:
        env = dict(self.bounds)
        env.update((d.name, v) for d, v in zip(op.domain, point))
        for name, r in self.sdg.ragged.items():
            if r.over in env and r.lengths is not None:
                env[name] = int(r.lengths[env[r.over]])
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
                       if q not in memo[e.src] and self.valid(e.src, q)]
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
            return src[points[0]] if points[0] in src else self._zeros(e.src)
        if not points:
            return np.zeros(shape + self._zeros(e.src).shape, self.sdg.ops[e.src].type.dtype)
        vals = np.stack([src[q] if q in src else self._zeros(e.src) for q in points])
        return vals.reshape(shape + vals.shape[1:])

    def _zeros(self, op_id: int) -> np.ndarray:
        """What a read of a point outside a ragged domain gives (and an output holds there)."""
        p = self.sdg.ops[op_id]
        return np.zeros(tuple(s if isinstance(s, int) else s.evaluate(self.bounds)
                              for s in p.type.shape), p.type.dtype)

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
        box = itertools.product(*(range(self.bounds[d.bound.name]) for d in op.domain))
        return (p for p in box if self.valid(op_id, p)) if self._guards(op_id) else box

    def evaluate(self, op_id: int) -> np.ndarray:
        """An op's value over its whole domain: domain axes (universe order), then spatial;
        zeros outside a ragged domain and beyond an instance's own length along a spatial
        axis."""
        op = self.sdg.ops[op_id]
        dom = tuple(self.bounds[d.bound.name] for d in op.domain)
        if self.sdg.ragged:
            pad = self._zeros(op_id)
            vals = [_padded(self.value(op_id, pt), pad) if self.valid(op_id, pt) else pad
                    for pt in itertools.product(*(range(n) for n in dom))]
            return np.stack(vals).reshape(dom + pad.shape) if vals else np.zeros(
                dom + pad.shape, pad.dtype)
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
                deliver(op, {d.name: v for d, v in zip(op.domain, pt)}, val)


def reference_bounds(sdg: SDG, bounds: Mapping[str, int]) -> tuple[dict[str, int], SDG]:
    """The bound values with each data-dependent bound (``tl.until``) cut after the first
    point of its dim where ``done`` holds (``max`` if none does), and ``sdg`` with the lengths
    of each per-instance ``tl.until`` found the same way (the bound: the longest)."""
    bounds = dict(bounds)
    for name, done in sdg.untils.items():
        ref = Reference(sdg, bounds)
        bounds[name] = next((v + 1 for v in range(bounds[name])
                             if bool(ref.value(done, (v,)))), bounds[name])
    found = {}
    for name, r in sdg.ragged.items():
        if r.lengths is not None:
            continue
        ref = Reference(sdg, bounds)
        dims = [d.name for d in sdg.ops[r.done].domain]

        def first(b: int, r=r, dims=dims, ref=ref) -> int:
            return next((v + 1 for v in range(r.max) if bool(ref.value(
                r.done, tuple(b if d == r.over else v for d in dims)))), r.max)
        n = [first(b) for b in range(bounds[r.over.upper()])]
        found[name] = dataclasses.replace(r, lengths=np.array(n, np.int64))
        bounds[name] = max(n)
    return bounds, (sdg.with_ragged({**sdg.ragged, **found}) if found else sdg)


def run_reference(sdg: SDG, bounds: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Evaluate every output of ``sdg`` (and call its sinks) with the reference interpreter."""
    ref = Reference(sdg, bounds)
    out = {name: ref.evaluate(i) for name, i in sdg.outputs.items()}
    ref.run_sinks()
    return out


class ReferenceBackend:
    """The reference interpreter as a back end of the registry (``executors.REGISTRY``). Its
    capabilities say it does not lower (``Caps.lowers``): a compilation for it stops after the
    passes, and a run evaluates the SDG as built (``PassTrace.initial``), with no schedule,
    memory plan or ``Executable``."""

    name = "reference"

    def run(self, sdg: SDG, bounds: Mapping[str, int]
            ) -> tuple[dict[str, np.ndarray], dict[str, int], SDG]:
        """(every output's value, the bounds reached, ``sdg`` with the lengths each
        per-instance ``tl.until`` reached)."""
        bounds, sdg = reference_bounds(sdg, bounds)
        try:
            values = run_reference(sdg, bounds)
        except MemoryError as e:  # without its traceback, whose frames hold the values
            raise reference_error(e, sdg, bounds) from e.with_traceback(None)
        return values, bounds, sdg
