"""Example programs shared by the tests, the benchmarks and the notebooks, each with a
plain-JAX twin that computes the same numbers.

``delay_line``: a small RNN trained to output its previous input, written as one program over
(iteration ``i``, step ``t``): ``tl.random`` inputs per iteration, back-propagation through time
over ``t`` (``tl.grad``) and Adam over ``i`` (``tl.optim``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import tempo_lab as tl


@dataclass(frozen=True)
class DelayLine:
    hidden: int = 16
    lr: float = 0.02
    seed: int = 0

    def init(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        return {"wx": (rng.normal(size=(1, self.hidden)) * 0.5).astype(np.float32),
                "wh": (rng.normal(size=(self.hidden, self.hidden)) * 0.2).astype(np.float32),
                "wo": (rng.normal(size=(self.hidden, 1)) * 0.2).astype(np.float32)}

    def program(self):
        """``(ctx, per-iteration mean loss, inputs x over (i, t))``; bounds ``(I, T)``."""
        ctx = tl.Context(dims=("i", "t"))
        i, t = ctx.dims
        _, T = ctx.bounds
        with ctx:
            p = tl.optim.parameters(self.init(), dim=i)
            x = tl.random.normal((1,), domain=(i, t), seed=self.seed)
            h = tl.placeholder((self.hidden,), domain=(i, t))
            h[i, 0] = tl.tanh(x @ p["wx"])
            h[i, t] = tl.tanh(x @ p["wx"] + h[i, t - 1] @ p["wh"])
            y = tl.placeholder((1,), domain=(i, t))  # target: the previous step's input
            y[i, 0] = tl.zeros((1,))
            y[i, t] = x[i, t - 1]
            loss = ((h @ p["wo"] - y) ** 2).mean()
            tl.optim.Adam(lr=self.lr).minimize(loss, p)
            per_iteration = loss[i, 0:T].mean(axis=0)
        return ctx, per_iteration, x

    def jax_train(self):
        """The same training as one ``jax.jit`` of a ``lax.scan`` over iterations, with
        ``jax.grad`` and Adam written out: ``f(xs) -> per-iteration losses`` for inputs
        ``xs`` of shape ``(I, T, 1)``."""
        import jax
        import jax.numpy as jnp

        b1, b2, eps, lr = 0.9, 0.999, 1e-8, self.lr

        def loss_fn(p, x):
            def cell(h, xt):
                h = jnp.tanh(xt @ p["wx"] + h @ p["wh"])
                return h, h
            _, hs = jax.lax.scan(cell, jnp.zeros(self.hidden), x)
            y = jnp.concatenate([jnp.zeros((1, 1)), x[:-1]])
            return (((hs @ p["wo"]) - y) ** 2).mean()

        def iteration(carry, x):
            p, m, v, step = carry
            loss, g = jax.value_and_grad(loss_fn)(p, x)
            step = step + 1
            m = jax.tree.map(lambda a, b: b1 * a + (1 - b1) * b, m, g)
            v = jax.tree.map(lambda a, b: b2 * a + (1 - b2) * b * b, v, g)
            p = jax.tree.map(lambda q, a, b: q - lr * (a / (1 - b1 ** step))
                             / (jnp.sqrt(b / (1 - b2 ** step)) + eps), p, m, v)
            return (p, m, v, step), loss

        p0 = {k: jnp.asarray(a) for k, a in self.init().items()}
        zeros = jax.tree.map(jnp.zeros_like, p0)

        @jax.jit
        def train(xs):
            return jax.lax.scan(iteration, (p0, zeros, zeros, 0.0), xs)[1]
        return train


def unrolled_decoder(ctx: tl.Context, weights: dict, tokens, heads: int,
                     window: int | None = None):
    """``tempo_lab.demo.decoder`` with its layers written out, one set of ops per layer (how
    most models are written): ``ctx`` has dims ``(t,)`` or ``(b, t)`` with tokens over
    ``(b, t)`` (an array, or a recurrent tensor over the context's dims); ``weights`` as for
    the demo, stacked over layers. Returns the last layer's output (about 15 ops per layer)."""
    from .demo import rms_norm

    *lead, t = ctx.dims
    d = int(tokens.shape[-1])
    dh = d // heads
    start = 0 if window is None else tl.max(0, t - window + 1)
    with ctx:
        h = (tokens if isinstance(tokens, tl.RecurrentTensor) else
             tl.from_array(tokens, domain=ctx.dims, name="emb"))
        for layer in range(weights["wq"].shape[0]):
            with tl.scope(f"layer{layer}"):
                w = {k: tl.constant(v[layer]) for k, v in weights.items()}
                x = rms_norm(h)
                q = (x @ w["wq"]).reshape(heads, dh)
                k = (x @ w["wk"]).reshape(heads, dh)
                v = (x @ w["wv"]).reshape(heads, dh)
                keys = k[(*lead, slice(start, t + 1))].transpose(1, 0, 2)
                values = v[(*lead, slice(start, t + 1))].transpose(1, 0, 2)
                scores = (keys @ q.expand_dims(2)).squeeze(2) / float(np.sqrt(dh))
                att = (tl.softmax(scores, axis=-1).expand_dims(1) @ values).squeeze(1)
                h_mid = h + att.reshape(d) @ w["wo"]
                h = h_mid + tl.relu(rms_norm(h_mid) @ w["w1"]) @ w["w2"]
    return h


def op_chain(ctx: tl.Context, n: int, data: np.ndarray):
    """A chain of about ``n`` ops over ``(t,)`` (the shape of a long unrolled program, for
    compile-time scaling): ``x * 0.9 + 0.1`` again and again, every tenth link a recurrence
    ``r[0] = x; r[t] = tanh(r[t - 1] * 0.5 + x)``. ``data``: the input over ``(t, width)``.
    Returns ``(y, jax_fn)``: the last link, and a plain-JAX twin ``jax_fn(data) -> y``."""
    (t,) = ctx.dims
    kinds = ["rec" if k % 10 == 9 else "affine" for k in range(max(1, n // 2))]
    with ctx:
        x = tl.from_array(data, domain=(t,), name="x0")
        for kind in kinds:
            if kind == "affine":
                x = x * 0.9 + 0.1
            else:
                r = tl.placeholder((data.shape[1],), domain=(t,))
                r[0] = x
                r[t] = tl.tanh(r[t - 1] * 0.5 + x)
                x = r

    def jax_fn(xs):
        import jax
        import jax.numpy as jnp

        def step(carry, item):
            i, x = item
            states = list(carry)
            j = 0
            for kind in kinds:
                if kind == "affine":
                    x = x * 0.9 + 0.1
                else:
                    x = jnp.where(i == 0, x, jnp.tanh(states[j] * 0.5 + x))
                    states[j] = x
                    j += 1
            return tuple(states), x

        init = tuple(jnp.zeros(xs.shape[1:], xs.dtype) for k in kinds if k == "rec")
        return jax.lax.scan(step, init, (jnp.arange(xs.shape[0]), xs))[1]

    return x, jax_fn
