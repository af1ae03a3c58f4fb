"""``tl.optim``: optimisers as recurrences over an iteration dim.

Parameters are placeholders over the iteration dim ``i``; an optimiser defines them as
``p[0] = init`` and ``p[i] = update(p[i - 1], g[i - 1], state[i - 1])`` with
``g = tl.grad(loss, p)`` taken on the program as written before the update (so ``g[i]`` is the
gradient of ``loss[i]`` at ``p[i]``). Training is then one recurrent program: the compiler
schedules the forward pass, the backward pass and the update of every iteration together.

    with ctx:                                      # ctx = tl.Context(dims=("i", ...))
        p = tl.optim.parameters({"w": w0}, dim=i)
        loss = ((x @ p["w"] - y) ** 2).mean()
        tl.optim.Adam(lr=1e-2).minimize(loss, p)

Several updates per iteration (PPO's epochs and minibatches) make the parameters a tensor over
several dims, ``parameters(init, dim=(i, e, m))``: the updates run in the dims' lexicographic
order, so ``p[i, e, 0]`` follows ``p[i, e - 1, M - 1]`` and ``p[i, 0, 0]`` follows
``p[i - 1, E - 1, M - 1]``; Adam's step count is that order's position.

Mixed precision: ``parameters(init, dim=i, dtype="bfloat16", master_dtype="float32")`` gives
the model bfloat16 weights, ``p[i] = master[i].astype(bfloat16)``, while the optimiser updates
float32 master weights (``p.masters``) and keeps its moments in float32: an update smaller than
a bfloat16 step (lr 1e-4 on a weight near 1 moves it by a 30th of one) accumulates in the
master instead of being rounded away. The gradient is taken in the weights' dtype, as
``jax.grad`` of a bfloat16 model gives it, and widened before the update.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError, DefinitionError, DTypeError, user_location
from ..frontend.api import CLASS, library_scope, placeholder, sqrt
from ..frontend.autodiff import grad
from ..frontend.context import current_context, scope
from ..frontend.tensor import RecurrentTensor, apply, as_tensor, constant
from ..ir.ops import canonical_dtype, is_floating
from ..symbolic import Dim, eq


class Parameters(dict):
    """Names -> placeholders over ``dims`` (the update order, outermost first), with the initial
    values an optimiser assigns. With mixed precision, ``masters`` holds the wider placeholders
    the optimiser updates (``init`` is then theirs) and each entry is a narrowing of its master;
    without, ``masters`` is the parameters themselves."""

    def __init__(self, tensors: dict, init: dict, dims: tuple[Dim, ...],
                 masters: dict | None = None):
        super().__init__(tensors)
        self.init, self.dims, self._masters = init, dims, masters

    @property
    def masters(self) -> dict:
        return self if self._masters is None else self._masters


@library_scope()
def parameters(init: dict, dim, dtype="float32", master_dtype=None) -> Parameters:
    """Placeholders over ``(dim,)``, or over ``dim`` if it is a tuple of dims (one update per
    point, in lexicographic order), one per entry of ``init`` (name -> array), to be defined by
    an optimiser's ``minimize``. With ``master_dtype`` wider than ``dtype`` (``"bfloat16"``
    weights, ``"float32"`` masters), the optimiser updates master weights and its moments in
    ``master_dtype`` and the parameters are their rounding to ``dtype``."""
    loc = user_location()
    dims = dim if isinstance(dim, tuple) else (dim,)
    if not dims or not all(isinstance(d, Dim) for d in dims) or len(set(dims)) < len(dims):
        raise DefinitionError(f"parameters live over an iteration dim (e.g. i) or a tuple of "
                              f"distinct dims (e.g. (i, e, m)); got {dim!r}", loc)
    dt = canonical_dtype(dtype)
    wide = dt if master_dtype is None else canonical_dtype(master_dtype)
    if master_dtype is not None and not (is_floating(dt) and is_floating(wide)
                                         and wide.itemsize > dt.itemsize):
        raise DTypeError(f"parameters: master_dtype ({wide.name}) must be a floating type wider "
                         f"than dtype ({dt.name}), e.g. dtype='bfloat16', "
                         f"master_dtype='float32'; leave master_dtype out to update the "
                         f"parameters in their own dtype", loc)
    arrays = {k: np.asarray(v, wide) for k, v in init.items()}
    tensors = {k: placeholder(a.shape, dt, domain=dims, name=k) for k, a in arrays.items()}
    if master_dtype is None:
        return Parameters(tensors, arrays, dims)
    masters = {k: placeholder(a.shape, wide, domain=dims, name=f"{k}_master")
               for k, a in arrays.items()}
    return Parameters(tensors, arrays, dims, masters)


def _steps(dims: tuple[Dim, ...]) -> list[tuple[tuple, tuple]]:
    """The branches of an update over ``dims`` in lexicographic order: ``(key, before)`` per
    case, where ``key`` selects the points whose last nonzero coordinate is ``dims[j]`` and
    ``before`` is the index of the point each of them follows. The innermost case is the
    default branch; the first point (all zeros) is the initial value's."""
    out = []
    for j, d in enumerate(dims):
        inner = dims[j + 1:]
        key = (*dims[:j], d if not inner else d >= 1, *(eq(x, 0) for x in inner))
        before = (*dims[:j], d - 1, *(x.bound - 1 for x in inner))
        out.append((key, before))
    return out


def _first(dims) -> tuple:
    return (0,) * len(dims) if len(dims) > 1 else 0


def _state(like: RecurrentTensor, name: str) -> RecurrentTensor:
    s = placeholder(like.shape, like.dtype, domain=like.domain, name=name)
    # a zero broadcast, not an array of zeros: a constant would be held as big as the
    # parameter (1 GB per moment for Llama-3.2-1B's embedding table)
    zero = constant(np.zeros((), like.dtype), like.ctx)
    s[_first(like.domain)] = apply("broadcast_to", [zero], {"shape": tuple(like.shape)})
    return s


def _position(dims: tuple[Dim, ...], ctx) -> RecurrentTensor:
    """The current point's position in the lexicographic order of ``dims`` (an int tensor)."""
    pos = as_tensor(dims[0], ctx)
    for d in dims[1:]:
        pos = pos * as_tensor(d.bound, ctx) + as_tensor(d, ctx)
    return pos


class _Optimizer:
    # field -> (low, high, high included): the ranges in which the update is meaningful
    RANGES: dict[str, tuple[float, float, bool]] = {}

    def __post_init__(self):
        for name, (low, high, closed) in self.RANGES.items():
            v = getattr(self, name)
            if isinstance(v, RecurrentTensor):   # a schedule (e.g. lr annealed over i)
                continue
            ok = (isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                  and np.isfinite(v) and low <= v and (v <= high if closed else v < high))
            if not ok:
                raise ArgumentError(f"{type(self).__name__}: {name}={v!r} must be a number in "
                                    f"[{low}, {high}{']' if closed else ')'}")

    def minimize(self, loss: RecurrentTensor, params: Parameters) -> dict[str, RecurrentTensor]:
        """Define every parameter's recurrence; returns the gradients (name -> RT over i)."""
        if not isinstance(params, Parameters):
            raise DefinitionError("minimize needs the result of tl.optim.parameters(...)",
                                  user_location())
        ctx = current_context(loss)
        dims = params.dims
        with ctx, scope("gradient"):
            grads = dict(zip(params, grad(loss, list(params.values()))))
        with ctx, scope("update"):
            step = _position(dims, ctx)
            for name, p in params.items():
                master = params.masters[name]
                master[_first(dims)] = constant(params.init[name], ctx)
                states = self._states(name, master)
                for key, before in _steps(dims):
                    g = grads[name][before]
                    g = g if master is p else g.astype(master.dtype)
                    master[key] = self._update(master[before], g, states, key, before, step,
                                               self._lr(dims, before))
                if master is not p:
                    p[dims] = master.astype(p.dtype)
        return grads

    def _lr(self, dims, before):
        """The learning rate of the update that follows the point ``before`` (a schedule is
        read there, so all the updates of an iteration use that iteration's rate)."""
        lr = self.lr
        if not isinstance(lr, RecurrentTensor):
            return lr
        if not set(lr.domain) <= set(dims):
            raise DefinitionError(f"{type(self).__name__}: the learning rate's dims "
                                  f"({', '.join(map(str, lr.domain))}) must be among the "
                                  f"parameters' ({', '.join(map(str, dims))})", user_location())
        return lr[tuple(before[dims.index(d)] for d in lr.domain)] if lr.domain else lr

    def _states(self, name, p) -> dict[str, RecurrentTensor]:
        """The optimiser's state tensors for ``p`` (zero at the first point)."""
        return {}

    def _update(self, p, g, states: dict, key, before, step, lr):
        """``p``'s value at the points of ``key`` from its value ``p`` and gradient ``g`` at
        the point ``before``; each state is read at ``before`` and defined at ``key``.
        ``step`` counts the updates (1 for the first); ``lr`` is the learning rate."""
        raise NotImplementedError


@dataclass(frozen=True)
class SGD(_Optimizer):
    """``p[i] = p[i-1] - lr * v[i]`` with ``v[i] = momentum * v[i-1] + g[i-1]``."""

    lr: float = 1e-2
    momentum: float = 0.0
    RANGES = {"lr": (0.0, np.inf, False), "momentum": (0.0, 1.0, True)}

    def _states(self, name, p):
        return {"v": _state(p, f"{name}_velocity")} if self.momentum else {}

    @library_scope(CLASS)
    def _update(self, p, g, states, key, before, step, lr):
        if not self.momentum:
            return p - lr * g
        v = self.momentum * states["v"][before] + g
        states["v"][key] = v
        return p - lr * v


@dataclass(frozen=True)
class Adam(_Optimizer):
    """Adam (Kingma & Ba) with bias correction; step ``i`` takes the ``i``-th update. ``lr``
    may be a tensor over some of the parameters' dims (a schedule, e.g. annealed over ``i``)."""

    lr: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    RANGES = {"lr": (0.0, np.inf, False), "b1": (0.0, 1.0, False), "b2": (0.0, 1.0, False),
              "eps": (0.0, np.inf, False)}

    def _states(self, name, p):
        return {"m": _state(p, f"{name}_m"), "v": _state(p, f"{name}_v")}

    @library_scope(CLASS)
    def _update(self, p, g, states, key, before, step, lr):
        m = self.b1 * states["m"][before] + (1 - self.b1) * g
        v = self.b2 * states["v"][before] + (1 - self.b2) * g * g
        states["m"][key], states["v"][key] = m, v
        step = step.astype(p.dtype)
        m_hat = m / (1 - self.b1 ** step)
        v_hat = v / (1 - self.b2 ** step)
        return p - lr * m_hat / (sqrt(v_hat) + self.eps)


__all__ = ["SGD", "Adam", "Parameters", "parameters"]
