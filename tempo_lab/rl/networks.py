"""An actor-critic as one pure JAX function of one flat parameter vector.

The program lifts it with ``tl.lift``: a single op per use, whose gradient is one ``jax.vjp``,
and one parameter tensor for the optimiser. Written with ``tl.nn`` modules instead, every layer
is several ops and every weight a separate Adam recurrence, which makes the training program
(and its compile time) several times larger for the same arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
from jax import lax


@dataclass(frozen=True)
class ActorCritic:
    """Two tanh MLPs (``obs_dim -> hidden -> hidden -> out``): the policy head gives ``out``
    logits (discrete) or means (continuous; then ``out`` trailing entries of the vector are a
    state-independent ``log_std``), the critic one value."""

    obs_dim: int
    out: int
    hidden: int = 32
    continuous: bool = False

    @classmethod
    def for_env(cls, env, hidden: int = 32) -> ActorCritic:
        if hasattr(env, "num_actions"):
            return cls(env.obs_dim, int(env.num_actions), hidden)
        return cls(env.obs_dim, int(env.action_dim), hidden, continuous=True)

    @property
    def shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        h, d, o = self.hidden, self.obs_dim, self.out
        layers = []
        for net, last in (("pi", o), ("v", 1)):
            for k, (a, b) in enumerate(((d, h), (h, h), (h, last))):
                layers += [(f"{net}.{k}.w", (a, b)), (f"{net}.{k}.b", (b,))]
        if self.continuous:
            layers.append(("log_std", (o,)))
        return layers

    @property
    def size(self) -> int:
        return sum(int(np.prod(s)) for _, s in self.shapes)

    def init(self, seed: int = 0, log_std: float = -0.5) -> np.ndarray:
        """LeCun-normal weights, zero biases; the policy's last layer is scaled by 0.01 so the
        first policy is near uniform (near zero mean)."""
        rng = np.random.default_rng(seed)
        parts = []
        for name, shape in self.shapes:
            if name == "log_std":
                parts.append(np.full(shape, log_std))
            elif name.endswith(".b"):
                parts.append(np.zeros(shape))
            else:
                scale = 0.01 if name == "pi.2.w" else 1.0
                parts.append(rng.normal(size=shape) * scale / np.sqrt(shape[0]))
        return np.concatenate([p.reshape(-1) for p in parts]).astype(np.float32)

    def unflatten(self, theta, prefix: str = "") -> dict:
        """The parameters named ``prefix...`` as slices of the flat ``theta``: only those a
        caller uses, each one ``lax.slice`` (indexing, ``theta[k:k + n]``, ran NumPy's
        indexing rules in Python at every trace, for all twelve of them)."""
        out, k = {}, 0
        for name, shape in self.shapes:
            n = int(np.prod(shape))
            if name.startswith(prefix):
                out[name] = lax.slice(theta, (k,), (k + n,)).reshape(shape)
            k += n
        return out

    def _mlp(self, p, net, x):
        for k in range(3):
            x = x @ p[f"{net}.{k}.w"] + p[f"{net}.{k}.b"]
            if k < 2:
                x = jnp.tanh(x)
        return x

    def policy(self, theta, obs):
        """Logits, or the means of the action's normals."""
        return self._mlp(self.unflatten(theta, "pi."), "pi", obs)

    def log_std(self, theta):
        return self.unflatten(theta, "log_std")["log_std"]

    def value(self, theta, obs):
        return self._mlp(self.unflatten(theta, "v."), "v", obs)[..., 0]


__all__ = ["ActorCritic"]
