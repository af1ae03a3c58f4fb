"""REINFORCE and PPO as one recurrent training program over ``(i, b, t)``.

Iteration ``i`` acts in ``B`` environments for ``T`` steps with the parameters ``p[i]``, then
Adam (``tl.optim``) takes one step on that batch's loss: ``p[i + 1]`` comes from ``g[i]``. The
compiler schedules rollouts, returns, the backward pass and the update of every iteration as one
program.

What the gradient must not see (the rollout, the sampled actions, the acting log-probs, the
advantages and value targets) enters the loss through placeholders whose branches are assigned
*after* ``minimize`` calls ``tl.grad``: it differentiates the program as written so far, so those
placeholders are constants to it (a stop-gradient). The rollout then runs a second copy of the
networks on ``p[i]``, which common-subexpression elimination merges with the loss's copy.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..frontend.api import exp, lift, maximum, minimum, placeholder
from ..frontend.tensor import RecurrentTensor as RT
from ..frontend.tensor import as_tensor
from ..optim import Adam, parameters
from .distributions import Categorical, Normal
from .networks import ActorCritic
from .returns import discounted_returns, gae, n_step_returns
from .rollout import action_type, rollout


@dataclass(frozen=True)
class ReinforceConfig:
    """``n_step=None``: Monte-Carlo returns with the batch mean as baseline; ``n_step=n``:
    TD(n) returns bootstrapped from a learned value (an actor-critic), advantage ``G^n - V``."""

    lr: float = 1e-2
    gamma: float = 0.99
    n_step: int | None = None
    hidden: int = 32
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    normalize: bool = True       # scale advantages to unit variance per iteration
    seed: int = 0


@dataclass(frozen=True)
class PPOConfig:
    """Clipped surrogate (Schulman et al. 2017), GAE(γ, λ) advantages normalised per iteration,
    a squared-error value loss and an entropy bonus; one Adam step per iteration."""

    lr: float = 1e-2
    gamma: float = 0.99
    lam: float = 0.95
    clip: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    hidden: int = 32
    init_log_std: float = -0.5
    seed: int = 0


@dataclass(frozen=True)
class Training:
    """What a builder returns. Per-iteration tensors are over ``(i,)``."""

    params: dict             # name -> parameter over (i,)
    episode_return: RT       # mean over b of the summed rewards of the row (truncated at T)
    episode_length: RT       # mean over b of the steps the episode was alive (at most T)
    loss: RT                 # the total loss per iteration
    policy_loss: RT
    value_loss: RT
    entropy: RT
    rollout: object          # the Rollout (acting copy) over (i, b, t)


# -- networks ---------------------------------------------------------------------------------------
def policy(net: ActorCritic, theta: RT, obs: RT):
    """The action distribution at ``obs`` under parameters ``theta``."""
    out = lift(net.policy)(theta, obs)
    return Normal(out, lift(net.log_std)(theta)) if net.continuous else Categorical(out)


def value(net: ActorCritic, theta: RT, obs: RT) -> RT:
    """The critic's estimate at ``obs`` (a scalar per point)."""
    return lift(net.value)(theta, obs)


# -- the training program ---------------------------------------------------------------------------
def _per_iteration(x: RT, i, B, T) -> RT:
    """The sum over (b, t) at each iteration: over t, then over b, one range per read, so the
    environments dim b stays vectorisable (a read of all of b is then a whole leading axis)."""
    b = x.domain[1]
    return x[i, b, 0:T].sum(axis=0)[i, 0:B].sum(axis=0)


def _build(ctx, env, cfg, loss_terms, targets):
    """The shared skeleton: parameters over ``i``; the loss on stopped rollout tensors;
    ``minimize``; then the rollout and the stopped tensors' definitions (``targets``)."""
    i, b, t = ctx.dims
    _, B, T = ctx.bounds
    dims = (i, b, t)
    shape, dtype = action_type(env)
    with ctx:
        net = ActorCritic.for_env(env, cfg.hidden)
        p = parameters({"theta": net.init(cfg.seed, getattr(cfg, "init_log_std", -0.5))}, dim=i)
        theta = p["theta"]
        # constants to tl.grad: their branches are assigned after minimize
        obs = placeholder((env.obs_dim,), "float32", dims, "obs_in")
        action = placeholder(shape, dtype, dims, "action_in")
        weight = placeholder((), "float32", dims, "weight")     # alive / count(alive) at i
        stopped = {k: placeholder((), "float32", dims, k) for k in ("adv", "target", "old_logp")}
        dist, v = policy(net, theta, obs), value(net, theta, obs)
        pg, vl, ent = loss_terms(dist, dist.log_prob(action), v, stopped)
        total = pg + cfg.vf_coef * vl - cfg.ent_coef * ent
        Adam(lr=cfg.lr).minimize(total * weight, p)

        # -- below: not seen by the gradient ----------------------------------------------------
        def act(o, u):
            d = policy(net, theta, o)
            a = d.sample(u)
            return a, {"logp": d.log_prob(a), "value": value(net, theta, o)}

        ro = rollout(env, t, act, seed=cfg.seed)
        count = _per_iteration(ro.alive, i, B, T)
        obs[i, b, t] = ro.obs
        action[i, b, t] = ro.action
        weight[i, b, t] = ro.alive / count
        values = targets(ro, _next_value(ro, value(net, theta, ro.next_obs), t, T), count)
        for k in ("adv", "target", "old_logp"):
            stopped[k][i, b, t] = values[k]
        n_envs = as_tensor(B, ctx).astype("float32")
        mean = {k: _per_iteration(x * weight, i, B, T) for k, x in
                (("policy_loss", pg), ("value_loss", vl), ("entropy", ent), ("loss", total))}
        return Training(dict(p), _per_iteration(ro.reward, i, B, T) / n_envs,
                        _per_iteration(ro.alive, i, B, T) / n_envs, mean["loss"],
                        mean["policy_loss"], mean["value_loss"], mean["entropy"], ro)


def _next_value(ro, at_next_obs: RT, t, T) -> RT:
    """The value of the state each transition leads to: the next step's value (the state
    after a transition that does not end the episode is the next step's), and at the horizon
    the value of ``next_obs``. Where an episode ends it is multiplied by 0 either way. One
    value forward pass per step instead of two."""
    i, b, _ = ro.obs.domain
    nv = placeholder((), "float32", ro.obs.domain, "next_value")
    nv[i, b, T - 1] = at_next_obs
    nv[i, b, t] = ro.extras["value"][i, b, t + 1]
    return nv


def _normalised(x: RT, ro, count, i, B, T) -> RT:
    """``x`` minus its mean over the alive points of the iteration, over their std."""
    mean = _per_iteration(x * ro.alive, i, B, T) / count
    var = _per_iteration((x - mean) ** 2 * ro.alive, i, B, T) / count
    return (x - mean) / ((var + 1e-8) ** 0.5)


def ppo(ctx, env, cfg: PPOConfig = PPOConfig()) -> Training:
    """Build PPO in ``ctx`` (dims ``(i, b, t)``): the clipped surrogate on GAE advantages,
    ``vf_coef ·`` the squared error to the GAE value targets, ``- ent_coef ·`` the entropy.
    With one update per batch the ratio is 1 where the gradient is taken, so the clip does not
    bind yet; it will once several epochs run over a batch (an extra dim)."""
    i, b, t = ctx.dims
    _, B, T = ctx.bounds

    def loss_terms(dist, logp, v, s):
        ratio = exp(logp - s["old_logp"])
        clipped = maximum(minimum(ratio, 1.0 + cfg.clip), 1.0 - cfg.clip)
        pg = -minimum(ratio * s["adv"], clipped * s["adv"])
        return pg, (v - s["target"]) ** 2, dist.entropy()

    def targets(ro, next_value, count):
        v = ro.extras["value"]
        a = gae(ro.reward, v, next_value, t, T, cfg.gamma, cfg.lam, done=ro.done, mask=ro.alive)
        return {"adv": _normalised(a, ro, count, i, B, T), "target": a + v,
                "old_logp": ro.extras["logp"]}

    return _build(ctx, env, cfg, loss_terms, targets)


def reinforce(ctx, env, cfg: ReinforceConfig = ReinforceConfig()) -> Training:
    """Build REINFORCE in ``ctx`` (dims ``(i, b, t)``): ``-log π(a|s) · advantage``, with
    Monte-Carlo returns (``n_step=None``) or TD(n) returns and a learned critic."""
    i, b, t = ctx.dims
    _, B, T = ctx.bounds

    def loss_terms(dist, logp, v, s):
        return -logp * s["adv"], (v - s["target"]) ** 2, dist.entropy()

    def targets(ro, next_value, count):
        v = ro.extras["value"]
        if cfg.n_step is None:
            g = discounted_returns(ro.reward, t, T, cfg.gamma, done=ro.done, mask=ro.alive,
                                   bootstrap=next_value)
            adv = g - _per_iteration(g * ro.alive, i, B, T) / count
        else:
            g = n_step_returns(ro.reward, v, t, T, cfg.gamma, cfg.n_step, done=ro.done,
                               mask=ro.alive, bootstrap=next_value)
            adv = g - v
        if cfg.normalize:
            adv = _normalised(adv, ro, count, i, B, T)
        return {"adv": adv, "target": g, "old_logp": ro.extras["logp"]}

    return _build(ctx, env, cfg, loss_terms, targets)


def train(build, env, cfg, iterations: int, num_envs: int, steps: int, config=None) -> dict:
    """Compile and run ``build(ctx, env, cfg)`` (``ppo`` or ``reinforce``) in a fresh context
    over ``(i, b, t)``; returns the per-iteration curves as NumPy arrays."""
    from ..frontend.context import Context
    from ..program import CompileConfig

    ctx = Context(dims=("i", "b", "t"))
    n_i, n_b, n_t = ctx.bounds
    tr = build(ctx, env, cfg)
    outputs = {k: getattr(tr, k) for k in ("episode_return", "episode_length", "loss",
                                           "policy_loss", "value_loss", "entropy")}
    prog = ctx.compile(bounds={n_i: iterations, n_b: num_envs, n_t: steps}, outputs=outputs,
                       config=config or CompileConfig())
    run = prog.run()
    return {k: np.asarray(run[k]) for k in outputs}


__all__ = ["PPOConfig", "ReinforceConfig", "Training", "policy", "ppo",
           "evaluate", "reinforce", "train", "value"]


def evaluate(env, theta: np.ndarray, num_envs: int, hidden: int = 32, seed: int = 123,
             greedy: bool = True, max_steps: int | None = None, config=None) -> dict:
    """Run ``num_envs`` episodes of the policy with parameters ``theta`` (e.g. the last row of
    a training run) in a ``(b, t)`` program whose length follows the episodes:
    ``T = tl.until(every episode is over, max=max_steps)``. Returns each episode's return and
    length and the number of steps the program ran."""
    from ..frontend.api import constant_
    from ..frontend.context import Context
    from ..program import CompileConfig, until

    net = ActorCritic.for_env(env, hidden)
    ctx = Context(dims=("b", "t"))
    b, t = ctx.dims
    n_b, n_t = ctx.bounds
    with ctx:
        th = constant_(np.asarray(theta, np.float32))

        def act(o, u):
            d = policy(net, th, o)
            return (d.mode() if greedy else d.sample(u)), {}

        ro = rollout(env, t, act, seed=seed)
        over = (ro.alive * (1.0 - ro.done.astype("float32")))[0:n_b, t].sum(axis=0) == 0.0
        returns = ro.reward[b, 0:n_t].sum(axis=0)
        lengths = ro.alive[b, 0:n_t].sum(axis=0)
    prog = ctx.compile(bounds={n_b: num_envs, n_t: until(over, max=max_steps or env.max_steps)},
                       outputs={"returns": returns, "lengths": lengths, "alive": ro.alive},
                       config=config or CompileConfig())
    run = prog.run()
    return {"returns": np.asarray(run["returns"]), "lengths": np.asarray(run["lengths"]),
            "steps": int(np.asarray(run["alive"]).shape[1])}
