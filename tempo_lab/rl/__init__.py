"""``tl.rl``: reinforcement learning as one recurrent program over ``(i, b, t)``.

Environments (``envs``: pure-JAX CartPole and Pendulum) run as recurrent tensors, one masked
episode per ``(i, b)`` row (``rollout``); returns, n-step returns and GAE are reverse
recurrences over ``t`` (``returns``); ``Categorical`` and ``Normal`` give log-probs, entropies and
samples from uniform noise (``distributions``); ``reinforce`` and ``ppo`` build whole training
programs whose parameters are Adam recurrences over ``i`` (``algorithms``).
"""
from .distributions import Categorical, Normal
from .envs import CartPole, Pendulum
from .returns import discounted_returns, gae, n_step_returns
from .rollout import Rollout, rollout

__all__ = ["CartPole", "Categorical", "Normal", "Pendulum", "Rollout", "discounted_returns",
           "gae", "n_step_returns", "rollout"]
