"""``tl.lift``: a pure JAX function applied pointwise, its types from ``jax.eval_shape``, its
gradient from ``jax.vjp``; the same values on every executor."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tempo_lab as tl
from tempo_lab.ir.cotangent import Cotangent

CONFIGS = [tl.CompileConfig(executor="reference"), tl.CompileConfig(),
           tl.CompileConfig(fuse=False, vectorise=False)]
X = np.random.default_rng(0).normal(size=(2, 5, 3)).astype(np.float32)


def step(state, action):
    """A toy environment step: two outputs of different shapes and dtypes."""
    new = state * 0.9 + jnp.sin(action)
    return new, (new.sum() > 0).astype(jnp.int32)


@pytest.mark.parametrize("config", CONFIGS, ids=["reference", "default", "unfused"])
def test_values_and_tuple_outputs(config):
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        x = tl.from_array(X, domain=(b, t))
        s = tl.placeholder((3,), domain=(b, t))
        s[b, 0] = x
        new, flag = tl.lift(step)(s[b, t - 1], x)
        s[b, t] = new
        f = tl.placeholder((), "int32", domain=(b, t))  # flag only exists from t = 1 on
        f[b, 0] = tl.zeros((), "int32")
        f[b, t] = flag
        norm = tl.lift(jnp.linalg.norm)(s)
    res = ctx.compile(bounds={B: 2, T: 5}, outputs={"s": s, "flag": f, "norm": norm},
                      config=config).run()
    want = np.zeros_like(X)
    flags = np.zeros((2, 5), np.int32)
    for bb in range(2):
        want[bb, 0] = X[bb, 0]
        for k in range(1, 5):
            want[bb, k], flags[bb, k] = step(want[bb, k - 1], X[bb, k])
    np.testing.assert_allclose(res["s"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(res["flag"], flags)
    assert res["flag"].dtype == np.int32
    np.testing.assert_allclose(res["norm"], np.linalg.norm(want, axis=-1), rtol=1e-5)


def test_gradient_through_a_lifted_function():
    def f(w, x):
        return jnp.tanh(x @ w).sum()

    W = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    (T,) = ctx.bounds
    with ctx:
        x = tl.from_array(X[0], domain=(t,))
        w = tl.placeholder((3, 4), domain=())
        w[()] = tl.constant(W)
        gw, gx = tl.grad(tl.lift(f)(w, x) * 2.0, [w, x])
    want_w, want_x = jax.grad(lambda w, x: 2.0 * jnp.tanh(x @ w).sum(), argnums=(0, 1))(W, X[0])
    for config in CONFIGS[:2]:
        res = ctx.compile(bounds={T: 5}, outputs={"gw": gw, "gx": gx}, config=config).run()
        np.testing.assert_allclose(res["gw"], want_w, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(res["gx"], want_x, rtol=1e-4, atol=1e-5)


def _two_outputs(w, h):
    z = jnp.tanh(h @ w[0])
    return (z @ w[1]).sum(), (z * z).sum(), jnp.argmax(z)  # the last: no cotangent (int)


def test_a_call_with_several_differentiated_outputs_is_one_vjp_per_input(executor):
    """Both outputs of one lifted call reach the loss (a sum and a product of them): their
    cotangents go back through one ``jax.vjp`` per input, not one per output and input, and
    the gradients equal ``jax.grad``'s."""
    rng = np.random.default_rng(2)
    H = rng.normal(size=(6, 4)).astype(np.float32)
    W = rng.normal(size=(2, 4, 4)).astype(np.float32) * 0.5
    ctx = tl.Context(dims=("b",))
    (b,) = ctx.dims
    with ctx:
        h = tl.placeholder((4,), domain=(b,))
        h[b] = tl.from_array(H, domain=(b,)) * 1.0
        w = tl.placeholder((2, 4, 4), domain=())
        w[()] = tl.constant(W)
        a, c, _ = tl.lift(_two_outputs)(w, h)
        gw, gh = tl.grad(a + a * c, [w, h])

    def loss(w, h):
        a, c, _ = jax.vmap(_two_outputs, (None, 0))(w, h)
        return (a + a * c).sum()
    want_w, want_h = jax.grad(loss, argnums=(0, 1))(W, H)
    prog = ctx.compile(bounds={ctx.bounds[0]: 6}, outputs={"gw": gw, "gh": gh},
                       config=tl.CompileConfig(executor=executor))
    ops = [m for op in prog.sdg.ops.values()
           for m in ([m for m, _ in op.attrs["body"]] if op.kind == "fused" else [op])]
    vjps = [m.attrs["jax_fn"] for m in ops if m.kind == "lift"
            and isinstance(m.attrs["jax_fn"], Cotangent)]
    assert sorted(f.j for f in vjps) == [0, 1]
    assert all(f.out == (0, 1) for f in vjps)
    res = prog.run()
    np.testing.assert_allclose(res["gw"], want_w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(res["gh"], want_h, rtol=1e-4, atol=1e-5)


def _cell(w, h, x):
    n = jnp.tanh(h @ w + x)
    return n, (n * n).sum()


def test_a_recurrent_call_with_two_differentiated_outputs_equals_jax_grad(executor):
    """Back-propagation through time through a lifted cell whose state and energy both reach
    the loss, the state also through the next step's call: one vjp per input of each call."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(5, 3)).astype(np.float32)
    W = (rng.normal(size=(3, 3)) * 0.5).astype(np.float32)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_array(X, domain=(t,))
        w = tl.placeholder((3, 3), domain=())
        w[()] = tl.constant(W)
        h, e = tl.placeholder((3,), domain=(t,)), tl.placeholder((), domain=(t,))
        h[0], e[0] = tl.lift(_cell)(w, tl.zeros((3,)), x)
        h[t], e[t] = tl.lift(_cell)(w, h[t - 1], x)
        (gw,) = tl.grad(e * 0.5 + h.sum(), [w])

    def loss(w):
        state, total = jnp.zeros(3), 0.0
        for k in range(5):
            state, energy = _cell(w, state, X[k])
            total = total + energy * 0.5 + state.sum()
        return total
    res = ctx.compile(bounds={T: 5}, outputs={"gw": gw},
                      config=tl.CompileConfig(executor=executor)).run()
    np.testing.assert_allclose(res["gw"], jax.grad(loss)(W), rtol=1e-5, atol=1e-6)


def test_bad_functions_are_clear_errors():
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        x = tl.from_array(X[0], domain=(t,))
        with pytest.raises(tl.ShapeError, match="fails on arguments") as e:
            tl.lift(lambda a: a @ jnp.ones((7, 2)))(x)
        assert e.value.loc.file == __file__
        with pytest.raises(tl.ShapeError, match="static shapes"):
            tl.lift(jnp.sum)(x[0:t + 1])
        with pytest.raises(tl.ShapeError, match="array or a tuple"):
            tl.lift(lambda a: {"a": a})(x)


def test_a_lifted_product_contracts_its_left_operand_on_its_last_axes():
    """``jax_ops.lhs_last``: the same values for every ``dot_general`` form (batch axes,
    several contracted axes, nested ``jit``, under ``vmap`` and ``grad``), and on the CPU a
    weight's gradient compiled as a product whose left operand is contracted on its last axis
    (XLA:CPU's fast library takes no other)."""
    from jax import lax

    from tempo_lab.runtime.jax_ops import lhs_last

    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(4, 6, 5)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(4, 6, 3)), jnp.float32)
    forms = [
        lambda a, b: lax.dot_general(a, b, (((1,), (1,)), ((0,), (0,)))),
        lambda a, b: lax.dot_general(a, b, (((0, 1), (0, 1)), ((), ()))),
        lambda a, b: jax.jit(lambda u, v: jnp.einsum("bsi,bsj->ij", u, v))(a, b),
        lambda a, b: jax.vmap(lambda u, v: u.T @ v)(a, b),
        lambda a, b: jax.grad(lambda w: jnp.tanh(a @ w).sum())(jnp.ones((5, 3))),
        lambda a, b: a @ jnp.ones((5, 2)),  # already contracted on its last axis
    ]
    for f in forms:
        np.testing.assert_allclose(lhs_last(f)(x, y), f(x, y), rtol=1e-5, atol=1e-5)

    def grad_w(a, g):  # the weight gradient of a @ w, as jax.vjp writes it
        return jax.vjp(lambda w: a @ w, jnp.zeros((64, 64)))[1](g)[0]

    a = jnp.ones((2000, 64), jnp.float32)
    text = jax.jit(lhs_last(grad_w)).lower(a, a).compile().as_text()
    if jax.default_backend() == "cpu":
        assert "lhs_contracting_dims={0}" in jax.jit(grad_w).lower(a, a).compile().as_text()
        assert "lhs_contracting_dims={0}" not in text, text
