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
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError, DefinitionError, user_location
from ..frontend.api import placeholder, sqrt
from ..frontend.autodiff import grad
from ..frontend.context import current_context
from ..frontend.tensor import RecurrentTensor, as_tensor, constant
from ..symbolic import Dim


class Parameters(dict):
    """Names -> placeholders over ``(dim,)``, with the initial values an optimiser assigns."""

    def __init__(self, tensors: dict, init: dict, dim: Dim):
        super().__init__(tensors)
        self.init, self.dim = init, dim


def parameters(init: dict, dim: Dim, dtype="float32") -> Parameters:
    """Placeholders over ``(dim,)``, one per entry of ``init`` (name -> array), to be defined
    by an optimiser's ``minimize``."""
    if not isinstance(dim, Dim):
        raise DefinitionError(f"parameters live over an iteration dim (e.g. i); got {dim!r}",
                              user_location())
    arrays = {k: np.asarray(v, dtype) for k, v in init.items()}
    return Parameters({k: placeholder(a.shape, dtype, domain=(dim,), name=k)
                       for k, a in arrays.items()}, arrays, dim)


def _state(like: RecurrentTensor, name: str) -> RecurrentTensor:
    s = placeholder(like.shape, like.dtype, domain=like.domain, name=name)
    s[0] = constant(np.zeros(like.shape, like.dtype), like.ctx)
    return s


class _Optimizer:
    # field -> (low, high, high included): the ranges in which the update is meaningful
    RANGES: dict[str, tuple[float, float, bool]] = {}

    def __post_init__(self):
        for name, (low, high, closed) in self.RANGES.items():
            v = getattr(self, name)
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
        i = params.dim
        with ctx:
            grads = dict(zip(params, grad(loss, list(params.values()))))
            for name, p in params.items():
                p[0] = constant(params.init[name], ctx)
                p[i] = self._update(name, p, grads[name], i)
        return grads

    def _update(self, name, p, g, i):
        raise NotImplementedError


@dataclass(frozen=True)
class SGD(_Optimizer):
    """``p[i] = p[i-1] - lr * v[i]`` with ``v[i] = momentum * v[i-1] + g[i-1]``."""

    lr: float = 1e-2
    momentum: float = 0.0
    RANGES = {"lr": (0.0, np.inf, False), "momentum": (0.0, 1.0, True)}

    def _update(self, name, p, g, i):
        if not self.momentum:
            return p[i - 1] - self.lr * g[i - 1]
        v = _state(p, f"{name}_velocity")
        v[i] = self.momentum * v[i - 1] + g[i - 1]
        return p[i - 1] - self.lr * v[i]


@dataclass(frozen=True)
class Adam(_Optimizer):
    """Adam (Kingma & Ba) with bias correction; step ``i`` takes the ``i``-th update."""

    lr: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    RANGES = {"lr": (0.0, np.inf, False), "b1": (0.0, 1.0, False), "b2": (0.0, 1.0, False),
              "eps": (0.0, np.inf, False)}

    def _update(self, name, p, g, i):
        m, v = _state(p, f"{name}_m"), _state(p, f"{name}_v")
        m[i] = self.b1 * m[i - 1] + (1 - self.b1) * g[i - 1]
        v[i] = self.b2 * v[i - 1] + (1 - self.b2) * g[i - 1] * g[i - 1]
        step = as_tensor(i, p.ctx).astype(p.dtype)
        m_hat = m[i] / (1 - self.b1 ** step)
        v_hat = v[i] / (1 - self.b2 ** step)
        return p[i - 1] - self.lr * m_hat / (sqrt(v_hat) + self.eps)


__all__ = ["SGD", "Adam", "Parameters", "parameters"]
