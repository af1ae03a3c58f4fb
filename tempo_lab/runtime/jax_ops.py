"""JAX implementations of the primitive ops on padded values.

A symbolic axis (a range read through ``0:t+1``, or anything computed from one) is padded to a
static size (``memory.pad``) so kernels compile once per size class. Each input comes with the
valid length of every padded axis (``None`` for static axes); ops that would let padding leak
into valid results (reductions, softmax, contractions, negative indices) mask it out. Dtype
rules are the reference interpreter's: operands are promoted as in ``jax.numpy``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ..ir.ops import promote
from ..ir.sdg import Op
from . import counter_rng

UNARY = {"neg": jnp.negative, "abs": jnp.abs, "exp": jnp.exp, "log": jnp.log,
         "sqrt": jnp.sqrt, "tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid,
         "relu": lambda x: jnp.maximum(x, 0), "sin": jnp.sin, "cos": jnp.cos,
         "not": jnp.logical_not}
BINARY = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.true_divide,
          "pow": jnp.power, "maximum": jnp.maximum, "minimum": jnp.minimum,
          "floordiv": jnp.floor_divide, "mod": jnp.mod, "lt": jnp.less, "le": jnp.less_equal,
          "gt": jnp.greater, "ge": jnp.greater_equal, "eq": jnp.equal, "ne": jnp.not_equal,
          "and": jnp.logical_and, "or": jnp.logical_or}


def _mask(x, axis: int, n, fill):
    keep = lax.broadcasted_iota(jnp.int32, x.shape, axis) < n
    return jnp.where(keep, x, jnp.asarray(fill, x.dtype))


def _extreme(dtype, low: bool):
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf if low else jnp.inf
    if dtype == jnp.bool_:
        return not low
    info = jnp.iinfo(dtype)
    return info.min if low else info.max


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axis = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(a % ndim for a in axis)


def compute(op: Op, xs: list, lens: list[tuple], in_types, out_shape) -> jax.Array:
    """The value of ``op`` at one point from padded inputs ``xs`` with valid ``lens``."""
    k, a = op.kind, op.attrs
    dt = op.type.dtype
    if k in UNARY:
        return UNARY[k](xs[0] if k == "not" else xs[0].astype(dt))
    if k in BINARY:
        cdt, _ = promote(in_types)
        return BINARY[k](xs[0].astype(cdt), xs[1].astype(cdt))
    if k in ("identity", "merge"):
        return xs[0]
    if k == "fused":
        return run_body(op, xs, lens, in_types,
                        lambda o, a, ln, ts: compute(o, a, ln, ts, o.type.shape))
    if k == "cast":
        return xs[0].astype(dt)
    if k == "where":
        cdt, _ = promote(in_types[1:])
        return jnp.where(xs[0], xs[1].astype(cdt), xs[2].astype(cdt))
    if k in ("sum", "mean", "max", "min"):
        x, ln = xs[0], lens[0]
        if k in ("sum", "mean"):
            x = x.astype(dt)
        axes = _axes(a.get("axis"), x.ndim)
        fill = 0 if k in ("sum", "mean") else _extreme(x.dtype, low=(k == "max"))
        count = 1
        for ax in axes:
            if ln[ax] is not None:
                x = _mask(x, ax, ln[ax], fill)
            count = count * (ln[ax] if ln[ax] is not None else x.shape[ax])
        fn = {"sum": jnp.sum, "mean": jnp.sum, "max": jnp.max, "min": jnp.min}[k]
        out = fn(x, axis=axes, keepdims=a.get("keepdims", False))
        return out / jnp.asarray(count, dt) if k == "mean" else out
    if k == "softmax":
        x, ax = xs[0].astype(dt), a["axis"] % xs[0].ndim
        n = lens[0][ax]
        if n is None:
            return jax.nn.softmax(x, axis=ax)
        return _mask(jax.nn.softmax(_mask(x, ax, n, -jnp.inf), axis=ax), ax, n, 0)
    if k == "matmul":
        cdt, _ = promote(in_types)
        x, y = xs[0].astype(cdt), xs[1].astype(cdt)
        n = lens[0][-1] if lens[0][-1] is not None else lens[1][-2 if y.ndim > 1 else -1]
        if n is not None:
            x = _mask(x, x.ndim - 1, n, 0)
            y = _mask(y, y.ndim - 2 if y.ndim > 1 else 0, n, 0)
        return jnp.matmul(x, y)
    if k == "reshape":
        return xs[0].reshape(op.type.shape)
    if k == "transpose":
        return jnp.transpose(xs[0], a["perm"])
    if k == "squeeze":
        return jnp.squeeze(xs[0], axis=tuple(a["axis"]))
    if k == "expand_dims":
        return jnp.expand_dims(xs[0], axis=tuple(a["axis"]))
    if k == "broadcast_to":
        return jnp.broadcast_to(xs[0], out_shape)
    if k == "getitem":
        return xs[0][_dynamic_index(a["index"], lens[0], xs[0].ndim)]
    if k == "random":
        return counter_rng.sample(jnp, a, xs)
    if k == "lift":
        return lift_output(a, xs)
    if k == "take":
        return lax.dynamic_index_in_dim(xs[0], xs[1], a["axis"] % xs[0].ndim, keepdims=False)
    if k == "unindex":
        return jnp.zeros(out_shape, xs[0].dtype).at[a["index"]].set(xs[0])
    if k == "embed":
        x, ax = xs[0], a["axis"] % xs[0].ndim
        if lens[0][ax] is not None:  # padding must not land inside the frame
            x = _mask(x, ax, lens[0][ax], 0)
        frame = list(x.shape)
        frame[ax] = out_shape[ax] + x.shape[ax]
        out = lax.dynamic_update_slice_in_dim(jnp.zeros(frame, x.dtype), x, xs[1], ax)
        return lax.slice_in_dim(out, 0, out_shape[ax], axis=ax)
    if k == "concatenate":
        cdt, _ = promote(in_types)
        return jnp.concatenate([x.astype(cdt) for x in xs], axis=a["axis"])
    raise NotImplementedError(f"no JAX rule for op kind {k!r}")


def lift_output(attrs: dict, xs: list):
    """A ``tl.lift`` op's value: its function on the inputs, the op's output picked out."""
    out = attrs["jax_fn"](*xs)
    return out if attrs["out"] is None else out[attrs["out"]]


def run_body(op: Op, xs: list, lens: list, in_types, compute_one):
    """Evaluate a fused op's body: ``compute_one(op, inputs, lens, input types)`` per member.
    Members have static shapes, so values made inside the body need no masks."""
    vals, types = [], []
    for member, refs in op.attrs["body"]:
        args = [xs[k] if where == "ext" else vals[k] for where, k in refs]
        ln = [lens[k] if where == "ext" else (None,) * len(types[k].shape)
              for where, k in refs]
        ts = [in_types[k] if where == "ext" else types[k] for where, k in refs]
        vals.append(compute_one(member, args, ln, ts).astype(member.type.dtype))
        types.append(member.type)
    return vals[-1]


def _dynamic_index(index, lens, ndim):
    """A negative int index on a padded axis counts from the valid end, not the padded end."""
    n_real = sum(1 for e in index if e is not None and e is not Ellipsis)
    if Ellipsis in index:
        i = index.index(Ellipsis)
        index = index[:i] + (slice(None),) * (ndim - n_real) + index[i + 1:]
    out, axis = [], 0
    for e in index:
        if e is None:
            out.append(None)
            continue
        if isinstance(e, int) and e < 0 and lens[axis] is not None:
            e = lens[axis] + e
        out.append(e)
        axis += 1
    return tuple(out)


def fit(x, shape) -> jax.Array:
    """Pad with zeros or cut ``x`` to ``shape`` (both are padded static shapes)."""
    if tuple(x.shape) == tuple(shape):
        return x
    x = x[tuple(slice(0, s) for s in shape)]
    return jnp.pad(x, [(0, s - d) for s, d in zip(shape, x.shape)])
