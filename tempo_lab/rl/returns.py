"""Returns and advantages as reverse recurrences over the step dim ``t`` of ``[0, T)``.

Conventions (one transition per point): ``r[t]`` is the reward for the action at ``t`` and
``done[t]`` says that transition ended the episode, so nothing after it is credited to ``t``.
``bootstrap[t]`` (optional) is a value estimate of the state the transition at ``t`` leads to; it
stands in for the rewards beyond the horizon ``T`` when an episode is still running at ``T - 1``.
``mask`` (optional) multiplies the rewards: with masked episodes (an ``alive`` mask that stays 0
after the end) it keeps the steps after an episode's end out of every return.

Each function writes the recurrence ``x[t] = f(x[t + 1])`` with a branch at ``t == T - 1``, so
the compiler runs it backwards in ``t`` inside whatever outer dims (``i``, ``b``) the inputs
have; the γ^k weights come from unrolling it, which is what the NumPy references check.
"""
from __future__ import annotations

import numpy as np

from ..errors import DefinitionError, user_location
from ..frontend.api import exp, library_scope, lift, placeholder, stack
from ..frontend.tensor import RecurrentTensor as RT
from ..frontend.tensor import as_tensor
from ..symbolic import Dim


def _keys(x: RT, t: Dim, at):
    """A branch key for ``x``'s domain with ``t`` replaced by ``at``."""
    return tuple(at if d == t else d for d in x.domain)


def _not(done: RT | None, like: RT):
    return 1.0 if done is None else 1.0 - done.astype(like.dtype)


@library_scope()
def discounted_returns(r: RT, t: Dim, T, gamma: float, done: RT | None = None,
                       mask: RT | None = None, bootstrap: RT | None = None) -> RT:
    """``G[t] = r[t] + γ (1 - done[t]) G[t + 1]`` and ``G[T-1] = r[T-1] + γ (1 - done[T-1])
    bootstrap[T-1]`` (just ``r[T-1]`` without a bootstrap): the Monte-Carlo return
    ``Σ_k γ^k r[t + k]`` up to the episode's end or the horizon."""
    if mask is not None:
        r = r * mask
    cont = _not(done, r)
    g = placeholder(r.shape, r.dtype, domain=r.domain, name="returns")
    g[_keys(g, t, T - 1)] = r if bootstrap is None else r + gamma * cont * bootstrap
    g[_keys(g, t, t)] = r + gamma * cont * g[_keys(g, t, t + 1)]
    return g


@library_scope()
def n_step_returns(r: RT, value: RT, t: Dim, T, gamma: float, n: int, done: RT | None = None,
                   mask: RT | None = None, bootstrap: RT | None = None) -> RT:
    """``Σ_{k<n} γ^k r[t + k] + γ^n V[t + n]``, cut at the episode's end (no bootstrap then)
    and at the horizon (where ``bootstrap[T-1]`` discounted by ``γ^(T - t)`` takes the place of
    ``V[t + n]``). ``value[t]`` estimates the state at ``t``.

    Written as a window of the next ``n`` steps (``r[t + k]``, zero beyond the horizon), not
    from the Monte-Carlo return's backward recurrence: step ``t``'s return then depends on
    steps ``t .. t + n`` only, so a schedule may consume it ``n`` steps later inside the
    rollout's loop instead of after the whole episode (what lets a TD(n) learner's memory stay
    flat in ``T``)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise DefinitionError(f"n_step_returns needs an int n >= 1, got {n!r}", user_location())
    if mask is not None:
        r = r * mask
    zero = np.zeros((), r.dtype)
    rewards = stack([_ahead(r, t, T, k, zero) for k in range(n)])
    dones = None if done is None else stack(
        [_ahead(done.astype(r.dtype), t, T, k, zero) for k in range(n)])
    boot = placeholder(r.shape, r.dtype, domain=r.domain, name=f"bootstrap_{n}step")
    boot[t < T - n] = gamma ** n * value[_keys(value, t, t + n)]
    if bootstrap is None:
        boot[_keys(boot, t, t)] = zero
    else:  # the horizon is T - t < n steps away
        steps = as_tensor(T - t, r.ctx).astype(r.dtype)
        boot[_keys(boot, t, t)] = exp(steps * float(np.log(gamma))) \
            * bootstrap[_keys(bootstrap, t, T - 1)]
    window = _Window(float(gamma), n)
    return lift(window)(rewards, boot) if dones is None else lift(window)(rewards, boot, dones)


def _ahead(x: RT, t: Dim, T, k: int, fill) -> RT:
    """``x[t + k]`` where ``t + k < T``, ``fill`` beyond the horizon."""
    if k == 0:
        return x
    y = placeholder(x.shape, x.dtype, domain=x.domain, name=f"{x.name or 'x'}_ahead{k}")
    y[t < T - k] = x[_keys(x, t, t + k)]
    y[_keys(y, t, t)] = fill
    return y


class _Window:
    """``Σ_k γ^k c_k r_k + c_n boot`` over a window of ``n`` steps, ``c_k`` the chance that the
    episode is still running after ``k`` of them (the product of ``1 - done``)."""

    def __init__(self, gamma: float, n: int):
        self.gamma, self.n = gamma, n
        self.__name__ = f"n_step_window_{n}"

    def __call__(self, rewards, boot, dones=None):
        import jax.numpy as jnp

        shape = (self.n,) + (1,) * (rewards.ndim - 1)
        disc = (self.gamma ** jnp.arange(self.n, dtype=rewards.dtype)).reshape(shape)
        if dones is None:
            return (disc * rewards).sum(axis=0) + boot
        running = jnp.cumprod(1 - dones, axis=0)
        cut = jnp.concatenate([jnp.ones_like(running[:1]), running[:-1]])
        return (disc * cut * rewards).sum(axis=0) + running[-1] * boot


@library_scope()
def gae(r: RT, value: RT, next_value: RT, t: Dim, T, gamma: float, lam: float,
        done: RT | None = None, mask: RT | None = None, terminated: RT | None = None) -> RT:
    """Generalised advantage estimation (Schulman et al. 2016): ``δ[t] = r[t] + γ (1 -
    done[t]) next_value[t] - value[t]`` and ``A[t] = δ[t] + γλ (1 - done[t]) A[t + 1]``, ``A[T-1]
    = δ[T-1]``. ``next_value[t]`` estimates the state the transition at ``t`` leads to (the
    horizon's bootstrap at ``T - 1``). The value targets are ``A + value``.

    With ``terminated`` (a part of ``done``), ``δ`` drops ``next_value`` only where the task
    ended, so an episode cut by a time limit (``done`` but not ``terminated``) is bootstrapped
    from ``next_value`` there, while ``A`` still stops at every ``done``."""
    if mask is not None:
        r = r * mask
    cont = _not(done, r)
    delta = r + gamma * _not(terminated if terminated is not None else done, r) * next_value \
        - value
    if mask is not None:
        delta = delta * mask
    a = placeholder(r.shape, r.dtype, domain=r.domain, name="advantages")
    a[_keys(a, t, T - 1)] = delta
    a[_keys(a, t, t)] = delta + gamma * lam * cont * a[_keys(a, t, t + 1)]
    return a


__all__ = ["discounted_returns", "gae", "n_step_returns"]
