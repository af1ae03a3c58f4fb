"""Counter-based random numbers: a value is a hash of (seed, stream, point, element index).

Nothing depends on the order of evaluation, so a random tensor has the same value under every
schedule, bound value, pass and executor. One function serves NumPy (the reference
interpreter) and ``jax.numpy`` (the kernels), and the values are bit-identical in both: the
pipeline is integer arithmetic (which wraps the same way everywhere) up to one exact
conversion at the end. So normals come from an inverse-CDF table in fixed point, interpolated
with integers, not from ``log``/``cos`` (Box-Muller), whose last bits differ between NumPy and
XLA.
"""
from __future__ import annotations

import functools
from statistics import NormalDist

import numpy as np

MASK = 0xFFFFFFFF
# The normal's inverse CDF at p = (m + 0.5) / 2**32 for the 31-bit magnitude word m: one entry
# for each m below DIRECT, then per octave [2**(L-1), 2**L) of m, SEGMENTS pieces interpolated
# linearly (largest error 8e-7 against the exact quantile), in fixed point with FRAC bits.
DIRECT, SEGMENTS, FRAC = 512, 256, 22


def _mix(x):
    """A 32-bit integer finaliser (xor-shift-multiply; good avalanche, cheap on any device).
    Its constants are NumPy scalars: ``jnp.uint32(c)`` made a device array at every use while
    a program was traced."""
    x = x ^ (x >> 16)
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> 16)


def bits(xp, seed: int, stream: int, coords, size: int, salt: int = 0):
    """``size`` uint32 words for the point ``coords`` (integer scalars, dims in domain order,
    or arrays of them that broadcast together: the words for each point, along a last axis).
    The seed and stream are mixed in NumPy, the coordinates in ``xp``."""
    with np.errstate(over="ignore"):
        h = _mix(np.asarray(seed & MASK, np.uint32) ^ np.uint32(0x9E3779B9))
        h = _mix(h ^ np.asarray((stream * 0x85EBCA6B + salt) & MASK, np.uint32))
        for c in coords:
            h = _mix(h ^ xp.asarray(c).astype(xp.uint32))
        counter = xp.arange(size, dtype=xp.uint32)
        return _mix(_mix(xp.asarray(h)[..., None] ^ counter) + np.uint32(0x68E31DA4))


def sample(xp, attrs: dict, coords):
    """The value of a ``random`` op at one point; or at many, where the coordinates are arrays
    that broadcast together (the value's shape is theirs, then the op's)."""
    shape, dtype = tuple(attrs["shape"]), np.dtype(attrs["dtype"])
    size = int(np.prod(shape, dtype=np.int64))

    b = bits(xp, attrs["seed"], attrs["stream"], coords, size)
    if attrs["dist"] == "uniform":
        out = _uniform(xp, b >> 8, attrs["minval"], attrs["maxval"])
    else:
        out = _normal(xp, b)
    return out.astype(dtype).reshape(out.shape[:-1] + shape)


def _uniform(xp, k, lo: float, hi: float):
    """``lo + (hi - lo) * k / 2**24`` for 24-bit integers ``k``, in fixed point with ``S``
    fraction bits (as many as int32 allows for this range): ``lo + u * (hi - lo)`` in floats
    would be fused into one multiply-add by XLA and rounded differently from NumPy."""
    lo32, hi32 = float(np.float32(lo)), float(np.float32(hi))
    top = max(abs(lo32), abs(hi32), hi32 - lo32, 2.0**-100)
    s = min(29 - int(np.ceil(np.log2(top))), 120)  # |values| * 2**s <= 2**29
    d = round((hi32 - lo32) * 2.0**s)
    d_hi, d_lo = np.uint32(d >> 15), np.uint32(d & 0x7FFF)
    k = k.astype(xp.uint32)
    k_hi, k_lo = k >> 12, k & np.uint32(0xFFF)
    # floor(k * d / 2**24) from 12- and 15-bit limbs, every partial sum below 2**31
    mid = k_hi * d_lo + ((k_lo * d_hi) << 3) + ((k_lo * d_lo) >> 12)
    v = (k_hi * d_hi << 3) + (mid >> 12)
    fixed = v.astype(xp.int32) + np.int32(round(lo32 * 2.0**s))
    out = fixed.astype(xp.float32) * np.float32(2.0**-s)
    below = np.float32(np.nextafter(np.float32(hi32), np.float32(lo32)))
    return xp.clip(out, np.float32(lo32), below)


@functools.cache
def _normal_table() -> np.ndarray:
    q = NormalDist().inv_cdf
    nodes = list(range(DIRECT))
    for level in range(DIRECT.bit_length(), 32):
        lo = 1 << (level - 1)
        nodes += [lo + k * (lo // SEGMENTS) for k in range(SEGMENTS + 1)]
    return np.array([round(-q((m + 0.5) / 2**32) * 2**FRAC) for m in nodes], np.int32)


def _normal(xp, b):
    """Standard normals from uint32 words: the top bit is the sign, the other 31 the
    magnitude's tail probability, mapped through the table with integer interpolation."""
    table = xp.asarray(_normal_table())
    m = (b & np.uint32(0x7FFFFFFF)).astype(xp.int32)
    level = sum(((m >> k) != 0).astype(xp.int32) for k in range(31))  # bit length of m
    shift = xp.maximum(level - SEGMENTS.bit_length(), 0)  # bits below the segment index
    seg = (m >> shift) & (SEGMENTS - 1)
    frac = m & (xp.left_shift(np.int32(1), shift) - 1)
    drop = xp.maximum(shift - 16, 0)  # keep 16 fraction bits: the product stays in int32
    frac, shift = frac >> drop, shift - drop
    row = DIRECT + (level - DIRECT.bit_length()) * (SEGMENTS + 1) + seg
    at = xp.clip(xp.where(m < DIRECT, m, row), 0, table.shape[0] - 2)
    lo, hi = table[at], table[at + 1]
    mag = xp.where(m < DIRECT, lo, lo + (((hi - lo) * frac) >> shift))
    fixed = xp.where((b >> 31) == 0, -mag, mag)
    return fixed.astype(xp.float32) * np.float32(2.0 ** -FRAC)
