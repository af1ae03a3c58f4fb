"""Counter-based random numbers: a value is a hash of (seed, stream, point, element index).

Nothing depends on the order of evaluation, so a random tensor has the same value under every
schedule, bound value, pass and executor. One function serves NumPy (the reference
interpreter) and ``jax.numpy`` (the kernels): both wrap uint32 arithmetic the same way, so the
bits are identical and the floats differ at most in the last place of ``log``/``cos``.
"""
from __future__ import annotations

import numpy as np

MASK = 0xFFFFFFFF


def _mix(xp, x):
    """A 32-bit integer finaliser (xor-shift-multiply; good avalanche, cheap on any device)."""
    x = x ^ (x >> 16)
    x = x * xp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * xp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def bits(xp, seed: int, stream: int, coords, size: int, salt: int = 0):
    """``size`` uint32 words for the point ``coords`` (integer scalars, dims in domain order)."""
    with np.errstate(over="ignore"):
        h = _mix(xp, xp.asarray(seed & MASK, xp.uint32) ^ xp.uint32(0x9E3779B9))
        h = _mix(xp, h ^ xp.asarray((stream * 0x85EBCA6B + salt) & MASK, xp.uint32))
        for c in coords:
            h = _mix(xp, h ^ xp.asarray(c).astype(xp.uint32))
        counter = xp.arange(size, dtype=xp.uint32)
        return _mix(xp, _mix(xp, h ^ counter) + xp.uint32(0x68E31DA4))


def sample(xp, attrs: dict, coords):
    """The value of a ``random`` op at one point."""
    shape, dtype = tuple(attrs["shape"]), np.dtype(attrs["dtype"])
    size = int(np.prod(shape, dtype=np.int64))

    def unit(salt):  # uniform in [0, 1) with 24 random bits
        b = bits(xp, attrs["seed"], attrs["stream"], coords, size, salt)
        return (b >> 8).astype(xp.float32) * xp.float32(2.0 ** -24)

    if attrs["dist"] == "uniform":
        lo, hi = attrs["minval"], attrs["maxval"]
        out = unit(0) * xp.float32(hi - lo) + xp.float32(lo)
    else:  # Box-Muller
        r = xp.sqrt(xp.float32(-2.0) * xp.log(xp.float32(1.0) - unit(0)))
        out = r * xp.cos(xp.float32(2 * np.pi) * unit(1))
    return out.astype(dtype).reshape(shape)
