"""``tl.grad`` against ``jax.grad`` of unrolled plain-JAX equivalents: every primitive op, every
temporal read pattern, back-propagation through recursive definitions, attention, and an MLP
whose parameters live over an iteration dim. Each check runs on the reference interpreter and
on the default executor."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tempo_lab as tl

CONFIGS = {"reference": tl.CompileConfig(executor="reference"), "default": tl.CompileConfig()}
T = 6


@pytest.fixture(params=list(CONFIGS))
def config(request):
    return CONFIGS[request.param]


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).normal(size=shape) * scale).astype(np.float32)


def check(ctx, bounds, grads, jax_loss, args, config, rtol=2e-4, atol=2e-5):
    """Compile the RT gradients and compare each with ``jax.grad(jax_loss, argnums=k)``."""
    prog = ctx.compile(bounds=bounds, outputs={f"g{k}": g for k, g in enumerate(grads)},
                       config=config)
    res = prog.run()
    want = jax.grad(jax_loss, argnums=tuple(range(len(args))))(*map(jnp.asarray, args))
    for k, w in enumerate(want):
        got = res[f"g{k}"]
        assert got.shape == w.shape, (k, got.shape, w.shape)
        np.testing.assert_allclose(got, np.asarray(w), rtol=rtol, atol=atol, err_msg=f"g{k}")


def ctx_t():
    ctx = tl.Context(dims=("t",))
    return ctx, ctx.dims[0], ctx.bounds[0]


# -- primitive ops ----------------------------------------------------------------------------------
UNARY = {
    "exp": (tl.exp, jnp.exp), "log": (tl.log, jnp.log), "sqrt": (tl.sqrt, jnp.sqrt),
    "tanh": (tl.tanh, jnp.tanh), "sigmoid": (tl.sigmoid, jax.nn.sigmoid),
    "relu": (tl.relu, jax.nn.relu), "sin": (tl.sin, jnp.sin), "cos": (tl.cos, jnp.cos),
    "abs": (tl.abs, jnp.abs), "neg": (lambda x: -x, lambda x: -x),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_ops(name, config):
    f_tl, f_jax = UNARY[name]
    X = rnd(T, 3)
    if name in ("log", "sqrt"):
        X = np.abs(X) + 0.5
    ctx, t, TT = ctx_t()
    with ctx:
        x = tl.from_array(X, domain=(t,))
        loss = (f_tl(x) * tl.constant(np.arange(1, 4, dtype=np.float32))).sum()
        g = tl.grad(loss, x)
    check(ctx, {TT: T}, [g], lambda X: (f_jax(X) * jnp.arange(1, 4)).sum(), [X], config)


BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "pow": lambda a, b: a ** b,
    "maximum": (tl.maximum, jnp.maximum), "minimum": (tl.minimum, jnp.minimum),
    "mod": lambda a, b: a % b,
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_ops_with_broadcasting(name, config):
    fs = BINARY[name]
    f_tl, f_jax = fs if isinstance(fs, tuple) else (fs, fs)
    A, B = rnd(T, 2, 3), rnd(3, seed=1)
    if name in ("pow", "div", "mod"):
        A, B = np.abs(A) + 0.5, np.abs(B) + 0.5
    ctx, t, TT = ctx_t()
    with ctx:
        a = tl.from_array(A, domain=(t,))
        b = tl.placeholder((3,), domain=())
        b[()] = tl.constant(B)
        loss = tl.sin(f_tl(a, b)).sum()
        ga, gb = tl.grad(loss, [a, b])
    check(ctx, {TT: T}, [ga, gb], lambda A, B: jnp.sin(f_jax(A, B)).sum(), [A, B], config)


def test_where_cast_and_reductions(config):
    X = rnd(T, 4, 3)
    ctx, t, TT = ctx_t()
    with ctx:
        x = tl.from_array(X, domain=(t,))
        y = tl.where(x > 0, x * 2.0, tl.exp(x))
        loss = (y.sum(axis=0) * y.mean(axis=1, keepdims=True).astype("float32")).sum() \
            + y.max(axis=1).sum() - (x * 0.5).min() + tl.softmax(x, axis=0)[t, 1, 2]
        g = tl.grad(loss, x)

    def f(X):
        ys = jnp.where(X > 0, X * 2.0, jnp.exp(X))
        out = 0.0
        for k in range(T):
            y = ys[k]
            out += (y.sum(0) * y.mean(1, keepdims=True)).sum() + y.max(1).sum() \
                - (X[k] * 0.5).min() + jax.nn.softmax(X[k], axis=0)[1, 2]
        return out
    check(ctx, {TT: T}, [g], f, [X], config)


def test_layout_ops_and_matmul(config):
    X, W, V = rnd(T, 2, 3), rnd(3, 4, seed=1), rnd(4, seed=2)
    ctx, t, TT = ctx_t()
    with ctx:
        x = tl.from_array(X, domain=(t,))
        w = tl.placeholder((3, 4), domain=())
        w[()] = tl.constant(W)
        v = tl.placeholder((4,), domain=())
        v[()] = tl.constant(V)
        h = (x @ w).reshape(8).reshape((2, 4)).transpose()          # (4, 2)
        h = tl.concatenate([h, h[t, 1:3] * 2.0], axis=0)            # (6, 2)
        z = h.expand_dims(0).squeeze(0)[t, :, 1][t, None, 2:5]      # (1, 3)
        u = (v @ w.T) @ x[t, 0].T + z.sum() + tl.stack([v, v])[1, 0]  # 1-D matmuls
        loss = tl.tanh(u).sum() + (x[t, 1] @ (w @ v)).sum()
        gx, gw, gv = tl.grad(loss, [x, w, v])

    def f(X, W, V):
        out = 0.0
        for k in range(T):
            h = (X[k] @ W).reshape(8).reshape(2, 4).T
            h = jnp.concatenate([h, h[1:3] * 2.0], axis=0)
            z = h[:, 1][None, 2:5]
            u = (V @ W.T) @ X[k][0].T + z.sum() + V[0]
            out += jnp.tanh(u).sum() + (X[k][1] @ (W @ V)).sum()
        return out
    check(ctx, {TT: T}, [gx, gw, gv], f, [X, W, V], config)


# -- temporal read patterns ---------------------------------------------------------------------------
def _pattern(build, unrolled, config, bounds=T):
    X = rnd(bounds, 3)
    ctx, t, TT = ctx_t()
    with ctx:
        x = tl.from_array(X, domain=(t,))
        y = build(x, t, TT)
        loss = tl.sin(y).sum()
        g = tl.grad(loss, x)

    def f(X):
        return sum(jnp.sin(unrolled(X, k, bounds)).sum() for k in range(bounds))
    check(ctx, {TT: bounds}, [g], f, [X], config)


def test_shift_back_with_an_init_branch(config):
    def build(x, t, TT):
        y = tl.placeholder((3,), domain=(t,))
        y[0] = x[0] * 2.0
        y[t] = x[t - 1] * x[t]
        return y
    _pattern(build, lambda X, k, n: X[0] * 2 if k == 0 else X[k - 1] * X[k], config)


def test_shift_forward_with_a_last_branch(config):
    def build(x, t, TT):
        y = tl.placeholder((3,), domain=(t,))
        y[TT - 1] = x[TT - 1]
        y[t] = x[t + 1] - x[t]
        return y
    _pattern(build, lambda X, k, n: X[n - 1] if k == n - 1 else X[k + 1] - X[k], config)


def test_causal_prefix(config):
    _pattern(lambda x, t, TT: (x[0:t + 1] * 1.5).sum(axis=0),
             lambda X, k, n: (X[:k + 1] * 1.5).sum(0), config)


def test_window(config):
    _pattern(lambda x, t, TT: tl.exp(x[tl.max(0, t - 2):t + 1]).mean(axis=0),
             lambda X, k, n: jnp.exp(X[max(0, k - 2):k + 1]).mean(0), config)


def test_future_window(config):
    _pattern(lambda x, t, TT: x[t:tl.min(t + 3, TT)].max(axis=0),
             lambda X, k, n: X[k:min(k + 3, n)].max(0), config)


def test_suffix(config):
    _pattern(lambda x, t, TT: tl.softmax(x[t:TT], axis=0)[t, 0] * x[t],
             lambda X, k, n: jax.nn.softmax(X[k:], axis=0)[0] * X[k], config)


def test_constant_point_and_last_point(config):
    _pattern(lambda x, t, TT: x[0] * x[t] + x[TT - 1],
             lambda X, k, n: X[0] * X[k] + X[n - 1], config)


def test_constant_slice(config):
    _pattern(lambda x, t, TT: x[1:4].sum(axis=0) * x[t] + x[0:TT].mean(axis=0),
             lambda X, k, n: X[1:4].sum(0) * X[k] + X.mean(0), config)


def test_broadcast_over_a_dim():
    """A parameter with no dims used at every t: its gradient sums over t."""
    P, X = rnd(3, seed=3), rnd(T, 3)
    ctx, t, TT = ctx_t()
    with ctx:
        x = tl.from_array(X, domain=(t,))
        p = tl.placeholder((3,), domain=())
        p[()] = tl.constant(P)
        loss = tl.tanh(x * p).sum()
        g = tl.grad(loss, p)
    for config in CONFIGS.values():
        check(ctx, {TT: T}, [g], lambda P: jnp.tanh(X * P).sum(), [P], config)


def test_two_dims_batch_and_time(config):
    X = rnd(2, T, 3)
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, TT = ctx.bounds
    with ctx:
        x = tl.from_array(X, domain=(b, t))
        y = x[b, 0:t + 1].sum(axis=0) * x[b, t] + x[0:B, t].mean(axis=0)
        g = tl.grad(tl.sin(y).sum(), x)

    def f(X):
        c = jnp.cumsum(X, axis=1) * X + X.mean(0)[None]
        return jnp.sin(c).sum()
    check(ctx, {B: 2, TT: T}, [g], f, [X], config)


# -- recursion: back-propagation through time --------------------------------------------------------
def test_rnn_bptt(config):
    X, W, H0 = rnd(T, 3), rnd(3, 3, seed=1, scale=0.5), rnd(3, seed=2)
    ctx, t, TT = ctx_t()
    with ctx:
        x = tl.from_array(X, domain=(t,))
        w = tl.placeholder((3, 3), domain=())
        w[()] = tl.constant(W)
        h0 = tl.placeholder((3,), domain=())
        h0[()] = tl.constant(H0)
        h = tl.placeholder((3,), domain=(t,))
        h[0] = tl.tanh(h0 @ w + x[0])
        h[t] = tl.tanh(h[t - 1] @ w + x[t])
        loss = (h[0:t + 1].sum(axis=0) ** 2).sum() + h[TT - 1].sum()
        gx, gw, gh0 = tl.grad(loss, [x, w, h0])

    def f(X, W, H0):
        h, hs = H0, []
        for k in range(T):
            h = jnp.tanh(h @ W + X[k])
            hs.append(h)
        H = jnp.stack(hs)
        # h[T - 1].sum() has no dims, but the sum with a (t,) term is over (t,): T copies
        return (jnp.cumsum(H, 0) ** 2).sum() + T * hs[-1].sum()
    check(ctx, {TT: T}, [gx, gw, gh0], f, [X, W, H0], config)


def test_gradient_with_respect_to_a_recurrent_state(config):
    """The adjoint of a placeholder is a placeholder: d loss / d h[t] for every t."""
    X, W = rnd(T, 3), rnd(3, 3, seed=1, scale=0.5)
    ctx, t, TT = ctx_t()
    with ctx:
        x = tl.from_array(X, domain=(t,))
        h = tl.placeholder((3,), domain=(t,))
        h[0] = x[0]
        h[t] = tl.tanh(h[t - 1] @ tl.constant(W)) + x[t]
        g = tl.grad((h * h).sum(), h)

    def f(X):  # perturb every h[t] by X: gradient w.r.t. the additive input equals dL/dh[t]
        h = X[0]
        hs = [h]
        for k in range(1, T):
            h = jnp.tanh(h @ W) + X[k]
            hs.append(h)
        return sum((v * v).sum() for v in hs)
    check(ctx, {TT: T}, [g], f, [X], config)


def test_causal_attention():
    X = rnd(T, 4)
    Wq, Wk, Wv = (rnd(4, 4, seed=s, scale=0.5) for s in (1, 2, 3))
    ctx, t, TT = ctx_t()
    with ctx:
        x = tl.from_array(X, domain=(t,))
        ws = []
        for W in (Wq, Wk, Wv):
            w = tl.placeholder((4, 4), domain=())
            w[()] = tl.constant(W)
            ws.append(w)
        q, k, v = (x @ w for w in ws)
        att = tl.softmax(k[0:t + 1] @ q / 2.0, axis=0)          # (t+1,)
        o = att @ v[0:t + 1]                                      # (4,)
        loss = tl.tanh(o).sum()
        grads = tl.grad(loss, ws + [x])

    def f(Wq, Wk, Wv, X):
        q, k, v = X @ Wq, X @ Wk, X @ Wv
        s = (q @ k.T) / 2.0
        s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
        return jnp.tanh(jax.nn.softmax(s, axis=1) @ v).sum()
    for config in CONFIGS.values():
        check(ctx, {TT: T}, grads, f, [Wq, Wk, Wv, X], config, rtol=1e-3, atol=1e-4)


def test_mlp_with_parameters_over_an_iteration_dim(config):
    """Parameters given per iteration i (as an optimiser would produce them): the gradient at
    i is the gradient of loss[i] alone."""
    n = 4
    W1, W2 = rnd(n, 3, 8, seed=1, scale=0.5), rnd(n, 8, 2, seed=2, scale=0.5)
    X, Y = rnd(5, 3, seed=3), rnd(5, 2, seed=4)
    ctx = tl.Context(dims=("i",))
    (i,) = ctx.dims
    (n_iter,) = ctx.bounds
    with ctx:
        w1 = tl.from_array(W1, domain=(i,))
        w2 = tl.from_array(W2, domain=(i,))
        pred = tl.relu(tl.constant(X) @ w1) @ w2
        loss = ((pred - tl.constant(Y)) ** 2).mean()
        g1, g2 = tl.grad(loss, [w1, w2])

    def f(W1, W2):
        return sum((((jax.nn.relu(X @ W1[k]) @ W2[k]) - Y) ** 2).mean() for k in range(n))
    check(ctx, {n_iter: n}, [g1, g2], f, [W1, W2], config)


# -- what tl.grad refuses ------------------------------------------------------------------------------
def test_unsupported_gradients_raise_clear_errors():
    ctx, t, TT = ctx_t()
    with ctx:
        x = tl.from_array(rnd(T, 3), domain=(t,))
        g = tl.grad((x[0:t + 1] * x[t]).sum(), x)
        with pytest.raises(tl.GradientError, match="second-order") as e:
            tl.grad((g * g).sum(), x)
        assert e.value.loc.file == __file__
        with pytest.raises(tl.GradientError, match="floating loss"):
            tl.grad((x > 0).astype("int32").sum(), x)
        with pytest.raises(tl.GradientError, match="itself"):
            tl.grad((x * x).sum(), x[t - 1])
        y = x[t // 2]
        with pytest.raises(tl.GradientError, match="dim plus a constant"):
            tl.grad(y.sum(), x)


def test_second_order_through_point_reads(config):
    """A gradient is a program like any other: differentiating it again (here through a
    recurrence and a constant point) matches jax.grad of jax.grad."""
    X = rnd(T, 3)
    ctx, t, TT = ctx_t()
    with ctx:
        x = tl.from_array(X, domain=(t,))
        h = tl.placeholder((3,), domain=(t,))
        h[0] = tl.sin(x[0])
        h[t] = tl.tanh(h[t - 1]) * x[t] + x[0]
        g = tl.grad((h * h).sum(), x)
        gg = tl.grad((g * g).sum(), x)

    def f(X):
        h = jnp.sin(X[0])
        hs = [h]
        for k in range(1, T):
            h = jnp.tanh(h) * X[k] + X[0]
            hs.append(h)
        return sum((v * v).sum() for v in hs)
    check(ctx, {TT: T}, [gg], lambda X: (jax.grad(f)(X) ** 2).sum(), [X], config, rtol=1e-3)


def test_gradient_of_an_unrelated_tensor_is_zero(config):
    ctx, t, TT = ctx_t()
    with ctx:
        x = tl.from_array(rnd(T, 3), domain=(t,))
        z = tl.from_array(rnd(T, 2), domain=(t,))
        g = tl.grad((x * x).sum(), z)
    out = ctx.compile(bounds={TT: T}, outputs={"g": g}, config=config).run()["g"]
    assert out.shape == (T, 2) and not out.any()
