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

from ..errors import ArgumentError, DefinitionError, user_location
from ..frontend.api import exp, library_scope, lift, maximum, minimum, placeholder, take, where
from ..frontend.context import scope
from ..frontend.tensor import RecurrentTensor as RT
from ..frontend.tensor import as_tensor
from ..optim import Adam, parameters
from ..random import permutation
from .distributions import Categorical, Normal
from .networks import ActorCritic
from .returns import discounted_returns, gae, n_step_returns
from .rollout import action_type, rollout


@dataclass(frozen=True)
class ReinforceConfig:
    """``n_step=None``: Monte-Carlo returns with the batch mean as baseline; ``n_step=n``:
    TD(n) returns bootstrapped from a learned value (an actor-critic), advantage ``G^n - V``.

    ``loss_mean="alive"`` averages the loss over the iteration's alive steps, a count known
    only once the whole rollout has run; ``"steps"`` over all ``B · T`` steps (the ended ones
    add zero), known before it, so with TD(n) returns every step's gradient can be
    accumulated ``n`` steps after it runs (what ``benchmarks.rl_memory`` measures)."""

    lr: float = 1e-2
    gamma: float = 0.99
    n_step: int | None = None
    hidden: int = 32
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    normalize: bool = True       # scale advantages to unit variance per iteration
    loss_mean: str = "alive"     # or "steps"
    seed: int = 0

    def __post_init__(self):
        if self.loss_mean not in ("alive", "steps"):
            raise ArgumentError(f"ReinforceConfig(loss_mean={self.loss_mean!r}): give 'alive' "
                                "(the mean over the alive steps) or 'steps' (over all B * T)")

    DIMS = ("i", "b", "t")

    def bounds(self, ctx, iterations: int, num_envs: int, steps: int) -> dict:
        """The bounds of ``reinforce``'s context."""
        return dict(zip(ctx.bounds, (iterations, num_envs, steps)))


@dataclass(frozen=True)
class PPOConfig:
    """PPO as CleanRL runs it (Schulman et al. 2017; Huang et al. 2022): GAE(γ, λ) advantages,
    then ``update_epochs`` passes over the rollout, each in ``num_minibatches`` shuffled
    minibatches with one Adam step per minibatch; advantages normalised per minibatch, the
    clipped surrogate, ``vf_coef ·`` half the squared error to the value targets (clipped
    around the acting values with ``clip_vloss``) and ``- ent_coef ·`` the entropy. With
    ``anneal_lr`` the learning rate falls linearly to 0 over the iterations. A minibatch is
    the mean over its alive samples (episodes are masked, see ``tl.rl.rollout``).

    ``bootstrap_truncated``: an episode the environment's time limit truncates is bootstrapped
    with the value of the state it reached (an extra value forward pass per step), as
    gymnasium's ``terminated``/``truncated`` split intends; off by default, as in CleanRL's
    classic PPO, which treats a truncation as the episode's end."""

    lr: float = 2.5e-3
    gamma: float = 0.99
    lam: float = 0.95
    clip: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    hidden: int = 32
    init_log_std: float = -0.5
    update_epochs: int = 4
    num_minibatches: int = 4
    clip_vloss: bool = True
    anneal_lr: bool = False
    bootstrap_truncated: bool = False
    seed: int = 0

    DIMS = ("i", "e", "m", "s", "b", "t")

    def bounds(self, ctx, iterations: int, num_envs: int, steps: int) -> dict:
        """The bounds of ``ppo``'s context: ``S = num_envs · steps / num_minibatches`` samples
        per minibatch (which must divide evenly, as in CleanRL)."""
        n_i, n_e, n_m, n_s, n_b, n_t = ctx.bounds
        if (num_envs * steps) % self.num_minibatches:
            raise ArgumentError(f"PPO: num_envs * steps = {num_envs * steps} does not split "
                                f"into {self.num_minibatches} minibatches; change one of them")
        return {n_i: iterations, n_e: self.update_epochs, n_m: self.num_minibatches,
                n_s: num_envs * steps // self.num_minibatches, n_b: num_envs, n_t: steps}


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
@library_scope()
def policy(net: ActorCritic, theta: RT, obs: RT):
    """The action distribution at ``obs`` under parameters ``theta``."""
    out = lift(net.policy)(theta, obs)
    return Normal(out, lift(net.log_std)(theta)) if net.continuous else Categorical(out)


@library_scope()
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
        per_point = count if cfg.loss_mean == "alive" else \
            as_tensor(B, ctx).astype("float32") * as_tensor(T, ctx).astype("float32")
        weight[i, b, t] = ro.alive / per_point
        values = targets(ro, _next_value(ro, value(net, theta, ro.next_obs), t, T), count)
        for k in ("adv", "target", "old_logp"):
            stopped[k][i, b, t] = values[k]
        n_envs = as_tensor(B, ctx).astype("float32")
        mean = {k: _per_iteration(x * weight, i, B, T) for k, x in
                (("policy_loss", pg), ("value_loss", vl), ("entropy", ent), ("loss", total))}
        return Training(dict(p), _per_iteration(ro.reward, i, B, T) / n_envs,
                        _per_iteration(ro.alive, i, B, T) / n_envs, mean["loss"],
                        mean["policy_loss"], mean["value_loss"], mean["entropy"], ro)


def _next_value(ro, at_next_obs: RT, t, T, bootstrap_truncated: bool = False) -> RT:
    """The value of the state each transition leads to: the next step's value (the state
    after a transition that does not end the episode is the next step's), and at the horizon
    the value of ``next_obs``. Where an episode ends it is multiplied by 0 either way, unless
    ``bootstrap_truncated``: then a truncating transition (whose next step's state is frozen, not the
    one reached) takes the value of ``next_obs`` too. One value forward pass per step instead
    of two, without ``bootstrap_truncated``."""
    i, b, _ = ro.obs.domain
    nv = placeholder((), "float32", ro.obs.domain, "next_value")
    nv[i, b, T - 1] = at_next_obs
    after = ro.extras["value"][i, b, t + 1]
    nv[i, b, t] = where(ro.truncated, at_next_obs, after) if bootstrap_truncated else after
    return nv


def _normalised(x: RT, ro, count, i, B, T) -> RT:
    """``x`` minus its mean over the alive points of the iteration, over their std."""
    mean = _per_iteration(x * ro.alive, i, B, T) / count
    var = _per_iteration((x - mean) ** 2 * ro.alive, i, B, T) / count
    return (x - mean) / ((var + 1e-8) ** 0.5)


def ppo(ctx, env, cfg: PPOConfig = PPOConfig()) -> Training:
    """Build PPO in ``ctx``, whose dims are ``PPOConfig.DIMS``: iterations ``i``, epochs
    ``e``, minibatches ``m``, samples ``s`` of a minibatch, environments ``b`` and steps ``t``
    (bounds from ``cfg.bounds``). The parameters are a recurrence over ``(i, e, m)``, one
    Adam step per minibatch; iteration ``i`` acts with ``theta[i, 0, 0]`` over ``(i, b, t)``.
    Sample ``s`` of minibatch ``m`` in epoch ``e`` is the rollout point at entry
    ``m * S + s`` of a permutation of the ``B * T`` points drawn per ``(i, e)``
    (``tl.random.permutation``), read with ``tl.take``."""
    if tuple(d.name for d in ctx.dims) != PPOConfig.DIMS:
        raise DefinitionError(f"tl.rl.ppo needs a context with dims {PPOConfig.DIMS} "
                              f"(iterations, epochs, minibatches, samples, environments, steps); "
                              f"this one has {tuple(d.name for d in ctx.dims)}", user_location())
    i, e, m, s, b, t = ctx.dims
    n_i, E, M, S, B, T = ctx.bounds
    shape, dtype = action_type(env)
    with ctx:
        net = ActorCritic.for_env(env, cfg.hidden)
        p = parameters({"theta": net.init(cfg.seed, cfg.init_log_std)}, dim=(i, e, m))
        theta = p["theta"]
        with scope("minibatch"):  # constants to tl.grad: their branches come after minimize
            mb = {k: placeholder(sh, dt, (i, e, m, s), f"mb_{k}") for k, (sh, dt) in {
                "obs": ((env.obs_dim,), "float32"), "action": (shape, dtype),
                **{k: ((), "float32") for k in ("logp", "value", "adv", "alive")}}.items()}
        with scope("loss"):
            terms = _ppo_loss(cfg, net, theta, mb, (i, e, m), S)
            loss = (terms["policy_loss"] + cfg.vf_coef * terms["value_loss"]
                    - cfg.ent_coef * terms["entropy"])
        lr = cfg.lr
        if cfg.anneal_lr:
            lr = cfg.lr * (1.0 - as_tensor(i, ctx).astype("float32")
                           / as_tensor(n_i, ctx).astype("float32"))
        Adam(lr=lr).minimize(loss, p)  # scopes "gradient" and "update"

        # -- below: not seen by the gradient ----------------------------------------------------
        acting = theta[i, 0, 0]

        def act(o, u):
            d = policy(net, acting, o)
            a = d.sample(u)
            return a, {"logp": d.log_prob(a), "value": value(net, acting, o)}

        with scope("rollout"):
            ro = rollout(env, t, act, seed=cfg.seed, domain=(i, b, t))
            v_act = ro.extras["value"]
            nv = _next_value(ro, value(net, acting, ro.next_obs), t, T,
                             bootstrap_truncated=cfg.bootstrap_truncated)
        with scope("gae"):
            adv = gae(ro.reward, v_act, nv, t, T, cfg.gamma, cfg.lam, done=ro.done,
                      mask=ro.alive,
                      terminated=ro.terminated if cfg.bootstrap_truncated else None)
        with scope("minibatch"):
            source = {"obs": ro.obs, "action": ro.action, "logp": ro.extras["logp"],
                      "value": v_act, "alive": ro.alive, "adv": adv}
            flat = permutation(as_tensor(m, ctx) * S + s, as_tensor(B, ctx) * T,
                               domain=(i, e), seed=cfg.seed + 2)
            at = (flat // T, flat % T)
            for k, x in source.items():   # one range per read keeps b vectorisable
                mb[k][i, e, m, s] = take(x[i, b, 0:T][i, 0:B], at)
        with scope("metrics"):
            n_envs = as_tensor(B, ctx).astype("float32")
            updates = as_tensor(E, ctx).astype("float32") * as_tensor(M, ctx).astype("float32")
            per_iter = {k: x[i, e, 0:M].sum(axis=0)[i, 0:E].sum(axis=0) / updates
                        for k, x in {**terms, "loss": loss}.items()}
            ret = _per_iteration(ro.reward, i, B, T) / n_envs
            length = _per_iteration(ro.alive, i, B, T) / n_envs
        return Training(dict(p), ret, length, per_iter["loss"],
                        per_iter["policy_loss"], per_iter["value_loss"], per_iter["entropy"], ro)


def _ppo_loss(cfg: PPOConfig, net, theta: RT, mb: dict, at: tuple, S) -> dict:
    """PPO's loss terms on minibatch ``mb`` (over ``at + (s,)``), each the mean over the
    minibatch's alive samples."""
    i, e, m = at
    w = mb["alive"]
    count = maximum(w[i, e, m, 0:S].sum(axis=0), 1.0)

    def mean(x):
        return (x * w)[i, e, m, 0:S].sum(axis=0) / count

    adv = mb["adv"]
    mu = mean(adv)
    adv = (adv - mu) / ((mean((adv - mu) ** 2)) ** 0.5 + 1e-8)
    dist, v = policy(net, theta, mb["obs"]), value(net, theta, mb["obs"])
    ratio = exp(dist.log_prob(mb["action"]) - mb["logp"])
    pg = -minimum(ratio * adv, _clip(ratio, 1.0 - cfg.clip, 1.0 + cfg.clip) * adv)
    target = mb["adv"] + mb["value"]
    vl = (v - target) ** 2
    if cfg.clip_vloss:
        clipped = mb["value"] + _clip(v - mb["value"], -cfg.clip, cfg.clip)
        vl = maximum(vl, (clipped - target) ** 2)
    return {"policy_loss": mean(pg), "value_loss": 0.5 * mean(vl),
            "entropy": mean(dist.entropy())}

@library_scope("clip")
def _clip(x: RT, lo: float, hi: float) -> RT:
    return maximum(minimum(x, hi), lo)


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
    with the dims ``cfg.DIMS`` and bounds ``cfg.bounds(...)``; returns the per-iteration
    curves as NumPy arrays. ``config``: a ``tl.CompileConfig`` (the default batches the
    networks on the rollout's observations and GAE's inputs over the steps, as hand-written
    JAX does them: PPO at 8 x 256 compiled in 9 s where it took 24 without)."""
    from ..frontend.context import Context

    ctx = Context(dims=cfg.DIMS)
    tr = build(ctx, env, cfg)
    outputs = {k: getattr(tr, k) for k in ("episode_return", "episode_length", "loss",
                                           "policy_loss", "value_loss", "entropy")}
    prog = ctx.compile(bounds=cfg.bounds(ctx, iterations, num_envs, steps), outputs=outputs,
                       config=config)
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
    from ..compile_config import CompileConfig
    from ..frontend.api import constant_
    from ..frontend.bounds import until
    from ..frontend.context import Context

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
