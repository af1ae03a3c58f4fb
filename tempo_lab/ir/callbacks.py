"""Calling the user's functions of ``tl.source`` and ``tl.sink`` ops: what every executor and
the reference interpreter do the same way (the value checked against the op's type, the
user's exception wrapped at the line that registered the function)."""
from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError, run_callback
from .ops import cast_array
from .sdg import Op


def calls_python(ops) -> bool:
    """Whether a program (its ops: ``sdg.ops`` or an editor's) calls the user's Python at
    every point of an op: it has a ``tl.source`` or a ``tl.sink`` (what ``executor="auto"``
    decides by, ``executors.resolve``)."""
    return any(op.kind in ("source", "sink") for op in ops.values())


def source_value(op: Op, point: dict[str, int]) -> np.ndarray:
    """``tl.source``'s function at one point, checked against the op's shape and dtype: a
    value that does not fit the dtype (``2**40`` for int32, ``1e300`` for float32) is a
    DTypeError, not a wrapped or infinite number. A private copy (an executor may hold it in
    place): the function may change the array it returned once called again."""
    got = run_callback(op.attrs["fn"], (dict(point),), "tl.source", op.loc, point)
    try:
        v = np.array(got)
    except ValueError:  # a ragged nested list
        v = np.asarray(None)
    if v.shape != tuple(op.type.shape):
        raise ShapeError(f"tl.source {op.label}: fn returned shape {v.shape} at {point}, "
                         f"expected {tuple(op.type.shape)}", op.loc)
    if not (np.can_cast(v.dtype, op.type.dtype, casting="same_kind")
            or v.dtype.kind in "iu" and op.type.dtype.kind in "iu"):  # ints checked by value
        raise DTypeError(f"tl.source {op.label}: fn returned {v.dtype} at {point}, expected "
                         f"{op.type.dtype}", op.loc)
    return cast_array(v, op.type.dtype, f"tl.source {op.label} at {point}", op.loc)


def deliver(op: Op, point: dict[str, int], value) -> None:
    """``tl.sink``'s function at one point."""
    run_callback(op.attrs["fn"], (dict(point), value), "tl.sink", op.loc, point)
