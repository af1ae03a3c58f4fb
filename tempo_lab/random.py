"""``tl.random``: random tensors keyed by (seed, op, point).

Each call is its own stream (numbered in trace order within the context), and the value at a
point depends only on the seed, the stream, the point's coordinates and the element index
(``runtime/counter_rng.py``), never on the schedule, the bounds, vectorisation or any pass.
"""
from __future__ import annotations

import numpy as np

from .errors import ArgumentError, DTypeError, user_location
from .frontend.api import static_shape
from .frontend.context import current_context
from .frontend.tensor import RecurrentTensor, apply, as_tensor
from .ir.ops import canonical_dtype


def _random(dist: str, shape, domain, seed: int, dtype, **params) -> RecurrentTensor:
    ctx = current_context()
    domain = ctx.check_domain(domain)
    dt = canonical_dtype(dtype)
    if dt.kind != "f":
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
