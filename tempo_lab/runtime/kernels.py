"""The kernel library every JAX executor shares: one jitted function per op structure and
static read pattern, reading the op's inputs from their stores (points by index, ranges by a
padded slice or gather), computing the op with its JAX rule (``jax_ops``) and writing its own
store in place (``dynamic_update_slice`` on a donated buffer). The XLA-loop executor traces the
same bodies inline instead of jitting them one by one.
"""
from __future__ import annotations

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..cache import LRU
from ..errors import ShapeError
from ..ir.ops import flag
from ..ir.sdg import SDG, Op
from ..ir.vmap import base_op, mapped_axes
from . import counter_rng, jax_ops

MAX_KERNELS = 4096  # jitted per-statement kernels kept process-wide (least recently used go)
KERNELS = LRU(MAX_KERNELS)


def shared_kernel(sdg: SDG, op: Op, reads: tuple, out_shape: tuple, has_store: bool,
                  donate: bool, levels: tuple):
    """The process-wide jitted kernel for an op's structure and static read pattern
    (``reads``: (source op id, pattern) per input), so equal ops in other programs and other
    bound values reuse it."""
    in_types = tuple(sdg.ops[src].type for src, _ in reads)
    patterns = tuple(p for _, p in reads)
    key = (op.kind, attrs_key(op), op.type, len(op.domain), in_types, patterns, out_shape,
           has_store, donate, levels)
    return KERNELS.get(key, lambda: _make_kernel(bare(op), in_types, patterns, out_shape,
                                                 has_store, donate, levels))


HOST_ATTRS = ("value", "array", "fn")  # given to a kernel at call time, never kept by it


def bare(op: Op) -> Op:
    """``op`` without its host-side values: what a kernel kept process-wide may hold (with
    them, the kernel cache held every program's weights after the program was dropped)."""
    if not any(k in op.attrs for k in HOST_ATTRS):
        return op
    return dataclasses.replace(op, attrs={k: v for k, v in op.attrs.items()
                                          if k not in HOST_ATTRS})


def _vmapped(op: Op, xs, lens, in_types, out_shape, levels):
    """The op applied per element of its vectorised leading axes, with ``jax.vmap``."""
    base = base_op(op)
    inner = []
    for i, ln in enumerate(lens):
        mapped = set(mapped_axes(levels, i))
        inner.append(type(ln)(n for j, n in enumerate(ln) if j not in mapped))

    def f(*args):
        return jax_ops.compute(base, list(args), inner, list(in_types),
                               out_shape[len(levels):])
    xs = list(xs)
    for i, x in enumerate(xs):  # a stacked range read comes padded to its size class
        sizes = [out_shape[k] for k, level in enumerate(levels) if level[i] is not None]
        for a, n in zip(mapped_axes(levels, i), sizes):
            if x.shape[a] != n:
                x = lax.slice_in_dim(x, 0, n, axis=a)
        xs[i] = x
    if base.kind == "random":  # its hash broadcasts over the points: no vmap to trace it again
        return _random_at_points(base, xs, levels, out_shape)
    for k in reversed(range(len(levels))):
        f = jax.vmap(f, in_axes=tuple(levels[k]), axis_size=out_shape[k])
    return f(*xs)


def _random_at_points(op: Op, coords, levels, out_shape):
    """A ``random`` op at every point of its vectorised axes at once: each coordinate (a
    scalar per point) with one axis per level, of the level's size where it varies and 1 where
    not, so the integer hash broadcasts. Under ``vmap`` each of its ``jnp`` operators was a
    jitted function traced again (with ``_mix``'s NumPy constants, PPO's three random ops
    traced in half the time). The values are the same integers, so the same numbers."""
    batched = []
    for i, x in enumerate(coords):
        axes = mapped_axes(levels, i)
        x = jnp.moveaxis(x, axes, list(range(len(axes))))
        for k, level in enumerate(levels):
            if level[i] is None:
                x = jnp.expand_dims(x, k)
        batched.append(x)
    return jnp.broadcast_to(counter_rng.sample(jnp, op.attrs, batched), tuple(out_shape))


def check_nonempty(op: Op, lens: list, point: tuple):
    """max/min over an empty range has no value (the reference raises the same error)."""
    axis = op.attrs.get("axis")
    nd = len(lens)
    axes = range(nd) if axis is None else [a % nd for a in ((axis,) if isinstance(axis, int)
                                                              else axis)]
    if any(lens[a] == 0 for a in axes):
        where = {d.name: v for d, v in zip(op.domain, point)}
        raise ShapeError(f"{op.kind} over an empty axis at {where}: {op.kind} has no identity; "
                         "make the range non-empty at every point (e.g. 0:t + 1) or guard this "
                         "point with a branch", op.loc)


# Every XLA program tempo_lab compiles rounds each 16-bit float op to its dtype, as NumPy and the
# reference do: with excess precision allowed, XLA keeps a bfloat16 product in float32 inside a
# fusion, and a sum of products that overflow was inf where NumPy gives NaN.
COMPILER_OPTIONS = {"xla_allow_excess_precision": False}


def attrs_key(op: Op) -> tuple:
    """The attributes a kernel is specialised on (host-side values such as constants, arrays,
    callables and index expressions are passed at call time, not baked in)."""
    return tuple((k, _value_key(v)) for k, v in sorted(op.attrs.items())
                 if k not in ("value", "array", "fn", "expr", "type", "weak"))


def _value_key(v):
    """An attribute as a key: a fused body's ops by what they compute (kind, domain, type,
    attributes, the values of their constants), never by where the user wrote them (their
    location, name or scope, which the repr of an op holds: the same program built from
    another line compiled again)."""
    if isinstance(v, Op):
        data = tuple((k, _digest(x)) for k, x in sorted(v.attrs.items())
                     if k in ("value", "array"))
        return ("op", v.id, v.kind, tuple(d.name for d in v.domain), str(v.type),
                attrs_key(v), data)
    if isinstance(v, tuple):
        return tuple(_value_key(x) for x in v)
    return repr(v)


def _digest(x) -> tuple:
    a = np.asarray(x)
    return (str(a.dtype), a.shape, hashlib.blake2b(a.tobytes(), digest_size=16).hexdigest())


def _make_kernel(op: Op, in_types: tuple, patterns: tuple, out_shape: tuple, has_store: bool,
                 donate: bool, levels: tuple):
    """One jitted function: gather every input from its store, compute, write in place."""
    kernel = kernel_body(op, in_types, patterns, out_shape, has_store, levels)
    return jax.jit(kernel, donate_argnums=(3,) if donate else (),
                   compiler_options=COMPILER_OPTIONS)


def kernel_body(op: Op, in_types: tuple, patterns: tuple, out_shape: tuple, has_store: bool,
                levels: tuple, perms: tuple = (), zeroed: tuple = ()):
    """The traceable body of a kernel (``kernel(bufs, ints, host_value, out_buf)``), shared by
    the jitted per-statement kernels and by the XLA-loop executor, which traces it inside a
    loop. ``levels``: per vectorised dim of the op, the axis of each input to map over.
    ``perms``: per input, the order its store's axes are held in (the XLA executor's
    ``perms``; None or missing: the logical order). ``zeroed``: per input, whether its
    padding is known to hold zeros (its lengths are a ``jax_ops.Zeroed``; missing: no)."""
    ndom = len(op.domain)

    def kernel(bufs, ints, host_value, out_buf):
        xs, lens_struct, pos = [], [], 0
        for r, ((pattern, cut), buf) in enumerate(zip(patterns, bufs)):
            d = ints[pos:pos + len(pattern)]
            pos += len(pattern)
            perm = perms[r] if r < len(perms) else None
            held = list(range(buf.ndim) if perm is None else perm)  # logical axis per axis
            x, ln = buf, []
            for j, p in enumerate(pattern):
                ax = held.index(j)
                if p[0] == "p":  # a point: in the store or, if its statement's guard fails,
                    # a value not used, so no wrapping of negative indices (3 ops each) to trace
                    # (nor dynamic_index_in_dim's nested jit)
                    x = lax.dynamic_slice_in_dim(x, d[j], 1, ax, allow_negative_indices=False)
                    x = lax.squeeze(x, (ax,))
                    held.pop(ax)
                    continue
                if p[2] is None and p[3]:  # 0:n on a growing axis: a plain slice, no gather
                    x = _prefix(x, ax, p[1])
                elif p[2] is None:  # s:s+n (a tiled block): two dynamic slices, no gather
                    x = _window(x, ax, d[j], p[1])
                else:  # a ring: slots wrap around
                    idx = (d[j] + jnp.arange(p[1], dtype=jnp.int32)) % p[2]
                    x = jnp.take(x, idx, axis=ax)
                ln.append(ints[pos])
                pos += 1
            if held != sorted(held):  # back to the logical order: XLA folds this transpose
                x = jnp.transpose(x, sorted(range(len(held)), key=held.__getitem__))
            ax = len(ln)
            x = x[(slice(None),) * ax + tuple(slice(0, c) for c in cut)]
            for c in cut:
                ln.append(None if c is None else ints[pos])
                pos += c is not None
            xs.append(x)
            zero = r < len(zeroed) and zeroed[r]
            lens_struct.append(jax_ops.Zeroed(ln) if zero else tuple(ln))
        at, slot = ints[pos:pos + ndom], ints[pos + ndom:]
        if op.kind == "sink":
            return xs[0]
        if op.kind == "from_array":
            rest = host_value.shape[ndom:]
            y = lax.dynamic_slice(host_value, tuple(at) + (0,) * len(rest),
                                  (1,) * ndom + rest).reshape(rest)
        elif flag(op.kind, "value"):
            y = jnp.asarray(host_value)
        else:
            y = (_vmapped(op, xs, lens_struct, in_types, out_shape, levels) if levels
                 else jax_ops.compute(op, xs, lens_struct, list(in_types), out_shape))
        y = jax_ops.fit(y.astype(op.type.dtype), out_shape)
        if not has_store:
            return y
        upd = y.reshape((1,) * ndom + y.shape)
        return lax.dynamic_update_slice(out_buf, upd, tuple(slot) + (0,) * y.ndim,
                                        allow_negative_indices=False)

    return kernel


def _prefix(x, axis: int, n: int):
    """The first ``n`` entries of ``axis`` (zeros past the buffer's end)."""
    have = min(n, x.shape[axis])
    x = lax.slice_in_dim(x, 0, have, axis=axis)
    if have < n:
        pads = [(0, 0)] * x.ndim
        pads[axis] = (0, n - have)
        x = jnp.pad(x, pads)
    return x


def _window(x, axis: int, start, n: int):
    """Entries ``start:start+n`` of ``axis`` (zeros past the buffer's end). A dynamic slice
    clamps its start to fit the buffer, so the window is cut where it fits and then shifted
    back by what the clamp took off, through a buffer of twice its size."""
    x = _prefix(x, axis, max(n, x.shape[axis]))
    lo = jnp.clip(start, 0, x.shape[axis] - n)
    w = lax.dynamic_slice_in_dim(x, lo, n, axis=axis)
    return lax.dynamic_slice_in_dim(jnp.concatenate([w, jnp.zeros_like(w)], axis), start - lo,
                                    n, axis=axis)
