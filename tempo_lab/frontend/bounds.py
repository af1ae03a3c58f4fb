"""How a dim's bound is given at compile time: an int, ``tl.until(done, max=N)`` (the dim ends
where data says) or ``tl.lengths(array, over=b)`` (one length per instance of ``b``), and the
check that turns ``compile(bounds=...)`` into plain ints plus the data-dependent and ragged
bounds, with a located error for anything else."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import BoundsError, Location, user_location
from ..ir.sdg import Ragged
from ..symbolic import Bound, Dim
from .tensor import RecurrentTensor


def positive_int(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, np.integer)) and v >= 1


def _bound_name(key, ctx) -> str:
    if isinstance(key, Dim):
        key = key.bound
    if isinstance(key, Bound):
        key = key.name
    names = [b.name for b in ctx.bounds]
    if not isinstance(key, str) or key not in names:
        raise BoundsError(f"{key!r} is not a bound of this context; bounds are "
                          f"{', '.join(names)} (use ctx.bounds or dims)")
    return key


@dataclass(frozen=True)
class Until:
    """A data-dependent bound: the dim ends after the first point where ``done`` holds."""

    done: RecurrentTensor
    max: int
    loc: Location


def until(done: RecurrentTensor, max: int) -> Until:  # noqa: A002 - the documented keyword
    """``bounds={T: tl.until(done, max=N)}``: run ``t`` until ``done[t]`` first holds (at most
    ``N`` steps); outputs have the length actually reached."""
    if not isinstance(done, RecurrentTensor):
        raise BoundsError("tl.until needs a boolean recurrent tensor: tl.until(done, max=N)")
    if not positive_int(max) or max > MAX_BOUND:
        raise BoundsError(f"tl.until: max must be a positive int up to {MAX_BOUND}, got "
                          f"{max!r}")
    return Until(done, int(max), user_location())


MAX_BOUND = 2**31 - 1  # kernels index with int32


@dataclass(frozen=True, eq=False)
class Lengths:
    """A ragged bound: one length per point of an outer dim, given (``lengths``) or where
    ``done`` over ``(over, t)`` first holds (``until``)."""

    array: np.ndarray | None
    over: Dim
    loc: Location
    done: RecurrentTensor | None = None
    max: int = 0


def lengths(array, over: Dim) -> Lengths:
    """``bounds={T: tl.lengths(array, over=b)}``: at each point ``b``, dim ``t`` has
    ``array[b]`` points, so ``x`` over ``(b, t)`` lives on ``{(b, t) : t < T_b}``; ``T - 1`` is
    each instance's own last point and ``x[b, 0:T]`` its own whole range. Outputs come back
    padded with zeros; ``run.mask(name)`` says which entries are real."""
    loc = user_location()
    if not isinstance(over, Dim):
        raise BoundsError(f"tl.lengths(array, over=...): over must be a dim (e.g. b), got "
                          f"{over!r}", loc)
    if isinstance(array, RecurrentTensor):
        raise BoundsError(f"tl.lengths: {array.name} is a recurrent tensor; give the lengths as "
                          "a NumPy array known before the run, or end each instance by data "
                          f"with tl.until(done, max=N) where done is over ({over}, t)", loc)
    a = np.asarray(array)
    if a.ndim != 1 or a.size == 0 or a.dtype.kind not in "iu":
        raise BoundsError(f"tl.lengths: give a non-empty 1-D integer array with one length per "
                          f"point of {over}, got {a.dtype.name} of shape {a.shape}", loc)
    if a.min() < 1 or a.max() > MAX_BOUND:
        raise BoundsError(f"tl.lengths: every length must be between 1 and {MAX_BOUND}, got "
                          f"{a.min()}..{a.max()}; drop the empty instances", loc)
    return Lengths(a.astype(np.int64), over, loc)


def normalise_bounds(ctx, bounds) -> tuple[dict[str, int], dict[str, RecurrentTensor],
                                            dict[str, Ragged]]:
    if bounds is None:
        bounds = {}
    if not isinstance(bounds, Mapping):
        raise BoundsError(f"bounds={bounds!r}: give a dict from bounds to values, e.g. "
                          f"bounds={{{', '.join(f'{b.name}: 8' for b in ctx.bounds)}}}")
    out, dynamic, ragged = {}, {}, {}
    for k, v in bounds.items():
        name = _bound_name(k, ctx)
        if name in out:
            raise BoundsError(f"the bound {name} is given twice in bounds=; give it once")
        if isinstance(v, Lengths) and v.array is not None:
            ragged[name] = v
            v = int(v.array.max())
        if isinstance(v, Until):
            d = next(d for d in ctx.dims if d.bound.name == name)
            per_instance = len(v.done.domain) == 2 and d in v.done.domain
            if (v.done.domain != (d,) and not per_instance) or v.done.dtype != np.bool_ \
                    or v.done.shape != ():
                raise BoundsError(f"tl.until for {name}: done ({v.done.name}, made at "
                                  f"{v.done.loc}) must be a bool scalar over ({d},), or over "
                                  f"(b, {d}) to end {d} per instance of b; got {v.done.type} "
                                  f"over ({', '.join(map(str, v.done.domain))}); write it at "
                                  f"the point {d}, e.g. done = x[{d}] > 0.5", v.loc)
            if per_instance:
                over = next(x for x in v.done.domain if x != d)
                ragged[name] = Lengths(None, over, v.loc, v.done, v.max)
            else:
                dynamic[name] = v.done
            v = v.max
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise BoundsError(f"the bound {name} must be a positive int or tl.until(done, max=N),"
                              f" got {v!r}")
        if v > MAX_BOUND:
            raise BoundsError(f"the bound {name} = {v} exceeds {MAX_BOUND}, the largest index "
                              "the kernels can address (int32); split the dim in two")
        out[name] = int(v)
    return out, dynamic, _check_ragged(ctx, out, ragged, dynamic)


def _check_ragged(ctx, bounds: dict[str, int], given: dict[str, Lengths],
                  dynamic) -> dict[str, Ragged]:
    """Each ragged bound's outer dim is another, plainly bounded dim, with one length per
    point."""
    out = {}
    for name, v in given.items():
        b = v.over
        if b not in ctx.dims or b.bound.name == name:
            raise BoundsError(f"tl.lengths for {name}: over={b} must be another dim of this "
                              f"context ({', '.join(map(str, ctx.dims))})", v.loc)
        if b.bound.name in given or b.bound.name in dynamic:
            raise BoundsError(f"tl.lengths for {name}: {b}'s bound is ragged or data-"
                              "dependent itself; give over= a dim with an int bound", v.loc)
        want = bounds.get(b.bound.name)
        if v.array is None:  # tl.until per instance: the done tensor, an op once built
            out[name] = Ragged(b.name, None, v.done, v.max)
            continue
        if want is not None and want != len(v.array):
            raise BoundsError(f"tl.lengths for {name}: {len(v.array)} lengths, but {b.bound} = "
                              f"{want}; give one length per point of {b}", v.loc)
        out[name] = Ragged(b.name, v.array)
    return out
