"""Picking a token from logits: greedy (argmax) or a softmax sample at a temperature, drawn by
Gumbel-max from ``tl.random.uniform`` noise so that every sample is keyed by (seed, point) and
a plain JAX program given the same noise picks the same tokens."""
from __future__ import annotations

import jax.numpy as jnp

from ..errors import ArgumentError, DTypeError, ShapeError
from ..frontend.api import lift
from ..frontend.tensor import RecurrentTensor as RT
from ..ir.ops import is_floating
from ..random import uniform


def gumbel_argmax(logits, u):
    """Gumbel-max: argmax(logits + Gumbel noise) is a sample of softmax(logits)."""
    u = jnp.clip(u, 1e-12, 1.0 - 1e-7)
    return jnp.argmax(logits - jnp.log(-jnp.log(u)), axis=-1).astype(jnp.int32)


def argmax(logits):
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def sample(logits: RT, temperature: float = 0.0, seed: int = 0) -> RT:
    """An int32 token per point from ``logits`` (last axis: the vocabulary): the argmax for
    ``temperature == 0``, else a sample of ``softmax(logits / temperature)``."""
    if not isinstance(logits, RT) or not logits.ndim:
        raise ShapeError(f"sample takes a recurrent tensor of logits with the vocabulary as its "
                         f"last axis, got {getattr(logits, 'type', type(logits).__name__)}")
    if not is_floating(logits.dtype):
        raise DTypeError(f"sample expects floating logits, got {logits.dtype.name}")
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise ArgumentError(f"sample: temperature must be a number >= 0 (0: greedy), got "
                            f"{temperature!r}")
    if temperature == 0:
        return lift(argmax)(logits)
    with logits.ctx:
        u = uniform(logits.shape, domain=logits.domain, seed=seed)
    return lift(gumbel_argmax)(logits * (1.0 / float(temperature)), u)
