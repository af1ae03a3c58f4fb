"""Dense layers, embeddings and norms as frozen dataclasses: sizes in the object, parameters in
a dict passed at call time, so the same module runs on constants, differentiable tensors or
parameters that change over an iteration dim."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import DTypeError, ShapeError
from ..frontend import api
from ..frontend.api import library_scope
from ..frontend.tensor import RecurrentTensor, constant
from ._params import check_input, child_seed, nest, normal, param, rng, sub

RT = RecurrentTensor


# -- activations ------------------------------------------------------------------------------------
@library_scope()
def silu(x) -> RT:
    """``x * sigmoid(x)`` (a.k.a. swish), the gate of SwiGLU."""
    return x * api.sigmoid(x)


@library_scope()
def gelu(x) -> RT:
    """GELU, tanh approximation (as ``jax.nn.gelu(approximate=True)``)."""
    c = float(np.sqrt(2.0 / np.pi))
    return 0.5 * x * (1.0 + api.tanh(c * (x + 0.044715 * x * x * x)))


ACTIVATIONS: dict[str, Callable] = {
    "relu": api.relu, "tanh": api.tanh, "sigmoid": api.sigmoid, "silu": silu, "gelu": gelu,
    "identity": lambda x: x,
}


def activation(name_or_fn) -> Callable:
    if callable(name_or_fn):
        return name_or_fn
    if name_or_fn not in ACTIVATIONS:
        raise ShapeError(f"unknown activation {name_or_fn!r}; use one of "
                         f"{', '.join(sorted(ACTIVATIONS))} or pass a function")
    return ACTIVATIONS[name_or_fn]


# -- modules ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Linear:
    """``x @ w + b`` over the last axis. Init: ``w ~ N(0, 1/d_in)`` (LeCun normal, keeps the
    output variance near the input's), ``b = 0``."""

    d_in: int
    d_out: int
    bias: bool = True

    def init(self, seed: int = 0) -> dict[str, np.ndarray]:
        p = {"w": normal(rng(seed), (self.d_in, self.d_out), 1.0 / np.sqrt(self.d_in))}
        if self.bias:
            p["b"] = np.zeros((self.d_out,), np.float32)
        return p

    @library_scope()
    def __call__(self, params, x) -> RT:
        me = f"Linear({self.d_in}, {self.d_out})"
        x = check_input(x, me, self.d_in)
        y = x @ param(params, "w", (self.d_in, self.d_out), x.ctx, me)
        if self.bias:
            y = y + param(params, "b", (self.d_out,), x.ctx, me)
        return y


@dataclass(frozen=True)
class MLP:
    """Linear layers with ``activation`` between them (none after the last). ``sizes`` are the
    widths from input to output; layer ``k``'s parameters are ``"k.w"`` and ``"k.b"``."""

    sizes: tuple[int, ...]
    activation: str | Callable = "relu"
    bias: bool = True

    def __post_init__(self):
        object.__setattr__(self, "sizes", tuple(int(s) for s in self.sizes))
        if len(self.sizes) < 2:
            raise ShapeError(f"MLP needs at least an input and an output size, got {self.sizes}")
        activation(self.activation)

    @property
    def layers(self) -> tuple[Linear, ...]:
        return tuple(Linear(a, b, self.bias) for a, b in zip(self.sizes, self.sizes[1:]))

    def init(self, seed: int = 0) -> dict[str, np.ndarray]:
        out = {}
        for k, layer in enumerate(self.layers):
            out.update(nest(str(k), layer.init(child_seed(seed, k))))
        return out

    @library_scope()
    def __call__(self, params, x) -> RT:
        act = activation(self.activation)
        layers = self.layers
        for k, layer in enumerate(layers):
            x = layer(sub(params, str(k)), x)
            if k < len(layers) - 1:
                x = act(x)
        return x


@dataclass(frozen=True)
class Embedding:
    """Rows of a ``(vocab, dim)`` table picked by integer ids. One id per point is a
    ``tl.take`` (a step costs a row; ``tl.grad`` adds the row's cotangent back at its id);
    several per point are a one-hot matmul, as ``take`` reads one position. Ids outside
    ``[0, vocab)`` give zero vectors. Init: ``N(0, 1)``."""

    vocab: int
    dim: int

    def init(self, seed: int = 0) -> dict[str, np.ndarray]:
        return {"w": normal(rng(seed), (self.vocab, self.dim), 1.0)}

    @library_scope()
    def __call__(self, params, ids) -> RT:
        me = f"Embedding({self.vocab}, {self.dim})"
        if not isinstance(ids, RT):
            raise ShapeError(f"{me} takes a recurrent tensor of integer ids, got "
                             f"{type(ids).__name__}")
        if ids.dtype.kind not in "iu":
            raise DTypeError(f"{me} needs integer ids, got {ids.dtype.name}; convert them with "
                             ".astype('int32')")
        table = param(params, "w", (self.vocab, self.dim), ids.ctx, me)
        if ids.ndim:
            hot = api.eq(ids.expand_dims(-1), constant(np.arange(self.vocab), ids.ctx, "int32"))
            return hot.astype(table.dtype) @ table
        inside = (ids >= 0) & (ids < self.vocab)
        return api.where(inside.expand_dims(-1), api.take(table, ids), 0.0)


@dataclass(frozen=True)
class RMSNorm:
    """``x / sqrt(mean(x^2) + eps) * scale`` over the last axis. Init: ``scale = 1``."""

    dim: int
    eps: float = 1e-6

    def init(self, seed: int = 0) -> dict[str, np.ndarray]:
        return {"scale": np.ones((self.dim,), np.float32)}

    @library_scope()
    def __call__(self, params, x) -> RT:
        me = f"RMSNorm({self.dim})"
        x = check_input(x, me, self.dim)
        scale = param(params, "scale", (self.dim,), x.ctx, me)
        return x / api.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps) * scale


@dataclass(frozen=True)
class LayerNorm:
    """``(x - mean) / sqrt(var + eps) * scale + bias`` over the last axis. Init: ``scale = 1``,
    ``bias = 0``."""

    dim: int
    eps: float = 1e-5

    def init(self, seed: int = 0) -> dict[str, np.ndarray]:
        return {"scale": np.ones((self.dim,), np.float32),
                "bias": np.zeros((self.dim,), np.float32)}

    @library_scope()
    def __call__(self, params, x) -> RT:
        me = f"LayerNorm({self.dim})"
        x = check_input(x, me, self.dim)
        scale = param(params, "scale", (self.dim,), x.ctx, me)
        bias = param(params, "bias", (self.dim,), x.ctx, me)
        c = x - x.mean(axis=-1, keepdims=True)
        return c / api.sqrt((c * c).mean(axis=-1, keepdims=True) + self.eps) * scale + bias


@dataclass(frozen=True)
class SwiGLU:
    """The gated feed-forward of Llama: ``(silu(x @ w_gate) * (x @ w_up)) @ w_down``. Init:
    ``N(0, 1/fan_in)`` for each matrix."""

    dim: int
    hidden: int

    def init(self, seed: int = 0) -> dict[str, np.ndarray]:
        g = rng(seed)
        d, h = self.dim, self.hidden
        return {"w_gate": normal(g, (d, h), 1.0 / np.sqrt(d)),
                "w_up": normal(g, (d, h), 1.0 / np.sqrt(d)),
                "w_down": normal(g, (h, d), 1.0 / np.sqrt(h))}

    @library_scope("swiglu")
    def __call__(self, params, x) -> RT:
        me = f"SwiGLU({self.dim}, {self.hidden})"
        x = check_input(x, me, self.dim)
        d, h = self.dim, self.hidden
        gate = x @ param(params, "w_gate", (d, h), x.ctx, me)
        up = x @ param(params, "w_up", (d, h), x.ctx, me)
        return (silu(gate) * up) @ param(params, "w_down", (h, d), x.ctx, me)
