"""Action distributions over recurrent tensors: log-probabilities and entropies for the losses,
and sampling from uniform noise (``tl.random.uniform``) so every action is keyed by (seed,
point) and a plain JAX program given the same noise takes the same actions."""
from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ..frontend.api import exp, library_scope, lift
from ..frontend.tensor import RecurrentTensor as RT
from ..nn.sampling import argmax, gumbel_argmax


def _log_prob(logits, action):
    return jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1),
                               action[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _entropy(logits):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -(jnp.exp(logp) * logp).sum(axis=-1)


def _inverse_normal_cdf(u):
    return jax.scipy.special.ndtri(jnp.clip(u, 1e-7, 1.0 - 1e-7))


@dataclass(frozen=True)
class Categorical:
    """``softmax(logits)`` over the last axis; actions are int32 indices."""

    logits: RT

    @library_scope()
    def sample(self, u: RT) -> RT:
        """``u``: uniform ``[0, 1)`` noise with the logits' shape."""
        return lift(gumbel_argmax)(self.logits, u)

    @library_scope()
    def log_prob(self, action: RT) -> RT:
        return lift(_log_prob)(self.logits, action)

    @library_scope()
    def entropy(self) -> RT:
        return lift(_entropy)(self.logits)

    @library_scope()
    def mode(self) -> RT:
        return lift(argmax)(self.logits)


@dataclass(frozen=True)
class Normal:
    """Independent normals over the last axis (a diagonal Gaussian): log-prob and entropy sum
    over it."""

    mean: RT
    log_std: RT

    @library_scope()
    def sample(self, u: RT) -> RT:
        """``u``: uniform ``[0, 1)`` noise with the mean's shape (inverse-CDF sampling)."""
        return self.mean + exp(self.log_std) * lift(_inverse_normal_cdf)(u)

    @library_scope()
    def log_prob(self, action: RT) -> RT:
        z = (action - self.mean) / exp(self.log_std)
        return (-0.5 * z * z - self.log_std - 0.5 * math.log(2 * math.pi)).sum(axis=-1)

    @library_scope()
    def entropy(self) -> RT:
        return (self.log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum(axis=-1)

    @library_scope()
    def mode(self) -> RT:
        return self.mean


__all__ = ["Categorical", "Normal"]
