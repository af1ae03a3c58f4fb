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

from ..errors import DefinitionError, user_location
from ..frontend.api import placeholder
from ..frontend.tensor import RecurrentTensor as RT
from ..symbolic import Dim


def _keys(x: RT, t: Dim, at):
    """A branch key for ``x``'s domain with ``t`` replaced by ``at``."""
    return tuple(at if d == t else d for d in x.domain)


def _not(done: RT | None, like: RT):
    return 1.0 if done is None else 1.0 - done.astype(like.dtype)


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


def n_step_returns(r: RT, value: RT, t: Dim, T, gamma: float, n: int, done: RT | None = None,
                   mask: RT | None = None, bootstrap: RT | None = None) -> RT:
    """``Σ_{k<n} γ^k r[t + k] + γ^n V[t + n]``, cut at the episode's end (no bootstrap then)
    and at the horizon (where ``bootstrap[T-1]`` discounted by ``γ^(T - t)`` takes the place of
    ``V[t + n]``). ``value[t]`` estimates the state at ``t``.

    Built from the full return ``G`` by unrolling its recurrence ``n`` times:
    ``G[t] = Σ_{k<n} γ^k r[t + k] + γ^n c[t] G[t + n]`` with ``c[t] = Π_{k<n} (1 - done[t + k])``,
    so the n-step return is ``G[t] + γ^n c[t] (V[t + n] - G[t + n])`` where ``t + n < T`` and
    ``G[t]`` elsewhere."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise DefinitionError(f"n_step_returns needs an int n >= 1, got {n!r}", user_location())
    g = discounted_returns(r, t, T, gamma, done, mask, bootstrap)
    out = placeholder(r.shape, r.dtype, domain=r.domain, name=f"returns_{n}step")
    ahead = _keys(g, t, t + n)
    if done is None:
        cont = 1.0
    else:
        cont = 1.0 - done[_keys(done, t, slice(t, t + n))].astype(r.dtype).max(axis=0)
    out[t < T - n] = g + gamma ** n * cont * (value[ahead] - g[ahead])
    out[_keys(out, t, t)] = g
    return out


def gae(r: RT, value: RT, next_value: RT, t: Dim, T, gamma: float, lam: float,
        done: RT | None = None, mask: RT | None = None) -> RT:
    """Generalised advantage estimation (Schulman et al. 2016): ``δ[t] = r[t] + γ (1 -
    done[t]) next_value[t] - value[t]`` and ``A[t] = δ[t] + γλ (1 - done[t]) A[t + 1]``, ``A[T-1]
    = δ[T-1]``. ``next_value[t]`` estimates the state the transition at ``t`` leads to (the
    horizon's bootstrap at ``T - 1``). The value targets are ``A + value``."""
    if mask is not None:
        r = r * mask
    cont = _not(done, r)
    delta = r + gamma * cont * next_value - value
    if mask is not None:
        delta = delta * mask
    a = placeholder(r.shape, r.dtype, domain=r.domain, name="advantages")
    a[_keys(a, t, T - 1)] = delta
    a[_keys(a, t, t)] = delta + gamma * lam * cont * a[_keys(a, t, t + 1)]
    return a


__all__ = ["discounted_returns", "gae", "n_step_returns"]
