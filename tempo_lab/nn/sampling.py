"""Picking a token from logits: greedy (argmax) or a softmax sample at a temperature, drawn by
Gumbel-max from ``tl.random.uniform`` noise so that every sample is keyed by (seed, point) and
a plain JAX program given the same noise picks the same tokens."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ..errors import ArgumentError, DTypeError, ShapeError
from ..frontend.api import library_scope, lift
from ..frontend.tensor import RecurrentTensor as RT
from ..ir.ops import is_floating
from ..random import uniform


def gumbel_argmax(logits, u):
    """Gumbel-max: argmax(logits + Gumbel noise) is a sample of softmax(logits)."""
    u = jnp.clip(u, 1e-12, 1.0 - 1e-7)
    return jnp.argmax(logits - jnp.log(-jnp.log(u)), axis=-1).astype(jnp.int32)


def argmax(logits):
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def keep_top(logits, top_k: int | None, top_p: float | None):
    """``logits`` with every token outside the ``top_k`` most likely and outside the smallest
    set whose probability reaches ``top_p`` set to -inf, as ``transformers``' top-k and top-p
    warpers do (ties at the cut are kept; the most likely token always is)."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p is not None and top_p < 1.0:
        ascending = jnp.sort(logits, axis=-1)
        cum = jnp.cumsum(jax.nn.softmax(ascending, axis=-1), axis=-1)
        dropped = (cum <= 1.0 - top_p).at[..., -1].set(False)
        cut = jnp.min(jnp.where(dropped, jnp.inf, ascending), axis=-1, keepdims=True)
        logits = jnp.where(logits < cut, -jnp.inf, logits)
    return logits


@library_scope()
def sample(logits: RT, temperature: float = 0.0, seed: int = 0, top_k: int | None = None,
           top_p: float | None = None) -> RT:
    """An int32 token per point from ``logits`` (last axis: the vocabulary): the argmax for
    ``temperature == 0``, else a sample of ``softmax(logits / temperature)`` restricted to
    the ``top_k`` most likely tokens and to the smallest set of probability ``top_p`` (as
    ``transformers``' sampling), each draw keyed by ``(seed, point)``."""
    if not isinstance(logits, RT) or not logits.ndim:
        raise ShapeError(f"sample takes a recurrent tensor of logits with the vocabulary as its "
                         f"last axis, got {getattr(logits, 'type', type(logits).__name__)}")
    if not is_floating(logits.dtype):
        raise DTypeError(f"sample expects floating logits, got {logits.dtype.name}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not temperature >= 0 or temperature == float("inf"):
        raise ArgumentError(f"sample: temperature must be a finite number >= 0 (0: greedy), "
                            f"got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                              or top_k < 1):
        raise ArgumentError(f"sample: top_k must be an int >= 1 or None, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))
                              or not 0 < top_p <= 1):
        raise ArgumentError(f"sample: top_p must be a number in (0, 1] or None, got {top_p!r}")
    if temperature == 0:
        return lift(argmax)(logits)
    with logits.ctx:
        u = uniform(logits.shape, domain=logits.domain, seed=seed)
    scaled = logits * (1.0 / float(temperature))
    if top_k is not None or top_p is not None:
        scaled = lift(functools.partial(keep_top, top_k=top_k, top_p=top_p))(scaled)
    return lift(gumbel_argmax)(scaled, u)
