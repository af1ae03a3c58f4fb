"""``tl.rl``: reinforcement learning as one recurrent program over ``(i, b, t)``.

Environments (``envs``: pure-JAX CartPole and Pendulum) run as recurrent tensors, one masked
episode per ``(i, b)`` row (``rollout``); returns, n-step returns and GAE are reverse
recurrences over ``t`` (``returns``); ``Categorical`` and ``Normal`` give log-probs, entropies and
samples from uniform noise (``distributions``); ``reinforce`` and ``ppo`` build whole training
programs whose parameters are Adam recurrences over ``i`` (``algorithms``)::

    ctx = tl.Context(dims=("i", "b", "t"))
    n_i, n_b, n_t = ctx.bounds
    tr = tl.rl.ppo(ctx, tl.rl.CartPole(), tl.rl.PPOConfig(lr=1e-2))
    prog = ctx.compile(bounds={n_i: 20, n_b: 8, n_t: 64},
                       outputs={"return": tr.episode_return})
    prog.run()["return"]          # mean episode return per iteration
"""
from .algorithms import (
    PPOConfig,
    ReinforceConfig,
    Training,
    evaluate,
    policy,
    ppo,
    reinforce,
    train,
    value,
)
from .distributions import Categorical, Normal
from .envs import CartPole, Pendulum, Pixels
from .networks import ActorCritic
from .returns import discounted_returns, gae, n_step_returns
from .rollout import Rollout, rollout

__all__ = ["ActorCritic", "CartPole", "Categorical", "Normal", "PPOConfig", "Pendulum", "Pixels",
           "ReinforceConfig", "Rollout", "Training", "discounted_returns", "evaluate", "gae",
           "n_step_returns", "policy", "ppo", "reinforce", "rollout", "train", "value"]
