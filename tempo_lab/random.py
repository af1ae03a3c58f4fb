"""``tl.random``: random tensors keyed by (seed, op, point).

Each call is its own stream (numbered in trace order within the context), and the value at a
point depends only on the seed, the stream, the point's coordinates and the element index
(``runtime/counter_rng.py``), never on the schedule, the bounds, vectorisation or any pass.
"""
from __future__ import annotations

import functools

import numpy as np

from .errors import ArgumentError, DTypeError, user_location
from .frontend.api import library_scope, lift, static_shape
from .frontend.context import current_context
from .frontend.tensor import RecurrentTensor, apply, as_tensor
from .ir.ops import canonical_dtype, is_floating


def _random(dist: str, shape, domain, seed: int, dtype, **params) -> RecurrentTensor:
    ctx = current_context()
    domain = ctx.check_domain(domain)
    dt = canonical_dtype(dtype)
    if not is_floating(dt):
        raise DTypeError(f"tl.random.{dist} makes floating values; got dtype {dt.name}",
                         user_location())
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ArgumentError(f"tl.random.{dist}: seed must be an int, got {seed!r}")
    for k, v in params.items():
        if not np.isfinite(v):
            raise ArgumentError(f"tl.random.{dist}: {k} must be finite, got {v!r}")
    if dist == "uniform" and not params["minval"] < params["maxval"]:
        raise ArgumentError(f"tl.random.uniform: minval ({params['minval']}) must be below "
                            f"maxval ({params['maxval']})")
    stream = sum(1 for n in ctx._nodes if n.kind == "random")
    attrs = {"dist": dist, "shape": static_shape(shape), "dtype": dt, "seed": int(seed),
             "stream": stream, **params}
    return apply("random", [as_tensor(d, ctx) for d in domain], attrs)


def uniform(shape, domain=(), seed: int = 0, minval: float = 0.0, maxval: float = 1.0,
            dtype="float32") -> RecurrentTensor:
    """Uniform in ``[minval, maxval)`` at every point of ``domain``."""
    return _random("uniform", shape, domain, seed, dtype, minval=_float(minval, "minval"),
                   maxval=_float(maxval, "maxval"))


def _float(v, what: str) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        raise ArgumentError(f"tl.random.uniform: {what} must be a number, got {v!r}") from None


def normal(shape, domain=(), seed: int = 0, dtype="float32") -> RecurrentTensor:
    """Standard normal at every point of ``domain``."""
    return _random("normal", shape, domain, seed, dtype)


ROUNDS = 6  # Feistel rounds of a permutation: each a keyed 32-bit mix of the right half


@library_scope()
def permutation(index, n, domain=(), seed: int = 0) -> RecurrentTensor:
    """Entry ``index`` of a random permutation of ``[0, n)``, one permutation per point of
    ``domain``: where ``index`` runs over ``[0, n)`` (e.g. ``m * S + s`` over the minibatches
    ``m`` and samples ``s`` of an epoch), the results visit every position once, shuffled.

    Computed pointwise, without materialising or sorting ``n`` keys, so ``n`` may be a
    program's size (``B * T``, a product of bounds: a value, not an index): the keys of a balanced Feistel network on the smallest
    ``4^h >= n`` come from ``tl.random.uniform((ROUNDS,), domain, seed)``, and entries that
    land at ``n`` or beyond are mapped again until they fall inside (cycle walking), which
    keeps it a permutation. An ``index`` outside ``[0, n)`` (or an ``n`` below 1, when it
    is data) has no entry: it is -1. A plain JAX program gets the same permutation from
    ``permutation_entry`` with the same keys."""
    ctx = current_context()
    loc = user_location()
    if isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n < 1:
        raise ArgumentError(f"tl.random.permutation: n must be at least 1, got {n}", loc)
    args = {"index": as_tensor(index, ctx), "n": as_tensor(n, ctx)}
    for what, x in args.items():
        if x.shape or x.dtype.kind not in "iu":
            raise DTypeError(f"tl.random.permutation: {what} must be an integer scalar (a dim, "
                             f"a bound or an int tensor), got {x.type}", loc)
    if np.iinfo(args["n"].dtype).max > np.iinfo(np.int32).max:  # entries are int32
        raise DTypeError(f"tl.random.permutation: n is {args['n'].dtype}, whose values may not "
                         "fit the int32 entries; give it as int32 (n up to 2**31 - 1)", loc)
    keys = uniform((ROUNDS,), domain=domain, seed=seed)
    return lift(permutation_entry)(args["index"], args["n"], keys)


def permutation_entry(index, n, keys):
    """The pure JAX function behind ``permutation``: ``index`` and ``n`` integer scalars (or
    arrays of the same shape), ``keys`` ``ROUNDS`` uniform ``[0, 1)`` floats.

    Jitted: called eagerly (the reference interpreter runs lifted functions point by point),
    its cycle-walking ``while_loop`` would otherwise be traced and compiled again at every
    call, its closures being new each time (PPO's small reference run: 12 of 24 s)."""
    return _jitted_entry()(index, n, keys)


@functools.cache
def _jitted_entry():
    import jax

    return jax.jit(_entry)


def _entry(index, n, keys):
    import jax.numpy as jnp
    from jax import lax

    from .runtime.counter_rng import _mix

    # a negative n (data) is read as 0, not as a huge unsigned one; a negative index is past n
    x, n = jnp.asarray(index).astype(jnp.uint32), jnp.maximum(jnp.asarray(n), 0).astype(jnp.uint32)
    words = (jnp.asarray(keys, jnp.float32) * 2.0**24).astype(jnp.uint32)  # exact: k / 2**24
    width = 32 - lax.clz(jnp.maximum(n, 2) - 1)            # bits of the largest entry
    half = (width + 1) // 2
    mask = (jnp.uint32(1) << half) - 1

    def feistel(x):
        left, right = x >> half, x & mask
        for r in range(ROUNDS):
            f = _mix(right ^ _mix(words[r] + jnp.uint32(0x9E3779B9 * (r + 1) & 0xFFFFFFFF)))
            left, right = right, left ^ (f & mask)
        return (left << half) | right

    # cycle walking: a valid index's cycle holds the index itself, so its walk ends within
    # that cycle, at most back where it started (about 4^half / n steps on average, at most
    # 4 there). An index outside [0, n), or any index when n < 1 from data, has no entry: it
    # does not walk (its cycle may hold no valid entry) and is -1. No step count bounds the
    # walk: 4^half is 2**32 for n above 2**30, which a uint32 cannot hold (it wrapped to 0
    # and stopped every walk after one round).
    inside = x < n
    x = lax.while_loop(lambda x: jnp.any(inside & (x >= n)),
                       lambda x: jnp.where(inside & (x >= n), feistel(x), x), feistel(x))
    return jnp.where(inside, x.astype(jnp.int32), -1)
