"""``tl.optim``: SGD (with and without momentum) and Adam as recurrences over an iteration dim,
checked step by step against a NumPy implementation of the same update rules."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tempo_lab as tl

X = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
Y = (X @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3).astype(np.float32)
W0, B0 = np.zeros(3, np.float32), np.zeros((), np.float32)
N = 6


def numpy_grads(w, b):
    r = X @ w + b - Y
    return {"w": 2 * X.T @ r / len(Y), "b": np.asarray(2 * r.mean(), np.float32)}


def numpy_train(update):
    p, state, hist = {"w": W0.copy(), "b": B0.copy()}, {}, []
    for step in range(N):
        hist.append({k: v.copy() for k, v in p.items()})
        g = numpy_grads(p["w"], p["b"])
        for k in p:
            p[k] = update(k, p[k], g[k], state, step + 1)
    return hist


def sgd(lr, mu):
    def update(k, p, g, state, step):
        v = mu * state.get(k, 0.0) + g
        state[k] = v
        return p - lr * v
    return update


def adam(lr, b1=0.9, b2=0.999, eps=1e-8):
    def update(k, p, g, state, step):
        m, v = state.get(k, (0.0, 0.0))
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        state[k] = (m, v)
        return p - lr * (m / (1 - b1 ** step)) / (np.sqrt(v / (1 - b2 ** step)) + eps)
    return update


CASES = {"sgd": (tl.optim.SGD(lr=0.1), sgd(0.1, 0.0)),
         "momentum": (tl.optim.SGD(lr=0.05, momentum=0.9), sgd(0.05, 0.9)),
         "adam": (tl.optim.Adam(lr=0.1), adam(0.1))}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.executors(("reference", "auto"), reason="the reference and what a user runs")
def test_optimizer_matches_numpy(name, executor):
    opt, update = CASES[name]
    ctx = tl.Context(dims=("i",))
    (i,) = ctx.dims
    with ctx:
        p = tl.optim.parameters({"w": W0, "b": B0}, dim=i)
        loss = ((tl.constant(X) @ p["w"] + p["b"] - tl.constant(Y)) ** 2).mean()
        opt.minimize(loss, p)
    config = tl.CompileConfig(executor=executor) if executor == "reference" else tl.CompileConfig()
    res = ctx.compile(bounds={ctx.bounds[0]: N}, outputs={"w": p["w"], "b": p["b"], "loss": loss},
                      config=config).run()
    hist = numpy_train(update)
    np.testing.assert_allclose(res["w"], np.stack([h["w"] for h in hist]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(res["b"], np.stack([h["b"] for h in hist]), rtol=1e-4, atol=1e-5)
    assert res["loss"][-1] < res["loss"][0]


def test_parameters_need_an_iteration_dim():
    ctx = tl.Context(dims=("i",))
    with ctx, pytest.raises(tl.DefinitionError, match="iteration dim") as e:
        tl.optim.parameters({"w": W0}, dim="i")
    assert e.value.loc.file == __file__


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.executors(("reference", "auto", "interpreter"), reason="the reference, what a "
                        "user runs and one back end per statement")
def test_updates_over_several_dims_run_in_lexicographic_order(name, executor):
    """Parameters over (i, e, m) take one update per point: the same sequence of N = 2·1·3
    updates as over one dim, so the same values (e.g. PPO's epochs x minibatches per
    iteration)."""
    opt, update = CASES[name]
    ctx = tl.Context(dims=("i", "e", "m"))
    dims = ctx.dims
    with ctx:
        p = tl.optim.parameters({"w": W0, "b": B0}, dim=dims)
        loss = ((tl.constant(X) @ p["w"] + p["b"] - tl.constant(Y)) ** 2).mean()
        opt.minimize(loss, p)
    res = ctx.compile(bounds=dict(zip(ctx.bounds, (2, 1, 3))), outputs={"w": p["w"]},
                      config=tl.CompileConfig(executor=executor)).run()
    hist = numpy_train(update)
    np.testing.assert_allclose(np.asarray(res["w"]).reshape(N, 3),
                               np.stack([h["w"] for h in hist]), rtol=1e-4, atol=1e-5)


def test_parameters_over_repeated_dims_are_an_error():
    ctx = tl.Context(dims=("i", "e"))
    i, _ = ctx.dims
    with ctx, pytest.raises(tl.DefinitionError, match="distinct dims"):
        tl.optim.parameters({"w": W0}, dim=(i, i))


def test_a_learning_rate_schedule_is_read_where_each_update_starts():
    """Adam with ``lr`` a tensor over i (halved every iteration) and parameters over (i, m):
    the updates of iteration i, including the one that leads into iteration i + 1, use lr[i]."""
    ctx = tl.Context(dims=("i", "m"))
    i, m = ctx.dims
    with ctx:
        lr = 0.1 * 0.5 ** (tl.zeros((), "float32") + i)
        p = tl.optim.parameters({"w": W0, "b": B0}, dim=(i, m))
        loss = ((tl.constant(X) @ p["w"] + p["b"] - tl.constant(Y)) ** 2).mean()
        tl.optim.Adam(lr=lr).minimize(loss, p)
    res = ctx.compile(bounds=dict(zip(ctx.bounds, (3, 2))), outputs={"w": p["w"]}).run()
    hist = numpy_train(lambda k, p_, g, state, step: adam(0.1 * 0.5 ** ((step - 1) // 2))(
        k, p_, g, state, step))
    np.testing.assert_allclose(np.asarray(res["w"]).reshape(N, 3),
                               np.stack([h["w"] for h in hist]), rtol=1e-4, atol=1e-5)


def jax_mixed_precision_adam(lr, steps, w0, b1=0.9, b2=0.999, eps=1e-8):
    """Mixed precision as written in JAX: bfloat16 weights rounded from float32 masters, the
    gradient of the bfloat16 weights widened, Adam on the masters. -> (weights, masters)."""
    import jax
    import jax.numpy as jnp

    def loss(w):
        return ((jnp.asarray(X) @ w - jnp.asarray(Y)) ** 2).mean()

    master, m, v, ws, masters = jnp.asarray(w0), 0.0, 0.0, [], []
    for step in range(1, steps + 1):
        w = master.astype(jnp.bfloat16)
        ws.append(w)
        masters.append(master)
        g = jax.grad(loss)(w).astype(jnp.float32)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        master = master - lr * (m / (1 - b1 ** step)) / (jnp.sqrt(v / (1 - b2 ** step)) + eps)
    return np.stack(ws), np.stack(masters)


def _mixed(master_dtype, executor="auto", lr=1e-3, steps=12):
    ctx = tl.Context(dims=("i",))
    (i,) = ctx.dims
    with ctx:
        p = tl.optim.parameters({"w": np.ones(3, np.float32)}, dim=i, dtype="bfloat16",
                                master_dtype=master_dtype)
        loss = ((tl.constant(X) @ p["w"] - tl.constant(Y)) ** 2).mean()
        tl.optim.Adam(lr=lr).minimize(loss, p)
    config = tl.CompileConfig(executor=executor)
    return ctx.compile(bounds={ctx.bounds[0]: steps}, config=config,
                       outputs={"w": p["w"], "master": p.masters["w"]}).run()


@pytest.mark.executors(("reference", "auto", "interpreter"), reason="the reference, what a "
                       "user runs and one back end per statement")
def test_mixed_precision_updates_float32_masters_as_jax_does(executor):
    """bfloat16 weights with float32 masters: the weights are the masters rounded, the
    masters and moments take every update. Steps of lr = 1e-3 on weights near 1 are under half
    a bfloat16 step (2^-8), so they only add up in the masters."""
    res = _mixed("float32", executor)
    ws, masters = jax_mixed_precision_adam(1e-3, 12, np.ones(3, np.float32))
    assert res["w"].dtype == ml_dtypes.bfloat16 and res["master"].dtype == np.float32
    np.testing.assert_allclose(res["master"], masters, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(res["w"].astype(np.float32), ws.astype(np.float32))
    assert (res["w"][-1] != 1).all()


def test_without_masters_bfloat16_updates_round_away():
    """The same training with the updates in bfloat16: each update rounds back to 1, which is
    why masters exist."""
    res = _mixed(None)
    np.testing.assert_array_equal(res["w"].astype(np.float32), 1.0)


def test_a_master_dtype_no_wider_than_the_weights_is_a_located_error():
    ctx = tl.Context(dims=("i",))
    (i,) = ctx.dims
    with ctx, pytest.raises(tl.DTypeError, match="master_dtype") as e:
        tl.optim.parameters({"w": W0}, dim=i, dtype="float32", master_dtype="bfloat16")
    assert e.value.loc.file == __file__


def test_mixed_precision_over_several_dims_takes_the_same_updates():
    """Mixed-precision parameters over (i, m), one update per point in lexicographic order:
    the same masters as over i alone with as many points."""
    runs = {}
    for dims in (("i",), ("i", "m")):
        ctx = tl.Context(dims=dims)
        with ctx:
            p = tl.optim.parameters({"w": np.ones(3, np.float32)},
                                    dim=ctx.dims if len(dims) > 1 else ctx.dims[0],
                                    dtype="bfloat16", master_dtype="float32")
            loss = ((tl.constant(X) @ p["w"] - tl.constant(Y)) ** 2).mean()
            tl.optim.Adam(lr=1e-3).minimize(loss, p)
        bounds = dict(zip(ctx.bounds, (6, 2) if len(dims) > 1 else (12,)))
        runs[dims] = np.asarray(ctx.compile(bounds=bounds, outputs={"m": p.masters["w"]})
                                .run()["m"]).reshape(12, 3)
    np.testing.assert_allclose(runs[("i", "m")], runs[("i",)], rtol=0, atol=1e-6)
