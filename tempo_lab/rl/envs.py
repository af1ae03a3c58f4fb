"""Small pure-JAX environments: CartPole (discrete) and Pendulum (continuous control).

They are written here rather than taken from gymnax because two short functions do not justify
its dependency tree. Each is a frozen dataclass of constants with pure JAX methods that an RT
program applies pointwise through ``tl.lift``, and that a plain JAX program can ``vmap``/``scan``:

* ``reset(noise) -> state``: ``noise`` is ``reset_noise_shape`` uniform ``[0, 1)`` values, so a
  program feeds ``tl.random.uniform`` and every episode start is keyed by (seed, point);
* ``step(state, action) -> (state, reward, terminated, truncated)``: reward a float32 scalar,
  ``terminated`` and ``truncated`` bool scalars as gymnasium separates them: the task ended
  (the pole fell), or the ``max_steps`` time limit cut the episode (both can hold at once, as
  with gymnasium's ``TimeLimit``); an episode is over at ``done = terminated | truncated``;
* ``observe(state) -> obs``: float32 ``(obs_dim,)``.

A state is one float32 vector of ``state_dim`` entries whose last entry counts the steps taken.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class CartPole:
    """A pole hinged on a cart that moves along a track; actions push left (0) or right (1) with
    a fixed force. Reward 1 per step (the terminating one included); the episode terminates
    when the pole leans past 12 degrees or the cart leaves ``[-2.4, 2.4]``, and is truncated
    after ``max_steps``. One explicit Euler step of the cart's and the pole's equations of
    motion per action: gymnasium's ``CartPole-v1`` (``tests/fixtures/gym`` checks it)."""

    gravity: float = 9.8
    cart_mass: float = 1.0
    pole_mass: float = 0.1
    half_length: float = 0.5     # pivot to the pole's centre of mass
    force: float = 10.0
    dt: float = 0.02
    theta_limit: float = 12 * 2 * math.pi / 360
    x_limit: float = 2.4
    max_steps: int = 500
    obs_dim = 4
    num_actions = 2
    state_dim = 5                 # x, x_dot, theta, theta_dot, steps
    reset_noise_shape = (4,)

    def reset(self, noise):
        """Position, velocity, angle and angular velocity uniform in ``[-0.05, 0.05)``."""
        noise = jnp.asarray(noise, jnp.float32)
        return jnp.concatenate([noise * 0.1 - 0.05, jnp.zeros((1,), jnp.float32)])

    def step(self, state, action):
        x, x_dot, theta, theta_dot, steps = (state[k] for k in range(5))
        f = jnp.where(action == 1, self.force, -self.force)
        total = self.cart_mass + self.pole_mass
        ml = self.pole_mass * self.half_length
        cos, sin = jnp.cos(theta), jnp.sin(theta)
        # Newton for the cart with the pole's reaction, and for the pole about its pivot:
        # solve for the angular acceleration first, then the cart's.
        tmp = (f + ml * theta_dot ** 2 * sin) / total
        theta_acc = (self.gravity * sin - cos * tmp) / (
            self.half_length * (4.0 / 3.0 - self.pole_mass * cos ** 2 / total))
        x_acc = tmp - ml * theta_acc * cos / total
        new = jnp.stack([x + self.dt * x_dot, x_dot + self.dt * x_acc,
                         theta + self.dt * theta_dot, theta_dot + self.dt * theta_acc,
                         steps + 1]).astype(jnp.float32)
        fell = (jnp.abs(new[0]) > self.x_limit) | (jnp.abs(new[2]) > self.theta_limit)
        return new, jnp.float32(1.0), fell, new[4] >= self.max_steps

    def observe(self, state):
        return state[:4].astype(jnp.float32)


@dataclass(frozen=True)
class Pendulum:
    """Swing a pendulum up and hold it there with a bounded torque (one action in
    ``[-max_torque, max_torque]``; larger values are clipped). Reward ``-(angle² + 0.1·ω² +
    0.001·u²)`` with the angle measured from upright in ``[-π, π)``; it never terminates, it is
    truncated after ``max_steps``. Observation ``(cos θ, sin θ, ω)``: gymnasium's
    ``Pendulum-v1``."""

    gravity: float = 10.0
    mass: float = 1.0
    length: float = 1.0
    dt: float = 0.05
    max_speed: float = 8.0
    max_torque: float = 2.0
    max_steps: int = 200
    obs_dim = 3
    action_dim = 1
    state_dim = 3                 # theta (0 = upright), omega, steps
    reset_noise_shape = (2,)

    def reset(self, noise):
        """Angle uniform in ``[-π, π)``, angular velocity uniform in ``[-1, 1)``."""
        noise = jnp.asarray(noise, jnp.float32)
        return jnp.stack([noise[0] * 2 * jnp.pi - jnp.pi, noise[1] * 2.0 - 1.0,
                          jnp.float32(0.0)]).astype(jnp.float32)

    def step(self, state, action):
        theta, omega, steps = state[0], state[1], state[2]
        u = jnp.clip(jnp.reshape(action, (-1,))[0], -self.max_torque, self.max_torque)
        angle = (theta + jnp.pi) % (2 * jnp.pi) - jnp.pi
        cost = angle ** 2 + 0.1 * omega ** 2 + 0.001 * u ** 2
        # a rod of uniform mass about its end: I = m l² / 3, gravity acts at l / 2
        omega_acc = (3 * self.gravity / (2 * self.length) * jnp.sin(theta)
                     + 3.0 / (self.mass * self.length ** 2) * u)
        omega = jnp.clip(omega + omega_acc * self.dt, -self.max_speed, self.max_speed)
        new = jnp.stack([theta + omega * self.dt, omega, steps + 1]).astype(jnp.float32)
        return new, (-cost).astype(jnp.float32), jnp.bool_(False), new[2] >= self.max_steps

    def observe(self, state):
        return jnp.stack([jnp.cos(state[0]), jnp.sin(state[0]), state[1]]).astype(jnp.float32)


@dataclass(frozen=True)
class Pixels:
    """``env`` observed as an image of ``shape`` (channels, height, width), flattened: a fixed
    random projection of ``env``'s observation through ``tanh``, keyed by ``seed``. Large
    observations at no simulation cost, to measure what storing them costs (the paper's PPO
    with 3x128x128 and 3x256x256 observations). Everything else is ``env``'s."""

    env: object
    shape: tuple = (3, 64, 64)
    seed: int = 0

    @property
    def obs_dim(self) -> int:
        return math.prod(self.shape)

    def __getattr__(self, name):  # only for what a Pixels does not define itself
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.env, name)

    def reset(self, noise):
        return self.env.reset(noise)

    def step(self, state, action):
        return self.env.step(state, action)

    def observe(self, state):
        small = self.env.observe(state)
        w = jax.random.normal(jax.random.PRNGKey(self.seed), (self.obs_dim, small.shape[0]))
        return jnp.tanh(w @ small).astype(jnp.float32)


__all__ = ["CartPole", "Pendulum", "Pixels"]
