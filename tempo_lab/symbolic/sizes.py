"""Static sizes for symbolic lengths: what a range such as ``0:t+1`` is padded to in kernels
and stores, so that kernels compile once per size class rather than once per step or bound."""
from __future__ import annotations

from .expr import Const, MinMax

MIN_PAD = 8


def const_cap(e) -> int | None:
    """A bound-independent upper bound of a length, e.g. 3 for ``min(3, t + 1)``."""
    if isinstance(e, int):
        return e
    if isinstance(e, Const):
        return e.value
    if isinstance(e, MinMax) and e.op == "min":
        caps = [c for c in map(const_cap, e.args) if c is not None]
        return min(caps) if caps else None
    return None


def pad(e, value: int) -> int:
    """The static size a symbolic axis of length ``value`` is padded to in kernels and stores:
    its constant cap if it has one, else the next power of two (at least MIN_PAD), so kernels
    compile once per size class, not once per step or per bound value."""
    cap = const_cap(e)
    return cap if cap is not None else size_class(value)


def size_class(n: int) -> int:
    """``n`` rounded up to a power of two, at least MIN_PAD."""
    return max(MIN_PAD, 1 << max(0, int(n) - 1).bit_length())


def store_extent(n: int) -> int:
    """The points a store allocates along a dim of bound ``n``: ``n`` itself up to MIN_PAD (two
    layers' weights are two, not eight), else its size class, so that a larger bound in the
    same class keeps the store's shape."""
    return int(n) if int(n) <= MIN_PAD else size_class(n)
