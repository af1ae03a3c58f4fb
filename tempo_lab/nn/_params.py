"""Parameter plumbing shared by the modules: lifting, shape checks, nesting, deterministic init.

Parameters are plain dicts from dotted names to values, so that a user can keep them as NumPy
arrays (lifted as constants), make them tensors to differentiate, or give them over an iteration
dim (an optimiser's output) without the modules knowing which.
"""
from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError, TempoLabError
from ..frontend.tensor import RecurrentTensor, as_tensor
from ..ir.ops import is_floating, norm_dim, shape_str


class ParamError(TempoLabError):
    """A parameter dict that lacks an entry a module needs."""


def lift(x, ctx) -> RecurrentTensor:
    """``x`` as a tensor of ``ctx`` (arrays, scalars and index expressions become ops)."""
    return as_tensor(x, ctx)


def param_dims(params) -> tuple:
    """The dims the parameter tensors among ``params`` vary over (e.g. the iteration dim of
    weights an optimiser updates): a model's values vary over them too."""
    return tuple(d for v in params.values() if isinstance(v, RecurrentTensor) for d in v.domain)


def spatial_shape(x) -> tuple:
    """The spatial shape of a tensor or array, with constant sizes as ints."""
    return tuple(norm_dim(s) for s in getattr(x, "shape", np.shape(x)))


def param(params, name: str, shape: tuple, ctx, owner: str) -> RecurrentTensor:
    """``params[name]`` lifted into ``ctx``, after checking that its spatial shape is ``shape``."""
    if name not in params:
        have = ", ".join(sorted(params)) or "nothing"
        raise ParamError(f"{owner} needs the parameter '{name}' of shape {shape_str(shape)} but "
                         f"the dict has {have}; build it with {owner.split('(')[0]}.init(seed)")
    value = params[name]
    got = spatial_shape(value)
    if got != tuple(shape):
        raise ShapeError(f"{owner}: parameter '{name}' has shape {shape_str(got)} but "
                         f"{shape_str(tuple(shape))} is needed")
    return lift(value, ctx)


def check_input(x, owner: str, size: int, what: str = "the last axis") -> RecurrentTensor:
    """``x`` must be a floating tensor whose last axis has ``size`` entries."""
    if not isinstance(x, RecurrentTensor):
        raise ShapeError(f"{owner} takes a recurrent tensor as input, got {type(x).__name__}; "
                         "lift arrays with tl.constant or tl.from_array")
    shape = spatial_shape(x)
    if not shape or shape[-1] != size:
        raise ShapeError(f"{owner} expects {what} of its input to have size {size}, got an input "
                         f"of shape {shape_str(shape)}")
    if not is_floating(x.dtype):
        raise DTypeError(f"{owner} expects a floating input, got {x.dtype.name}; convert it with "
                         ".astype('float32')")
    return x


def sub(params, prefix: str) -> dict:
    """The entries of a nested module: ``{"attn.wq": w} -> {"wq": w}`` for prefix ``attn``."""
    head = prefix + "."
    return {k[len(head):]: v for k, v in params.items() if k.startswith(head)}


def nest(prefix: str, params: dict) -> dict:
    return {f"{prefix}.{k}": v for k, v in params.items()}


def rng(seed, *path: int) -> np.random.Generator:
    """A generator for one module in a tree: children get independent, reproducible streams."""
    return np.random.default_rng([int(seed), *path])


def normal(gen: np.random.Generator, shape, std: float) -> np.ndarray:
    return (gen.standard_normal(shape) * std).astype(np.float32)


def child_seed(seed, index: int) -> int:
    """The seed of a module's ``index``-th child, derived so that siblings differ."""
    return int(rng(seed, index).integers(2**31 - 1))
