"""Calling the user's functions of ``tl.source`` and ``tl.sink`` ops: what every executor and
the reference interpreter do the same way (the value checked against the op's type, the
user's exception wrapped at the line that registered the function)."""
from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError, run_callback
from .sdg import Op


def source_value(op: Op, point: dict[str, int]) -> np.ndarray:
    """``tl.source``'s function at one point, checked against the op's shape and dtype."""
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


def deliver(op: Op, point: dict[str, int], value) -> None:
    """``tl.sink``'s function at one point."""
    run_callback(op.attrs["fn"], (dict(point), value), "tl.sink", op.loc, point)
