"""Environments as recurrent tensors: one episode per row, reset at ``t = 0``, a step per ``t``.

Episodes are *masked*, not auto-reset: ``alive[t]`` is 1 until the transition that ends the
episode (included) and 0 after it, and the state stays frozen once the episode is over. A
masked row is one episode, so Monte-Carlo returns need no bookkeeping across resets, and the
horizon ``T`` truncates (and bootstraps) episodes that are still running. Programs whose length
should follow the episodes use ``bounds={T: tl.until(all_done, max=N)}`` (see ``evaluate``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import DefinitionError, user_location
from ..frontend.api import library_scope, lift, placeholder, where
from ..frontend.context import current_context
from ..frontend.tensor import RecurrentTensor as RT
from ..random import uniform
from ..symbolic import Dim


@dataclass(frozen=True)
class Rollout:
    """The tensors of a rollout, all over the rollout's domain (``(..., b, t)``)."""

    obs: RT          # observation at t
    action: RT       # action taken at t
    reward: RT       # reward of that action (0 once the episode is over)
    done: RT         # that transition ended the episode: terminated | truncated (bool)
    terminated: RT   # ... because the task ended (no value beyond it; bool)
    truncated: RT    # ... because the time limit cut it (the state after it has a value; bool)
    alive: RT        # 1.0 while the episode runs (the ending transition included), then 0.0
    next_obs: RT     # observation after the transition (for bootstrapping)
    state: RT        # the environment's state vector at t
    extras: dict     # whatever ``act`` returned besides the action (log-probs, values, ...)


def action_type(env) -> tuple[tuple[int, ...], str]:
    """The shape and dtype of one action of ``env``."""
    if hasattr(env, "num_actions"):
        return (), "int32"
    return (int(env.action_dim),), "float32"


@library_scope()
def rollout(env, t: Dim, act: Callable[[RT, RT], tuple], seed: int = 0,
            domain: tuple[Dim, ...] | None = None) -> Rollout:
    """Run ``env`` over ``domain`` (default: every dim of the current context; ``t`` last):
    ``act(obs, u)`` gets the observation and uniform ``[0, 1)`` noise of the action's shape
    (``(num_actions,)`` for discrete actions, for Gumbel-max) and returns
    ``(action, extras)``. ``env.step`` returns ``(state, reward, terminated, truncated)`` as
    gymnasium separates them; one that returns ``(state, reward, done)`` is read as
    terminating at ``done`` and never truncated."""
    ctx = current_context()
    dims = ctx.dims if domain is None else ctx.check_domain(domain)
    if dims[-1] != t:
        raise DefinitionError(f"rollout: the step dim {t} must be the rollout domain's last dim "
                              f"(it is ({', '.join(map(str, dims))}))", user_location())
    outer = dims[:-1]
    shape, dtype = action_type(env)
    state = placeholder((env.state_dim,), "float32", domain=dims, name="env_state")
    alive = placeholder((), "float32", domain=dims, name="alive")
    noise = uniform(env.reset_noise_shape, domain=outer, seed=seed)
    obs = lift(env.observe)(state)
    u = uniform((env.num_actions,) if dtype == "int32" else shape, domain=dims, seed=seed + 1)
    action, extras = act(obs, u)
    stepped = lift(env.step)(state, action)
    arity = len(stepped) if isinstance(stepped, tuple) else 1
    if arity == 3:
        new_state, reward, terminated = stepped
        truncated = terminated & False
    elif arity == 4:
        new_state, reward, terminated, truncated = stepped
    else:
        raise DefinitionError(f"rollout: {type(env).__name__}.step returned {arity} "
                              f"value{'s' * (arity != 1)}; return (state, reward, terminated, "
                              "truncated) as gymnasium separates them, or (state, reward, "
                              "done)", user_location())
    done = terminated | truncated
    state[(*outer, 0)] = lift(env.reset)(noise)
    state[(*outer, t)] = where(done[(*outer, t - 1)], state[(*outer, t - 1)],
                               new_state[(*outer, t - 1)])
    alive[(*outer, 0)] = np.float32(1.0)
    alive[(*outer, t)] = alive[(*outer, t - 1)] * (1.0 - done[(*outer, t - 1)].astype("float32"))
    return Rollout(obs, action, reward * alive, done, terminated, truncated, alive,
                   lift(env.observe)(new_state), state, dict(extras))


__all__ = ["Rollout", "action_type", "rollout"]
